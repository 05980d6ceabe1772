"""The seeded simulator: 400 seeds across N = 1..10 in CI; `--seeds K` runs K per size.

Seeds fall into classes by `scenario.kind_of` (four in ten chaos, the rest membership,
honest, gapped, slow and censor), and every seed draws a hostile world (`hostile.py`; the
membership class the chaos class's faults); a failure names its class, its world and the
command that replays it. Below the random seeds: one seed per hostile world
that must fail when the engine handles it the old way (each old way put back by a
monkeypatch), and the gaps the simulator found (xfail, strict: they pass once fixed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest

from pbft_engine.core import (
    BlockBuilt,
    BlockValidated,
    CommitBlock,
    CommitRefused,
    Refusal,
    ValidateBlock,
    catch_up,
)
from pbft_engine.core.replica import Replica
from pbft_engine.messages import (
    Authenticator,
    Commit,
    KeyVerifier,
    decode_commit_certificate,
    encode_commit_certificate,
)
from tests.simulation import cluster as cluster_module
from tests.simulation import scenario
from tests.simulation.cluster import (
    CHAIN_ID,
    Cluster,
    ExecutorFaults,
    NetworkFaults,
    Node,
    SafetyViolation,
    _Queued,
)
from tests.simulation.scenario import kind_of, replay_command, run_seed

# CI seeds per size: the quorum edge cases (N = 2, 3, 5, 6) and the cheap sizes get more, the
# large ones fewer (N = 10 takes about 0.9 s a seed here); 700 in total, about 100 s of CPU
# (ten fewer at N = 7 and ten more at N = 1 than before the hostile worlds, which cost ~5%).
# Set changes in half the seeds of every class cost 1.5x at N = 4 and about 2x at N = 7: 400
# seeds (four sevenths of each size) keep the CPU time what it was (136 s against 139 s).
CI_SEEDS = {1: 90, 2: 60, 3: 60, 4: 85, 5: 23, 6: 23, 7: 28, 8: 11, 9: 10, 10: 10}
# Odd seeds run with the engine's group commit modelled (a write of this many ms: the steps
# taken meanwhile share the next one, `cluster.GROUP_COMMIT_MS`), as the engine writes; even
# ones with one write per step. Seeds 0..89 of every size passed both ways in session 11.
GROUP_COMMIT_CI_MS = 3

# Seeds a test case: CI runs the simulator at nice 19 beside the other suites, and a whole
# size's seeds in one case took 300 s there (pytest's timeout) on a loaded machine.
SEED_CHUNK = 15
CI_CHUNKS = [(n, first) for n in sorted(CI_SEEDS) for first in range(0, CI_SEEDS[n], SEED_CHUNK)]

_SEEN: Counter[str] = Counter()  # the hostile events of the random seeds run so far
_RAN: set[tuple[int, int]] = set()


@pytest.mark.timeout(900)  # at nice 19 under make test's other suites, on a host 2 x slower:
# a case of 15 seeds at N = 7 took over 300 s (session 16); starved, not stuck
@pytest.mark.parametrize(("n", "first"), CI_CHUNKS)
def test_random_seeds(n: int, first: int, seed_count: int | None,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The CI seeds `first`.. of size n, SEED_CHUNK of them (`--seeds K`: seeds 0..K-1 in
    the size's first case)."""
    if seed_count is not None and first:
        pytest.skip("--seeds runs a size's seeds in its first case")
    last = seed_count if seed_count is not None else min(first + SEED_CHUNK, CI_SEEDS[n])
    failures = []
    for seed in range(first, last):
        write_ms = GROUP_COMMIT_CI_MS if seed % 2 else 0
        monkeypatch.setattr(cluster_module, "GROUP_COMMIT_MS", write_ms)
        try:
            _SEEN.update(run_seed(seed, n).seen)
        except AssertionError as exc:
            replay = replay_command(seed, n) + (f" --group-commit {write_ms}" if write_ms else "")
            failures.append(f"seed {seed} ({kind_of(seed, n)}): {exc}\n  replay: {replay}")
    assert not failures, "\n".join(failures)
    _RAN.add((n, first))


