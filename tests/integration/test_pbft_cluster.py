"""Four PBFT validators as real processes on loopback: transactions sent to different nodes
commit, every node holds the same chain, and every block's commit certificate verifies."""

from __future__ import annotations

from typing import Any

from eth_account import Account
from web3 import Web3

from pbft_engine.messages import verify_commit_certificate
from tests.integration.conftest import RunningNode, wait_for

GWEI = 10**9


def _transfer(w3: Web3, key: str, to: str, nonce: int) -> bytes:
    tx = {
        "chainId": 1337,
        "nonce": nonce,
        "gas": 21_000,
        "to": to,
        "value": 1 + nonce,
        "maxFeePerGas": 10 * GWEI,
        "maxPriorityFeePerGas": GWEI,
    }
    return w3.eth.send_raw_transaction(Account.from_key(key).sign_transaction(tx).raw_transaction)


def test_transactions_to_every_node_commit_everywhere(cluster: list[RunningNode]) -> None:
    description = cluster[0].description
    accounts = description["accounts"]
    sent: list[Any] = []
    for index, node in enumerate(cluster):  # each node gets its own sender's transactions
        w3 = node.web3()
        for nonce in range(3):
            sent.append(
                _transfer(w3, accounts[index]["private_key"], accounts[9]["address"], nonce)
            )
    receipts = [cluster[0].web3().eth.wait_for_transaction_receipt(h, timeout=60) for h in sent]
    assert all(r.status == 1 for r in receipts)
    head = max(r.blockNumber for r in receipts)
    wait_for(lambda: all(n.web3().eth.block_number >= head for n in cluster), 30, "all heads")
    for tx_hash, receipt in zip(sent, receipts, strict=True):
        for node in cluster[1:]:
            other = node.web3().eth.get_transaction_receipt(tx_hash)
            assert (other.blockHash, other.status, other.gasUsed) == (
                receipt.blockHash,
                receipt.status,
                receipt.gasUsed,
            )
    assert_same_chain_with_valid_certificates(cluster)


def assert_same_chain_with_valid_certificates(cluster: list[RunningNode]) -> None:
    description = cluster[0].description
    validators = [bytes.fromhex(v[2:]) for v in description["validators"]]
    height = min(n.web3().eth.block_number for n in cluster)
    assert height > 0
    for number in range(1, height + 1):
        hashes = {bytes(n.web3().eth.get_block(number).hash) for n in cluster}
        assert len(hashes) == 1, f"nodes disagree at height {number}"
        (block_hash,) = hashes
        for node in cluster:
            reply = node.web3().provider.make_request("pbft_getCommitCertificate", [hex(number)])
            certificate = bytes.fromhex(reply["result"]["certificate"][2:])
            signers = verify_commit_certificate(
                certificate,
                validators=validators,
                chain_id=description["chain_id"],
                block_number=number,
                block_hash=block_hash,
            )
            assert len(signers) >= 3


def test_status_and_validators(cluster: list[RunningNode]) -> None:
    statuses = [n.web3().provider.make_request("pbft_status", [])["result"] for n in cluster]
    assert {s["view"] for s in statuses} == {0}
    assert {s["primary"] for s in statuses} == {cluster[0].node["address"].lower()}
    assert all(s["mode"] == "normal" for s in statuses)
    validators = cluster[1].web3().provider.make_request("pbft_getValidators", [])["result"]
    assert validators == [v.lower() for v in cluster[0].description["validators"]]
    provider = cluster[2].web3().provider
    assert provider.make_request("pbft_getCommitCertificate", ["0xffffff"])["result"] is None
    bad = provider.make_request("pbft_getCommitCertificate", ["12"])
    assert bad["error"]["code"] == -32602

