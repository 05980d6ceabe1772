"""Attack review of ccbb6cc (session 10): a head only a peer proved excused at most two
request timeouts in a row at the same head (`catch_up.claimed_lag`), while f+1 matching
checkpoints above the head (`CheckpointTracker.vouched_above`) excuse with no limit.

Leads: (a) an honest fetch slower than the timers then suspects a correct primary: real,
fixed (past those two timeouts, a claimed head excuses the primary until two fetches in a
row have failed at this head, however long each takes; the simulator's
`test_replicas_catching_up_slower_than_the_timers_replace_no_primary` is the cluster-wide
side: f+1 such replicas replaced a correct primary, f asked alone for a view and stayed out
of the quorum). (b) one faulty peer counted as f+1 in `vouched_above`: held (the tally
holds one CHECKPOINT per replica index and height, and a validator-set change checks the
held ones again with the set deciding them). (c) the liar with the fix: it holds each fetch
as long as block sync lets it, and is believed for two timeouts or two fetches at a head
(each of which excused a timeout, since session 14), whichever lasts longer, no more; since
session 17 a fetch that waits on peers without progress longer than block sync waits for
one answer excuses no more (`catch_up.stalled`), and an honest slow one reports its
progress (`FetchProgressed`).

One replica driven event by event (`test_attack_review_core7`'s backup V0[1] at block 8,
K = 10, W = 4: the window is (0, 40]; a transfer waits, so its request timer times V0[0]).
"""

from __future__ import annotations

from eth_hash.auto import keccak

from pbft_engine.core import (
    FetchCompleted,
    FetchFailed,
    FetchProgressed,
    PeerCommitted,
    ScheduleChange,
    TimerFired,
    TimerKind,
)
from pbft_engine.core.catch_up import lagging, stalled_after
from pbft_engine.messages import Checkpoint, ViewChange
from tests.unit.pbft.test_pbft_epochs import ADDED, V0
from tests.unit.test_attack_review_core7 import LIE, backup_with_a_waiting_request
from tests.unit.test_replica_handover import PASSED_AT, Driven, digest, state

REQUEST_TIMEOUT = TimerFired(TimerKind.REQUEST, b"")


def times_out(driven: Driven, times: int) -> None:
    for _ in range(times):
        driven.step(REQUEST_TIMEOUT)


# --- (a) a fetch slower than the timers -------------------------------------------------------


def test_a_fetch_slower_than_the_timers_does_not_suspect_the_primary() -> None:
    """Lead (a), real: a peer proves head 11, three blocks above V0[1] (no checkpoint
    vouches for it: fewer than K), and the fetch takes six request timeouts (large blocks
    on a slow link, a slow machine). Since ccbb6cc the third timeout asked for a view change
    while the fetch was still under way: an honest lag blamed on a correct primary. Once
    the fetch completes the wait is the primary's again."""
    driven = backup_with_a_waiting_request()
    driven.step(PeerCommitted(PASSED_AT + 3, digest(PASSED_AT + 3), b""))
    assert driven.replica.fetching == PASSED_AT + 3
    for seq_no in range(PASSED_AT + 1, PASSED_AT + 3):  # (a large block each, slow link)
        times_out(driven, 1)
        driven.step(FetchProgressed(PASSED_AT + 3, seq_no, executing=False))
    driven.step(FetchProgressed(PASSED_AT + 3, PASSED_AT + 3, executing=True))
    times_out(driven, 4)  # (a slow machine executing the last)
    assert not driven.sent(ViewChange), "an honest catch-up blamed on the primary"
    driven.step(FetchCompleted(PASSED_AT + 3, digest(PASSED_AT + 3), state(PASSED_AT + 3), ()))
    driven.step(REQUEST_TIMEOUT)
    assert driven.sent(ViewChange)


def test_a_failed_fetch_that_imported_blocks_is_progress() -> None:
    """A fetch that fails part-way moved the head: the two failures it takes to stop
    believing a claim are counted afresh at the new head. (It imports, then the liar holds
    it a timeout: block sync's hedge, `sync.HEDGE_AFTER_S`, bounds the hold.)"""
    driven = backup_with_a_waiting_request()
    for head in (PASSED_AT + 2, PASSED_AT + 4):
        driven.step(PeerCommitted(*LIE, b""))
        driven.step(FetchFailed(LIE[0]))
        reached = FetchCompleted(head, digest(head), state(head), ())
        driven.step(PeerCommitted(*LIE, b""))
        times_out(driven, 1)
        driven.step(FetchProgressed(LIE[0], head, executing=False))
        times_out(driven, 1)
        driven.step(FetchFailed(LIE[0], reached))
    assert driven.replica.last_exec == PASSED_AT + 4
    assert not driven.sent(ViewChange)


