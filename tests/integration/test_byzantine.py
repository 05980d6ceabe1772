"""Byzantine validators as real processes (issue 28; CometBFT's e2e misbehaviours).

A real 4-validator cluster on `pbft-node testnet init`'s defaults (2 s request and new-view
timeouts, no flag tuned) in which one node runs as `python -m testkit.byzantine --behaviour
NAME` (`testkit/byzantine.py`): the real node with its engine's sending and building taken
over by the behaviour. Where a behaviour needs the primary it is validator 0, the primary of
view 0. Transfers from the dev accounts go to the honest nodes; every test waits with
deadlines until they are committed on the three honest nodes, then checks that they agree
at every height (with certificates that verify), that a view change came within the
timeouts docs/engine.md promises where one is due (and none where it is not), and that the
misbehaviour was recorded where it is provable (`pbft_getEvidence`; `pbft_status`'s
`misbehaviour` when the node reports one; else the honest nodes' logs).

Each test fails with what the honest nodes printed (`explain`). One testnet is initialised
per module and copied for each test (a fresh chain), so a test costs a cluster start, its
load and its checks.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from pbft_engine.messages import verify_commit_certificate
from pbft_engine.sync_messages import MAX_BLOCKS_PER_REQUEST
from testkit.byzantine import ACTION
from testkit.cluster import Cluster, rpc
from testkit.nodes import make_testnet, wait_for
from tests.integration.test_liveness import (
    Burst,
    sign_transfer,
)

pytestmark = pytest.mark.integration

BYZANTINE = 0  # the primary of view 0
HONEST = [1, 2, 3]
CENSORED = 9  # dev account whose transfers the censoring primary leaves out
# Beyond the protocol's timeouts: message delays, block validation and RPC polling on a
# loaded 2-core machine.
SLACK = 5.0
POLL = 0.2
LATENCY_BOUND = 4.0  # seconds from sending a probe to its receipt: twice the request timeout


# ------------------------------------------------------------------------------------------
# Clusters: one `testnet init` per module, a fresh copy per test.


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("byzantine-testnet")
    make_testnet(directory, 4)  # the defaults: no pbft flag
    return directory


@pytest.fixture
def launch(template: Path, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """`launch(behaviour, *options, index=0)`: a fresh copy of the testnet with node `index`
    byzantine, all four started; stopped after the test (SIGKILL if stuck)."""
    clusters: list[Cluster] = []

    def launch(behaviour: str, *options: str, index: int = BYZANTINE) -> Cluster:
        cluster = Cluster.copy(template, tmp_path / "testnet")
        cluster.make_byzantine(index, behaviour, *options)
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield launch
    for cluster in clusters:
        cluster.terminate()


def pbft_params(cluster: Cluster) -> dict[str, Any]:
    genesis = json.loads((cluster.directory / "genesis.json").read_text())
    return genesis["config"]["pbft"]


def view_change_bound(cluster: Cluster) -> float:
    """One view change away from a faulty primary (docs/engine.md): a backup's request timer
    runs out (request_timeout) and N-f VIEW-CHANGEs reach the next primary, which sends
    NEW-VIEW at once; new_view_timeout covers a NEW-VIEW that must be waited for once."""
    params = pbft_params(cluster)
    return params["request_timeout"] + params["new_view_timeout"] + SLACK


def commit_deadline(count: int, cluster: Cluster) -> float:
    return view_change_bound(cluster) + 30 + count / 20


# ------------------------------------------------------------------------------------------
# What the nodes say, for assertions and for failures. Polls use short timeouts: a node
# whose event loop is stuck must fail a test with a clear message, not hang it.

ANSWER_TIMEOUT = 5.0


class NoAnswer(AssertionError):
    pass


def ask(cluster: Cluster, index: int, calls: list[tuple[str, list[Any]]],
        timeout: float = ANSWER_TIMEOUT) -> list[Any]:
    """One JSON-RPC batch to node `index`; the results in call order."""
    payload = [{"jsonrpc": "2.0", "id": i, "method": method, "params": params}
               for i, (method, params) in enumerate(calls)]
    try:
        replies = requests.post(cluster.nodes[index].rpc_url, json=payload,
                                timeout=timeout).json()
    except requests.RequestException as exc:
        raise NoAnswer(f"node {index} did not answer {calls[0][0]} within {timeout:.0f} s "
                       f"({type(exc).__name__})") from None
    by_id = {reply["id"]: reply for reply in replies}
    for reply in by_id.values():
        assert "error" not in reply, f"node {index}: {reply}"
    return [by_id[i]["result"] for i in range(len(calls))]


def status(cluster: Cluster, index: int, timeout: float = ANSWER_TIMEOUT) -> dict[str, Any]:
    return ask(cluster, index, [("pbft_status", [])], timeout)[0]


def head(cluster: Cluster, index: int, timeout: float = ANSWER_TIMEOUT) -> int:
    return int(ask(cluster, index, [("eth_blockNumber", [])], timeout)[0], 16)


def account_nonces(cluster: Cluster, index: int, addresses: list[str], tag: str = "latest"
                   ) -> dict[str, int]:
    results = ask(cluster, index, [("eth_getTransactionCount", [a, tag]) for a in addresses])
    return {a: int(n, 16) for a, n in zip(addresses, results, strict=True)}


def log_text(cluster: Cluster, index: int) -> str:
    path = cluster.nodes[index].log_path
    return path.read_text(errors="replace") if path.exists() else ""


def actions(cluster: Cluster, index: int = BYZANTINE) -> list[str]:
    return [line for line in log_text(cluster, index).splitlines() if ACTION in line]


NOTABLE = re.compile(r" (WARNING|ERROR|CRITICAL) |^\S+(Error|Exception)\b|^\w+(\.\w+)+: ")


def notable_lines(cluster: Cluster, index: int, limit: int = 12) -> list[str]:
    """The node's warnings, errors and exception lines, the last `limit` distinct ones (the
    timestamp and the consensus state prefix cut, repeats counted)."""
    counts: Counter[str] = Counter()
    for line in log_text(cluster, index).splitlines():
        if ACTION in line or not NOTABLE.search(line):
            continue
        text = re.sub(r"^\d{4}-\d\d-\d\d \S+ ", "", line)
        text = re.sub(r"view=\d+ seqNo=\d+ h=\d+ mode=\S+ \| ", "", text)
        counts[text[:300]] += 1
    return [f"{n} x {text}" if n > 1 else text for text, n in list(counts.items())[-limit:]]


def describe_node(cluster: Cluster, index: int) -> str:
    lines = "\n".join(f"    {line}" for line in notable_lines(cluster, index))
    try:
        reported = status(cluster, index, timeout=3)
        state = {k: reported.get(k) for k in ("view", "mode", "seqNo", "lastExecuted", "h")}
        if "misbehaviour" in reported:
            state["misbehaviour"] = reported["misbehaviour"]
        return f"node {index}: head {head(cluster, index, 3)} {state}\n{lines}"
    except NoAnswer as exc:
        return f"node {index}: {exc}: its event loop is stuck?\n{lines}"


@contextmanager
def explain(cluster: Cluster, honest: list[int], byzantine: int = BYZANTINE) -> Iterator[None]:
    """A failure inside (an assertion, or a node's RPC that does not answer) says what each
    honest node reports and printed, and what the byzantine node did last."""
    try:
        yield
    except Exception as failure:
        nodes = "\n".join(describe_node(cluster, i) for i in honest)
        acts = actions(cluster, byzantine)
        what = "" if isinstance(failure, AssertionError) else f"{type(failure).__name__}: "
        raise AssertionError(
            f"{what}{failure}\n--- the honest nodes ---\n{nodes}\n--- byzantine node "
            f"{byzantine}: {len(acts)} actions, the last: {acts[-3:]}") from None


def misbehaviour_reported(cluster: Cluster, index: int, culprit: str, section: str,
                          *log_patterns: str) -> bool:
    """Node `index` names `culprit` in pbft_status's `misbehaviour[section]` (`evidence` or
    `peerFaults`, docs/rpc.md) when the node reports one; otherwise it holds evidence against
    it, or its log says so (any of `log_patterns`, case-insensitive)."""
    reported = status(cluster, index)
    if "misbehaviour" in reported:
        accused = {address.lower() for address in reported["misbehaviour"].get(section, {})}
        return culprit.lower() in accused
    evidence = rpc(cluster.nodes[index], "pbft_getEvidence")
    if section == "evidence" and any(e["signer"].lower() == culprit.lower() for e in evidence):
        return True
    text = log_text(cluster, index)
    return any(re.search(pattern, text, re.IGNORECASE) for pattern in log_patterns)


def blocks_refused(cluster: Cluster, index: int) -> dict[str, int] | None:
    """pbft_status's misbehaviour.blocksRefused (None: the node does not report it)."""
    reported = status(cluster, index)
    return (reported["misbehaviour"].get("blocksRefused", {}) if "misbehaviour" in reported
            else None)


