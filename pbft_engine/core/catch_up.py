"""Falling behind and catching up: when a replica is behind the cluster (a request timer
that runs out then says nothing about the primary), which head peers proved, and the fetch
of certified blocks the adapter runs for it (`FetchCommitted` -> `FetchCompleted` /
`FetchFailed`; `PeerCommitted` from block sync's STATUS answers and announcements).
Functions of the replica (`core.replica` calls them; its state is the replica's), as in
`core.handover`. Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pbft_engine.core.actions import FetchCommitted
from pbft_engine.core.events import FetchCompleted, FetchFailed, FetchProgressed, PeerCommitted
from pbft_engine.core.new_view import join_certified_view
from pbft_engine.core.params import FETCH_ANSWER_WAIT_MS
from pbft_engine.core.status import MAX_PASSED_OVER
from pbft_engine.errors import MessageError

if TYPE_CHECKING:
    from pbft_engine.core.params import EngineParams
    from pbft_engine.core.replica import Replica

FORGOTTEN_AFTER = 2  # fetches in a row that reach nothing of a claimed head forget it
# Excused request timeouts a fetch may wait on peers without moving its head (`stalled`),
# beyond those that fire while block sync waits for one answer (FETCH_ANSWER_WAIT_MS: five
# 2 s request timeouts, six if the timer's phase lines up), so an honest answer block sync
# would still take (a slow link: the simulator's ranges taking five timeouts to arrive) is
# never cut; the timeouts it waited count when the fetch ends (`stall_count`).
STALL_MARGIN = 2


def stalled_after(params: EngineParams) -> int:
    """The cut in request timeouts at this chain's request timeout: 7 at the default 2 s, 12
    at 1 s (a constant 7 cut an answer block sync still waited for at the 8th of 10: the
    attack review s17-censor, finding 4)."""
    return -(-FETCH_ANSWER_WAIT_MS // params.request_timeout_ms) + STALL_MARGIN


def busy(replica: Replica) -> bool:
    """A block is being built, validated (in this view: an older view's validation no
    longer holds anything up) or executed here: it may be exactly the block the peers
    are ahead by, and executing it again after a fetch would be wasted."""
    return (replica.executing is not None or replica.building is not None
            or any(slot.validating for (view, _), slot in replica.log.certs.items()
                   if view == replica.view))


def lagging(replica: Replica) -> bool:
    """This replica is behind the cluster, so a request timer that runs out says nothing
    about the primary: it is catching up or still validating or executing a block (a
    slow or loaded machine), it holds the certificate of its next block (whose body it
    may still be fetching), f+1 replicas vouch for a checkpoint above it, or a peer proved
    a head above it (`claimed_lag`: two timeouts, or two failed fetches). Not a certificate
    beyond a gap, which a view change may be needed to fill. (A restarted replica replays
    such blocks, passing over the requests it pooled meanwhile, so its commits soon stop
    restarting the timer.)"""
    if replica.checkpoints.vouched_above(replica._certified_run_end()) is not None:
        return True  # f+1 replicas executed past this one: one faulty peer cannot fake that
    # Anything else excuses the primary only while it does not keep passing over the oldest
    # request: a censoring primary that keeps this replica busy with other blocks, or
    # whose blocks move its head while a peer claims a head above, is replaced all the same.
    return replica.passed_over <= MAX_PASSED_OVER and (
        claimed_lag(replica) or busy(replica)
        or replica._certified_run_end() > replica.last_exec)


def claimed_lag(replica: Replica) -> bool:
    """A fetch under way, or a head a peer proved with its certificate, excuses the primary
    for `FORGOTTEN_AFTER` request timeouts in a row at this replica's head (`excuse`), and
    beyond them until as many fetches in a row have failed there, each after it excused a
    timeout (`missed_fetch`): then only real progress excuses it again. Fetches that fail
    fast (no peer served a range) get their retries within the timeouts, and count only
    once a timeout relied on one; a fetch slower than the timers (large blocks, a
    slow link or machine) ends by moving the head, while one of a head no peer can serve
    fails once block sync has asked every peer (it waits for each answer a bounded time).
    Counting timeouts alone made f+1 correct replicas catching up slowly together replace
    a correct primary, and fewer ask alone for a view. The certificate is block sync's to
    check; a peer that tells an unprovable head again once per timeout (and serves it
    slowly) must not shield a censoring primary for good, as forgetting the head after two
    failed fetches alone did (it only applies between two claims). So Sawtooth PBFT
    (node.rs `catchup`) stops its idle timeout only while it commits a block a verified
    seal proves, and Fabric v0.6 (pbft-core.go `weakCheckpointSetOutOfRange`) stops the
    view-change timer for a state transfer only to a checkpoint f+1 replicas vouch for,
    never to one replica's word.

    A fetch under way excuses timeouts only while it makes progress (`stalled`): one that
    waited on peers for `stalled_after` excused timeouts without moving its head excuses
    no more, and those it waited count when it ends (`stall_count`). A censoring primary
    that withholds its COMMITs holds the only certificates of its newest blocks, so its
    claims pass block sync's check and no correct peer can serve them; its f peers each
    held a fetch of one for block sync's 10 s, so a fetch excused every timeout and the
    backup suspected the censor at its 34th request timeout (the attack review s14-core,
    findings 1 and 2; now the 12th)."""
    if stalled(replica):
        return False
    if replica.fetching is None and proved_head(replica) is None:
        return False
    return min(at_head(replica, replica.excused),
               at_head(replica, replica.missed_fetches)) < FORGOTTEN_AFTER


def stalled(replica: Replica) -> bool:
    """The fetch under way waited on peers across `stalled_after` excused request timeouts
    without moving its head (`on_fetch_progressed`): the lag is no longer this replica's
    own. Sawtooth PBFT (node.rs `catchup`) stops its idle timeout only while it commits the
    blocks a seal proves, one at a time, and Fabric v0.6's state transfer stops the
    view-change timer only while it moves toward a checkpoint f+1 vouch for: progress, not
    a transfer merely under way. A correct replica far behind imports a block every answer,
    and executing what it holds is its own work (`executing`, as `busy`), so a slow machine
    or large blocks stay excused; block sync asks the next peer once the first is slow
    (`sync.HEDGE_AFTER_S`), so an honest fetch waits on a slow or byzantine peer about half
    a request timeout, and one whose only answer is slow (its own link) waits at most
    block sync's 10 s, below the cut."""
    return (replica.fetching is not None and not replica.fetch_executing
            and replica.fetch_stalled >= stalled_after(replica.params))