# --- each hostile world, and the old way of handling it ------------------------------------


def _no_validation_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core before issue 28: a validation the adapter never answers is waited for."""
    monkeypatch.setattr(Replica, "_on_validation_deadline", lambda self, seq_no: None)


def _dead_validation_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter and core before issue 28: an exception the validation task did not expect
    killed it (no answer), and nothing gave the validation up."""
    _no_validation_deadline(monkeypatch)
    fault = Cluster._executor_fault

    def dead(self: Cluster, node: Node, faults: ExecutorFaults,
             queued: _Queued, duration: int, finish: Callable[[], None]
             ) -> tuple[int, Callable[[], None]]:
        duration, outcome = fault(self, node, faults, queued, duration, finish)
        if queued.kind == "validate" and outcome is not finish:
            return duration, lambda: None
        return duration, outcome

    monkeypatch.setattr(Cluster, "_executor_fault", dead)


def _no_invalid_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter before issue 28: a block that does not execute was "not validated", like
    a false copy (fetched again), whoever's fault it was."""
    refusal = Cluster._refusal

    def old(node: Node, action: ValidateBlock) -> Refusal | None:
        answer = refusal(node, action)
        return Refusal.FALSE_COPY if answer is Refusal.INVALID else answer

    monkeypatch.setattr(Cluster, "_refusal", staticmethod(old))


def _fetch_failed_without_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter before issue 28: a fetch that failed part-way said only that it failed."""
    done = Cluster._fetch_done

    def old(self: Cluster, node: Node, target: int,
            imported: tuple[bytes, ...], completed: bool) -> None:
        done(self, node, target, imported if completed else (), completed)

    monkeypatch.setattr(Cluster, "_fetch_done", old)


def _bound_before_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter before issue 28: the validator state file, then the store batch."""
    monkeypatch.setattr(cluster_module, "STORE_FIRST", False)


def _claims_excuse_every_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The core before the attack review core7's finding 2 was fixed: a head a peer claims
    excuses the primary at every request timeout while a fetch is under way (and, as then,
    the timeouts a fetch excused stalled count nothing when it ends)."""
    monkeypatch.setattr(catch_up, "claimed_lag", lambda replica: (
        replica.fetching is not None or catch_up.proved_head(replica) is not None))
    monkeypatch.setattr(catch_up, "stall_count", _counts_no_stall)


def _counts_no_stall(replica: Replica) -> int:
    replica.fetch_stalled, replica.fetch_executing = 0, False
    return 0


# (world, seed, n, what must have happened in it, the old way)
HOSTILE_SEEDS = [
    ("lost validation answers", 163, 2, "validation answer lost", _no_validation_deadline),
    ("raising executor", 23, 4, "validate raised", _dead_validation_task),
    ("poisoned primary", 11, 4, "refused invalid", _no_invalid_refusal),
    ("fetch failing part-way", 36, 4, "fetch failed part-way", _fetch_failed_without_head),
    ("crash between the store and the bound", 4, 4, "crash at bound", _bound_before_store),
    ("a censor claiming heads unchecked", 89, 4, "unchecked claim", _claims_excuse_every_timeout),
]


@pytest.mark.parametrize(("world", "seed", "n", "event", "old_way"), HOSTILE_SEEDS,
                         ids=[f"{w}-{s}-{n}" for w, s, n, _, _ in HOSTILE_SEEDS])
def test_hostile_world_and_the_old_way(
    monkeypatch: pytest.MonkeyPatch, world: str, seed: int, n: int, event: str,
    old_way: Callable[[pytest.MonkeyPatch], None],
) -> None:
    """The seed passes, its hostile world happened in it, and handled the old way it fails
    (the seed as it ran before seeds of every class voted set changes)."""
    monkeypatch.setattr(scenario, "CHANGE_SHARE", 0.0)
    cluster = run_seed(seed, n)
    assert cluster.seen[event], f"{world}: no {event!r} in seed {seed} at N = {n}"
    old_way(monkeypatch)
    with pytest.raises(AssertionError):
        run_seed(seed, n)


def test_every_hostile_event_happens_in_the_random_seeds() -> None:
    """The random CI seeds' worlds do what hostile.py says (counted by test_random_seeds,
    which runs first)."""
    if set(CI_CHUNKS) != _RAN:
        pytest.skip("needs every test_random_seeds case run before it")
    expected = {"validation answer lost", "validate raised", "build raised", "commit raised",
                "commit write failed", "stall", "refused invalid", "refused unavailable",
                "refused false_copy", "poisoned body", "poisoned parent", "fetch failed",
                "fetch failed part-way", "fetched range", "crash at step", "crash at bound",
                "crash at send", "crash at chain", "unchecked claim"}
    assert expected <= set(_SEEN), sorted(expected - set(_SEEN))


# --- gaps the simulator found in the engine: fixed (69258a1), or strict xfails -------------


Job = tuple[int, Callable[[], None]]  # the simulated executor's: (its time in ms, its answer)


def _answered_once(cluster: Cluster, perform: Callable[[Node, Any], Job],
                   answer: Callable[[Any], object]) -> Callable[[Node, Any], Job]:
    """The executor's `perform`, except that its first action is answered with
    `answer(action)` at once (a failure the adapter reports) instead of being done."""
    failed: list[object] = []

    def once(node: Node, action: Any) -> Job:
        if failed:
            return perform(node, action)
        failed.append(action)
        return 1, partial(cluster.feed, node.index, answer(action))

    return once


@pytest.mark.parametrize("n", [1, 4])
def test_a_failed_build_is_built_again(n: int) -> None:
    """One build of the first primary fails (the executor raised: the adapter's catch-all
    answers BlockBuilt with no block). The transaction must still commit, in view 0. Before
    69258a1 nothing built again until another transaction arrived: at N = 1 it never
    committed, at N = 4 the backups' request timers replaced a correct primary."""
    cluster = Cluster(n)
    cluster._build = _answered_once(  # type: ignore[method-assign]
        cluster, cluster._build, lambda a: BlockBuilt(a.seq_no, b"", b"", ()))
    tx = cluster.submit(b"one transfer")
    assert cluster.run_until(lambda: cluster.committed(tx) == n, 10_000)
    assert cluster.views() == [0] * n


