"""Every boundary where the core waits on the world fails safely (issue 28): a block the
proposer got wrong, a copy a peer falsified, a validation that never answers, a censoring
primary that keeps this replica busy, a fetch that fails part-way, and a checkpoint reached
by catch-up. One replica driven event by event; the adapter's half is in
test_pbft_adapter_boundaries.py."""

from __future__ import annotations

from eth_hash.auto import keccak

from pbft_engine.core import (
    Action,
    BlockValidated,
    FetchBlock,
    FetchCompleted,
    FetchFailed,
    Refusal,
    Replica,
    RequestReceived,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.core.catch_up import busy
from pbft_engine.core.records import u64
from pbft_engine.core.replica import MAX_PASSED_OVER
from pbft_engine.messages import Checkpoint, PrePrepare, ViewChange
from tests.unit.pbft.helpers import PARAMS, from_peer
from tests.unit.pbft.test_pbft_request_timer import WAITING, commit_block, start_replica


def propose(replica: Replica, seq_no: int, block: bytes) -> list[Action]:
    return replica.step(from_peer(PrePrepare(0, seq_no, keccak(block), 0), (block,))).actions


def test_a_block_the_primary_got_wrong_changes_the_view_at_once() -> None:
    """Its body matches the header the primary signed and does not execute: every correct
    backup refuses it alike, so none waits for a timer to blame the primary, and none asks
    for that body again (it used to fetch and validate it for ever)."""
    replica = start_replica()
    block = b"a block with an undecodable transaction"
    propose(replica, 1, block)
    actions = replica.step(BlockValidated(1, keccak(block), False, Refusal.INVALID)).actions
    assert replica.view == 1 and not replica.active
    assert replica.view_change_reasons == {"invalid_block": 1}
    assert len(replica.evidence) == 1 and replica.dropped["invalid block"] == 1
    assert not any(isinstance(a, FetchBlock | ValidateBlock) for a in actions)


def test_a_refusal_that_arrives_after_the_view_moved_still_accuses_its_proposer() -> None:
    """Faster backups refused the block and took this one to view 1 (f+1 VIEW-CHANGEs)
    while it still validated: its refusal is evidence against primary 0, not forgotten (the
    real-process suite saw it in one run in five)."""
    replica = start_replica()
    block = b"a block with an undecodable transaction"
    propose(replica, 1, block)
    for peer in (0, 1):
        replica.step(from_peer(ViewChange(1, 0, (), (), (), peer)))
    assert replica.view == 1
    replica.step(BlockValidated(1, keccak(block), False, Refusal.INVALID))
    assert [key[:2] for key in replica.evidence] == [(0).to_bytes(2, "big")]


def test_a_false_copy_is_fetched_again_and_blames_no_one() -> None:
    """A copy whose header is the primary's and whose body is not (a peer raced the primary
    with it): the copy is forgotten and fetched by digest; the primary stays."""
    replica = start_replica()
    block = b"the primary's header with another body"
    propose(replica, 1, block)
    actions = replica.step(BlockValidated(1, keccak(block), False, Refusal.FALSE_COPY)).actions
    assert replica.view == 0 and replica.active and not replica.view_change_reasons
    assert [a.seq_no for a in actions if isinstance(a, FetchBlock)] == [1]


def test_a_validation_that_never_answers_is_given_up_by_its_deadline() -> None:
    """The core owns the deadline: the adapter's validation of block 1 never reports back
    (a hung executor). At the first deadline it is asked once more; at the second the slot
    is refused here, "busy" ends, and the request timer that runs out next blames the
    primary instead of re-arming for ever."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    block = b"block 1"
    actions = propose(replica, 1, block)
    (deadline,) = [a for a in actions if getattr(a, "kind", None) is TimerKind.VALIDATION]
    assert deadline.key == u64(1) and deadline.duration_ms == 2 * PARAMS.request_timeout_ms
    replica.step(TimerFired(TimerKind.REQUEST, b""))  # busy validating: re-armed
    assert replica.view == 0
    actions = replica.step(TimerFired(TimerKind.VALIDATION, u64(1))).actions
    assert [a.seq_no for a in actions if isinstance(a, ValidateBlock)] == [1]  # once more
    actions = replica.step(TimerFired(TimerKind.VALIDATION, u64(1))).actions
    assert not busy(replica) and replica.dropped["validation deadline"] == 2
    assert not any(isinstance(a, ValidateBlock) for a in actions)  # not again in this view
    replica.step(BlockValidated(1, keccak(block), True))  # too late: ignored
    assert not replica.log.certs[(0, 1)].validated
    replica.step(TimerFired(TimerKind.REQUEST, b""))
    assert replica.view == 1 and replica.view_change_reasons == {"request_timeout": 1}


def test_a_censoring_primary_that_keeps_this_replica_busy_is_replaced() -> None:
    """Under load a backup is almost always validating a block; that excused the primary
    while it kept passing over the oldest request (MAX_PASSED_OVER was defeated)."""
    replica = start_replica()
    replica.step(RequestReceived(WAITING))
    replica.step(TimerFired(TimerKind.FAIRNESS_MARK, b""))  # it has reached the primary
    others = [keccak(b"other %d" % i) for i in range(MAX_PASSED_OVER + 1)]
    for tx in others:
        replica.step(RequestReceived(tx))
    for n, tx in enumerate(others, start=1):
        commit_block(replica, n, (tx,))
    propose(replica, len(others) + 1, b"yet another block without it")
    assert busy(replica)
    replica.step(TimerFired(TimerKind.REQUEST, b""))
    assert replica.view == 1 and replica.view_change_reasons == {"request_timeout": 1}


def test_a_fetch_that_fails_part_way_moves_the_head_as_far_as_it_got() -> None:
    """The adapter committed the first ranges, then no peer served the next: the replica's
    head is what was committed (it used to stay behind, and the next commit of a block the
    chain already held went unanswered)."""
    replica = start_replica()
    target = PARAMS.log_size + PARAMS.checkpoint_interval
    vouch(replica, target, peers=(0, 1))
    assert replica.fetching == target
    reached = FetchCompleted(PARAMS.checkpoint_interval, keccak(b"head"), keccak(b"root"), ())
    replica.step(FetchFailed(target, reached))
    assert (replica.last_exec, replica.last_exec_hash) == (reached.seq_no, reached.block_hash)
    assert replica.fetching in (None, target)  # (fetching the rest again, if it may)
    replica.step(FetchFailed(target))  # and a fetch that got nowhere changes nothing
    assert replica.last_exec == reached.seq_no


def test_a_checkpoint_reached_by_catch_up_becomes_stable_here() -> None:
    """The catch-up moved h to the checkpoint; the peers' CHECKPOINTs for it, held above the
    old window, and this replica's own make it stable (they were dropped as "below the low
    watermark", and the stable checkpoint stayed behind)."""
    replica = start_replica()
    checkpoint = PARAMS.log_size + PARAMS.checkpoint_interval
    vouch(replica, checkpoint, peers=(0, 1))
    assert replica.fetching == checkpoint
    replica.step(FetchCompleted(checkpoint, BLOCK_HASH, STATE_ROOT, ()))
    assert replica.low_watermark == checkpoint
    assert replica.stable_checkpoint == checkpoint


BLOCK_HASH, STATE_ROOT = keccak(b"checkpointed block"), keccak(b"checkpointed state")


def vouch(replica: Replica, seq_no: int, peers: tuple[int, ...]) -> None:
    """`peers` send matching CHECKPOINTs at seq_no."""
    for peer in peers:
        replica.step(from_peer(Checkpoint(seq_no, BLOCK_HASH, STATE_ROOT, peer)))