def stall_count(replica: Replica) -> int:
    """The fetch under way ended: the timeouts it excused while stalled, which pass the
    oldest request over as commits do (counted from its fairness mark), so that a fetch a
    byzantine peer holds just short of the cut and then fails or serves counts for the time
    it held. Clears the stall."""
    counted, replica.fetch_stalled, replica.fetch_executing = replica.fetch_stalled, 0, False
    return counted if replica.fair_mark is not None else 0


def on_fetch_progressed(replica: Replica, event: FetchProgressed) -> None:
    """Block sync executes an answer (the stall pauses), or waits for peers again at a head
    that may have moved (progress: the stall starts afresh). A report for another fetch,
    whose task outlived the replica that asked for it, is not this one's."""
    if replica.fetching != event.target_seq_no:
        return
    replica.fetch_executing = event.executing
    if not event.executing and event.seq_no > replica.fetch_reached:
        replica.fetch_reached, replica.fetch_stalled = event.seq_no, 0


def at_head(replica: Replica, count: tuple[int, int]) -> int:
    """A (head, count) tally's count, if kept at this replica's head (else 0)."""
    head, counted = count
    return counted if head == replica.last_exec else 0


def excuse(replica: Replica) -> None:
    """A request timeout was put down to this replica's lag: count it at this head, fetch up
    to the head peers proved, and mark the fetch under way (begun before or now) as one
    that excused a timeout: if it fails, the timeout it excused was not this replica's lag
    after all, and `on_fetch_failed` counts it. A fetch that was already waiting on peers
    is one timeout nearer its stall (`stalled`), unless this replica's own work (`busy`,
    or executing what the fetch holds) held it up."""
    replica.excused = (replica.last_exec, at_head(replica, replica.excused) + 1)
    if replica.fetching is not None and not (replica.fetch_executing or busy(replica)):
        replica.fetch_stalled += 1
    catch_up(replica)
    replica.fetch_excused = replica.fetching is not None


def missed_fetch(replica: Replica) -> int:
    """A fetch that excused a request timeout imported nothing: count it at this head.
    Returns the fetches in a row that failed there."""
    replica.missed_fetches = (replica.last_exec, at_head(replica, replica.missed_fetches) + 1)
    return replica.missed_fetches[1]


def proved_head(replica: Replica) -> tuple[int, bytes, bytes] | None:
    """The highest head above this replica's certified run that peers proved: a peer's
    certified head, or f+1 matching checkpoints (a correct replica executed that far)."""
    known = replica._certified_run_end()
    vouched = replica.checkpoints.vouched_above(known)
    if vouched is not None and vouched[0] >= replica.peer_head[0]:
        return vouched
    if replica.peer_head[0] > known:
        return (*replica.peer_head, b"")
    return None


def catch_up(replica: Replica) -> None:
    """Fetch up to the head peers proved, if nothing else is under way."""
    if replica.fetching is None and not busy(replica) and (head := proved_head(replica)):
        fall_behind(replica, *head)


def check_high_checkpoints(replica: Replica) -> None:
    if replica.fetching is not None or busy(replica):
        return
    ahead = replica.checkpoints.ahead()
    if ahead is not None:
        fall_behind(replica, *ahead)
    elif replica.peer_head[0] > replica._certified_run_end() + 1:
        fall_behind(replica, *replica.peer_head, b"")  # proved while this replica was busy


def fall_behind(replica: Replica, seq_no: int, block_hash: bytes, state_root: bytes) -> None:
    """Ask the adapter to fetch certified blocks. The uncommitted blocks stay until the
    fetch succeeds (the watermarks then drop those it passed): a peer that claims a head
    and then serves nothing must not cost the cluster a prepared block's only copies."""
    replica.fetching, replica.fetch_stalled, replica.fetch_executing = seq_no, 0, False
    replica.fetch_reached = replica.last_exec
    replica._out.append(FetchCommitted(seq_no, block_hash, state_root))