def test_a_lone_validator_commits_after_a_failed_re_execution() -> None:
    """One validator; its commit of block 1 re-executes it (not in the adapter's executed
    blocks: a restart came between) and the executor raises once. The adapter answers
    CommitRefused (not a false copy), and the core keeps its copy and tries again. Before
    69258a1 it discarded the body and asked the peers, and there are none: block 1 was never
    committed, nor anything after it."""
    cluster = Cluster(1)
    cluster._commit = _answered_once(  # type: ignore[method-assign]
        cluster, cluster._commit,
        lambda a: CommitRefused(a.seq_no, a.digest, false_copy=False))
    tx = cluster.submit(b"one transfer")
    assert cluster.run_until(lambda: cluster.committed(tx) == 1, 10_000)


def test_transactions_only_a_stranded_replica_holds_commit() -> None:
    """Chaos seed 31 at N = 6 (no hostile world needed): replica 1 asked alone for view 1
    while cut off and holds three transactions whose gossip to the others was lost (two only
    it holds); until its VIEW-CHANGE resends relayed its oldest requests to every peer, the
    healed cluster stayed in view 0 and never committed them."""
    run_seed(31, 6)


def test_a_restarted_new_primary_sends_no_pre_prepare_without_its_block() -> None:
    """Chaos seed 850 at N = 6: replica 1 crashed while sending and restarted as the new
    primary, holding re-proposals from its NEW-VIEW whose bodies it never had; it resent
    them as PRE-PREPAREs without a block, which every peer's decoder refuses
    (`UndecodableSent`). They travelled in the NEW-VIEW: it resends only what it holds."""
    run_seed(850, 6)


