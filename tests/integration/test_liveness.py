"""Liveness under real load (issue 12): a correct primary is never replaced, whatever users send.

Real node processes on a DEFAULT `pbft-node testnet init --validators 4` (2 s request timeout;
no flag is tuned: these are the settings users get). Users send bursts of transfers, to one
node or sprayed over all four as a load balancer would, a transaction with a nonce gap, and a
replacement by fee; none of it may cost a view change, and every transaction a node accepted
must commit. The last test kills the primary with a burst in flight: within the escalating
timeouts a new view commits, every accepted transaction commits, and the primary of the view
that committed is not replaced afterwards.

View changes are read from `pbft_view_changes_total` (summed over its label values) on every
node; the waits fail as soon as that sum moves.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from eth_account import Account

from testkit.cluster import Cluster, rpc
from testkit.links import Links
from testkit.nodes import RunningNode, wait_for

pytestmark = pytest.mark.integration

GWEI = 10**9
MAX_FEE = 1_000 * GWEI  # far above the base fee, which rises ~12.5% per full block
TIP = GWEI
PER_SENDER = 10  # consecutive nonces of each dev account in one batch
SENDERS = 10  # the funded dev accounts: a batch is 100 eth_sendRawTransaction calls
# A sprayed burst keeps this many batches in flight, one per node: a node may get a batch
# before the gossip of the lower nonces sent to the others, but no sender ever has more than
# (WINDOW - 1) x PER_SENDER = 30 nonces above a gap anywhere, within geth's 64 per account.
# (Unbounded concurrency is not: a node slowed by block execution holds the lowest nonces
# while the others race ahead, and a 64-per-account queue must refuse.)
WINDOW = 4
POLL = 0.5  # between progress checks, so polling does not compete with the nodes for the CPU
SETTLE_DEADLINE = 60.0
NEW_VIEW_DEADLINE = 60.0
GAP_WATCH = 30.0  # seconds a lone gapped transaction is watched for a view change

# ------------------------------------------------------------------------------------------
# Pure helpers: signing a workload, sending batches, reading nonces and metrics.


@dataclass
class Burst:
    """Pre-signed transfers in sending order: `batches` of raw transactions (hex), each
    holding PER_SENDER consecutive nonces of every sender; `first` and `expected` are each
    sender's first nonce and its nonce once all of them committed."""

    batches: list[list[str]]
    first: dict[str, int]
    expected: dict[str, int]

    @property
    def count(self) -> int:
        return sum(len(batch) for batch in self.batches)


def sign_transfer(
    chain_id: int, private_key: str, nonce: int, to: str, *,
    value: int = 1, max_fee: int = MAX_FEE, tip: int = TIP,
) -> str:
    tx = {
        "chainId": chain_id, "nonce": nonce, "gas": 21_000, "to": to, "value": value,
        "maxFeePerGas": max_fee, "maxPriorityFeePerGas": tip,
    }
    return "0x" + Account.from_key(private_key).sign_transaction(tx).raw_transaction.hex()


def sign_burst(description: dict[str, Any], first: dict[str, int], count: int) -> Burst:
    """`count` transfers, count / SENDERS per dev account, consecutive nonces from `first`."""
    accounts = description["accounts"][:SENDERS]
    per_sender, rest = divmod(count, len(accounts))
    assert rest == 0 and per_sender % PER_SENDER == 0, count
    recipient = description["accounts"][-1]["address"]
    batches = [
        [
            sign_transfer(description["chain_id"], account["private_key"],
                          first[account["address"]] + offset + i, recipient)
            for account in accounts
            for i in range(PER_SENDER)
        ]
        for offset in range(0, per_sender, PER_SENDER)
    ]
    expected = {address: nonce + per_sender for address, nonce in first.items()}
    return Burst(batches, dict(first), expected)


