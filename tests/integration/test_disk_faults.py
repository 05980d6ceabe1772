"""A data directory the node may not write, a disk that fills up and a damaged table file:
one clear error, nothing committed is lost, nothing wrong is served.

The full disk is a file-size limit (RLIMIT_FSIZE) on the node process: LevelDB's writes then
fail with EFBIG exactly as they fail with ENOSPC on a full disk. Permissions are enforced on
root too by dropping its capability to override them (setpriv).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from eth_account import Account
from web3 import Web3

from testkit.cluster import GWEI
from testkit.nodes import RunningNode, make_testnet, pbft_node, wait_for
from tests.integration.test_cli import REPO, assert_one_line_error

pytestmark = pytest.mark.integration

DISK_BYTES = 1 << 20  # the largest file the node may write
FILL_DEADLINE = 180.0
OVERRIDES = "dac_override,dac_read_search,fowner"


def as_unprivileged(argv: list[str]) -> list[str]:
    """`argv` without root's power to ignore file permissions (unchanged for other users)."""
    if os.geteuid() != 0:
        return argv
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed to test permissions as root"
    drop = ",".join(f"-{cap}" for cap in OVERRIDES.split(","))
    return ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}", *argv]


def test_a_datadir_the_node_may_not_write_is_a_clear_error(tmp_path: Path) -> None:
    datadir = tmp_path / "node"
    pbft_node("init", "--genesis", str(REPO / "genesis" / "dev.json"), "--datadir", str(datadir))
    for path in [datadir, *datadir.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        argv = as_unprivileged([*_node_argv(), "run", "--datadir", str(datadir),
                                "--http.port", "0"])
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert_one_line_error(result, "permission denied; the node's user needs read and write")
        result = subprocess.run(
            as_unprivileged([*_node_argv(), "init", "--genesis", str(REPO / "genesis" /
                             "dev.json"), "--datadir", str(datadir / "sub")]),
            capture_output=True, text=True, timeout=120)
        assert_one_line_error(result, "cannot create data directory")
    finally:
        for path in [datadir, *datadir.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


def _node_argv() -> list[str]:
    return [sys.executable, "-m", "cli.node"]


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (DISK_BYTES, DISK_BYTES))


def _send_batch(w3: Web3, key: str, to: str, count: int) -> list[bytes]:
    account = Account.from_key(key)
    nonce = w3.eth.get_transaction_count(account.address, "pending")
    hashes = []
    for i in range(count):
        tx = {"chainId": w3.eth.chain_id, "nonce": nonce + i, "gas": 21_000, "to": to,
              "value": 1, "maxFeePerGas": 10 * GWEI, "maxPriorityFeePerGas": GWEI}
        hashes.append(bytes(w3.eth.send_raw_transaction(
            account.sign_transaction(tx).raw_transaction)))
    return hashes


def test_a_full_disk_stops_the_node_with_a_clear_error_and_loses_nothing(
    tmp_path: Path,
) -> None:
    description = make_testnet(tmp_path / "net")
    node = RunningNode(description, description["nodes"][0], tmp_path / "node.log")
    accounts = description["accounts"]
    with open(node.log_path, "wb") as log:
        node.process = subprocess.Popen(node.node["command"], stdout=log, stderr=log,
                                        preexec_fn=_limit_file_size)
    node.wait_ready()
    w3 = node.web3()
    committed: dict[bytes, int] = {}  # tx hash -> block, as the client saw its receipt

    def fill() -> bool:
        if node.process.poll() is not None:
            return True
        try:
            for tx_hash in _send_batch(w3, accounts[len(committed) // 100 % 8]["private_key"],
                                       accounts[9]["address"], 100):
                receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30,
                                                              poll_latency=0.05)
                committed[tx_hash] = receipt.blockNumber
        except Exception:  # the node stopped under us
            return node.process.poll() is not None
        return False

    wait_for(fill, FILL_DEADLINE, "the node to run out of disk")
    assert node.process.wait(timeout=30) == 1
    node.process = None
    output = node.log_path.read_text()
    assert "Traceback" not in output, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("pbft-node: error: cannot write to the database in "), last
    assert "File too large; free space on its disk" in last, last
    assert len(committed) >= 100

    node.start()  # the limit lifted: every acknowledged transaction is still there
    try:
        w3 = node.web3()
        for tx_hash, block in committed.items():
            assert w3.eth.get_transaction_receipt(tx_hash).blockNumber == block
        (tx_hash,) = _send_batch(w3, accounts[8]["private_key"], accounts[9]["address"], 1)
        assert w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30).status == 1
    finally:
        assert node.stop() == 0


def test_a_truncated_table_file_stops_the_node_with_the_recovery(tmp_path: Path) -> None:
    description = make_testnet(tmp_path / "net")
    node = RunningNode(description, description["nodes"][0], tmp_path / "node.log")
    accounts = description["accounts"]
    node.start()
    w3 = node.web3()
    for tx_hash in _send_batch(w3, accounts[0]["private_key"], accounts[9]["address"], 50):
        w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30)
    hashes = [bytes(w3.eth.get_block(n).hash) for n in range(w3.eth.block_number + 1)]
    assert node.stop() == 0
    node.start()  # opening the database again writes its log out as a table file
    assert node.stop() == 0
    chaindata = Path(node.node["datadir"]) / "chaindata"
    table = max(chaindata.glob("*.ldb"), key=lambda path: path.stat().st_size)
    with open(table, "r+b") as handle:
        handle.truncate(table.stat().st_size // 2)

    with open(node.log_path, "ab") as log:
        process = subprocess.Popen(node.node["command"], stdout=log, stderr=log)
    served: list[list[bytes]] = []

    def stopped() -> bool:
        if process.poll() is not None:
            return True
        with contextlib.suppress(Exception):  # not serving yet, or stopping
            served.append([bytes(w3.eth.get_block(n).hash) for n in range(len(hashes))])
        return False

    try:
        wait_for(stopped, 60, "the node to stop on the damaged table")
    finally:
        process.kill()
    assert process.wait() == 1
    assert all(chain == hashes for chain in served)  # until it stopped, it served the truth
    output = node.log_path.read_text()
    assert "Traceback" not in output, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert f"{table.name}" in last and "the database is damaged: move " in last, last
    assert "pbft-node init --genesis GENESIS --datadir" in last, last