def test_fetches_that_fail_fast_get_their_retries_within_two_timeouts() -> None:
    """Two fetches of a proved head fail at once (no peer served the range: the
    simulator's flaky block sync, honest seed 206 at N = 7), and the third is under way
    when the request timer runs out: it excuses the primary for as long as it runs, as a
    first fetch does. Until session 14 the two fast failures counted, so the third timeout
    at the same head asked for a view change while that fetch was still under way (honest
    seed 776 at N = 5: a lone VIEW-CHANGE of a laggard whose slow fetch then moved its
    head); now only the failures of fetches that excused a timeout count, and two of them
    forget the head."""
    driven = backup_with_a_waiting_request()
    head = (PASSED_AT + 3, digest(PASSED_AT + 3))
    for _ in range(2):
        driven.step(PeerCommitted(*head, b""))
        driven.step(FetchFailed(head[0]))
    driven.step(PeerCommitted(*head, b""))
    assert driven.replica.fetching == head[0]
    driven.step(FetchProgressed(head[0], head[0], executing=True))  # (slow: it progresses)
    times_out(driven, 4)
    assert not driven.sent(ViewChange)
    driven.step(FetchFailed(head[0]))
    times_out(driven, 1)  # (fetches again)
    driven.step(FetchFailed(head[0]))
    assert not driven.sent(ViewChange)
    driven.step(REQUEST_TIMEOUT)
    assert driven.sent(ViewChange)


# --- (c) the liar, with the fix ----------------------------------------------------------------


def test_a_liar_holding_each_fetch_for_timeouts_is_believed_for_two_fetches() -> None:
    """The liar of finding 2 (core7) holds each fetch of its unprovable head three request
    timeouts (as long as block sync waits for its answer), then the fetch fails, and it
    claims again at once. The first two fetches excuse the primary while under way; from
    the second failure on (two timeouts past), a claim excuses nothing, and the next
    timeout suspects the primary although a third fetch is under way. (Since session 17 a
    fetch that waits on peers longer than block sync waits for one answer excuses no more,
    `catch_up.stalled`: three timeouts are below that.)"""
    driven = backup_with_a_waiting_request()
    for _ in range(2):
        driven.step(PeerCommitted(*LIE, b""))
        times_out(driven, 3)
        driven.step(FetchFailed(LIE[0]))
    assert not driven.sent(ViewChange)
    driven.step(PeerCommitted(*LIE, b""))
    assert driven.replica.fetching == LIE[0]
    driven.step(REQUEST_TIMEOUT)
    assert driven.sent(ViewChange)


def test_a_fetch_waiting_on_peers_past_block_syncs_timeout_suspects_the_primary() -> None:
    """A fetch of a claimed head that waits on peers with no progress across more request
    timeouts than block sync waits for one answer (`catch_up.stalled_after`: f byzantine
    peers asked in turn) excuses no more: the next timeout suspects the primary with the
    fetch still under way."""
    driven = backup_with_a_waiting_request()
    driven.step(PeerCommitted(*LIE, b""))
    times_out(driven, stalled_after(driven.replica.params))
    assert not driven.sent(ViewChange)
    times_out(driven, 1)
    assert driven.sent(ViewChange) and driven.replica.fetching == LIE[0]


# --- (b) one faulty peer counted as f+1 checkpoints ----------------------------------------------


def test_one_peer_s_checkpoints_never_vouch_for_a_head() -> None:
    """Lead (b), held: V0[3] (faulty; f + 1 = 2) sends CHECKPOINTs of a block nobody
    executed at 20 (inside V0[1]'s window), again, at 50 (above it), and at both again
    once the change to ADDED passed in block 8 capped the window at c = 10 (the one way a
    height inside the window goes above it), signed for the new set. Each height's tally
    holds it once: nothing vouches for a head above V0[1], so it does not lag, and its
    request timer suspects the primary. (A second member's CHECKPOINT would vouch.)"""
    driven = backup_with_a_waiting_request()
    fake = keccak(b"a block nobody executed")
    for seq_no in (20, 20, 50):
        driven.receive(Checkpoint(seq_no, fake, fake, 3), V0)
    driven.step(ScheduleChange(ADDED, PASSED_AT))
    assert driven.replica.high_watermark == 10
    for seq_no in (20, 50):
        driven.receive(Checkpoint(seq_no, fake, fake, 3), ADDED)
    assert driven.replica.checkpoints.vouched_above(PASSED_AT) is None
    assert not lagging(driven.replica)
    driven.step(REQUEST_TIMEOUT)
    assert driven.sent(ViewChange)
    driven.receive(Checkpoint(50, fake, fake, 0), ADDED)
    assert driven.replica.checkpoints.vouched_above(PASSED_AT) == (50, fake, fake)