# ------------------------------------------------------------------------------------------
# Load and clocks.


PER_BATCH = 10  # consecutive nonces of each sender in one batch (as test_liveness sends)


def sign_load(description: dict[str, Any], senders: Sequence[int], count: int,
              first: dict[str, int]) -> Burst:
    """`count` transfers spread over dev accounts `senders`, in batches of PER_BATCH
    consecutive nonces of each, from their `first` nonces, to dev account 9."""
    accounts = [description["accounts"][i] for i in senders]
    per_sender = count // len(senders)
    assert per_sender * len(senders) == count, count
    recipient = description["accounts"][9]["address"]
    batches = [
        [sign_transfer(description["chain_id"], a["private_key"],
                       first[a["address"]] + nonce, recipient)
         for a in accounts for nonce in range(offset, min(offset + PER_BATCH, per_sender))]
        for offset in range(0, per_sender, PER_BATCH)
    ]
    expected = {a["address"]: first[a["address"]] + per_sender for a in accounts}
    return Burst(batches, {a["address"]: first[a["address"]] for a in accounts}, expected)


def send_load(cluster: Cluster, count: int, via: list[int],
              senders: Sequence[int] = tuple(range(10))) -> Burst:
    """`count` transfers from dev accounts `senders`, batches round-robin over `via`, each
    batch answered before the next is sent; every one accepted."""
    addresses = [cluster.description["accounts"][i]["address"] for i in senders]
    first = account_nonces(cluster, via[0], addresses, "pending")
    burst = sign_load(cluster.description, senders, count, first)
    for turn, batch in enumerate(burst.batches):  # ask() fails on a refusal
        ask(cluster, via[turn % len(via)], [("eth_sendRawTransaction", [raw]) for raw in batch],
            timeout=30)
    return burst