def test_a_replica_caught_up_past_its_stable_checkpoint_keeps_the_next_block() -> None:
    """Replica 2 restarts with nothing, a peer proves head 45 (no checkpoint: K = 10) and it
    catches up there: h = 45, its stable checkpoint stays 0, so it may vote up to 40 only.
    The primary then proposes block 46 and the three others commit it. Replica 2 must still
    execute block 46 (on their COMMITs, or by fetching it) rather than blame the primary when
    its request timer runs out. Between eb8f2b2 and 69258a1 it dropped the PRE-PREPARE as
    outside the watermarks, never certified 46, and its request timer blamed the correct
    primary (simulator: honest seed 735 at N = 4 with the first world draw, a backup
    restarted after a crash at "chain")."""
    from eth_hash.auto import keccak

    from pbft_engine.core import (
        ChainHead,
        FetchCompleted,
        PeerCommitted,
        RequestReceived,
        TimerFired,
        TimerKind,
    )
    from pbft_engine.messages import (
        Commit,
        KeyVerifier,
        Prepare,
        PrePrepare,
        encode_commit_certificate,
    )
    from tests.unit.pbft.helpers import AUTH, GENESIS, PARAMS, SIGNERS, from_peer

    replica = Replica(PARAMS, 2, SIGNERS[2], KeyVerifier(), ChainHead(0, GENESIS),
                      block_digest=keccak)
    replica.start()
    head, head_hash = 45, keccak(b"block 45")
    certificate = encode_commit_certificate(
        AUTH.sign(Commit(0, head, head_hash, peer), SIGNERS[peer]) for peer in (0, 1, 3))
    replica.step(PeerCommitted(head, head_hash, certificate))
    assert replica.fetching == head
    replica.step(FetchCompleted(head, head_hash, keccak(b"state 45"), ()))
    assert (replica.last_exec, replica.low_watermark, replica.stable_checkpoint) == (45, 45, 0)
    waiting = keccak(b"a transfer in block 46")
    replica.step(RequestReceived(waiting))
    block = b"block 46"
    for action in replica.step(from_peer(PrePrepare(0, 46, keccak(block), 0), (block,))).actions:
        if isinstance(action, ValidateBlock):  # (the executor answers at once)
            replica.step(BlockValidated(46, keccak(block), True))
    for peer in (1, 3):
        replica.step(from_peer(Prepare(0, 46, keccak(block), peer)))
    for peer in (0, 1, 3):
        replica.step(from_peer(Commit(0, 46, keccak(block), peer)))
    replica.step(TimerFired(TimerKind.REQUEST, b""))
    assert replica.view == 0 and not replica.view_change_reasons
    assert 46 in replica.log.certified or (replica.fetching or 0) >= 46


def test_a_replica_restarted_in_a_view_change_executes_what_it_holds_certified() -> None:
    """Replica 2 asks alone for view 1 (its request timer ran out); a peer's STATUS then
    proves block 1, which it certifies, fetches and starts to commit; the commit's write
    fails and the node stops. It restarts from its store: waiting for view 1, block 1
    certified and not executed. It must commit block 1 (or fetch it); today it does nothing,
    even when a peer's STATUS proves block 1 again (simulator: slow seed 368 at N = 8, where
    the replica stays at height 2 in view 5 for ever while the others, idle, hold 3)."""
    from eth_hash.auto import keccak

    from pbft_engine.core import (
        BlockReceived,
        ChainHead,
        FetchBlock,
        FetchCommitted,
        PeerCommitted,
        Ready,
        RequestReceived,
        TimerFired,
        TimerKind,
    )
    from pbft_engine.messages import Commit, KeyVerifier, encode_commit_certificate
    from pbft_engine.record_store import MemoryConsensusStore
    from tests.unit.pbft.helpers import AUTH, GENESIS, PARAMS, SIGNERS

    store = MemoryConsensusStore()

    def written(ready: Ready) -> Ready:
        if ready.persist is not None:
            store.apply(ready.persist.ops)
        return ready

    replica = Replica(PARAMS, 2, SIGNERS[2], KeyVerifier(), ChainHead(0, GENESIS),
                      block_digest=keccak)
    written(replica.start())
    written(replica.step(RequestReceived(keccak(b"a transfer"))))
    written(replica.step(TimerFired(TimerKind.REQUEST, b"")))
    assert (replica.view, replica.active) == (1, False)
    block = b"block 1"
    digest = keccak(block)
    certificate = encode_commit_certificate(
        AUTH.sign(Commit(0, 1, digest, peer), SIGNERS[peer]) for peer in (0, 1, 3))
    actions = written(replica.step(PeerCommitted(1, digest, certificate))).actions
    assert FetchBlock(1, digest) in actions
    actions = written(replica.step(BlockReceived(1, digest, block))).actions
    assert any(isinstance(a, CommitBlock) for a in actions)  # under way when the node stops

    restarted = Replica.restore(PARAMS, 2, SIGNERS[2], KeyVerifier(), ChainHead(0, GENESIS),
                                store, block_digest=keccak, signing_bound=replica.signing_bound)
    assert 1 in restarted.log.certified and not restarted.active
    actions = list(restarted.start().actions)
    actions += restarted.step(PeerCommitted(1, digest, certificate)).actions
    assert any(isinstance(a, CommitBlock | FetchBlock | FetchCommitted) for a in actions)


