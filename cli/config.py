"""`pbft-node run` settings: a TOML config file, overridden by command-line flags.

datadir = "node0"
keystore = "keystore"                # this node's key (one V3 keyfile); none: DATADIR/nodekey
password_file = "password.txt"
[p2p]
addr = "127.0.0.1"
port = 30303
peers = ["0xADDRESS@127.0.0.1:30304"]  # the validators (and observers) this node dials
observers = ["0xADDRESS"]            # a validator's: observer node keys allowed to connect in
[http]
addr = "127.0.0.1"
port = 8545
hosts = ["localhost", "127.0.0.1"]   # Host header allowlist ("*" for any)
corsdomain = []                      # browser origins allowed (none by default)
max_connections = 256                # HTTP and WebSocket together; 503 beyond
max_request_bytes = 5242880          # a request body; 413 beyond
max_request_rate = 16777216          # bytes a second of request bodies, all clients together
max_response_rate = 16777216         # bytes a second of answers written, all clients together
read_timeout = 30                    # seconds to send a request body; 408 beyond
idle_timeout = 120                   # seconds a connection may wait between requests
[rpc]
batch_request_limit = 1000           # calls in one batch
batch_response_max_size = 25000000   # bytes of one batch's answers; the rest get an error
gascap = 50000000                    # gas for eth_call and eth_estimateGas
evmtimeout = 5                       # seconds an eth_call / eth_estimateGas may execute
evm_workers = 1                      # processes that execute them (nice 19)
evm_max_pending = 8                  # of them running or waiting; "server busy" beyond
[txpool]                             # geth's --txpool.* (issue 29)
pricelimit = 1                       # wei: the lowest fee cap admitted (the base fee if higher)
lifetime = 10800                     # seconds a sender's queued transactions wait
accountqueue = 200                   # transactions per sender behind a nonce gap
globalqueue = 4000                   # transactions behind nonce gaps in all
[metrics]                            # Prometheus metrics; off unless a port is set
addr = "127.0.0.1"
port = 6060
[log]
level = "info"
"""

from __future__ import annotations

import argparse
import contextlib
import math
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from eth_keys.datatypes import PrivateKey

from chain.node import NodeConfig
from chain.rpc.limits import RpcLimits
from chain.txpool import PoolLimits
from cli.errors import CliError
from cli.keys import list_keyfiles, read_password, unlock_keyfile

# flag name -> (section, key) in the config file
FLAG_KEYS = {
    "datadir": ("", "datadir"),
    "http_addr": ("http", "addr"),
    "http_port": ("http", "port"),
    "http_hosts": ("http", "hosts"),
    "http_corsdomain": ("http", "corsdomain"),
    "p2p_addr": ("p2p", "addr"),
    "p2p_port": ("p2p", "port"),
    "peers": ("p2p", "peers"),
    "observers": ("p2p", "observers"),
    "keystore": ("", "keystore"),
    "password_file": ("", "password_file"),
    "log_level": ("log", "level"),
    "metrics_addr": ("metrics", "addr"),
    "metrics_port": ("metrics", "port"),
    "http_max_connections": ("http", "max_connections"),
    "http_max_request_bytes": ("http", "max_request_bytes"),
    "http_max_request_rate": ("http", "max_request_rate"),
    "http_max_response_rate": ("http", "max_response_rate"),
    "http_read_timeout": ("http", "read_timeout"),
    "http_idle_timeout": ("http", "idle_timeout"),
    "rpc_batch_request_limit": ("rpc", "batch_request_limit"),
    "rpc_batch_response_max_size": ("rpc", "batch_response_max_size"),
    "rpc_gascap": ("rpc", "gascap"),
    "rpc_evmtimeout": ("rpc", "evmtimeout"),
    "rpc_evm_workers": ("rpc", "evm_workers"),
    "rpc_evm_max_pending": ("rpc", "evm_max_pending"),
    "txpool_pricelimit": ("txpool", "pricelimit"),
    "txpool_lifetime": ("txpool", "lifetime"),
    "txpool_accountqueue": ("txpool", "accountqueue"),
    "txpool_globalqueue": ("txpool", "globalqueue"),
}
PATH_SETTINGS = ("datadir", "keystore", "password_file")
# flag -> RpcLimits field ("batch." for BatchLimits, "evm." for EvmLimits), and its type
RPC_LIMIT_SETTINGS: tuple[tuple[str, str, type[int] | type[float]], ...] = (
    ("http_max_connections", "max_connections", int),
    ("http_max_request_bytes", "max_body_bytes", int),
    ("http_max_request_rate", "max_body_rate", int),
    ("http_max_response_rate", "max_answer_rate", int),
    ("http_read_timeout", "read_timeout", float),
    ("http_idle_timeout", "idle_timeout", float),
    ("rpc_batch_request_limit", "batch.max_items", int),
    ("rpc_batch_response_max_size", "batch.max_response_bytes", int),
    ("rpc_evmtimeout", "evm.timeout", float),
    ("rpc_evm_workers", "evm.workers", int),
    ("rpc_evm_max_pending", "evm.max_pending", int),
)
# flag -> PoolLimits field, and its type
TXPOOL_SETTINGS: tuple[tuple[str, str, type[int] | type[float]], ...] = (
    ("txpool_pricelimit", "price_limit", int),
    ("txpool_lifetime", "lifetime", float),
    ("txpool_accountqueue", "max_queued_per_sender", int),
    ("txpool_globalqueue", "max_queued", int),
)


def load_config_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise CliError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"config file {path} is not valid TOML: {exc}") from None


def _lookup(document: dict[str, Any], section: str, key: str) -> Any:
    table = document.get(section, {}) if section else document
    return table.get(key) if isinstance(table, dict) else None