def wait_committed(cluster: Cluster, indices: list[int], expected: dict[str, int],
                   deadline: float, what: str = "the load") -> None:
    """Until every sender's nonce reaches `expected` on every node in `indices` (a node that
    does not answer within ANSWER_TIMEOUT is not there yet)."""
    behind: dict[int, int | str] = {}

    def done() -> bool:
        for i in indices:
            try:
                now = account_nonces(cluster, i, list(expected))
                behind[i] = sum(expected[a] - n for a, n in now.items())
            except NoAnswer as exc:
                behind[i] = str(exc)
        if not any(behind.values()):
            return True
        time.sleep(POLL)
        return False

    try:
        wait_for(done, deadline, f"{what} committed on nodes {indices}")
    except AssertionError as failure:
        raise AssertionError(f"{failure}; transactions not committed per node {behind}") \
            from None


class ViewClock:
    """Polls pbft_status of `indices` in the background from `start()`: when each node was
    first in a view above `view` in normal mode (seconds after start)."""

    def __init__(self, cluster: Cluster, indices: list[int], view: int = 0) -> None:
        self.cluster, self.indices, self.view = cluster, indices, view
        self.entered: dict[int, float] = {}
        self.started = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ViewClock:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for i in self.indices:
                if i in self.entered:
                    continue
                try:
                    reported = status(self.cluster, i, timeout=2)
                except NoAnswer:
                    continue
                if reported["view"] > self.view and reported["mode"] == "normal":
                    self.entered[i] = time.monotonic() - self.started

    def all_entered(self) -> float:
        """Seconds from start until the last of the nodes was in a new view."""
        missing = set(self.indices) - set(self.entered)
        assert not missing, f"nodes {sorted(missing)} never left view {self.view} for good"
        return max(self.entered.values())