# --- membership seeds that found gaps in the handover (issue 31, fixed with it) -------------


@pytest.mark.parametrize(("seed", "n"), [(32, 5), (172, 9), (202, 4), (382, 6), (662, 6)])
def test_membership_seeds_that_found_handover_gaps(seed: int, n: int) -> None:
    """Seed 32 at N = 5: a replica caught up past the handover checkpoint (its own stable
    checkpoint below it, so its VIEW-CHANGE would be the old epoch's) and the view change
    needed all five others: it adopts the checkpoint the new set's VIEW-CHANGEs prove.
    Seed 172 at N = 9: a replica fetched past the block in which a change passed, and acted
    on the head before the adapter fed the change: it signed a VIEW-CHANGE under its old
    index, which nobody took, and the view change split; the change is fed before the head
    above it (`Cluster._fetch_done`), and no VIEW-CHANGE is signed above a head not executed.
    Seeds 202 at N = 4 and 382 at N = 6: the primary owed blocks up to the handover
    checkpoint and brought none (in a view change of its own; faulty), and no request waited,
    so nothing timed it and the handover stalled: the backups time an owed block too
    (`handover.awaits_primary`).
    Seed 662 at N = 6: two members of the new set signed VIEW-CHANGE(1) in the old epoch,
    and a new-set VIEW-CHANGE installed the new epoch before they executed c, too early
    for their VIEW-CHANGE(2); the other three waited for a fourth of the new epoch for
    good: the next view is asked for once c is executed (`handover.leave_old_epoch_view`)."""
    run_seed(seed, n)


# --- set changes in every class (issue 31): the invariant, and the gaps they found ---------


def test_the_certificate_invariant_fails_on_a_certificate_of_another_set() -> None:
    """`check_certificates` (run after every seed of every class) refuses a block whose
    certificate is a quorum of another epoch's set, or of its own set naming another
    epoch: it can fail. Four validators and a spare voted in (4 -> 5, Q 3 -> 4)."""
    cluster = Cluster(4, spare=1)
    cluster.vote(4, True)
    assert cluster.run_until(lambda: cluster.nodes[4].up, 20_000)
    transfer = cluster.submit(b"a transfer in the new epoch")
    assert cluster.run_until(lambda: cluster.committed(transfer) == 5, 20_000)
    cluster.check_certificates()
    schedule = cluster.epochs.schedule
    height = schedule.epochs[1].first  # the new set's first block
    chain = cluster.nodes[2].chain
    entry = chain.blocks[height - 1]
    view = decode_commit_certificate(entry.certificate)[0].body.view

    def signed_by(nodes: range, epoch: int) -> bytes:
        """COMMITs of these nodes naming `epoch` (a node's index is its number in both
        sets: the new one is the old one and node 4)."""
        auth = Authenticator(CHAIN_ID, (), KeyVerifier(), epoch)
        return encode_commit_certificate(
            auth.sign(Commit(view, height, entry.block_hash, i, epoch=epoch),
                      cluster.nodes[i].signer) for i in nodes)

    for planted in (signed_by(range(3), 0),  # the old set's quorum, naming the old epoch
                    signed_by(range(1, 5), 0),  # a quorum of the new set naming the old epoch
                    signed_by(range(1, 4), 1)):  # the new set naming its epoch, the old Q
        chain.blocks[height - 1] = replace(entry, certificate=planted)
        with pytest.raises(SafetyViolation, match=f"block {height} on node 2"):
            cluster.check_certificates()
    chain.blocks[height - 1] = replace(entry, certificate=signed_by(range(1, 5), 1))
    cluster.check_certificates()  # (Q = 4 of the new set, naming its epoch: the real thing)


