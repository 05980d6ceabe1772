"""pbft-node's commands as a user runs them: accounts, init, run, testnet, status, and the
one-line errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from eth_account import Account
from web3 import Web3

from testkit.cluster import assert_next_busy_block
from testkit.nodes import free_port, make_testnet, pbft_node, wait_for

REPO = Path(__file__).resolve().parents[2]


def assert_one_line_error(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0], lines[0]


def test_account_new_and_list(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("correct horse\n")
    keystore = tmp_path / "keystore"
    created = pbft_node(
        "account", "new", "--keystore", str(keystore), "--password-file", str(password)
    )
    address = created.stdout.split()[1]
    listed = pbft_node("account", "list", "--keystore", str(keystore)).stdout
    assert address.lower() in listed
    (keyfile,) = keystore.iterdir()
    document = json.loads(keyfile.read_text())
    assert document["version"] == 3
    assert Account.from_key(Account.decrypt(document, "correct horse")).address == address


def test_account_new_without_password_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli.node", "account", "new", "--keystore", str(tmp_path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(result, "--password-file")


def test_init_run_status_and_errors(tmp_path: Path) -> None:
    datadir = tmp_path / "data"
    init = pbft_node(
        "init", "--genesis", str(REPO / "genesis" / "dev.json"), "--datadir", str(datadir)
    )
    assert "genesis block hash 0x" in init.stdout
    bad_genesis = tmp_path / "bad.json"
    bad_genesis.write_text('{"config": {"chainId": 1, "clique": {}}}')
    assert_one_line_error(
        pbft_node(
            "init", "--genesis", str(bad_genesis), "--datadir", str(tmp_path / "x"), check=False
        ),
        "unknown consensus engine 'clique'",
    )
    assert_one_line_error(
        pbft_node("run", "--datadir", str(tmp_path / "empty"), check=False), "not initialised"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "cli.node", "run", "--datadir", str(datadir)]
    with open(tmp_path / "node.log", "wb") as log:
        node = subprocess.Popen([*command, "--http.port", str(port)], stdout=log, stderr=log)
    try:
        w3 = Web3(Web3.HTTPProvider(url))
        wait_for(lambda: _connected(w3), 60, "the node's JSON-RPC")
        status = pbft_node("status", "--rpc", url).stdout
        assert "chain id 1337" in status and "head     #0" in status
        second = pbft_node(
            "run", "--datadir", str(datadir), "--http.port", str(free_port()), check=False
        )
        assert_one_line_error(second, "in use by another process")
    finally:
        node.send_signal(signal.SIGINT)
        assert node.wait(timeout=30) == 0
    assert "database closed" in (tmp_path / "node.log").read_text()
    assert_one_line_error(pbft_node("status", "--rpc", url, check=False), "cannot reach")


def _connected(w3: Web3) -> bool:
    try:
        return w3.is_connected()
    except Exception:
        return False


def test_testnet_run_serves_web3_end_to_end(tmp_path: Path) -> None:
    description = make_testnet(tmp_path / "net")
    assert description["engine"] == "dev" and len(description["nodes"]) == 1
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "cli.node", "testnet", "run", "--dir", str(tmp_path / "net")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        w3 = Web3(Web3.HTTPProvider(description["nodes"][0]["rpc_url"]))
        wait_for(lambda: _connected(w3), 60, "the testnet's JSON-RPC")
        assert _transfer(w3, description).status == 1
    finally:
        supervisor.send_signal(signal.SIGTERM)
        output = supervisor.communicate(timeout=60)[0].decode()
    assert supervisor.returncode == 0, output
    assert (
        "committed block #1" in (Path(description["nodes"][0]["datadir"]) / "node.log").read_text()
    )


def _transfer(w3: Web3, description: dict[str, Any]) -> Any:
    """Dev account 0 sends 5 wei to dev account 1 through `w3`; its receipt."""
    account = Account.from_key(description["accounts"][0]["private_key"])
    tx = {
        "chainId": description["chain_id"],
        "nonce": w3.eth.get_transaction_count(account.address, "pending"),
        "gas": 21_000,
        "value": 5,
        "to": description["accounts"][1]["address"],
        "maxFeePerGas": 10**10,
        "maxPriorityFeePerGas": 10**9,
    }
    tx_hash = w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
    return w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60)


def test_testnet_run_keeps_the_others_running_when_the_primary_is_killed(
        tmp_path: Path) -> None:
    """`kill -9` of node 0 (view 0's primary) under `testnet run`: the supervisor says so
    and how to start it again, the other three change view and commit, and SIGTERM then
    stops them with exit code 1 (a node exited on its own)."""
    description = make_testnet(tmp_path / "net", 4)
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "cli.node", "testnet", "run", "--dir", str(tmp_path / "net")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        nodes = [Web3(Web3.HTTPProvider(node["rpc_url"])) for node in description["nodes"]]
        wait_for(lambda: all(_connected(w3) for w3 in nodes), 60, "the testnet's JSON-RPC")
        first = _transfer(nodes[1], description)
        assert first.status == 1
        status = nodes[0].provider.make_request("pbft_status", [])["result"]
        assert status["primary"].lower() == description["validators"][0].lower()
        pid = int(subprocess.check_output(
            ["pgrep", "-f", "-P", str(supervisor.pid), "node0/config.toml"]).split()[0])
        subprocess.run(["kill", "-9", str(pid)], check=True)
        receipt = _transfer(nodes[1], description)
        assert receipt.status == 1
        # the next block with transactions (the empty one that follows the first transfer's
        # may have landed before the kill)
        assert_next_busy_block(nodes[1], first.blockNumber, receipt.blockNumber)
        assert nodes[2].provider.make_request("pbft_status", [])["result"]["view"] >= 1
    finally:
        supervisor.send_signal(signal.SIGTERM)
        output = supervisor.communicate(timeout=90)[0].decode()
    assert supervisor.returncode == 1, output
    assert "node 0 exited (killed by signal 9;" in output
    assert "3 still running; start it again with:" in output


def test_dev_period_seals_empty_blocks(tmp_path: Path) -> None:
    genesis = json.loads((REPO / "genesis" / "dev.json").read_text())
    genesis["config"]["dev"]["period"] = 1
    genesis_path = tmp_path / "genesis.json"
    genesis_path.write_text(json.dumps(genesis))
    datadir = tmp_path / "data"
    pbft_node("init", "--genesis", str(genesis_path), "--datadir", str(datadir))
    port = free_port()
    command = [sys.executable, "-m", "cli.node", "run", "--datadir", str(datadir)]
    with open(tmp_path / "node.log", "wb") as log:
        node = subprocess.Popen([*command, "--http.port", str(port)], stdout=log, stderr=log)
    try:
        w3 = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{port}"))
        wait_for(lambda: _connected(w3) and w3.eth.block_number >= 2, 30, "two sealed blocks")
        assert w3.eth.get_block(2).transactions == []
    finally:
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=30) == 0


def test_a_corrupt_database_is_refused_with_the_recovery(tmp_path: Path) -> None:
    datadir = tmp_path / "node"
    pbft_node("init", "--genesis", str(REPO / "genesis" / "dev.json"), "--datadir", str(datadir))
    (manifest,) = (datadir / "chaindata").glob("MANIFEST-*")
    manifest.write_bytes(b"not a manifest")
    result = pbft_node("run", "--datadir", str(datadir), "--http.port", "0", check=False)
    assert_one_line_error(result, "Corruption")
    assert "pbft-node init" in result.stderr and "re-syncs from its peers" in result.stderr


def test_status_refuses_bad_input_in_one_line(tmp_path: Path) -> None:
    assert_one_line_error(pbft_node("status", "--testnet", str(tmp_path), check=False),
                          f"no testnet in {tmp_path}")
    for period in ("-1", "0", "nan", "soon"):
        refused = pbft_node("status", "--testnet", str(tmp_path), "--watch", period, check=False)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert "want a number of seconds above 0" in refused.stderr.splitlines()[-1]
