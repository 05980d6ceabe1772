"""Issue 29's sprayed workload: an application behind a round-robin load balancer.

Transfers from a few accounts, interleaved (round r gives every sender its r-th nonce), cut
into batches of eth_sendRawTransaction sent to the validators in turn from IN_FLIGHT client
connections, so each account's consecutive nonces land on different nodes and often before
gossip brings a node the ones in between. Counted: the refusals (by message), the accepted
transactions that never commit (strands), and the rate from the first submission to the last
commit of what was accepted.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from benchmarks.accounts import SignedTx, bench_account, sign_workload
from benchmarks.testnet import BenchNet
from testkit.cluster import rpc

SENDERS = 10  # the ten dev accounts
PER_SENDER = 300  # 3,000 transfers
BATCH = 100
IN_FLIGHT = 4  # client connections to the balancer
COMMIT_DEADLINE = 120.0  # seconds for the accepted transactions to commit
POLL = 0.1  # seconds between reads of the senders' nonces


@dataclass
class SprayOutcome:
    submitted: int
    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    stranded: int = 0  # accepted, not committed by the deadline
    seconds: float = 0.0  # first submission to the last accepted one's commit (or deadline)

    def to_json(self) -> dict[str, Any]:
        return {"submitted": self.submitted, "accepted": self.accepted,
                "refused": dict(self.refused), "stranded": self.stranded,
                "seconds": self.seconds}


def spray(net: BenchNet, senders: int = SENDERS, per_sender: int = PER_SENDER) -> SprayOutcome:
    """Sign, spray and wait for the accepted transfers to commit on node 0."""
    chosen = list(range(senders))
    txs = sign_workload("transfer", net.chain_id, net.accounts, chosen,
                        [net.next_nonce[s] for s in chosen], per_sender)
    for sender in chosen:
        net.next_nonce[sender] += per_sender
    outcome = SprayOutcome(len(txs))
    started = time.monotonic()
    accepted = _submit(net, txs, outcome)
    outcome.stranded = _wait_for_commits(net, accepted)
    outcome.seconds = time.monotonic() - started
    return outcome


def _submit(net: BenchNet, txs: list[SignedTx], outcome: SprayOutcome
            ) -> dict[int, list[int]]:
    """The batches, in order, over the nodes in turn; the accepted nonces of each sender."""
    batches = [txs[start:start + BATCH] for start in range(0, len(txs), BATCH)]
    nodes = net.cluster.nodes

    def send(index: int) -> list[dict[str, Any]]:
        provider: Any = nodes[index % len(nodes)].web3().provider
        return provider.make_batch_request(
            [("eth_sendRawTransaction", ["0x" + tx.raw.hex()]) for tx in batches[index]])

    accepted: dict[int, list[int]] = {}
    with ThreadPoolExecutor(IN_FLIGHT) as balancer:
        for batch, replies in zip(batches, balancer.map(send, range(len(batches))), strict=True):
            for tx, reply in zip(batch, replies, strict=True):
                if "error" in reply:
                    outcome.refused[reply["error"]["message"]] += 1
                else:
                    outcome.accepted += 1
                    accepted.setdefault(tx.sender, []).append(tx.nonce)
    return accepted


def _wait_for_commits(net: BenchNet, accepted: dict[int, list[int]]) -> int:
    """Accepted transactions not committed on node 0 by the deadline (0: all committed);
    a refused nonce below accepted ones strands them."""
    node = net.cluster.nodes[0]
    end = time.monotonic() + COMMIT_DEADLINE
    while True:
        left = 0
        for sender, nonces in accepted.items():
            address = "0x" + bench_account(sender).address.hex()
            committed = int(rpc(node, "eth_getTransactionCount", address, "latest"), 16)
            left += sum(1 for nonce in nonces if nonce >= committed)
        if left == 0 or time.monotonic() > end:
            return left
        time.sleep(POLL)
