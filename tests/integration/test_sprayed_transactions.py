"""Issue 29: transactions sprayed over every validator by a load balancer commit, all of them.

An application behind a round-robin load balancer sends batches of transfers to the four
validators of `pbft-node testnet init` in turn, so each account's consecutive nonces land on
different nodes and reach each node before gossip brings it the ones in between. No
transaction may be refused for that gap, and every transaction a node accepted must commit.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3

from testkit.cluster import Cluster
from testkit.nodes import wait_for

GWEI = 10**9
SENDERS = 3  # dev accounts: few, so a batch carries many consecutive nonces of each
PER_SENDER = 150
BATCH = 90  # thirty consecutive nonces of each sender
IN_FLIGHT = 4  # batches sent and not yet answered: a client's connections to the balancer
COMMIT_DEADLINE = 60.0


def signed_transfers(cluster: Cluster) -> list[tuple[str, int, bytes]]:
    """(sender, nonce, raw) round by round: round r gives every sender its r-th transfer."""
    description = cluster.description
    w3 = cluster.nodes[0].web3()
    senders = [Account.from_key(a["private_key"]) for a in description["accounts"][:SENDERS]]
    first = {s.address: w3.eth.get_transaction_count(s.address, "pending") for s in senders}
    to = description["accounts"][SENDERS]["address"]
    return [
        (sender.address, first[sender.address] + r, bytes(sender.sign_transaction({
            "chainId": description["chain_id"], "nonce": first[sender.address] + r,
            "gas": 21_000, "to": to, "value": 1, "maxFeePerGas": 10 * GWEI,
            "maxPriorityFeePerGas": GWEI}).raw_transaction))
        for r in range(PER_SENDER) for sender in senders
    ]


def spray(cluster: Cluster, transfers: list[tuple[str, int, bytes]]
          ) -> tuple[dict[str, int], Counter[str]]:
    """Batches in order over the nodes in turn, from IN_FLIGHT connections: a busy node
    answers late while the others take the batches after its own; the highest accepted nonce
    of each sender, and the refusals by message."""
    batches = [transfers[start:start + BATCH] for start in range(0, len(transfers), BATCH)]
    providers: list[Any] = [node.web3().provider for node in cluster.nodes]

    def send(index: int) -> list[dict[str, Any]]:
        return providers[index % len(providers)].make_batch_request(
            [("eth_sendRawTransaction", ["0x" + raw.hex()]) for _, _, raw in batches[index]])

    accepted: dict[str, int] = {}
    refused: Counter[str] = Counter()
    with ThreadPoolExecutor(IN_FLIGHT) as balancer:
        for batch, replies in zip(batches, balancer.map(send, range(len(batches))), strict=True):
            for (sender, nonce, _), reply in zip(batch, replies, strict=True):
                if "error" in reply:
                    refused[reply["error"]["message"]] += 1
                else:
                    accepted[sender] = max(nonce, accepted.get(sender, -1))
    return accepted, refused


def uncommitted(w3: Web3, accepted: dict[str, int]) -> dict[str, int]:
    """Per sender, how many of its accepted nonces have not committed yet."""
    left = {s: top + 1 - w3.eth.get_transaction_count(s, "latest") for s, top in accepted.items()}
    return {s: n for s, n in left.items() if n > 0}


def test_sprayed_transfers_are_all_accepted_and_all_commit(cluster: Cluster) -> None:
    transfers = signed_transfers(cluster)
    accepted, refused = spray(cluster, transfers)
    strands: dict[int, dict[str, int]] = {}

    def all_committed() -> bool:
        for index, node in enumerate(cluster.nodes):
            strands[index] = uncommitted(node.web3(), accepted)
        return not any(strands.values())

    try:
        wait_for(all_committed, COMMIT_DEADLINE, "every accepted transfer committed")
    except AssertionError:
        pytest.fail(f"accepted transfers never committed, per node and sender: {strands}; "
                    f"refused: {dict(refused)}")
    assert not refused, f"refused {sum(refused.values())} of {len(transfers)}: {dict(refused)}"
    cluster.assert_consistent()


def test_a_refused_gap_leaves_what_follows_visible_as_queued(cluster: Cluster) -> None:
    """A transaction that never reaches any node leaves its successors queued, where
    txpool_content shows them (not silently lost), and a resend of it commits them all."""
    account = Account.from_key(cluster.description["accounts"][SENDERS]["private_key"])
    w3 = cluster.nodes[1].web3()
    nonce = w3.eth.get_transaction_count(account.address, "pending")

    def sign(n: int) -> bytes:
        return bytes(account.sign_transaction({
            "chainId": cluster.description["chain_id"], "nonce": n, "gas": 21_000,
            "to": account.address, "value": 0, "maxFeePerGas": 10 * GWEI,
            "maxPriorityFeePerGas": GWEI}).raw_transaction)

    later = [w3.eth.send_raw_transaction(sign(n)) for n in range(nonce + 1, nonce + 4)]
    content = w3.provider.make_request("txpool_content", [])["result"]
    assert sorted(content["queued"][account.address]) == [str(n) for n in
                                                           range(nonce + 1, nonce + 4)]
    cluster.nodes[2].web3().eth.send_raw_transaction(sign(nonce))  # the resend
    for tx_hash in later:
        assert w3.eth.wait_for_transaction_receipt(tx_hash, timeout=COMMIT_DEADLINE).status == 1