def certified_view(cluster: Cluster, index: int, number: int) -> int:
    return int(rpc(cluster.nodes[index], "pbft_getCommitCertificate", hex(number))["view"], 16)


def assert_no_fork(cluster: Cluster, indices: list[int]) -> None:
    """The same block hash at every height up to the lowest head of `indices`, and on each
    node a commit certificate for every block that verifies (one batched read per node)."""
    validators = cluster.validators
    height = min(head(cluster, i) for i in indices)
    assert height > 0
    hashes: dict[int, list[str]] = {}
    for i in indices:
        blocks = ask(cluster, i, [("eth_getBlockByNumber", [hex(n), False])
                                  for n in range(1, height + 1)], timeout=30)
        certificates = ask(cluster, i, [("pbft_getCommitCertificate", [hex(n)])
                                        for n in range(1, height + 1)], timeout=30)
        hashes[i] = [block["hash"] for block in blocks]
        for number, (block_hash, certificate) in enumerate(zip(hashes[i], certificates,
                                                               strict=True), 1):
            signers = verify_commit_certificate(
                bytes.fromhex(certificate["certificate"][2:]), validators=validators, epoch=0,
                chain_id=cluster.description["chain_id"], block_number=number,
                block_hash=bytes.fromhex(block_hash[2:]))
            assert len(signers) >= 3, f"node {i}: block {number} certified by {signers}"
    for number in range(1, height + 1):
        at = {i: hashes[i][number - 1] for i in indices}
        assert len(set(at.values())) == 1, f"a fork at height {number}: {at}"


# ------------------------------------------------------------------------------------------
# The primary misbehaves: a view change replaces it and everything commits.


def run_primary_fault(cluster: Cluster, count: int) -> float:
    """Send `count` transfers to the honest nodes; wait until all are committed on them and
    they are in a new view; the seconds from the first send until the last was."""
    clock = ViewClock(cluster, HONEST).start()
    try:
        burst = send_load(cluster, count, HONEST)
        wait_committed(cluster, HONEST, burst.expected, commit_deadline(count, cluster))
        committed = time.monotonic() - clock.started
        wait_for(lambda: len(clock.entered) == len(HONEST), 30, "the honest nodes in a new view")
    finally:
        clock.stop()
    print(f"{count} transfers committed {committed:.1f} s after the first was sent; "
          f"in a new view after {clock.entered} s (bound {view_change_bound(cluster):.1f} s)")
    return clock.all_entered()


def test_silent_primary_is_replaced_and_the_load_commits(
    launch: Callable[..., Cluster],
) -> None:
    cluster = launch("silent-primary")
    with explain(cluster, HONEST):
        view_change = run_primary_fault(cluster, 500)
        assert actions(cluster), "the byzantine primary withheld nothing"
        assert view_change <= view_change_bound(cluster), (
            f"the view change took {view_change:.1f} s, more than "
            f"{view_change_bound(cluster):.1f} s")
        assert certified_view(cluster, 1, 1) >= 1, "block 1 was committed in view 0"
        assert_no_fork(cluster, HONEST)


def test_equivocating_primary_is_recorded_and_replaced(launch: Callable[..., Cluster]) -> None:
    cluster = launch("equivocate")
    primary = cluster.description["validators"][BYZANTINE]
    with explain(cluster, HONEST):
        view_change = run_primary_fault(cluster, 200)
        assert actions(cluster), "the byzantine primary sent no conflicting PRE-PREPAREs"
        assert view_change <= view_change_bound(cluster), (
            f"the view change took {view_change:.1f} s, more than "
            f"{view_change_bound(cluster):.1f} s")
        evidence = {i: [(e["signer"].lower(), e["type"]) for e in
                        rpc(cluster.nodes[i], "pbft_getEvidence")] for i in HONEST}
        witnesses = [i for i, found in evidence.items()
                     if (primary.lower(), "pre-prepare") in found]
        assert witnesses, f"no evidence of conflicting PRE-PREPAREs: {evidence}"
        for i in witnesses:
            assert misbehaviour_reported(cluster, i, primary, "evidence"), (
                f"node {i} holds evidence but its pbft_status does not name {primary}")
        assert_no_fork(cluster, HONEST)