def on_fetch_completed(replica: Replica, event: FetchCompleted) -> None:
    """The fetch under way reached its target (block sync imports until its head does, or
    fails). One below it is another fetch's, whose task outlived the replica that asked for
    it: taken as this fetch's, it cleared this one (a second fetch of the head was asked for
    while the first ran) and this one's end was then dropped, the head left below the
    chain's."""
    if replica.fetching is None or event.seq_no < replica.fetching:
        return
    _fetched(replica, event)


def _fetched(replica: Replica, event: FetchCompleted) -> None:
    """The fetch under way ended at `event`'s head (its target, or short of it: failed).
    The timeouts it excused while stalled count (`stall_count`): a byzantine peer serving
    the censor's blocks just short of the cut, a fetch at a time, is judged by its stalls
    (finding 2), while an honest fetch, which progressed, counts only its import."""
    replica.passed_over += stall_count(replica)
    replica.fetching, replica.fetch_excused, replica.missed_fetches = None, False, (-1, 0)
    replica.executing, replica.held = None, None
    if event.seq_no > replica.last_exec:
        replica.last_exec, replica.last_exec_hash = event.seq_no, event.block_hash
    replica._forget_requests(event.tx_hashes)
    if event.seq_no > replica.low_watermark:
        replica._move_watermarks(event.seq_no)
    if event.seq_no % replica.params.checkpoint_interval == 0:
        replica._send_checkpoint(event.seq_no, event.block_hash, event.state_root)
    replica._after_execution()


def on_peer_committed(replica: Replica, event: PeerCommitted) -> None:
    """A peer committed a block we have not: fetch it unless our own work is under way.
    The next block is committed here on the peer's certificate instead, with the body we
    hold or fetch by digest: a peer that proves its head and then refuses to serve it
    would otherwise hold us in catch-up. Its certificate may prove a later view too (at the
    head as well: `join_certified_view`)."""
    join_certified_view(replica, event)
    if event.seq_no <= replica.last_exec:
        return
    replica.peer_head = max(replica.peer_head, (event.seq_no, event.block_hash))
    if replica.fetching is not None:
        return
    if event.seq_no == replica.last_exec + 1 and _adopt_certificate(replica, event):
        return
    if not busy(replica):
        fall_behind(replica, event.seq_no, event.block_hash, b"")


def _adopt_certificate(replica: Replica, event: PeerCommitted) -> bool:
    if event.seq_no in replica.log.certified:
        return True
    try:
        replica.epochs.verify_certificate(event.certificate, event.seq_no, event.block_hash)
    except MessageError:
        return False
    replica.log.certify(event.seq_no, event.block_hash, event.certificate)
    replica._advance()
    return True


def on_fetch_failed(replica: Replica, event: FetchFailed) -> None:
    """What the fetch imported before it failed is this replica's head now. One that
    imported nothing goes on as a completed one does: a block certified here during the
    fetch waited for it (`_advance` does nothing meanwhile), and nothing else may come to
    execute it (the attack review s10, finding 3).

    Only a fetch that excused a request timeout counts when it fails (`excuse`), whatever
    it imported before: the timeouts during a fetch count nothing, and a slow fetch that
    completes counts nothing either. Such a failure passes the oldest request over, as a
    commit does: a censoring primary that claims heads it cannot serve and commits other
    blocks in between (each commit moves the head, so its next claim is believed afresh)
    is judged by the claims it did not serve, not by its commits alone (censor simulator
    seeds 369 and 619 at N = 9: only the commits counted, 9 of them over 10.5 s, and the
    censored request missed its bound). A fetch that failed before any timeout relied on
    it counts nothing at all: two fast failures followed by a slow fetch still under way
    made its third excused timeout a lone VIEW-CHANGE (honest seed 776 at N = 5)."""
    if replica.fetching != event.target_seq_no:
        return
    # (at least one for a fetch that excused a timeout; each one it excused while stalled)
    stalls = stall_count(replica)
    if replica.fetch_excused and replica.fair_mark is not None:
        replica.passed_over += max(1, stalls)
    if event.reached is not None and event.reached.seq_no > replica.last_exec:
        _fetched(replica, event.reached)
        return
    counts, replica.fetching, replica.fetch_excused = replica.fetch_excused, None, False
    # A head that two such fetches in a row could not reach any of is no longer believed
    # (a peer claiming one it cannot serve would keep `lagging` true for good). Fetches
    # that failed fast, before a timeout relied on them, forget nothing: they forgot a
    # real head and left the timer nothing to excuse (gapped simulator seed 47 at N = 5: a
    # lone VIEW-CHANGE of an honest cluster). Waiting for two excused timeouts let censor
    # seed 9 at N = 9 miss its latency bound.
    if counts and missed_fetch(replica) >= FORGOTTEN_AFTER:
        replica.peer_head = min(replica.peer_head, (replica.last_exec, replica.last_exec_hash))
    replica._advance()
