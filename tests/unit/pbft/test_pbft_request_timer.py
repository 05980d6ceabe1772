"""The request timer under real load (issue 12), on one replica driven event by event: it
runs only for executable transactions, escalates with consecutive view changes, resets on a
commit, and still runs out on a primary that keeps leaving one transaction out."""

from __future__ import annotations

from eth_hash.auto import keccak

from pbft_engine.core import (
    Action,
    BlockCommitted,
    BlockValidated,
    CancelTimer,
    ChainHead,
    CommitBlock,
    FetchCommitted,
    FetchCompleted,
    Mode,
    PeerCommitted,
    RelayRequests,
    Replica,
    RequestDropped,
    RequestReceived,
    SetTimer,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.core.records import u64
from pbft_engine.core.replica import FAIR_BLOCK_TRANSACTIONS, MAX_PASSED_OVER
from pbft_engine.messages import (
    Checkpoint,
    Commit,
    KeyVerifier,
    NewView,
    Prepare,
    PrePrepare,
    ViewChange,
)
from tests.unit.pbft.helpers import AUTH, GENESIS, PARAMS, SIGNERS, from_peer

ME = 2  # never the primary of views 0 and 1
WAITING = keccak(b"the transaction a censoring primary leaves out")


def start_replica(me: int = ME) -> Replica:
    replica = Replica(PARAMS, me, SIGNERS[me], KeyVerifier(), ChainHead(0, GENESIS),
                      block_digest=keccak)
    replica.start()
    return replica


def request_timer(actions: list[Action]) -> int | None:
    """The duration the request timer was (re)armed with in these actions, if it was."""
    armed = [a.duration_ms for a in actions
             if isinstance(a, SetTimer) and a.kind is TimerKind.REQUEST]
    return armed[-1] if armed else None


def commit_block(
    replica: Replica, seq_no: int, txs: tuple[bytes, ...], imported: bytes | None = None
) -> list[Action]:
    """Primary 0 proposes a block of `txs`; the others prepare and commit it; returns the
    actions of the step that reports the block committed (as `imported`, if given)."""
    block = b"block %d with %d transactions" % (seq_no, len(txs))
    digest = keccak(block)
    actions = replica.step(from_peer(PrePrepare(0, seq_no, digest, 0), (block,))).actions
    assert any(isinstance(a, ValidateBlock) for a in actions)
    replica.step(BlockValidated(seq_no, digest, True))
    for peer in (1, 3):
        replica.step(from_peer(Prepare(0, seq_no, digest, peer)))
    for peer in (0, 1):
        actions = replica.step(from_peer(Commit(0, seq_no, digest, peer))).actions
    assert any(isinstance(a, CommitBlock) for a in actions)
    return replica.step(BlockCommitted(seq_no, imported or digest, keccak(digest), txs)).actions


def test_a_dropped_request_stops_the_timer() -> None:
    """A replaced, evicted or priced-out transaction no longer holds the primary to account."""
    replica = start_replica()
    waiting = replica.step(RequestReceived(WAITING)).actions
    assert request_timer(waiting) == PARAMS.request_timeout_ms
    actions = replica.step(RequestDropped(WAITING)).actions
    assert CancelTimer(TimerKind.REQUEST, b"") in actions
    replica.step(TimerFired(TimerKind.REQUEST, b""))  # a firing already on its way
    assert replica.view == 0 and replica.active and not replica.view_change_reasons


def test_commits_restart_the_timer_while_the_oldest_request_is_served() -> None:
    replica = start_replica()
    queue = [keccak(b"queued %d" % i) for i in range(3 * (MAX_PASSED_OVER + 2))]
    for tx in queue:
        replica.step(RequestReceived(tx))
    for seq_no, start in enumerate(range(0, len(queue), 3), start=1):
        actions = commit_block(replica, seq_no, tuple(queue[start:start + 3]))
        if start + 3 < len(queue):
            assert request_timer(actions) == PARAMS.request_timeout_ms
    assert not replica.requests and replica.view == 0


def test_a_primary_that_keeps_passing_over_a_request_is_replaced() -> None:
    """Censorship: blocks of transactions that arrived after the oldest waiting request's
    fairness mark (by then it has reached the primary) stop restarting the timer once they
    have passed it over MAX_PASSED_OVER times."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    replica.step(TimerFired(TimerKind.FAIRNESS_MARK, b""))
    others = [keccak(b"other %d" % i) for i in range(MAX_PASSED_OVER + 1)]
    for tx in others:
        replica.step(RequestReceived(tx))
    restarts = [request_timer(commit_block(replica, n, (tx,)))
                for n, tx in enumerate(others, start=1)]
    assert restarts == [PARAMS.request_timeout_ms] * MAX_PASSED_OVER + [None]
    replica.step(RequestReceived(keccak(b"late")))  # keeps the timer, does not restart it
    replica.step(TimerFired(TimerKind.REQUEST, b""))
    assert replica.view == 1 and not replica.active
    assert replica.view_change_reasons == {"request_timeout": 1}


def test_a_burst_the_primary_received_first_is_not_censorship() -> None:
    """In a burst, what the primary received before the oldest request here reached it
    goes first, however many blocks that takes: transactions that arrived here before the
    oldest one's fairness mark never count as passing it over (an honest 600-transaction
    burst at N = 4 passed one request over 15 times and replaced its primary)."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    blocks = 3 * MAX_PASSED_OVER  # of FAIR_BLOCK_TRANSACTIONS each: the burst in full blocks
    burst = [keccak(b"burst %d" % i) for i in range(blocks * FAIR_BLOCK_TRANSACTIONS)]
    for tx in burst:
        replica.step(RequestReceived(tx))
    replica.step(TimerFired(TimerKind.FAIRNESS_MARK, b""))
    size = FAIR_BLOCK_TRANSACTIONS
    restarts = [request_timer(commit_block(replica, n + 1, tuple(burst[n * size:][:size])))
                for n in range(blocks)]
    assert restarts == [PARAMS.request_timeout_ms] * blocks
    assert replica.passed_over == 0