# What a backup's log says of each poison (py-evm's and eth-keys' own messages). An r at the
# curve order raises what a y-parity of 5 does (BadSignature): the unit tests run all three
# against the real chain (test_pbft_adapter_boundaries.py), these two as real processes.
POISON_REASONS = {
    "tx-type": r"unknown transaction type",
    "y-parity": r"BadSignature|not less than or equal to 1\b",
}


@pytest.mark.parametrize("poison", list(POISON_REASONS))
def test_poisoned_block_is_refused_and_the_chain_goes_on(
    launch: Callable[..., Cluster], poison: str,
) -> None:
    """The primary's block has a consistent header (transaction root, hash) over one
    transaction whose bytes make py-evm raise its own exception, not a validation error, on
    every backup: a type byte no fork defines, or a signature with y-parity 5 or r at the
    curve order."""
    cluster = launch("poisoned-block", "--poison", poison)
    primary = cluster.description["validators"][BYZANTINE]
    with explain(cluster, HONEST):
        view_change = run_primary_fault(cluster, 200)
        acts = actions(cluster)
        assert acts, "the byzantine primary proposed no poisoned block"
        assert view_change <= view_change_bound(cluster), (
            f"the view change took {view_change:.1f} s, more than "
            f"{view_change_bound(cluster):.1f} s")
        poisoned = re.findall(r"proposed (0x[0-9a-f]{64})", "\n".join(acts))
        for i in HONEST:
            # A refusal names the primary that proposed the block, not the primary of the
            # view the replica is in when its validation ends (by then f+1 faster peers may
            # have taken it to the next view).
            blamed = {(digest, "0x" + by) for digest, by in re.findall(
                r"block \d+ 0x([0-9a-f]{12}) proposed by validator 0x([0-9a-f]{40}) refused",
                log_text(cluster, i)) if any(h[2:].startswith(digest) for h in poisoned)}
            assert blamed and {by for _, by in blamed} == {primary.lower()}, (
                f"node {i} blamed no one or another validator for the poisoned block: "
                f"{sorted(blamed)}")
            assert all(rpc(cluster.nodes[i], "eth_getBlockByHash", h, False) is None
                       for h in poisoned), f"node {i} holds a poisoned block"
            assert re.search(POISON_REASONS[poison], log_text(cluster, i), re.IGNORECASE), (
                f"node {i} logged no reason for refusing the block")
            refused = blocks_refused(cluster, i)
            assert refused is None or refused.get("invalid", 0) >= 1, (
                f"node {i}: pbft_status misbehaviour.blocksRefused {refused}")
            assert misbehaviour_reported(cluster, i, primary, "evidence",
                                         POISON_REASONS[poison]), (
                f"node {i} holds no evidence against {primary}")
        assert_no_fork(cluster, HONEST)


