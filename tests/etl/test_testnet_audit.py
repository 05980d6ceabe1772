"""End to end on a real 4-validator testnet: transfers and contract logs, the primary stopped
so that the others change view, more transactions in the new view; then `pbft-etl export`
from two nodes and `pbft-etl audit` of the result. The audit passes, and every table holds
as many rows per node as the node's JSON-RPC reports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_etl.rpc import JsonRpcClient
from spark_etl.tables import Dataset
from testkit.cluster import Cluster, rpc
from tests.etl.conftest import etl
from tests.integration.conftest import load_contract

pytestmark = pytest.mark.integration

FAST = ("--checkpoint-interval", "4", "--log-multiplier", "2", "--request-timeout", "1")
GWEI = 10**9


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster.create(tmp_path / "testnet", 4, *FAST)
    try:
        yield cluster
    finally:
        cluster.close()


def _send_contract_tx(cluster: Cluster, via: int, tx: dict[str, Any]) -> Any:
    """Sign `tx` (nonce and fees filled in) as dev account 2, send it, wait for its receipt."""
    w3 = cluster.nodes[via].web3()
    account = Account.from_key(cluster.description["accounts"][2]["private_key"])
    tx = {
        "chainId": cluster.description["chain_id"],
        "nonce": w3.eth.get_transaction_count(account.address, "pending"),
        "maxFeePerGas": 10 * GWEI,
        "maxPriorityFeePerGas": GWEI,
        "value": 0,
        **tx,
    }
    tx_hash = w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60, poll_latency=0.05)
    assert receipt.status == 1
    return receipt


def _store(cluster: Cluster, via: int, contract: str, key: int) -> None:
    events = cluster.nodes[via].web3().eth.contract(address=contract,
                                                    abi=load_contract("Events")["abi"])
    data = events.encode_abi("store", args=[key, key * 10])
    _send_contract_tx(cluster, via, {"to": contract, "data": data, "gas": 200_000})


def reported_counts(url: str, head: int) -> dict[str, int]:
    """Each table's rows for one node, as its JSON-RPC reports them."""
    numbers = [hex(n) for n in range(head + 1)]
    with JsonRpcClient(url) as client:
        blocks = client.batch([("eth_getBlockByNumber", [n, False]) for n in numbers])
        certificates = client.batch([("pbft_getCommitCertificate", [n]) for n in numbers])
        logs = client.call("eth_getLogs", {"fromBlock": "0x0", "toBlock": hex(head)})
        checkpoints = client.call("pbft_getCheckpoints", "0x0", hex(head))
        view = client.call("pbft_status")["view"]
        views = client.call("pbft_getViewChanges", "0x0", hex(view))
        evidence = client.call("pbft_getEvidence")
    transactions = sum(len(b["transactions"]) for b in blocks)
    return {
        "blocks": head + 1,
        "transactions": transactions,
        "receipts": transactions,
        "logs": len(logs),
        "commit_certificates": sum(len(c["signers"]) for c in certificates if c),
        "checkpoints": sum(max(1, len(c["proof"])) for c in checkpoints),
        "view_changes": sum(len(v["viewChanges"]) for v in views),
        "evidence": len(evidence),
    }


def test_export_two_nodes_of_a_testnet_with_a_view_change_and_audit_it(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path, cluster: Cluster
) -> None:
    cluster.start()
    artifact = load_contract("Events")
    deployed = _send_contract_tx(cluster, 0, {"data": artifact["bytecode"], "gas": 1_000_000})
    contract = deployed.contractAddress
    _store(cluster, 0, contract, 1)
    cluster.commit(via=0)
    assert cluster.stop(0) == 0  # the primary of view 0
    cluster.commit(via=1)  # pre-prepared only after a view change
    assert cluster.status(1)["view"] >= 1
    for key in range(2, 5):
        _store(cluster, 1, contract, key)
        last = cluster.commit(via=2, sender=1)
    # A settled head on 1, 2 and 3: the empty block that follows the last transfer's landed,
    # so no block commits (nor a checkpoint with it) while the export and the counts read.
    head = cluster.wait_idle(last, [1, 2, 3])

    out, report = tmp_path / "out", tmp_path / "report.json"
    urls = [cluster.nodes[i].rpc_url for i in (1, 2)]
    # up to `head`: a block committed after it was read must not race the counts
    code, stdout, stderr = etl(capsys, "export", "--rpc", ",".join(urls), "--out", str(out),
                               "--to", str(head))
    assert code == 0, stderr
    genesis = cluster.directory / "genesis.json"
    code, stdout, stderr = etl(capsys, "audit", "--data", str(out), "--genesis", str(genesis),
                               "--report", str(report))
    assert code == 0, stdout + stderr
    result = json.loads(report.read_text())
    assert result["ok"] and result["nodes"] == {url: head + 1 for url in urls}

    data = Dataset.read(spark, str(out))
    for url in urls:
        exported = {
            name: getattr(data, name).where(F.col("node") == url).count()
            for name in reported_counts(url, head)
        }
        assert exported == reported_counts(url, head), url
    assert exported["logs"] >= 4 and exported["view_changes"] >= 3
    assert data.commit_certificates.where(F.col("view") >= 1).count() > 0
    assert data.checkpoints.where(F.col("stable")).count() > 0
    assert rpc(cluster.nodes[1], "pbft_getValidators") == result["validators"]
