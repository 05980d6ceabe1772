"""`pbft-node testnet init|run`: a local cluster described by DIR/testnet.json.

testnet.json is the machine-readable description tools and tests use: chain_id, validators,
nodes (index, role: "validator" or "observer", address: the node key's, datadir, rpc_url, p2p
address, metrics url, command: the argv that runs the node) and accounts (funded dev accounts
with their private keys, as anvil prints them). Every node's address is funded in genesis too,
so its validator can pay for its votes on the set. Observers follow the validators (they dial
every validator and every other observer); each validator allows the observers' keys.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chain.errors import EngineError
from chain.genesis import DEFAULT_BASE_FEE, DEFAULT_GAS_LIMIT, parse_genesis
from chain.node import initialize_datadir, write_node_key
from chain.registry import available_engines, load_engine_class
from cli.errors import CliError
from cli.keys import DEV_VALIDATOR_SEED, LIGHT_SCRYPT_N, dev_private_key, write_keyfile
from cli.monitoring import write_monitoring

DEV_ACCOUNTS = 10
DEV_BALANCE = 10**24  # one million ether each
TESTNET_PBFT_PARAMS = {  # short periods so a local cluster reacts quickly
    "checkpoint_interval": 10,
    "log_multiplier": 4,
    "request_timeout": 2,
    "new_view_timeout": 2,
    "new_view_timeout_cap": 30,
    "block_period": 1,
}
TESTNET_PASSWORD = "testnet"  # the node keystores of a local testnet; not for real keys
DEV_OBSERVER_SEED = b"pbft-chain observer "  # the observer node keys of a local testnet


def _genesis_document(
    chain_id: int, validators: list[str], accounts: list[str], pbft: dict[str, Any]
) -> dict:
    if len(validators) == 1:
        engine = {"dev": {"period": 0, "coinbase": validators[0]}}
    else:
        if "pbft" not in available_engines():
            raise CliError(
                f"a testnet of {len(validators)} validators needs the pbft engine, which is "
                "not installed in this version; use --validators 1 (the dev engine)"
            )
        engine = {"pbft": {"validators": validators, **TESTNET_PBFT_PARAMS, **pbft}}
        try:
            load_engine_class("pbft").check_params(engine["pbft"])
        except EngineError as exc:
            raise CliError(f"{exc}; change the option") from None
    return {
        "config": {"chainId": chain_id, **engine},
        "alloc": {address: {"balance": hex(DEV_BALANCE)} for address in accounts},
        "gasLimit": hex(DEFAULT_GAS_LIMIT),
        "baseFeePerGas": hex(DEFAULT_BASE_FEE),
        "timestamp": hex(int(time.time())),
        "extraData": "0x",
    }


def _node_config(http_port: int, p2p_port: int, metrics_port: int, peers: list[str],
                 observers: list[str], validator: bool) -> str:
    p2p = (f'\n[p2p]\naddr = "127.0.0.1"\nport = {p2p_port}\npeers = {json.dumps(peers)}\n'
           + (f"observers = {json.dumps(observers)}\n" if observers else ""))
    # an observer has no validator key: its transport key is DATADIR/nodekey (geth's nodekey)
    key = 'keystore = "keystore"\npassword_file = "password.txt"\n' if validator else ""
    return (
        'datadir = "."\n' + key
        + (p2p if peers else "")
        + f'\n[http]\naddr = "127.0.0.1"\nport = {http_port}\n'
        + f'\n[metrics]\naddr = "127.0.0.1"\nport = {metrics_port}\n\n[log]\nlevel = "info"\n'
    )


def init_testnet(
    directory: Path,
    validators: int,
    chain_id: int,
    base_p2p_port: int,
    base_http_port: int,
    base_metrics_port: int,
    pbft: dict[str, Any] | None = None,
    observers: int = 0,
) -> dict[str, Any]:
    """`pbft` overrides TESTNET_PBFT_PARAMS (checkpoint_interval, request_timeout, ...)."""
    if validators < 1:
        raise CliError("--validators must be at least 1")
    if observers < 0:
        raise CliError("--observers must not be negative")
    if observers and validators == 1:
        raise CliError("observers follow a PBFT chain: use --validators 2 or more")
    if (directory / "testnet.json").exists():
        raise CliError(f"{directory} already holds a testnet; choose an empty --dir")
    validator_keys = [dev_private_key(i, DEV_VALIDATOR_SEED) for i in range(validators)]
    validator_addresses = [k.public_key.to_checksum_address() for k in validator_keys]
    node_keys = validator_keys + [dev_private_key(i, DEV_OBSERVER_SEED) for i in range(observers)]
    addresses = [k.public_key.to_checksum_address() for k in node_keys]
    account_keys = [dev_private_key(i) for i in range(DEV_ACCOUNTS)]
    accounts = [
        {"address": k.public_key.to_checksum_address(), "private_key": "0x" + k.to_bytes().hex()}
        for k in account_keys
    ]
    # Every node's address is funded too: votes on the validator set are transactions that
    # pay gas like any other (docs/validators.md), and an added validator must be able to vote.
    document = _genesis_document(
        chain_id, validator_addresses, [a["address"] for a in accounts] + addresses, pbft or {}
    )
    directory.mkdir(parents=True, exist_ok=True)
    genesis_path = directory / "genesis.json"
    genesis_bytes = json.dumps(document, indent=2).encode()
    genesis_path.write_bytes(genesis_bytes)
    genesis = parse_genesis(document, available_engines(), source=genesis_bytes)
    nodes = []
    for index, key in enumerate(node_keys):
        observer = index >= validators
        node_dir = directory / f"node{index}"
        initialize_datadir(node_dir, genesis)
        if observer:
            write_node_key(node_dir, key)
        else:
            write_keyfile(node_dir / "keystore", key, TESTNET_PASSWORD, LIGHT_SCRYPT_N)
            (node_dir / "password.txt").write_text(TESTNET_PASSWORD + "\n")
        http_port = base_http_port + index
        p2p_port = base_p2p_port + index
        config_path = node_dir / "config.toml"
        peers = [  # a validator dials the validators, an observer every other node
            f"{address}@127.0.0.1:{base_p2p_port + other}"
            for other, address in enumerate(addresses)
            if other != index and (observer or other < validators)
        ]
        allowed = [] if observer else addresses[validators:]
        metrics_port = base_metrics_port + index
        config_path.write_text(
            _node_config(http_port, p2p_port, metrics_port, peers, allowed, not observer))
        nodes.append(
            {
                "index": index,
                "role": "observer" if observer else "validator",
                "address": addresses[index],
                "datadir": str(node_dir.resolve()),
                "rpc_url": f"http://127.0.0.1:{http_port}",
                "ws_url": f"ws://127.0.0.1:{http_port}",
                "p2p": f"127.0.0.1:{p2p_port}",
                "metrics_url": f"http://127.0.0.1:{metrics_port}/metrics",
                "command": [
                    sys.executable,
                    "-m",
                    "cli.node",
                    "run",
                    "--config",
                    str(config_path.resolve()),
                ],
            }
        )
    description = {
        "chain_id": chain_id,
        "engine": genesis.engine,
        "genesis": str(genesis_path.resolve()),
        "validators": validator_addresses,
        "nodes": nodes,
        "accounts": accounts,
    }
    (directory / "testnet.json").write_text(json.dumps(description, indent=2))
    write_monitoring(directory, nodes[:validators])  # its alerts count validators
    return description


def load_testnet(directory: Path) -> dict[str, Any]:
    path = directory / "testnet.json"
    try:
        return json.loads(path.read_text())
    except OSError:
        raise CliError(
            f"no testnet in {directory}: run pbft-node testnet init --dir {directory} first"
        ) from None
    except ValueError as exc:
        raise CliError(f"{path} is not valid JSON: {exc}") from None


class _StopRequested(Exception):
    pass


def _request_stop(*_: Any) -> None:
    raise _StopRequested


def run_testnet(directory: Path) -> int:
    """Start every node as a child process and stop them all on Ctrl-C/SIGTERM. A node that
    exits (a crash, `kill -9`) is reported and the others keep running, as validators on
    separate machines would: the supervisor ends when every node has exited. Exit code 1 if
    any node exited on its own."""
    description = load_testnet(directory)
    children: dict[int, subprocess.Popen[bytes]] = {}
    signal.signal(signal.SIGINT, _request_stop)
    signal.signal(signal.SIGTERM, _request_stop)
    exited = 0
    try:
        for node in description["nodes"]:
            log_path = Path(node["datadir"]) / "node.log"
            with open(log_path, "ab") as log_file:
                child = subprocess.Popen(node["command"], stdout=log_file,
                                         stderr=subprocess.STDOUT)
            children[child.pid] = child
            print(f"node {node['index']} {node.get('role', 'validator')} {node['address']} "
                  f"rpc {node['rpc_url']} log {log_path}")
        print(f"chain id {description['chain_id']}; dev accounts in {directory / 'testnet.json'}")
        sys.stdout.flush()
        nodes = dict(zip(children, description["nodes"], strict=True))
        while exited < len(children):
            pid, status = os.wait()  # returns when a node exits
            if pid not in nodes:
                continue
            exited += 1
            _report_exit(nodes[pid], status, len(children) - exited)
    except _StopRequested:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_processes(list(children.values()))
    return 1 if exited else 0


def _report_exit(node: dict[str, Any], status: int, running: int) -> None:
    how = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
           else f"exit code {os.waitstatus_to_exitcode(status)}")
    command = " ".join(shlex.quote(part) for part in node["command"])
    print(f"node {node['index']} exited ({how}; log {Path(node['datadir']) / 'node.log'}); "
          f"{running} still running" + (f"; start it again with: {command}" if running else ""))
    sys.stdout.flush()


def stop_processes(children: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each one still running, then wait (30 s each) and kill what does not exit."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
