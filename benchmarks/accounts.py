"""Benchmark accounts and workloads.

The accounts are deterministic keys (so the load generator derives them from their index and
no key list travels between processes), funded in the benchmark genesis together with an
ERC-20 token whose storage already gives every account a balance. Workloads are pre-signed
EIP-1559 transactions: plain transfers, or ERC-20 `transfer` calls, each sender to the next
account.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from eth.vm.forks import PragueVM
from eth_hash.auto import keccak
from eth_keys import keys

KEY_SEED = b"pbft-chain benchmark account"
ACCOUNT_BALANCE = 10**24
TOKEN_ADDRESS = bytes.fromhex("00000000000000000000000000000000000e2c20")
TOKEN_BALANCE = 10**24
TOTAL_SUPPLY_SLOT = 0  # ERC20.sol: totalSupply, then mapping balanceOf
BALANCE_OF_SLOT = 1
TRANSFER_SELECTOR = keccak(b"transfer(address,uint256)")[:4]
GWEI = 10**9
# Full blocks raise the base fee by up to 12.5% a block; a cap this high keeps every
# transaction executable for hundreds of full blocks.
MAX_FEE_PER_GAS = 10**6 * GWEI
PRIORITY_FEE_PER_GAS = GWEI
TRANSFER_GAS = 21_000
ERC20_GAS = 40_000  # a transfer between two holders uses about 35,000
WORKLOAD_GAS = {"transfer": TRANSFER_GAS, "erc20": ERC20_GAS}
CONTRACTS_DIR = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "contracts"


@dataclass(frozen=True)
class Account:
    key: keys.PrivateKey
    address: bytes


@cache
def bench_account(index: int) -> Account:
    key = keys.PrivateKey(keccak(KEY_SEED + index.to_bytes(4, "big")))
    return Account(key, key.public_key.to_canonical_address())


def bench_accounts(count: int) -> list[Account]:
    return [bench_account(i) for i in range(count)]


def _word(value: int | bytes) -> bytes:
    return value.rjust(32, b"\0") if isinstance(value, bytes) else value.to_bytes(32, "big")


def token_balance_slot(holder: bytes) -> int:
    """Solidity's slot of balanceOf[holder]."""
    return int.from_bytes(keccak(_word(holder) + _word(BALANCE_OF_SLOT)), "big")


def _token_code() -> str:
    return json.loads((CONTRACTS_DIR / "ERC20.json").read_text())["deployedBytecode"]


def genesis_alloc(count: int) -> dict[str, dict[str, Any]]:
    """Geth-style alloc entries: `count` funded accounts and the token holding their balances."""
    accounts = bench_accounts(count)
    storage = {hex(token_balance_slot(a.address)): hex(TOKEN_BALANCE) for a in accounts}
    storage[hex(TOTAL_SUPPLY_SLOT)] = hex(TOKEN_BALANCE * count)
    alloc: dict[str, dict[str, Any]] = {
        "0x" + a.address.hex(): {"balance": hex(ACCOUNT_BALANCE)} for a in accounts
    }
    token = {"balance": "0x0", "code": _token_code(), "storage": storage}
    alloc["0x" + TOKEN_ADDRESS.hex()] = token
    return alloc


@dataclass(frozen=True)
class SignedTx:
    raw: bytes
    hash: bytes
    sender: int  # the sender's account index
    nonce: int


def _call_data(workload: str, recipient: bytes) -> tuple[bytes, bytes]:
    """(to, data) of one transaction of `workload` paying `recipient`."""
    if workload == "transfer":
        return recipient, b""
    if workload == "erc20":
        return TOKEN_ADDRESS, TRANSFER_SELECTOR + _word(recipient) + _word(1)
    raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOAD_GAS)}")


def sign(workload: str, chain_id: int, sender: int, nonce: int, accounts: int) -> SignedTx:
    builder = PragueVM.get_transaction_builder()
    to, data = _call_data(workload, bench_account((sender + 1) % accounts).address)
    unsigned = builder.new_unsigned_dynamic_fee_transaction(
        chain_id, nonce, PRIORITY_FEE_PER_GAS, MAX_FEE_PER_GAS, WORKLOAD_GAS[workload],
        to, 1 if workload == "transfer" else 0, data, [],
    )
    raw = unsigned.as_signed_transaction(bench_account(sender).key).encode()
    return SignedTx(raw, keccak(raw), sender, nonce)


def interleaved(
    senders: list[int], first_nonces: list[int], per_sender: int
) -> Iterator[tuple[int, int]]:
    """(sender, nonce) pairs: round r gives every sender its r-th transaction, so each sender's
    nonces arrive in order and every stretch of the stream spans many senders."""
    for round_index in range(per_sender):
        for sender, first in zip(senders, first_nonces, strict=True):
            yield sender, first + round_index


def sign_workload(
    workload: str,
    chain_id: int,
    accounts: int,
    senders: list[int],
    first_nonces: list[int],
    per_sender: int,
) -> list[SignedTx]:
    return [
        sign(workload, chain_id, sender, nonce, accounts)
        for sender, nonce in interleaved(senders, first_nonces, per_sender)
    ]
