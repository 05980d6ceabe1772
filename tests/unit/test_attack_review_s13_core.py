"""Attack review s13 (attackcore): session 13's protocol changes, on the pure core. 0eec5dd
(the commit of a block owed to the handover restarts the request timer), 9dc1a4c (once a
fetch reached nothing while the oldest request waits, a request timeout only a claimed head
excuses passes it over; reverted after this review) and 760082c (a validator voted out and
in again whose replica leaves at the new change's c looks for a join at once). Findings are
strict xfails naming the gap; the rules that held are plain tests.

Finding 1 (9dc1a4c, reverted: now a rule that holds): one fetch that failed for an ordinary
reason made every request timeout during a later, merely slow, honest fetch count as
passing the request over: a lone VIEW-CHANGE against a correct primary (f + 1 with the f
byzantine members'). Finding 2 (9dc1a4c): a fetch of a lie that imports the censor's block
before it fails (as block sync imports an honest peer's short answer) never started its
count. With 9dc1a4c reverted, the gap it was for stands (a strict xfail below: a censor
that claims heads it cannot serve is passed over by its commits only; censor simulator
seeds 369 and 619 at N = 9). The review's suggested fix for both: count the failure of a
fetch that excused a timeout (whatever it imported before), not the timeouts during a
fetch; a slow fetch that completes then counts nothing. Session 14 made it so
(`catch_up.on_fetch_failed`): the censor gap's test passes, its strict xfail mark removed."""

from __future__ import annotations

from functools import partial

from eth_hash.auto import keccak

from pbft_engine.core import (
    BlockCommitted,
    BlockValidated,
    FetchCompleted,
    FetchFailed,
    FetchProgressed,
    PeerCommitted,
    Replica,
    RequestReceived,
    SetTimer,
    TimerFired,
    TimerKind,
)
from pbft_engine.core.replica import MAX_PASSED_OVER
from pbft_engine.messages import Commit, Prepare, PrePrepare
from tests.simulation.cluster import Cluster
from tests.unit.pbft.helpers import from_peer
from tests.unit.pbft.test_pbft_epochs import V0
from tests.unit.pbft.test_pbft_request_timer import WAITING, start_replica
from tests.unit.test_replica_handover import (
    ADDED,
    PASSED_AT,
    C,
    Driven,
    backup,
    block,
    commit_through,
    digest,
)

HONEST_HEAD = (5, keccak(b"block 5, certified by the honest cluster"))


