"""`pbft-node run` settings: a TOML config file, overridden by command-line flags.

datadir = "node0"
[http]
addr = "127.0.0.1"
port = 8545
hosts = ["localhost", "127.0.0.1"]   # Host header allowlist ("*" for any)
corsdomain = []                      # browser origins allowed (none by default)
[log]
level = "info"
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from chain.node import NodeConfig
from cli.errors import CliError

# flag name -> (section, key) in the config file
FLAG_KEYS = {
    "datadir": ("", "datadir"),
    "http_addr": ("http", "addr"),
    "http_port": ("http", "port"),
    "http_hosts": ("http", "hosts"),
    "http_corsdomain": ("http", "corsdomain"),
    "log_level": ("log", "level"),
}


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
            if flag == "datadir" and value is not None:
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


def node_config(settings: dict[str, Any]) -> NodeConfig:
    config = NodeConfig(datadir=Path(settings["datadir"]))
    if settings["http_addr"] is not None:
        config.http_addr = str(settings["http_addr"])
    if settings["http_port"] is not None:
        port = settings["http_port"]
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise CliError(f"http port {port!r} is not a port number (0-65535)")
        config.http_port = port
    if settings["http_hosts"] is not None:
        config.host_allowlist = _split(settings["http_hosts"])
    if settings["http_corsdomain"] is not None:
        config.cors_origins = _split(settings["http_corsdomain"])
    return config