def test_censoring_primary_is_replaced_and_the_censored_sender_commits(
    launch: Callable[..., Cluster], template: Path,
) -> None:
    """Blocks of view 0 leave out dev account 9 and include the others: the backups' request
    timers stop restarting once its oldest transfer is passed over (docs/engine.md), or run
    out when nothing else is left; the next primary commits it."""
    described = json.loads((template / "testnet.json").read_text())
    censored = described["accounts"][CENSORED]["address"]
    cluster = launch("censor", "--censor", censored)
    primary = cluster.description["validators"][BYZANTINE]
    clock = ViewClock(cluster, HONEST).start()
    with explain(cluster, HONEST):
        try:
            burst = send_load(cluster, 300, HONEST)
            others = {a: n for a, n in burst.expected.items() if a != censored}
            wait_committed(cluster, HONEST, others, commit_deadline(300, cluster),
                           "the other senders' transfers")
            others_done = time.monotonic() - clock.started
            wait_committed(cluster, HONEST, {censored: burst.expected[censored]},
                           commit_deadline(30, cluster), "the censored sender's transfers")
            wait_for(lambda: len(clock.entered) == len(HONEST), 30, "a new view")
        finally:
            clock.stop()
        assert actions(cluster), f"the censoring primary {primary} left nothing out"
        late = clock.all_entered() - others_done
        print(f"the others' transfers committed after {others_done:.1f} s; in a new view "
              f"after {clock.entered} s")
        assert late <= view_change_bound(cluster), (
            f"the view change came {late:.1f} s after the other senders' transfers "
            f"committed, more than {view_change_bound(cluster):.1f} s")
        receipt = cluster.nodes[1].web3().eth.get_transaction_receipt(_last_tx(
            cluster, 1, censored))
        assert certified_view(cluster, 1, receipt.blockNumber) >= 1
        assert_no_fork(cluster, HONEST)


def _last_tx(cluster: Cluster, index: int, sender: str) -> str:
    """The hash of `sender`'s last committed transaction, from the newest blocks."""
    w3 = cluster.nodes[index].web3()
    for number in range(w3.eth.block_number, 0, -1):
        for tx in w3.eth.get_block(number, full_transactions=True).transactions:
            if tx["from"].lower() == sender.lower():
                return tx["hash"].to_0x_hex()
    raise AssertionError(f"no transaction of {sender} committed")


# ------------------------------------------------------------------------------------------
# A lying block-sync peer: a restarted honest node catches up from the others anyway.