def test_a_joiner_the_quorum_needs_causes_no_view_change() -> None:
    """One validator votes a second in (Q 1 -> 2) while transactions flow. The primary
    proposes c+1 as soon as c is stable (its own CHECKPOINT), before the joiner, which
    follows by block sync, holds c and starts its replica. Dropped, that PRE-PREPARE would
    come again only with the primary's resend, one to two request timeouts after it went
    out, and the joiner's request timer, started when it joined, ran out first: the change
    caused a view change ("No view change caused by a change itself"; honest N = 4 with a
    laggard, + 1, and chaos, honest and gapped seeds at N = 1 to 3 did it too). The follower
    keeps the messages for the heights of the epoch it joins (`core.joining`), even before
    it imports the block in which the change passed, and its replica takes them at once."""
    cluster = Cluster(1, spare=1)
    for i in range(30):
        cluster.at(100 * i, partial(cluster.submit, b"transfer %d" % i))
    cluster.at(500, partial(cluster.vote, 1, True))
    assert cluster.run_until(lambda: cluster.nodes[1].up and all(
        cluster.committed(tx) == 2 for tx in cluster.registry), 20_000)
    assert [node.view_changes for node in cluster.nodes] == [0, 0]


def test_a_validator_voted_out_and_in_again_causes_no_view_change() -> None:
    """One validator votes a second in, out and in again (Q 1 -> 2 -> 1 -> 2) while
    transactions flow. The second leaves only once it executed a block above the removal's
    c, here by a catch-up past the re-add's c, and joins at once: the new primary's
    PRE-PREPARE of c+1 reached it while its replica still ran, which took none of it (it
    names an epoch passed after that replica stopped voting). A validator voted out keeps
    those messages as a follower does (`core.joining`), so no view change."""
    cluster = Cluster(1, spare=1)
    for i in range(40):
        cluster.at(100 * i, partial(cluster.submit, b"transfer %d" % i))
    for when, add in ((500, True), (1000, False), (1100, True)):
        cluster.at(when, partial(cluster.vote, 1, add))
    assert cluster.run_until(lambda: len(cluster.epochs.schedule.epochs) == 4 and (
        cluster.nodes[1].up) and all(cluster.committed(tx) == 2 for tx in cluster.registry),
        20_000)
    assert (cluster.seen["left the set"], cluster.seen["joined the set"]) == (1, 2)
    assert [node.view_changes for node in cluster.nodes] == [0, 0]


def test_requests_that_arrive_while_an_owed_block_waits_replace_no_primary() -> None:
    """Honest seed 236 at N = 5 (changes +5, -2, -5, +5; fetches fail half the time). The
    primary proposed the last set's first block c + 1 = 41 empty, owed to the handover,
    and the backups' request timers timed it. Its quorum of four needed node 3 (12 blocks
    behind: the sets before did not need it) or node 5 (voted out and in again, joining
    once its failing fetches reached c): 41 waited ~700 ms for a PREPARE. A burst arrived
    200 ms after 41 went out; the primary builds 42 once 41 is prepared, and 41's commit,
    which held none of the burst, did not restart the timers: two backups ran out before
    42 was even built (800 ms after 41 went out) and replaced the correct primary. The
    commit of an owed block restarts the timer (`Replica._forget_requests`), and node 5,
    which left at 40 (its replica's catch-up ended there) and joined at its next poll,
    250 ms later, joins as it leaves (`PbftEngine._leave`): either fix passes the seed
    (unit tests in test_replica_handover.py and pbft/test_join_buffer.py)."""
    run_seed(236, 5)