def view_change_quorum(replica: Replica, view: int) -> list[Action]:
    actions: list[Action] = []
    for peer in [p for p in (1, 2, 3) if p != replica.epochs.current.primary(view)][:2]:
        actions += replica.step(from_peer(ViewChange(view, 0, (), (), (), peer))).actions
    return actions


def new_view_timer(actions: list[Action], view: int) -> int:
    (armed,) = [a.duration_ms for a in actions if isinstance(a, SetTimer)
                and a.kind is TimerKind.NEW_VIEW and a.key == u64(view)]
    return armed


def test_timeouts_double_per_view_change_without_a_commit_and_reset_on_commit() -> None:
    """Castro & Liskov 4.5.2: each view change without a commit doubles the request timeout
    (the new primary of a slow cluster gets longer), the new-view timeout from the second."""
    replica = start_replica(0)  # not the primary of views 1 to 3; it joins f+1 others
    replica.step(RequestReceived(WAITING))
    base = PARAMS.new_view_timeout_ms
    assert new_view_timer(view_change_quorum(replica, 1), 1) == base
    for view, expected in ((2, 2 * base), (3, 4 * base)):
        replica.step(TimerFired(TimerKind.NEW_VIEW, u64(view - 1)))
        assert replica.view == view
        assert new_view_timer(view_change_quorum(replica, view), view) == expected
    assert replica.view_change_reasons == {"join": 1, "new_view_timeout": 2}
    assert PARAMS.escalated(base, 40) == PARAMS.new_view_timeout_cap_ms
    # A block committed meanwhile (fetched from peers) is progress: back to T.
    actions = replica.step(PeerCommitted(1, keccak(b"block 1"), b"")).actions
    assert any(isinstance(a, FetchCommitted) for a in actions)
    replica.step(FetchCompleted(1, keccak(b"block 1"), keccak(b"root"), (WAITING,)))
    assert replica.views_without_commit == 0
    replica.step(TimerFired(TimerKind.NEW_VIEW, u64(3)))
    assert replica.view == 4 and replica.views_without_commit == 1


def test_the_request_timeout_doubles_for_the_next_primary() -> None:
    """A primary replaced for slowness hands a cluster whose rounds may be slow: its
    successor gets twice the time for its first block."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    replica.step(TimerFired(TimerKind.REQUEST, b""))
    votes = tuple(AUTH.sign(ViewChange(1, 0, (), (), (), r), SIGNERS[r]) for r in (0, 2, 3))
    actions = replica.step(from_peer(NewView(1, votes, (), 1))).actions
    assert replica.view == 1 and replica.active
    assert request_timer(actions) == 2 * PARAMS.request_timeout_ms


def test_the_replicas_own_validation_time_is_not_held_against_the_primary() -> None:
    """The timer restarts when the primary's PRE-PREPARE arrives and again when this
    replica has validated the block: a slow validation here is not a slow primary."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    block = b"block 1"
    actions = replica.step(from_peer(PrePrepare(0, 1, keccak(block), 0), (block,))).actions
    assert request_timer(actions) == PARAMS.request_timeout_ms
    actions = replica.step(BlockValidated(1, keccak(block), True)).actions
    assert request_timer(actions) == PARAMS.request_timeout_ms