def behind_an_honest_cluster() -> Replica:
    """A backup that restarted behind the honest cluster (head 5, a real certificate) with
    WAITING pooled: the honest primary committed WAITING in block 5 already. Its first
    fetch fails for an ordinary reason (the peer it asked restarted), and the fetch it
    starts at its next request timeout is slow (a long range to execute)."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    replica.step(TimerFired(TimerKind.FAIRNESS_MARK, b""))
    replica.step(PeerCommitted(*HONEST_HEAD, b""))
    assert replica.fetching == HONEST_HEAD[0]
    replica.step(FetchFailed(HONEST_HEAD[0]))  # (the one peer asked was restarting)
    return replica


def test_a_slow_honest_fetch_after_one_failed_fetch_keeps_excusing_the_primary() -> None:
    """Finding 1 (9dc1a4c, reverted). `claim_unserved` was set by any fetch that reached nothing and
    cleared only when the oldest request changes, so once one fetch failed for an ordinary
    reason (a peer restarting: a rolling restart), every request timeout during the next
    fetch, an honest one that is merely slow (a restarted validator executing a long range;
    the core hears of it only when it ends), counts as passing the request over. Before
    9dc1a4c such a fetch excused the primary for as long as it ran (`claimed_lag`: one
    missed fetch at this head). After MAX_PASSED_OVER + 1 timeouts (18 s at the default
    2 s timeout) the backup sends a lone VIEW-CHANGE against an honest primary that
    committed the request long ago; with the f byzantine members' VIEW-CHANGEs that is
    f + 1 (`check_view_change_quorum`'s join rule), and every correct replica follows: a
    correct primary replaced. Expected: a fetch under way of a head some peer proved with
    a certificate keeps excusing the primary at least until it fails."""
    replica = behind_an_honest_cluster()
    for _ in range(MAX_PASSED_OVER + 3):
        replica.step(TimerFired(TimerKind.REQUEST, b""))
        assert replica.fetching == HONEST_HEAD[0]  # (the slow fetch, still under way)
        # (executing the long range: block sync says so, `catch_up.stalled`)
        replica.step(FetchProgressed(HONEST_HEAD[0], HONEST_HEAD[0], executing=True))
        assert replica.view == 0, f"a lone VIEW-CHANGE with passed_over={replica.passed_over}"
    replica.step(FetchCompleted(*HONEST_HEAD, keccak(b"root"), (WAITING,)))
    assert replica.view == 0 and not replica.requests


def test_before_any_fetch_failed_a_slow_fetch_excuses_the_primary_for_good() -> None:
    """Held: a fetch under way that progresses (here: executing a long range) counts
    nothing however long it takes; the request comes with the fetch and the view stays."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    replica.step(TimerFired(TimerKind.FAIRNESS_MARK, b""))
    replica.step(PeerCommitted(*HONEST_HEAD, b""))
    replica.step(FetchProgressed(HONEST_HEAD[0], HONEST_HEAD[0], executing=True))
    for _ in range(3 * MAX_PASSED_OVER):
        replica.step(TimerFired(TimerKind.REQUEST, b""))
    assert replica.view == 0 and replica.passed_over == 0
    replica.step(FetchCompleted(*HONEST_HEAD, keccak(b"root"), (WAITING,)))
    assert replica.view == 0 and not replica.requests


def rounds_until_replaced(reached_by_the_fetch: bool) -> int:
    """A censoring primary claims a head nobody holds (`unchecked_claims`: block sync's
    certificate check missing or fooled) each round, so the backup is fetching when its
    request timeout runs out, and commits a block of another transaction meanwhile. The
    backup gets that block either after its fetch failed, by the agreement (9dc1a4c's own
    unit test), or `reached_by_the_fetch`: as `BlockSync.fetch` does, whose range request
    an honest peer answers with the prefix it holds (`_import_answer`: a short answer is
    imported), so the fetch imports the block before it fails on the lie. Returns the
    rounds (commits) until the backup asks for a view change."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    replica.step(TimerFired(TimerKind.FAIRNESS_MARK, b""))
    lie = (10**9, keccak(b"a head nobody holds"))
    seq_no = 0
    while replica.view == 0 and seq_no <= 3 * MAX_PASSED_OVER:
        replica.step(PeerCommitted(*lie, b""))
        assert replica.fetching == lie[0]
        replica.step(TimerFired(TimerKind.REQUEST, b""))
        if replica.view == 0:
            seq_no += 1
            other = keccak(b"other %d" % seq_no)
            replica.step(RequestReceived(other))
            if reached_by_the_fetch:
                head = FetchCompleted(seq_no, keccak(b"block %d" % seq_no), keccak(b"root"),
                                      (other,))
                replica.step(FetchFailed(lie[0], head))
                assert replica.last_exec == seq_no
            else:
                commit_while_fetching(replica, seq_no, other, lie[0])
    return seq_no


def test_a_censor_claiming_heads_it_cannot_serve_is_judged_by_time() -> None:
    """Censor simulator seeds 369 and 619 at N = 9: a censoring primary that claims heads it
    cannot serve keeps every backup fetching when its request timer runs out, so each
    timeout is excused, and commits other blocks in between, so each claim is believed
    afresh: only the commits that pass the censored request over count, each as slow as a
    request timeout and a stalled fetch make it (369: 9 commits over 10.5 s, the request
    committed past its bound). Expected: replaced once more than MAX_PASSED_OVER timeouts
    and commits together passed it over, whether the lie's fetches import the censor's
    blocks (finding 2's way, as block sync imports an honest peer's prefix) or not.
    Fixed in session 14 (was a strict xfail): the failure of each fetch that excused a
    request timeout passes the oldest request over, as a commit does, whatever the fetch
    imported first (`catch_up.on_fetch_failed`)."""
    expected = (MAX_PASSED_OVER + 2) // 2
    assert rounds_until_replaced(reached_by_the_fetch=False) <= expected
    assert rounds_until_replaced(reached_by_the_fetch=True) <= expected


def commit_while_fetching(replica: Replica, seq_no: int, tx: bytes, target: int) -> None:
    """Block `seq_no` of `tx` is agreed while this replica fetches `target`, and committed
    here once that fetch has failed."""
    block = b"block %d" % seq_no
    digest = keccak(block)
    replica.step(from_peer(PrePrepare(0, seq_no, digest, 0), (block,)))
    replica.step(FetchFailed(target))
    replica.step(BlockValidated(seq_no, digest, True))
    for peer in (1, 3):
        replica.step(from_peer(Prepare(0, seq_no, digest, peer)))
    for peer in (0, 1):
        replica.step(from_peer(Commit(0, seq_no, digest, peer)))
    if replica.fetching is not None:  # (the claim draws it into a fetch again)
        replica.step(FetchFailed(replica.fetching))
    replica.step(BlockCommitted(seq_no, digest, keccak(digest), (tx,)))
    assert replica.last_exec == seq_no


# --- change 1 (0eec5dd): owed blocks restart the request timer -----------------------------


def request_timer_restarted(driven: Driven, last: int) -> bool:
    since = len(driven.actions)
    commit_through(driven, last)
    return any(isinstance(a, SetTimer) and a.kind is TimerKind.REQUEST
               for a in driven.actions[since:])


def test_an_owed_empty_block_restarts_the_timer_only_as_a_commit_passing_the_request_over(
) -> None:
    """Held: a censoring primary at a handover cannot keep a backup's timer going with the
    empty blocks it owes (up to c + 1). Each one restarts the timer but, past the fairness
    mark, passes the waiting request over, so the MAX_PASSED_OVER bound on commits that
    pass it over holds for them as for any other (the counter is pushed to its bound here:
    a handover owes fewer blocks than that)."""
    driven = backup(2, ADDED)
    driven.step(RequestReceived(WAITING))
    driven.step(TimerFired(TimerKind.FAIRNESS_MARK, b""))
    assert request_timer_restarted(driven, PASSED_AT + 1)
    assert driven.replica.passed_over == 1  # (past the mark: it passed the request over)
    driven.replica.passed_over = MAX_PASSED_OVER  # (as if the censor had passed it over more)
    n = C  # (owed too: up to c)
    driven.receive(PrePrepare(0, n, digest(n), 0), V0, (block(n),))
    for i in (1, 3):
        driven.receive(Prepare(0, n, digest(n), i), V0)
    since = len(driven.actions)
    for i in (0, 1, 3):
        driven.receive(Commit(0, n, digest(n), i), V0)
    assert driven.replica.last_exec == C and driven.replica.passed_over > MAX_PASSED_OVER
    assert not any(isinstance(a, SetTimer) and a.kind is TimerKind.REQUEST
                   for a in driven.actions[since:])
    assert driven.replica.request_timer_armed  # (the timer armed before still runs out)


# --- change 3 (760082c): voted out and in again --------------------------------------------


def voted_out_and_in(cluster: Cluster, changes: tuple[tuple[int, bool], ...]) -> None:
    """Validator 0 votes validator 1 in, out and in again (`changes`: when, add) while
    transfers flow, as test_simulation's voted-out-and-in-again scenario."""
    for i in range(40):
        cluster.at(100 * i, partial(cluster.submit, b"transfer %d" % i))
    for when, add in changes:
        cluster.at(when, partial(cluster.vote, 1, add))


def settled_with(cluster: Cluster, epochs: int) -> bool:
    """All `epochs` scheduled, the last installed on both nodes (each holds its first
    block), validator 1 voting, every transfer committed on both."""
    schedule = cluster.epochs.schedule.epochs
    return len(schedule) == epochs and cluster.nodes[1].replica is not None and all(
        len(node.chain.blocks) >= schedule[-1].first for node in cluster.nodes) and all(
        cluster.committed(tx) == 2 for tx in cluster.registry)


def test_a_crash_between_leaving_and_joining_again_rejoins_without_a_fork() -> None:
    """Held: validator 1, voted out and in again, crashes the moment its replica leaves
    (before the engine's join, 760082c), and restarts 100 ms later from the old replica's
    records (`PbftEngine.start` restores them: META_STATE is never cleared on leaving).
    It votes again, every transfer commits on both, and nothing forks."""
    cluster = Cluster(1, spare=1)
    voted_out_and_in(cluster, ((500, True), (1000, False), (1100, True)))
    assert cluster.run_until(lambda: cluster.seen["left the set"] >= 1, 20_000)
    cluster.crash_for(1, 100)
    assert cluster.run_until(lambda: settled_with(cluster, 4), 30_000)
    cluster.check_safety()
    assert cluster.nodes[1].replica is not None


def test_a_validator_voted_out_and_in_twice_rejoins_each_time() -> None:
    """Held: out and in, twice (Q 1 -> 2 -> 1 -> 2 -> 1 -> 2), each re-add passed before
    the removal's handover; validator 1 leaves and joins again each time, and nothing
    forks."""
    cluster = Cluster(1, spare=1)
    voted_out_and_in(cluster, ((500, True), (1000, False), (1100, True), (1600, False),
                               (1700, True)))
    assert cluster.run_until(lambda: settled_with(cluster, 6), 30_000)
    cluster.check_safety()
    assert cluster.seen["left the set"] == 2 and cluster.seen["joined the set"] == 3