def stream_transfers(cluster: Cluster, count: int, via: list[int],
                     first: dict[str, int]) -> dict[str, int]:
    """`count` transfers from the 10 dev accounts, one eth_sendRawTransaction at a time
    round-robin over `via` (nonce n of every sender, then n + 1): the primary proposes while
    they arrive, so they make many small blocks. The senders' nonces after them."""
    burst = sign_load(cluster.description, range(10), count, first)
    by_nonce = sorted((i % PER_BATCH + PER_BATCH * b, i // PER_BATCH, raw)
                      for b, batch in enumerate(burst.batches) for i, raw in enumerate(batch))
    with requests.Session() as session:
        for turn, (_, _, raw) in enumerate(by_nonce):
            reply = session.post(cluster.nodes[via[turn % len(via)]].rpc_url, timeout=30, json={
                "jsonrpc": "2.0", "id": turn, "method": "eth_sendRawTransaction",
                "params": [raw]}).json()
            assert "result" in reply, reply
    return burst.expected


RESTARTED = 3


def first_range_peer(description: dict[str, Any], params: dict[str, Any], node: int) -> int:
    """The validator block sync asks first for the range after `node`'s watermark window:
    peers are taken in address order, range by range (pbft_engine.sync), and the first
    range a restarted node fetches starts right above its window (below it, the consensus
    messages its peers queued while it was down take it there)."""
    first = params["checkpoint_interval"] * params["log_multiplier"] + 1
    peers = sorted((bytes.fromhex(v[2:]), i) for i, v in enumerate(description["validators"])
                   if i != node)
    return peers[first // MAX_BLOCKS_PER_REQUEST % len(peers)][1]


@pytest.fixture
def liar(template: Path) -> int:
    description = json.loads((template / "testnet.json").read_text())
    genesis = json.loads((template / "genesis.json").read_text())
    return first_range_peer(description, genesis["config"]["pbft"], RESTARTED)


def test_restarted_node_catches_up_past_a_peer_serving_false_bodies(
    launch: Callable[..., Cluster], liar: int,
) -> None:
    """Node 3 is down while the others commit a watermark window and a block-sync range
    more, then starts again. On reconnecting it gets the consensus messages its peers queued
    for it and commits through consensus up to its window; the rest only block sync has.
    The liar is the peer whose turn that first range is (`first_range_peer`); it answers
    each request in turn with poisoned bodies under true headers, a partial range, stale
    certificates and swapped bodies (and GetBlock with a poisoned body)."""
    cluster = launch("false-bodies", index=liar)
    honest = [i for i in range(4) if i != liar]
    culprit = cluster.description["validators"][liar]
    params = pbft_params(cluster)
    enough = params["checkpoint_interval"] * params["log_multiplier"] \
        + MAX_BLOCKS_PER_REQUEST + 8
    up = [i for i in range(4) if i != RESTARTED]
    with explain(cluster, honest, liar):
        cluster.commit(via=up[0])
        assert cluster.stop(RESTARTED) == 0
        addresses = [a["address"] for a in cluster.description["accounts"][:10]]
        expected = account_nonces(cluster, up[0], addresses, "pending")
        while head(cluster, up[0]) < enough:
            expected = stream_transfers(cluster, 100, up, expected)
            wait_committed(cluster, up, expected, commit_deadline(100, cluster))
        target = head(cluster, up[0])
        cluster.start(RESTARTED)
        wait_committed(cluster, [RESTARTED], expected, commit_deadline(0, cluster) + 30,
                       "the restarted node's catch-up")
        assert head(cluster, RESTARTED) >= target
        assert actions(cluster, liar), (
            "the liar was never asked for blocks: the test proves nothing")
        assert misbehaviour_reported(cluster, RESTARTED, culprit, "peerFaults", culprit[2:]), (
            f"node {RESTARTED} did not record the liar {culprit}")
        assert cluster.commit(via=RESTARTED, sender=1) > target  # and it takes part again
        assert_no_fork(cluster, honest)


# ------------------------------------------------------------------------------------------
# Garbage from a validator on the consensus channel: the others keep committing, no slower
# than a bound, and change no view. Light garbage first, then (SIGUSR1) the item-heavy frames
# and VIEW-CHANGEs, on one cluster.

GARBAGE_NODE = 3  # a backup: the honest primary's rounds are what is measured


@pytest.fixture(scope="class")
def garbage_cluster(template: Path, tmp_path_factory: pytest.TempPathFactory
                    ) -> Iterator[Cluster]:
    cluster = Cluster.copy(template, tmp_path_factory.mktemp("garbage"))
    cluster.make_byzantine(GARBAGE_NODE, "garbage")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.terminate()


def counters(cluster: Cluster, index: int, prefix: str) -> float:
    """The sum of node `index`'s metric samples whose name starts with `prefix`."""
    try:
        text = requests.get(cluster.nodes[index].node["metrics_url"],
                            timeout=ANSWER_TIMEOUT).text
    except requests.RequestException as exc:
        raise NoAnswer(f"node {index} served no metrics within {ANSWER_TIMEOUT:.0f} s "
                       f"({type(exc).__name__})") from None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))


def view_changes(cluster: Cluster, indices: list[int]) -> dict[int, float]:
    return {i: counters(cluster, i, "pbft_view_changes_total") for i in indices}


def dropped(cluster: Cluster, indices: list[int]) -> dict[int, float]:
    return {i: counters(cluster, i, "pbft_dropped_messages_total") for i in indices}


def probe_latencies(cluster: Cluster, via: list[int], stop: threading.Event, sender: int,
                    latencies: list[float]) -> None:
    """Until `stop`: one transfer from dev account `sender` at a time, sent to the next of
    `via` and waited for there; appends the seconds from send to receipt to `latencies`
    (PROBE_GIVE_UP if none came, which ends the probing)."""
    account = cluster.description["accounts"][sender]
    to = cluster.description["accounts"][9]["address"]
    try:
        nonce = account_nonces(cluster, via[0], [account["address"]], "pending")[
            account["address"]]
    except NoAnswer:
        latencies.append(PROBE_GIVE_UP)
        return
    while not stop.is_set():
        node = via[len(latencies) % len(via)]
        raw = sign_transfer(cluster.description["chain_id"], account["private_key"], nonce, to)
        sent = time.monotonic()
        try:
            tx_hash = ask(cluster, node, [("eth_sendRawTransaction", [raw])])[0]
            while ask(cluster, node, [("eth_getTransactionReceipt", [tx_hash])])[0] is None:
                if time.monotonic() - sent > PROBE_GIVE_UP:
                    raise NoAnswer(f"no receipt on node {node}")
                time.sleep(0.05)
        except NoAnswer:
            latencies.append(PROBE_GIVE_UP)
            return
        latencies.append(time.monotonic() - sent)
        nonce += 1


