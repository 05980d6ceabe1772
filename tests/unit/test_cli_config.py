"""`pbft-node run` settings: the RPC limits from the config file and flags; `testnet init`'s
engine parameters."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from chain.rpc.limits import BatchLimits, RpcLimits
from cli.config import FLAG_KEYS, node_config, resolve_settings
from cli.errors import CliError
from cli.testnet import init_testnet


def _settings(tmp_path: Path, toml: str, **flags: object) -> dict[str, object]:
    config = tmp_path / "node.toml"
    config.write_text('datadir = "data"\n' + toml)
    args = argparse.Namespace(config=str(config), **{f: None for f in FLAG_KEYS})
    for name, value in flags.items():
        setattr(args, name, value)
    return resolve_settings(args)


def test_rpc_limits_come_from_the_file_and_flags_win(tmp_path: Path) -> None:
    settings = _settings(tmp_path, """
[http]
max_connections = 16
max_request_bytes = 1024
max_response_rate = 4096
read_timeout = 1.5
idle_timeout = 3
[rpc]
batch_request_limit = 10
batch_response_max_size = 2000
gascap = 100000
""", rpc_batch_request_limit=20)
    config = node_config(settings)
    assert config.rpc_limits == RpcLimits(
        max_body_bytes=1024, batch=BatchLimits(max_items=20, max_response_bytes=2000),
        read_timeout=1.5, idle_timeout=3.0, max_connections=16, max_answer_rate=4096)
    assert config.rpc_gas_cap == 100_000


def test_without_settings_the_limits_are_the_defaults(tmp_path: Path) -> None:
    config = node_config(_settings(tmp_path, ""))
    assert config.rpc_limits == RpcLimits()
    assert config.rpc_gas_cap == 50_000_000


@pytest.mark.parametrize(("toml", "message"), [
    ("[http]\nmax_connections = 0", "http.max_connections must be a positive integer, got 0"),
    ("[http]\nread_timeout = \"soon\"",
     "http.read_timeout must be a positive number of seconds, got 'soon'"),
    ("[rpc]\nbatch_request_limit = 1.5", "rpc.batch_request_limit must be a positive integer"),
    ("[rpc]\ngascap = true", "rpc.gascap must be a positive integer, got True"),
    ("[http]\nidle_timeout = nan", "http.idle_timeout must be a positive number of seconds"),
    ("[http]\nread_timeout = \"inf\"", "http.read_timeout must be a positive number"),
])
def test_a_bad_limit_is_a_one_line_error(tmp_path: Path, toml: str, message: str) -> None:
    with pytest.raises(CliError, match=message.replace(".", r"\.")):
        node_config(_settings(tmp_path, toml))


@pytest.mark.parametrize(("pbft", "message"), [
    ({"max_in_flight": 0}, "max_in_flight must be between 1 and the watermark window"),
    ({"max_in_flight": 41}, "x log_multiplier = 40"),
    ({"checkpoint_interval": 0}, "checkpoint_interval must be >= 1"),
])
def test_testnet_init_refuses_bad_engine_parameters_before_writing_anything(
        tmp_path: Path, pbft: dict[str, int], message: str) -> None:
    with pytest.raises(CliError, match=message):
        init_testnet(tmp_path / "net", 4, 1337, 30303, 8545, 6060, pbft)
    assert not (tmp_path / "net").exists()


def test_pool_and_evm_settings_come_from_the_file_and_flags_win(tmp_path: Path) -> None:
    """The geth-named flags `pbft-node run --help` lists (--txpool.*, --rpc.evmtimeout)."""
    from cli.node import build_parser

    parsed = build_parser().parse_args(
        ["run", "--config", str(tmp_path / "node.toml"), "--txpool.pricelimit", "7",
         "--txpool.globalqueue", "50", "--rpc.evmtimeout", "0.5"])
    flags = {f: getattr(parsed, f) for f in ("txpool_pricelimit", "txpool_globalqueue",
                                             "rpc_evmtimeout")}
    settings = _settings(tmp_path, "[txpool]\npricelimit = 3\naccountqueue = 9\n", **flags)
    config = node_config(settings)
    limits = config.pool_limits
    assert (limits.price_limit, limits.max_queued_per_sender, limits.max_queued) == (7, 9, 50)
    assert config.rpc_limits.evm.timeout == 0.5


def test_observers_come_from_the_file_and_the_flag_wins(tmp_path: Path) -> None:
    first, second = "0x" + "ab" * 20, "cd" * 20
    settings = _settings(tmp_path, f'[p2p]\nobservers = ["{first}"]\n')
    assert node_config(settings).observers == {bytes.fromhex("ab" * 20)}
    flagged = _settings(tmp_path, f'[p2p]\nobservers = ["{first}"]\n',
                        observers=f"{first},{second}")
    assert node_config(flagged).observers == {bytes.fromhex("ab" * 20), bytes.fromhex(second)}
    with pytest.raises(CliError, match="observer '0x1234' is not an address"):
        node_config(_settings(tmp_path, "", observers="0x1234"))


def test_testnet_init_lists_observers_and_lets_the_validators_accept_them(
        tmp_path: Path) -> None:
    import tomllib

    description = init_testnet(tmp_path / "net", 4, 1337, 30303, 8545, 6060, {}, observers=2)
    nodes = description["nodes"]
    assert [n["role"] for n in nodes] == ["validator"] * 4 + ["observer"] * 2
    assert [n["address"] for n in nodes[:4]] == description["validators"]
    observers = [n["address"] for n in nodes[4:]]
    assert not set(observers) & set(description["validators"])
    assert all(n["rpc_url"] and n["command"] for n in nodes)
    for node in nodes:
        p2p = tomllib.loads(Path(node["command"][-1]).read_text())["p2p"]
        dialed = {peer.split("@")[0] for peer in p2p["peers"]}
        others = {n["address"] for n in nodes} - {node["address"]}
        if node["role"] == "validator":
            assert dialed == set(description["validators"]) - {node["address"]}
            assert p2p["observers"] == observers
        else:
            assert dialed == others and "observers" not in p2p
    with pytest.raises(CliError, match="observers follow a PBFT chain"):
        init_testnet(tmp_path / "dev", 1, 1337, 30303, 8545, 6060, {}, observers=1)
