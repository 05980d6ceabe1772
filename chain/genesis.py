"""Geth-style genesis files: parsing, validation and the genesis block parameters.

The file carries `config.chainId`, one engine section (`config.dev`, `config.pbft`, or any
registered engine's name) with that engine's parameters, `alloc`, `gasLimit`, `baseFeePerGas`,
`timestamp`, `extraData` and optionally `coinbase`. Other geth config keys (fork blocks) are
accepted and ignored: the chain runs the newest fork py-evm supports from block 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth.constants import ZERO_HASH32
from eth_utils import is_hex_address, to_canonical_address

from chain.errors import GenesisError
from encoding import EncodingError
from encoding.hexcodec import parse_number

DEFAULT_GAS_LIMIT = 30_000_000
DEFAULT_BASE_FEE = 1_000_000_000
MAX_EXTRA_DATA = 32


@dataclass(frozen=True)
class GenesisAccount:
    balance: int = 0
    nonce: int = 0
    code: bytes = b""
    storage: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Genesis:
    chain_id: int
    engine: str
    engine_params: dict[str, Any]
    alloc: dict[bytes, GenesisAccount]
    gas_limit: int = DEFAULT_GAS_LIMIT
    base_fee_per_gas: int = DEFAULT_BASE_FEE
    timestamp: int = 0
    extra_data: bytes = b""
    coinbase: bytes = b"\x00" * 20
    source: bytes = b""  # the file's bytes, kept in the data directory

    def header_params(self) -> dict[str, Any]:
        return {
            "difficulty": 0,
            "gas_limit": self.gas_limit,
            "timestamp": self.timestamp,
            "nonce": b"\x00" * 8,
            "mix_hash": ZERO_HASH32,
            "extra_data": self.extra_data,
            "base_fee_per_gas": self.base_fee_per_gas,
            "coinbase": self.coinbase,
        }

    def state(self) -> dict[bytes, dict[str, Any]]:
        return {
            address: {
                "balance": account.balance,
                "nonce": account.nonce,
                "code": account.code,
                "storage": dict(account.storage),
            }
            for address, account in self.alloc.items()
        }


def parse_quantity(value: Any, what: str) -> int:
    """A JSON number, a decimal string or a 0x-hex string, as geth accepts in genesis files."""
    try:
        return parse_number(value, what)
    except EncodingError as exc:
        raise GenesisError(str(exc)) from None


def parse_data(value: Any, what: str) -> bytes:
    if not isinstance(value, str) or not value.lower().startswith("0x"):
        raise GenesisError(f"{what}: expected 0x-prefixed hex, got {value!r}")
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        raise GenesisError(f"{what}: {value!r} is not valid hex") from None


def parse_address(value: Any, what: str) -> bytes:
    text = value if isinstance(value, str) else ""
    if not text.startswith("0x") and len(text) == 40:
        text = "0x" + text
    if not is_hex_address(text):
        raise GenesisError(f"{what}: {value!r} is not a 20-byte hex address")
    return to_canonical_address(text)


def _parse_account(address: str, raw: Any) -> tuple[bytes, GenesisAccount]:
    where = f"alloc[{address}]"
    canonical = parse_address(address, "alloc: account")
    if not isinstance(raw, dict):
        raise GenesisError(f"{where}: expected an object with balance/nonce/code/storage")
    storage = raw.get("storage", {})
    if not isinstance(storage, dict):
        raise GenesisError(f"{where}.storage: expected an object of slot -> value")
    return canonical, GenesisAccount(
        balance=parse_quantity(raw.get("balance", 0), f"{where}.balance"),
        nonce=parse_quantity(raw.get("nonce", 0), f"{where}.nonce"),
        code=parse_data(raw.get("code", "0x"), f"{where}.code"),
        storage={
            parse_quantity(k, f"{where}.storage key"): parse_quantity(v, f"{where}.storage[{k}]")
            for k, v in storage.items()
        },
    )


def _engine_section(config: dict[str, Any], known_engines: set[str]) -> tuple[str, dict]:
    sections = {k: v for k, v in config.items() if isinstance(v, dict)}
    if not sections:
        raise GenesisError(
            "genesis config has no engine section; add one of "
            + ", ".join(f'"{name}": {{...}}' for name in sorted(known_engines))
        )
    if len(sections) > 1:
        raise GenesisError(
            f"genesis config has several engine sections ({', '.join(sorted(sections))}); "
            "keep exactly one"
        )
    name, params = next(iter(sections.items()))
    if name not in known_engines:
        raise GenesisError(
            f"genesis config names unknown consensus engine {name!r}; "
            f"installed engines: {', '.join(sorted(known_engines))}"
        )
    return name, params


def parse_genesis(document: Any, known_engines: set[str], source: bytes = b"") -> Genesis:
    """Validate a decoded genesis document; raise GenesisError with one clear message."""
    if not isinstance(document, dict):
        raise GenesisError("genesis: expected a JSON object at the top level")
    config = document.get("config")
    if not isinstance(config, dict):
        raise GenesisError('genesis: missing "config" object')
    if "chainId" not in config:
        raise GenesisError('genesis: missing "config.chainId"')
    chain_id = parse_quantity(config["chainId"], "config.chainId")
    if chain_id == 0:
        raise GenesisError("config.chainId: must be positive")
    engine, engine_params = _engine_section(config, known_engines)
    alloc = document.get("alloc", {})
    if not isinstance(alloc, dict):
        raise GenesisError('genesis: "alloc" must be an object of address -> account')
    extra_data = parse_data(document.get("extraData", "0x"), "extraData")
    if len(extra_data) > MAX_EXTRA_DATA:
        raise GenesisError(f"extraData: {len(extra_data)} bytes, at most {MAX_EXTRA_DATA}")
    gas_limit = parse_quantity(document.get("gasLimit", DEFAULT_GAS_LIMIT), "gasLimit")
    if gas_limit < 5000:
        raise GenesisError("gasLimit: must be at least 5000")
    return Genesis(
        chain_id=chain_id,
        engine=engine,
        engine_params=engine_params,
        alloc=dict(_parse_account(a, raw) for a, raw in alloc.items()),
        gas_limit=gas_limit,
        base_fee_per_gas=parse_quantity(
            document.get("baseFeePerGas", DEFAULT_BASE_FEE), "baseFeePerGas"
        ),
        timestamp=parse_quantity(document.get("timestamp", 0), "timestamp"),
        extra_data=extra_data,
        coinbase=parse_address(document.get("coinbase", "0x" + "00" * 20), "coinbase"),
        source=source,
    )


def load_genesis_bytes(data: bytes, known_engines: set[str], origin: str = "genesis") -> Genesis:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GenesisError(f"{origin}: not valid JSON ({exc})") from None
    return parse_genesis(document, known_engines, source=data)


def load_genesis_file(path: str | Path, known_engines: set[str]) -> Genesis:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise GenesisError(f"cannot read genesis file {path}: {exc.strerror}") from None
    return load_genesis_bytes(data, known_engines, origin=str(path))