@pytest.mark.parametrize(("seed", "short_answers"), [(369, True), (619, False)])
def test_a_censor_claiming_heads_it_cannot_serve_is_replaced_within_the_bound(
        seed: int, short_answers: bool) -> None:
    """Censor seeds 369 and 619 at N = 9 (a liar: the censoring primary claims heads it cannot
    serve, `Cluster.unchecked_claims`). Every backup was fetching a claimed head when its
    request timer ran out, so each timeout was excused, and the censor committed blocks of
    other transactions in between, moving the head, so each claim was believed afresh: only
    the commits passing the censored request over counted (369: 9 of them over 10.5 s; the
    request committed at 16.9 s against a bound of 13.6 s). The failure of a fetch that
    excused a timeout now passes the request over too, whatever it imported first
    (`catch_up.on_fetch_failed`; the attack review s13-core's censor gap). In 369 peers
    serve short answers (`Cluster.short_answers`: fetches import a prefix, then fail; the
    random CI seeds draw none that happen)."""
    assert bool(run_seed(seed, 9).seen["short answer"]) is short_answers


def test_a_laggard_whose_fetches_failed_fast_asks_for_no_view_alone() -> None:
    """Honest seed 776 at N = 5 (fetches fail half the time, ranges of 4): a laggard at head
    24 saw two fetches fail within 5 ms, before any request timeout relied on them, then
    started a third, slow one (a laggard: it executes slowly); its third request timeout
    during that fetch found two timeouts and two failed fetches at its head and sent a lone
    VIEW-CHANGE (the fetch moved its head 45 s later). Only the failures of fetches that
    excused a timeout count now (`catch_up.on_fetch_failed`)."""
    run_seed(776, 5)


def test_a_replica_that_crashed_as_it_committed_c_still_hands_over() -> None:
    """Two validators vote a third in (the handover needs both old CHECKPOINTs at c = 4).
    Validator 1's chain commits block 4 and the node crashes before its core hears of it
    (`arm_crash` at "chain"). Restored at head 4, its core signed CHECKPOINT(4) only on
    BlockCommitted and FetchCompleted, and a restored head carried no state root: at a
    handover the high watermark stops at c until the checkpoint at c is stable, so the chain
    stopped at 4 for good, the two changing views for ever (chaos seed 39 at N = 1, 1 -> 2,
    drew it when chaos seeds first voted changes). The head now carries its state root and
    the restored core signs its CHECKPOINT there (`handover.checkpoint_restored_head`)."""
    cluster = Cluster(2, spare=1)
    cluster.vote(2, True)
    cluster.arm_crash(1, "chain", countdown=4)  # its fourth block committed: c
    transfers = [cluster.submit(b"transfer %d" % i) for i in range(3)]
    assert cluster.run_until(lambda: len(cluster.epochs.schedule.epochs) == 2, 5_000)
    assert cluster.epochs.schedule.handover == 4
    cluster.run_for(1_000)
    transfers += [cluster.submit(b"later %d" % i) for i in range(3)]
    assert cluster.run_until(lambda: cluster.all_committed(transfers), 30_000), (
        f"heights {cluster.heights()}, views {cluster.views()}")
    assert cluster.write_crashes == [(cluster.write_crashes[0][0], 1, "chain")]


def test_a_replica_keeps_no_view_of_an_older_epoch() -> None:
    """Chaos seed 4 at N = 7 with set changes (seed 3 passes since a NEW-VIEW of the epoch
    just replaced is taken for a higher view: `handover.takes_old_new_view`; an older
    epoch's may be forged with retired keys, test_attack_review_core8): a replica missed the
    view change to view 1 and caught up past later handovers. The NEW-VIEW that proves the
    view is of an older epoch, and a NEW-VIEW counts only in its own epoch, so installed in
    a later one the replica refused what the STATUS polls brought and stayed in the older
    view while the others worked in the newer: on the idle, healed cluster it never joined
    them (`check_no_churn`: never settled). It now joins by the certificate of the head the
    STATUS answers carry, Q COMMITs of the installed set in that view
    (`new_view.join_certified_view`; docs/epochs.md says why that is safe)."""
    run_seed(4, 7)


# --- honest replicas catching up slower than the timers (s10 lead (a)) ------------------------