def rpc_batch(url: str, calls: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
    """One JSON-RPC batch; the replies (each with "result" or "error") in call order."""
    payload = [
        {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
        for i, (method, params) in enumerate(calls)
    ]
    response = requests.post(url, json=payload, timeout=120)
    response.raise_for_status()
    replies = {reply["id"]: reply for reply in response.json()}
    return [replies[i] for i in range(len(calls))]


def send_raw_batch(url: str, raws: list[str]) -> list[dict[str, Any]]:
    return rpc_batch(url, [("eth_sendRawTransaction", [raw]) for raw in raws])


def send_burst(urls: list[str], burst: Burst, window: int = 1) -> list[dict[str, Any]]:
    """Each batch to the next of `urls`, round-robin (a load balancer in front of the nodes),
    at most `window` batches unanswered at a time (concurrent clients taking the batches in
    order); every reply, in sending order."""
    with ThreadPoolExecutor(window) as pool:
        sent: list[Future[list[dict[str, Any]]]] = []
        for i, batch in enumerate(burst.batches):
            if i >= window:
                sent[i - window].result()
            sent.append(pool.submit(send_raw_batch, urls[i % len(urls)], batch))
        return [reply for future in sent for reply in future.result()]


def refusals(replies: list[dict[str, Any]]) -> dict[str, int]:
    """How many sends were refused, by error message."""
    counts: dict[str, int] = {}
    for reply in replies:
        if "error" in reply:
            message = reply["error"].get("message", str(reply["error"]))
            counts[message] = counts.get(message, 0) + 1
    return counts


def accepted_hashes(replies: list[dict[str, Any]]) -> set[str]:
    return {reply["result"].lower() for reply in replies if "result" in reply}


def nonces(node: RunningNode, addresses: list[str], tag: str) -> dict[str, int]:
    replies = rpc_batch(node.rpc_url, [("eth_getTransactionCount", [a, tag]) for a in addresses])
    return {a: int(reply["result"], 16) for a, reply in zip(addresses, replies, strict=True)}


def sender_addresses(description: dict[str, Any]) -> list[str]:
    return [account["address"] for account in description["accounts"][:SENDERS]]


def view_changes(cluster: Cluster, index: int) -> float:
    """pbft_view_changes_total on node `index`, summed over every label value."""
    return sum(value for key, value in cluster.metrics(index).items()
               if key.startswith("pbft_view_changes_total"))


def all_view_changes(cluster: Cluster, indices: list[int]) -> dict[int, float]:
    return {i: view_changes(cluster, i) for i in indices}


def assert_no_view_change(cluster: Cluster, baseline: dict[int, float]) -> None:
    now = all_view_changes(cluster, list(baseline))
    if now != baseline:
        statuses = {i: {k: cluster.status(i)[k] for k in ("view", "mode", "seqNo")}
                    for i in baseline}
        raise AssertionError(
            f"view changes (pbft_view_changes_total per node): before {baseline}, now {now}; "
            f"pbft_status {statuses}")


def watch_quiet(
    cluster: Cluster, indices: list[int], baseline: dict[int, float], seconds: float,
    heads: dict[int, int] | None = None,
) -> None:
    """Watch `seconds` of nothing, checking every second: no view change and, given `heads`,
    no new block. Only a window can show that a timer does not fire."""
    end = time.monotonic() + seconds
    while True:
        assert_no_view_change(cluster, baseline)
        if heads is not None:
            assert {i: cluster.head(i) for i in indices} == heads, "a block came"
        if time.monotonic() >= end:
            return
        time.sleep(1)


def after_commit_window(cluster: Cluster) -> float:
    """How long to watch once everything committed: twice the request timeout (and a second),
    so a timer still armed for a transaction that left the pool (replaced, pruned) would have
    fired."""
    genesis = json.loads((cluster.directory / "genesis.json").read_text())
    return 2 * genesis["config"]["pbft"]["request_timeout"] + 1


def pool_sizes(cluster: Cluster, indices: list[int]) -> dict[int, float]:
    return {i: cluster.metrics(i)["txpool_transactions|"] for i in indices}


def throttled(check: Callable[[], bool]) -> Callable[[], bool]:
    """`check` for wait_for, polled every POLL seconds rather than wait_for's 50 ms."""
    def condition() -> bool:
        if check():
            return True
        time.sleep(POLL)
        return False
    return condition


def wait_committed(
    cluster: Cluster, indices: list[int], expected: dict[str, int],
    baseline: dict[int, float] | None, deadline: float,
) -> None:
    """Until every sender's nonce reaches `expected` on every node in `indices`; fails at
    once if pbft_view_changes_total moves from `baseline` (None: not watched)."""
    addresses = list(expected)

    def committed() -> bool:
        if baseline is not None:
            assert_no_view_change(cluster, baseline)
        return all(nonces(cluster.nodes[i], addresses, "latest") == expected for i in indices)

    try:
        wait_for(throttled(committed), deadline, f"{len(expected)} senders' nonces on {indices}")
    except AssertionError as failure:
        behind = {i: sum(expected[a] - n for a, n in
                         nonces(cluster.nodes[i], addresses, "latest").items())
                  for i in indices}
        heads = {i: cluster.head(i) for i in indices}
        raise AssertionError(
            f"{failure}; transactions still to commit per node {behind}; heads {heads}"
        ) from None


def wait_pools_empty(cluster: Cluster, indices: list[int], baseline: dict[int, float]) -> None:
    """Until no node holds a transaction (nothing left for a request timer to blame)."""
    def empty() -> bool:
        assert_no_view_change(cluster, baseline)
        return not any(pool_sizes(cluster, indices).values())

    wait_for(throttled(empty), SETTLE_DEADLINE, f"empty pools on nodes {indices}")


def settle(cluster: Cluster, indices: list[int]) -> dict[int, float]:
    """Before a test: wait until the pools are empty (what an earlier test sent committed,
    however it went), then the view-change counts this test must not move."""
    wait_for(throttled(lambda: not any(pool_sizes(cluster, indices).values())),
             SETTLE_DEADLINE, f"empty pools on nodes {indices} before the test")
    return all_view_changes(cluster, indices)


def receipt_statuses(node: RunningNode, first_block: int, last_block: int) -> dict[str, int]:
    """Transaction hash -> receipt status, for every transaction in blocks first..last."""
    replies = rpc_batch(node.rpc_url, [("eth_getBlockReceipts", [hex(n)])
                                       for n in range(first_block, last_block + 1)])
    return {
        receipt["transactionHash"].lower(): int(receipt["status"], 16)
        for reply in replies
        for receipt in reply["result"]
    }


def assert_receipts(cluster: Cluster, indices: list[int], hashes: set[str], since: int) -> None:
    """Every one of `hashes` is in a block after `since`, with status 1, on every node."""
    for i in indices:
        statuses = receipt_statuses(cluster.nodes[i], since + 1, cluster.head(i))
        missing = hashes - statuses.keys()
        assert not missing, f"node {i}: {len(missing)} accepted transactions not in a block"
        failed = [h for h in hashes if statuses[h] != 1]
        assert not failed, f"node {i}: {len(failed)} receipts with status 0"


def pending_first_nonces(cluster: Cluster, via: int = 0) -> dict[str, int]:
    return nonces(cluster.nodes[via], sender_addresses(cluster.description), "pending")


# ------------------------------------------------------------------------------------------
# Bursts on one shared default cluster (conftest's module-scoped `cluster`: 4 validators, no
# pbft flags).

ALL = [0, 1, 2, 3]


def commit_deadline(count: int) -> float:
    return 60 + count / 20  # a generous bound (20 transfers a second), not an expectation


# (A 1,000-transfer spray ran here too: the 3,000 one takes the same path under more load,
# and CI's 20 minutes are better spent elsewhere.)
@pytest.mark.parametrize(
    ("count", "sprayed"),
    [(400, False), (3_000, False), (3_000, True)],
    ids=["400-to-node0", "3000-to-node0", "3000-sprayed"],
)
def test_burst_commits_everything_without_a_view_change(
    cluster: Cluster, count: int, sprayed: bool
) -> None:
    baseline = settle(cluster, ALL)
    since = max(cluster.head(i) for i in ALL)
    burst = sign_burst(cluster.description, pending_first_nonces(cluster), count)
    if sprayed:  # four clients: a node gets a batch before the gossip of lower nonces
        replies = send_burst([n.rpc_url for n in cluster.nodes], burst, WINDOW)
    else:  # one client: node 0 gets every sender's nonces in order
        replies = send_burst([cluster.nodes[0].rpc_url], burst)

    assert refusals(replies) == {}, f"{sum(refusals(replies).values())} of {count} refused"
    accepted = accepted_hashes(replies)
    assert len(accepted) == burst.count
    wait_committed(cluster, ALL, burst.expected, baseline, commit_deadline(count))
    wait_pools_empty(cluster, ALL, baseline)
    assert_receipts(cluster, ALL, accepted, since)
    watch_quiet(cluster, ALL, baseline, after_commit_window(cluster))
    cluster.assert_consistent()


def test_a_gapped_transaction_waits_without_a_view_change(cluster: Cluster) -> None:
    baseline = settle(cluster, ALL)
    account = cluster.description["accounts"][3]
    address, key = account["address"], account["private_key"]
    nonce = nonces(cluster.nodes[0], [address], "pending")[address]
    chain_id, to = cluster.description["chain_id"], cluster.description["accounts"][9]["address"]
    # a settled head: the empty block that follows an earlier test's last busy block landed
    heads = dict.fromkeys(ALL, cluster.wait_idle(indices=ALL))

    gapped = rpc(cluster.nodes[1], "eth_sendRawTransaction",
                 sign_transfer(chain_id, key, nonce + 1, to))
    watch_quiet(cluster, ALL, baseline, GAP_WATCH, heads)
    filler = rpc(cluster.nodes[2], "eth_sendRawTransaction",
                 sign_transfer(chain_id, key, nonce, to))

    wait_committed(cluster, ALL, {address: nonce + 2}, baseline, commit_deadline(2))
    wait_pools_empty(cluster, ALL, baseline)
    assert_receipts(cluster, ALL, {gapped.lower(), filler.lower()}, heads[0])
    watch_quiet(cluster, ALL, baseline, after_commit_window(cluster))


@pytest.mark.parametrize("across_nodes", [False, True],
                         ids=["same-batch", "original-node1-replacement-node2"])
def test_replace_by_fee_commits_one_transaction_without_a_view_change(
    cluster: Cluster, across_nodes: bool
) -> None:
    baseline = settle(cluster, ALL)
    account = cluster.description["accounts"][5 if across_nodes else 4]
    address, key = account["address"], account["private_key"]
    nonce = nonces(cluster.nodes[0], [address], "pending")[address]
    chain_id, to = cluster.description["chain_id"], cluster.description["accounts"][9]["address"]
    since = max(cluster.head(i) for i in ALL)
    original = sign_transfer(chain_id, key, nonce, to, value=1, max_fee=MAX_FEE // 2, tip=TIP)
    replacement = sign_transfer(chain_id, key, nonce, to, value=2, max_fee=MAX_FEE, tip=2 * TIP)

    if across_nodes:
        replies = (send_raw_batch(cluster.nodes[1].rpc_url, [original])
                   + send_raw_batch(cluster.nodes[2].rpc_url, [replacement]))
    else:
        replies = send_raw_batch(cluster.nodes[1].rpc_url, [original, replacement])

    # The replacement may be refused only if the original committed first.
    assert "result" in replies[0], replies
    assert "result" in replies[1] or "nonce too low" in str(replies[1]), replies
    sent = accepted_hashes(replies)
    wait_committed(cluster, ALL, {address: nonce + 1}, baseline, commit_deadline(1))
    wait_pools_empty(cluster, ALL, baseline)
    for i in ALL:
        statuses = receipt_statuses(cluster.nodes[i], since + 1, cluster.head(i))
        committed = sent & statuses.keys()
        assert len(committed) == 1, f"node {i}: {len(committed)} of {sent} committed"
        assert statuses[committed.pop()] == 1
    watch_quiet(cluster, ALL, baseline, after_commit_window(cluster))


# ------------------------------------------------------------------------------------------
# The primary killed with a burst in flight: its own cluster.


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster.create(tmp_path, 4)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def test_a_transfer_gossip_missed_at_the_primary_is_relayed_to_it(tmp_path: Path) -> None:
    """Node 1's link to the primary, node 0, is down when a user sends node 1 a transfer:
    gossip takes it to nodes 2 and 3 only. They relay what they wait for to the primary
    (Castro & Liskov 4.1), which commits it in view 0, so nodes 0, 2 and 3 change no view
    (node 1, cut off from the primary, may ask for one alone; nobody joins it). Without the
    relay, 2 and 3 replace a correct primary for a transaction it never had."""
    cluster = Cluster.create(tmp_path)  # the testnet's defaults
    links = Links()
    try:
        links.install(cluster)
        cluster.start()
        others = [0, 2, 3]
        baseline = settle(cluster, others)
        account = cluster.description["accounts"][4]
        address, key = account["address"], account["private_key"]
        nonce = nonces(cluster.nodes[1], [address], "pending")[address]
        to = cluster.description["accounts"][9]["address"]
        links.cut(0, 1)
        rpc(cluster.nodes[1], "eth_sendRawTransaction",
            sign_transfer(cluster.description["chain_id"], key, nonce, to))
        wait_committed(cluster, others, {address: nonce + 1}, baseline, commit_deadline(1))
        assert [cluster.status(i)["view"] for i in others] == [0, 0, 0]
        links.mend(0, 1)
    finally:
        links.close()
        codes = cluster.close()
    assert codes == [0, 0, 0, 0]


def test_primary_killed_during_a_burst_a_new_view_commits_everything(
    fresh_cluster: Cluster,
) -> None:
    cluster, live = fresh_cluster, [1, 2, 3]
    assert cluster.status(1)["primary"].lower() == cluster.description["validators"][0].lower()
    since = cluster.head(1)
    burst = sign_burst(cluster.description, pending_first_nonces(cluster, via=1), 1_000)
    urls = [cluster.nodes[i].rpc_url for i in live]
    first_batch_sent = threading.Event()

    def send() -> list[dict[str, Any]]:
        replies = send_raw_batch(urls[0], burst.batches[0])
        first_batch_sent.set()
        rest = Burst(burst.batches[1:], burst.first, burst.expected)
        return replies + send_burst(urls[1:] + urls[:1], rest)

    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(send)
        wait_for(lambda: first_batch_sent.is_set() or sending.done(), 60, "the first batch")
        assert cluster.stop(0, signal.SIGKILL) == -signal.SIGKILL  # 900 still to be sent
        replies = sending.result(timeout=120)

    assert refusals(replies) == {}, f"{sum(refusals(replies).values())} of 1000 refused"
    accepted = accepted_hashes(replies)

    def committing_in_a_new_view() -> bool:
        statuses = [cluster.status(i) for i in live]
        if len({s["view"] for s in statuses}) > 1 or any(s["mode"] != "normal" for s in statuses):
            return False
        heads = [cluster.head(i) for i in live]
        return all(h > 0 and int(rpc(cluster.nodes[i], "pbft_getCommitCertificate",
                                     hex(h))["view"], 16) >= 1
                   for i, h in zip(live, heads, strict=True))

    # As many view changes as it takes (the timeouts escalate), within NEW_VIEW_DEADLINE; but
    # from the first commit in a new view on, that view's primary (correct, on a healthy
    # network) is never replaced.
    wait_for(throttled(committing_in_a_new_view), NEW_VIEW_DEADLINE,
             "nodes 1-3 in one view, each with a block committed in a view after 0")
    in_new_view = all_view_changes(cluster, live)
    wait_committed(cluster, live, burst.expected, in_new_view, commit_deadline(1_000))
    wait_pools_empty(cluster, live, in_new_view)
    assert_receipts(cluster, live, accepted, since)
    watch_quiet(cluster, live, in_new_view, after_commit_window(cluster))
    cluster.assert_consistent()


def test_the_killed_primary_started_again_under_load_joins_the_others_view(
    fresh_cluster: Cluster,
) -> None:
    """The README's try: `kill -9` of the primary while users send, and the node started again
    with the command `testnet run` prints while they go on sending. It catches up and joins
    the view the others are in, asking for no view change of its own. (Found on a slow host:
    its request timer ran out between two catch-up rounds, as the blocks it replayed passed
    over the transactions it had pooled, and it went to view 2 alone, its votes lost.)"""
    cluster, everyone = fresh_cluster, [0, 1, 2, 3]
    burst = sign_burst(cluster.description, pending_first_nonces(cluster, via=1), 3_000)
    urls = [cluster.nodes[i].rpc_url for i in (1, 2, 3)]

    def part(batches: slice) -> Burst:
        return Burst(burst.batches[batches], burst.first, burst.expected)

    assert cluster.stop(0, signal.SIGKILL) == -signal.SIGKILL
    replies = send_burst(urls, part(slice(0, 20)))  # the others change view meanwhile
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(send_burst, urls, part(slice(20, None)))
        cluster.start(0)
        replies += sending.result(timeout=120)
    assert refusals(replies) == {}, f"{sum(refusals(replies).values())} of 3000 refused"

    wait_committed(cluster, everyone, burst.expected, None, commit_deadline(3_000))
    def one_view() -> bool:
        statuses = [cluster.status(i) for i in everyone]
        return len({s["view"] for s in statuses}) == 1 and all(
            s["mode"] == "normal" for s in statuses)

    wait_for(throttled(one_view), NEW_VIEW_DEADLINE, "all four in one view, in normal mode")
    assert cluster.status(0)["view"] >= 1
    own = {key: value for key, value in cluster.metrics(0).items()
           if key.startswith("pbft_view_changes_total") and value}
    assert set(own) <= {"pbft_view_changes_total|new_view", "pbft_view_changes_total|join"}, (
        f"the restarted node asked for a view change of its own: {own}")
    watch_quiet(cluster, everyone, all_view_changes(cluster, everyone),
                after_commit_window(cluster))
    cluster.assert_consistent()