def test_a_timer_that_runs_out_while_this_replica_still_validates_is_rearmed() -> None:
    """A block this replica takes longer to validate than the request timeout (a slow or
    loaded machine; seen in CI on a 3,000-transfer burst): the timer fires mid-validation,
    and the replica waits for its own work instead of asking for a view change alone."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    block = b"block 1"
    actions = replica.step(from_peer(PrePrepare(0, 1, keccak(block), 0), (block,))).actions
    assert any(isinstance(a, ValidateBlock) for a in actions)
    actions = replica.step(TimerFired(TimerKind.REQUEST, b"")).actions
    assert replica.view == 0 and replica.active and not replica.view_change_reasons
    assert request_timer(actions) == PARAMS.request_timeout_ms
    replica.step(BlockValidated(1, keccak(block), True))
    replica.step(TimerFired(TimerKind.REQUEST, b""))  # validated, and still no block: blame
    assert replica.view == 1 and replica.view_change_reasons == {"request_timeout": 1}


def test_checkpoints_of_f_plus_1_peers_above_the_head_are_this_replicas_lag() -> None:
    """A restarted replica replays the blocks the cluster committed while it was down,
    passing over the requests it pooled meanwhile (so commits stop restarting the timer).
    When the timer runs out between two blocks, f+1 peers' checkpoints above its head prove
    the primary is committing: it fetches up to them instead of changing view alone (it did
    on a real testnet: view 2 on its own, its votes lost to the others in view 1)."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    block_hash, state_root = keccak(b"block 10"), keccak(b"state 10")
    replica.step(from_peer(Checkpoint(10, block_hash, state_root, 0)))
    actions = replica.step(TimerFired(TimerKind.REQUEST, b"")).actions
    assert replica.view == 1, "one checkpoint vouches for nothing: a faulty peer could lie"
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    for peer in (0, 1):
        replica.step(from_peer(Checkpoint(10, block_hash, state_root, peer)))
    actions = replica.step(TimerFired(TimerKind.REQUEST, b"")).actions
    assert replica.view == 0 and replica.active and not replica.view_change_reasons
    assert FetchCommitted(10, block_hash, state_root) in actions
    assert request_timer(actions) == PARAMS.request_timeout_ms


def test_a_peer_head_proved_while_this_replica_was_busy_is_fetched_afterwards() -> None:
    """Block sync's STATUS answer arrives mid-validation: the replica does not fetch then
    (the block it validates may be the one it lacks), but it must not forget the head
    either, or it sits idle behind the cluster until its timer blames the primary."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    block = b"block 1"
    replica.step(from_peer(PrePrepare(0, 1, keccak(block), 0), (block,)))
    head = keccak(b"block 6")
    actions = replica.step(PeerCommitted(6, head, b"")).actions
    assert not any(isinstance(a, FetchCommitted) for a in actions)
    actions = replica.step(BlockValidated(1, keccak(block), True)).actions
    assert FetchCommitted(6, head, b"") in actions
    actions = replica.step(TimerFired(TimerKind.REQUEST, b"")).actions
    assert replica.view == 0 and replica.active and not replica.view_change_reasons


def relayed(actions: list[Action]) -> list[RelayRequests]:
    return [a for a in actions if isinstance(a, RelayRequests)]


def test_a_backup_relays_what_it_waits_for_to_the_primary() -> None:
    """A request gossip never delivered to the primary (a link down, a full queue) would cost
    a view change; the backup relays the oldest waiting requests to the primary when it
    starts timing it (Castro & Liskov 4.1), and again halfway through the timeout in case
    that relay was lost, then to the next primary. The primary relays nothing."""
    replica = start_replica()
    first = replica.step(RequestReceived(WAITING)).actions
    assert relayed(first) == [RelayRequests(0, (WAITING,))]
    assert SetTimer(TimerKind.RELAY, b"", PARAMS.request_timeout_ms // 2) in first
    later = keccak(b"a later request")
    assert relayed(replica.step(RequestReceived(later)).actions) == []  # already timing
    halfway = replica.step(TimerFired(TimerKind.RELAY, b"")).actions
    assert relayed(halfway) == [RelayRequests(0, (WAITING, later))]
    assert replica.view == 0 and replica.request_timer_armed
    others = [keccak(b"other %d" % i) for i in range(8)]
    for tx_hash in others:
        replica.step(RequestReceived(tx_hash))
    actions = commit_block(replica, 1, (WAITING,))  # restarts at the block and its commit
    assert relayed(actions) == [RelayRequests(0, (others[2],))]  # the new fourth oldest
    assert replica.relayed == {later, *others[:3]}
    replica.step(TimerFired(TimerKind.REQUEST, b""))
    votes = tuple(AUTH.sign(ViewChange(1, 0, (), (), (), r), SIGNERS[r]) for r in (0, 2, 3))
    actions = replica.step(from_peer(NewView(1, votes, (), 1))).actions
    assert relayed(actions) == [RelayRequests(1, (later, *others[:3]))]
    primary = start_replica(0)
    assert relayed(primary.step(RequestReceived(WAITING)).actions) == []


def test_the_primary_runs_no_request_timer() -> None:
    """Only backups time the primary (Castro & Liskov 4.4); a primary that timed itself
    would abandon its own view while its block was still being validated."""
    primary = start_replica(0)
    assert request_timer(primary.step(RequestReceived(WAITING)).actions) is None
    assert not primary.request_timer_armed


def test_the_block_time_budget_leaves_the_round_room_in_the_timer() -> None:
    assert 0 < PARAMS.block_time_budget_ms <= PARAMS.request_timeout_ms // 4


def test_a_halted_replica_reports_halted() -> None:
    """The chain imported another block than the certified one: the replica halts, and its
    status says so (it used to report normal)."""
    replica = start_replica()
    commit_block(replica, 1, (), imported=keccak(b"another block"))
    assert replica.halted and replica.mode is Mode.HALTED