TRANSFERS = 50  # one every 100 ms


@pytest.mark.parametrize(("n", "laggards"), [(6, (4, 5)), (7, (5, 6))])
def test_replicas_catching_up_slower_than_the_timers_replace_no_primary(
        n: int, laggards: tuple[int, ...]) -> None:
    """f+1 validators (N = 6: the four others are a quorum) or f (N = 7) are down together
    for two seconds while transactions flow, and restart: each catches up by a fetch whose
    ranges take 4 s to arrive (five request timeouts: large blocks on a slow link), and no
    checkpoint vouches for a head above theirs meanwhile (K = 100). Between ccbb6cc and the
    fix their claimed heads excused two timeouts at the same head: at N = 6 they replaced
    the correct primary twice (the f+1 rule brought the others along), at N = 7 both asked
    for view 1 without the others and stayed there, out of the quorum (five of seven
    voting: no fault left to spare). Past two timeouts, a claimed head now excuses the
    primary until two fetches in a row have failed at the head, however long each takes
    (`catch_up.claimed_lag`)."""
    cluster = Cluster(n, 1, faults=NetworkFaults(1, 10), checkpoint_interval=100)
    cluster.range_transfer_ms = 5 * cluster.params.request_timeout_ms
    transfers: list[bytes] = []
    for i in range(TRANSFERS):
        cluster.at(100 * i, lambda i=i: transfers.append(cluster.submit(b"transfer %d" % i)))
    for index in laggards:
        cluster.at(1_000, partial(cluster.crash, index))
        cluster.at(3_000, partial(cluster.restart, index))
    assert cluster.run_until(
        lambda: len(transfers) == TRANSFERS and cluster.all_committed(transfers), 60_000), (
        f"heights {cluster.heights()}")
    assert [node.view_changes for node in cluster.nodes] == [0] * n, cluster.views()


@pytest.mark.parametrize(("seed", "write_ms"), [(313, 20), (40, 3)])
def test_a_replica_fetched_past_the_handover_can_ask_for_a_view_again(
        monkeypatch: pytest.MonkeyPatch, seed: int, write_ms: int) -> None:
    """Found with the group-commit model (`--group-commit`, session 10; diagnosed in session
    11): chaos seeds at N = 4 whose set change removes one validator (epoch 1 from height
    13 or 5: three members, f = 0). One honest replica asked for view 1 (or joined view 3)
    in epoch 0, then caught up by a fetch that ended past the handover checkpoint c
    (`catch_up.on_fetch_completed` moves the watermarks to the fetched head and sends no
    CHECKPOINT for the c it crossed, and the others' CHECKPOINTs at c are below its new low
    watermark). Its stable checkpoint stays epoch 0's, so `_may_view_change` refuses every
    view of epoch 1, while the others drop its epoch-0 VIEW-CHANGE ("view-change of
    another epoch", 120 times): it is stranded for good, and a set of three, f = 0, needs
    all three: the next request halts the set. Fixed: a member that drops such a
    VIEW-CHANGE sends its sender the proof of its own stable checkpoint, if of the
    installed epoch (`handover.offer_stable_proof`), and the stranded replica adopts it
    (`handover.adopt_offered_checkpoint`), then asks for a view of the new epoch."""
    monkeypatch.setattr(cluster_module, "GROUP_COMMIT_MS", write_ms)
    run_seed(seed, 4)


def test_a_faulty_primary_replaced_on_an_idle_cluster_is_no_churn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Chaos seed 291 at N = 5 with the group-commit model at 3 ms: the cluster settles in
    view 1, whose primary poisons bodies, with the trailing empty block still owed
    (`Replica._arm_trailing_block`); the primary proposes it poisoned during the quiet
    window, and the others replace it ("invalid_block"). `check_no_churn` took that for
    churn; a view change that proves its primary faulty is not (`_faulty_primary_replaced`),
    and the cluster must settle again in the next view."""
    monkeypatch.setattr(cluster_module, "GROUP_COMMIT_MS", 3)
    cluster = run_seed(291, 5)
    assert any(node.replica is not None and node.replica.view_change_reasons["invalid_block"]
               for node in cluster.honest())
