"""`pbft-node send` against four real PBFT validators: the receipt it prints is confirmed by
at least f+1 = 2 of them, also when the node it submits through is down."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.nodes import pbft_node
from tests.integration.test_cli import assert_one_line_error

pytestmark = pytest.mark.integration


def _testnet_dir(cluster: Cluster) -> str:
    return str(Path(cluster.nodes[0].description["genesis"]).parent)


def send(cluster: Cluster, *args: str) -> dict[str, Any]:
    recipient = cluster.nodes[0].description["accounts"][9]["address"]
    result = pbft_node(
        "send", "--testnet", _testnet_dir(cluster), "--to", recipient, "--json", *args
    )
    return json.loads(result.stdout)


def assert_agreeing_validators_hold(cluster: Cluster, sent: dict[str, Any]) -> None:
    """The printed receipt is the one the confirming validators hold."""
    validators = {n.node["address"]: n for n in cluster.nodes}
    assert sent["status"] == 1 and sent["needed"] == 2 and sent["validators"] == 4
    assert len(set(sent["confirmedBy"])) >= 2
    for address in sent["confirmedBy"]:
        receipt = validators[address].web3().eth.get_transaction_receipt(sent["transactionHash"])
        assert "0x" + bytes(receipt.blockHash).hex() == sent["blockHash"]
        assert (receipt.status, receipt.gasUsed) == (1, sent["gasUsed"])


def test_send_returns_a_receipt_confirmed_by_f_plus_1(cluster: Cluster) -> None:
    sent = send(cluster, "--account", "0", "--value", "12345")
    assert_agreeing_validators_hold(cluster, sent)
    assert sent["gasUsed"] == 21_000 and sent["resends"] == 0
    human = pbft_node(
        "send", "--testnet", _testnet_dir(cluster), "--account", "0",
        "--to", cluster.nodes[0].description["accounts"][9]["address"],
    ).stdout  # fmt: skip
    assert "status       1 (success)" in human
    assert "of 4 validators (f+1 = 2): 0x" in human


def test_send_through_a_stopped_node_resends_to_the_others(cluster: Cluster) -> None:
    primary = cluster.nodes[0].web3().provider.make_request("pbft_status", [])["result"]["primary"]
    down = next(n for n in reversed(cluster.nodes) if n.node["address"].lower() != primary)
    down.stop()
    try:
        sent = send(
            cluster,
            "--account",
            "1",
            "--via",
            down.rpc_url,
            "--resend-after",
            "1",
            "--timeout",
            "30",
        )
        assert sent["resends"] >= 1
        assert down.node["address"] not in sent["confirmedBy"]
        assert_agreeing_validators_hold(cluster, sent)
    finally:
        down.start()


def test_a_validator_list_that_is_not_the_chains_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(cluster.nodes[0].description["accounts"][2]["private_key"])
    nodes = ",".join(f"{n.node['address']}@{n.rpc_url}" for n in cluster.nodes[:3])
    result = pbft_node(
        "send", "--nodes", nodes, "--key-file", str(key_file),
        "--to", cluster.nodes[0].node["address"], check=False,
    )  # fmt: skip
    assert_one_line_error(result, "the configured validators are not the chain's")