def resolve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Flags win over the config file; relative paths in the file are relative to it."""
    document = load_config_file(args.config) if args.config else {}
    base = Path(args.config).parent if args.config else Path.cwd()
    settings: dict[str, Any] = {}
    for flag, (section, key) in FLAG_KEYS.items():
        value = getattr(args, flag, None)
        if value is None:
            value = _lookup(document, section, key)
            if flag in PATH_SETTINGS and value is not None:
                value = str(base / value)
        settings[flag] = value
    if not settings["datadir"]:
        raise CliError("no data directory: pass --datadir DIR or --config FILE with datadir")
    return settings


def _split(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(str(v) for v in value)


def _port(value: Any, what: str) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise CliError(f"{what} {value!r} is not a port number (0-65535)")
    return value


def parse_peers(value: Any) -> dict[bytes, tuple[str, int]]:
    """`0xADDRESS@host:port` entries (comma-separated or a list) to address -> (host, port)."""
    peers = {}
    for entry in _split(value):
        address, _, endpoint = entry.partition("@")
        host, _, port = endpoint.rpartition(":")
        raw = _address(address)
        if raw is None or not host:
            raise CliError(f"peer {entry!r} is not ADDRESS@host:port")
        peers[raw] = (host, _port(port, f"peer {entry!r}: port"))
    return peers


def parse_observers(value: Any) -> frozenset[bytes]:
    """Observer node addresses (`0xADDRESS`, comma-separated or a list)."""
    observers = set()
    for entry in _split(value):
        raw = _address(entry)
        if raw is None:
            raise CliError(f"observer {entry!r} is not an address (0x and 40 hex digits)")
        observers.add(raw)
    return frozenset(observers)


def _address(text: str) -> bytes | None:
    """A 20-byte address from hex (0x optional), or None."""
    try:
        raw = bytes.fromhex(text.removeprefix("0x"))
    except ValueError:
        return None
    return raw if len(raw) == 20 else None


def _positive(value: Any, what: str, kind: type[int] | type[float] = int) -> Any:
    """A positive int (kind=float: a positive number of seconds) from a flag or the file."""
    number: int | float | None = None
    if not isinstance(value, bool) and not (kind is int and isinstance(value, float)):
        with contextlib.suppress(TypeError, ValueError):
            number = kind(value)
    if number is None or not 0 < number < math.inf:  # NaN and infinity too
        unit = "a positive number of seconds" if kind is float else "a positive integer"
        raise CliError(f"{what} must be {unit}, got {value!r}")
    return number


def _rpc_limits(settings: dict[str, Any]) -> RpcLimits:
    """[http] and [rpc] limits over the defaults (geth's where geth has one)."""
    limits = RpcLimits()
    for flag, field_name, kind in RPC_LIMIT_SETTINGS:
        value = settings[flag]
        if value is None:
            continue
        section, key = FLAG_KEYS[flag]
        limits = _with_field(limits, field_name, _positive(value, f"{section}.{key}", kind))
    return limits


def _with_field(limits: Any, field_name: str, value: Any) -> Any:
    """A copy of `limits` with `field_name` set; "batch.max_items" names a field of its
    BatchLimits."""
    outer, _, inner = field_name.partition(".")
    if inner:
        value = _with_field(getattr(limits, outer), inner, value)
    return replace(limits, **{outer: value})


def _pool_limits(settings: dict[str, Any]) -> PoolLimits:
    """[txpool] settings over the defaults (geth's)."""
    limits = PoolLimits()
    for flag, field_name, kind in TXPOOL_SETTINGS:
        if settings[flag] is not None:
            section, key = FLAG_KEYS[flag]
            limits = replace(limits, **{field_name: _positive(settings[flag],
                                                              f"{section}.{key}", kind)})
    return limits


def _validator_key(settings: dict[str, Any]) -> PrivateKey | None:
    if not settings["keystore"]:
        return None
    keyfiles = list_keyfiles(Path(settings["keystore"]))
    if len(keyfiles) != 1:
        raise CliError(
            f"keystore {settings['keystore']} holds {len(keyfiles)} keyfiles; a validator "
            "keystore must hold exactly one"
        )
    return unlock_keyfile(keyfiles[0][1], read_password(settings["password_file"]))


def node_config(settings: dict[str, Any]) -> NodeConfig:
    config = NodeConfig(datadir=Path(settings["datadir"]))
    config.validator_key = _validator_key(settings)
    if settings["http_addr"] is not None:
        config.http_addr = str(settings["http_addr"])
    if settings["http_port"] is not None:
        config.http_port = _port(settings["http_port"], "http port")
    if settings["p2p_addr"] is not None:
        config.p2p_addr = str(settings["p2p_addr"])
    if settings["p2p_port"] is not None:
        config.p2p_port = _port(settings["p2p_port"], "p2p port")
    if settings["peers"] is not None:
        config.peers = parse_peers(settings["peers"])
    if settings["observers"] is not None:
        config.observers = parse_observers(settings["observers"])
    if settings["metrics_addr"] is not None:
        config.metrics_addr = str(settings["metrics_addr"])
    if settings["metrics_port"] is not None:
        config.metrics_port = _port(settings["metrics_port"], "metrics port")
    if settings["http_hosts"] is not None:
        config.host_allowlist = _split(settings["http_hosts"])
    if settings["http_corsdomain"] is not None:
        config.cors_origins = _split(settings["http_corsdomain"])
    if settings["rpc_gascap"] is not None:
        config.rpc_gas_cap = _positive(settings["rpc_gascap"], "rpc.gascap")
    config.rpc_limits = _rpc_limits(settings)
    config.pool_limits = _pool_limits(settings)
    return config