PROBE_GIVE_UP = 30.0
MIN_PROBES = 10


def run_under_garbage(cluster: Cluster, count: int, baseline: dict[int, float]
                      ) -> list[float]:
    """`count` transfers from dev accounts 0-8 spread over the honest nodes while dev account
    9 probes the latency one transfer at a time; all committed, and no view change on the
    honest nodes since `baseline`. The probes' latencies."""
    honest = list(baseline)
    stop = threading.Event()
    latencies: list[float] = []
    prober = threading.Thread(target=probe_latencies, daemon=True,
                              args=(cluster, honest, stop, 9, latencies))
    prober.start()
    try:
        burst = send_load(cluster, count, honest, senders=range(9))
        wait_committed(cluster, honest, burst.expected, commit_deadline(count, cluster))
        wait_for(lambda: len(latencies) >= MIN_PROBES or PROBE_GIVE_UP in latencies
                 or not prober.is_alive(), MIN_PROBES * LATENCY_BOUND, f"{MIN_PROBES} probes")
        now = view_changes(cluster, honest)
        assert now == baseline, f"view changes (per node) before {baseline}, now {now}"
    finally:
        stop.set()
        prober.join(timeout=PROBE_GIVE_UP + 2 * ANSWER_TIMEOUT)
    print(f"{len(latencies)} probes, the slowest {sorted(latencies)[-3:]} s")
    assert latencies, "no probe went through"
    assert max(latencies) <= LATENCY_BOUND, (
        f"commit latency: the slowest probes took {sorted(latencies)[-5:]} s "
        f"({len(latencies)} probes)")
    return latencies


def wait_sent(cluster: Cluster, *kinds: str) -> None:
    """Until the garbage node's latest account of what it sent names every one of `kinds`."""
    def sent() -> bool:
        tallies = [a for a in actions(cluster, GARBAGE_NODE) if "sent so far" in a]
        return bool(tallies) and all(f"'{kind}'" in tallies[-1] for kind in kinds)

    wait_for(sent, 60, f"the garbage node to send {kinds}")


GARBAGE_HONEST = [0, 1, 2]


class TestGarbage:
    """Light garbage all along; item-heavy frames and VIEW-CHANGEs after SIGUSR1."""

    def test_random_malformed_replayed_and_largest_frames(
        self, garbage_cluster: Cluster
    ) -> None:
        cluster = garbage_cluster
        with explain(cluster, GARBAGE_HONEST, GARBAGE_NODE):
            cluster.commit(via=1)  # consensus messages for the garbage node to replay
            before = dropped(cluster, GARBAGE_HONEST)
            wait_sent(cluster, "random", "malformed", "replay", "largest")
            run_under_garbage(cluster, 180, view_changes(cluster, GARBAGE_HONEST))
            after = dropped(cluster, GARBAGE_HONEST)
            assert all(after[i] > before[i] for i in GARBAGE_HONEST), (
                f"the garbage was not refused and counted: dropped {before} -> {after}")
            assert_no_fork(cluster, GARBAGE_HONEST)

    def test_item_heavy_frames_and_view_changes(self, garbage_cluster: Cluster) -> None:
        cluster = garbage_cluster
        process = cluster.nodes[GARBAGE_NODE].process
        assert process is not None
        with explain(cluster, GARBAGE_HONEST, GARBAGE_NODE):
            baseline = view_changes(cluster, GARBAGE_HONEST)
            before = dropped(cluster, GARBAGE_HONEST)
            process.send_signal(signal.SIGUSR1)
            wait_sent(cluster, "heavy")
            run_under_garbage(cluster, 180, baseline)
            after = dropped(cluster, GARBAGE_HONEST)
            assert all(after[i] > before[i] for i in GARBAGE_HONEST), (
                f"the garbage was not refused and counted: dropped {before} -> {after}")
            assert_no_fork(cluster, GARBAGE_HONEST)
