"""What a validator added by a change keeps of the consensus messages it hears while it
follows (core.joining, issue 31): the new set's messages for the heights of the epoch it
joins and the old set's CHECKPOINTs at c, verified, bounded, and processed by its replica
once they are fed after `Replica.join`; a validator voted out keeps them too.

Four validators (K = 10, L = 40, W = 2) vote a fifth in; the change passes in block 8, so
c = 10 and the newcomer votes from 11.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from eth_hash.auto import keccak
from eth_keys.datatypes import PrivateKey

from pbft_engine.core import ChainHead, EngineParams, LeftValidatorSet, MessageReceived, Replica
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.core.joining import (
    FOLLOWER_LAG,
    JoinBuffer,
    handover_to_join,
    lowest_handover,
)
from pbft_engine.engine import PbftEngine
from pbft_engine.epoch_feed import EpochFeed
from pbft_engine.messages import (
    Checkpoint,
    Commit,
    KeyVerifier,
    Prepare,
    PrePrepare,
    WireMessage,
)
from pbft_engine.peer_budget import PeerBudget
from tests.unit.pbft.helpers import PARAMS
from tests.unit.pbft.test_pbft_epochs import ADDED, KEYS, POOL, REMOVED, V0, scheduled, signed
from tests.unit.test_replica_handover import C, Driven, block, digest, state

L = PARAMS.log_size
NEWCOMER = ADDED[4]
GENESIS_SCHEDULE = EpochSchedule.genesis(PARAMS)
REORDERED = (V0[0], *V0[2:], V0[1], NEWCOMER)  # replica 1 there is V0[2]


def wire(body: Any, epoch_set: tuple[bytes, ...] = ADDED, blocks: tuple[bytes, ...] = (),
         epoch: int | None = None) -> bytes:
    """`body` as the member its index names in `epoch_set` sends it (naming epoch 1 for the
    new set, 0 for the old one, unless told)."""
    return WireMessage(signed(body, epoch_set, epoch), blocks).encode()


def buffer() -> JoinBuffer:
    return JoinBuffer(PARAMS, KeyVerifier(), NEWCOMER)


def round_of(n: int) -> list[bytes]:
    """Block n's PRE-PREPARE from the new primary and the new set's PREPAREs and COMMITs
    (the newcomer's own aside)."""
    return [wire(PrePrepare(0, n, digest(n), 0), blocks=(block(n),)),
            *(wire(Prepare(0, n, digest(n), i)) for i in (1, 2, 3)),
            *(wire(Commit(0, n, digest(n), i)) for i in (0, 1, 2, 3))]


def old_checkpoints(seq_no: int = C) -> list[bytes]:
    return [wire(Checkpoint(seq_no, digest(seq_no), state(seq_no), i), V0) for i in (0, 1, 2)]


def joined() -> Driven:
    """The newcomer's replica, joined at c (its head)."""
    return Driven(Replica.join(PARAMS, KEYS[NEWCOMER], KeyVerifier(), ChainHead(C, digest(C)),
                               block_digest=keccak, schedule=scheduled(ADDED), view=0))


def test_the_handover_it_joins_at_is_known_or_expected() -> None:
    assert handover_to_join(scheduled(ADDED), NEWCOMER, 9) == C
    assert handover_to_join(scheduled(ADDED), NEWCOMER, C + 1) is None  # (it joins at once)
    assert handover_to_join(GENESIS_SCHEDULE, NEWCOMER, 5) is None
    # not imported the block in which the change passed: c is no lower than that of a
    # change passing in the next block
    assert lowest_handover(GENESIS_SCHEDULE, NEWCOMER, 5) == C
    assert lowest_handover(GENESIS_SCHEDULE, NEWCOMER, 9) == 20
    assert lowest_handover(GENESIS_SCHEDULE, V0[1], 5) is None  # a member is added by none
    assert handover_to_join(scheduled(ADDED), V0[1], 5) is None  # (it stays: joins nothing)


def test_a_validator_voted_out_keeps_what_the_set_voting_it_in_again_sends() -> None:
    """V0[0], voted out in block 8 (c = 10), still votes at head 9; voted in again by the
    next change, it joins at that change's c (20 at the soonest) as soon as it left, and the
    new primary's messages may reach it before: its buffer checks them with the set it
    expects (the last one plus itself) and keeps them."""
    removed = scheduled(REMOVED)
    again = (*REMOVED, V0[0])
    kept = JoinBuffer(PARAMS, KeyVerifier(), V0[0])
    assert kept.keep(wire(PrePrepare(0, 21, digest(21), 0), again, (block(21),), epoch=2),
                     removed, 9)
    assert not kept.keep(wire(Prepare(0, 11, digest(11), 1), REMOVED), removed, 9)
    assert len(kept) == 1


def test_the_new_sets_round_of_c_plus_1_kept_while_following_is_processed_after_join() -> None:
    """The new primary proposed 11 before the newcomer held 10: kept, and fed after the join
    (with the old set's CHECKPOINTs at 10), the replica prepares and commits 11 at once."""
    kept = buffer()
    for data in [*round_of(C + 1), *old_checkpoints()]:
        assert kept.keep(data, scheduled(ADDED), 9)
    driven = joined()
    for data in kept.take():
        driven.step(MessageReceived(data))
    assert len(kept) == 0 and kept.kept_bytes == 0
    assert Prepare(0, C + 1, digest(C + 1), 4, epoch=1) in driven.sent(Prepare)
    assert driven.replica.last_exec == C + 1
    assert len(driven.replica.checkpoints.proof(C)) == 3  # its stable checkpoint, proved


def test_a_follower_that_has_not_imported_the_change_keeps_what_it_will_need() -> None:
    """At head 5 the newcomer knows nothing of the change passed in 8: it keeps the
    messages that name a later epoch than it knows, signed by a member of the set it knows,
    up to FOLLOWER_LAG heights beyond the window of the lowest c (10), and the old set's
    CHECKPOINTs; once b is imported, those of the real window stay, and its replica takes
    them (dropping one whose index names another member than its signer)."""
    kept = buffer()
    for data in [*round_of(C + 1), *old_checkpoints()]:
        assert kept.keep(data, GENESIS_SCHEDULE, 5)
    assert kept.keep(wire(Prepare(0, C + 2, digest(C + 2), 1), REORDERED), GENESIS_SCHEDULE, 5)
    outsider = (*V0, POOL[5])  # not a member of the set it knows
    assert not kept.keep(wire(Commit(0, C + 1, digest(C + 1), 4), outsider), GENESIS_SCHEDULE, 5)
    assert not kept.keep(wire(Commit(0, C + 1, digest(C + 1), 1), epoch=0), GENESIS_SCHEDULE, 5)
    far = C + L + FOLLOWER_LAG
    assert kept.keep(wire(Prepare(0, far, digest(far), 1)), GENESIS_SCHEDULE, 5)
    assert not kept.keep(wire(Prepare(0, far + 1, digest(far), 1)), GENESIS_SCHEDULE, 5)
    assert len(kept) == 8 + 3 + 1 + 1
    kept.keep(wire(Commit(0, C + 2, digest(C + 2), 1)), scheduled(ADDED), 8)  # b imported
    assert len(kept) == 8 + 3 + 1 + 1  # (the one far beyond c + L went)
    driven = joined()
    for data in kept.take():
        driven.step(MessageReceived(data))
    assert driven.replica.last_exec == C + 1
    assert driven.replica.dropped["SignatureError"] == 1  # REORDERED's replica 1 is V0[2]


def test_messages_outside_the_window_or_not_the_replicas_to_take_keep_nothing() -> None:
    """Heights at or below c (but its CHECKPOINT) and above c + L, a sender outside the new
    set, a PRE-PREPARE from a backup, the wrong epoch, garbage, and view changes: nothing."""
    kept = buffer()
    outsider = (*V0, POOL[5])  # POOL[5] signs as replica 4: not the newcomer
    refused = [
        wire(Prepare(0, C, digest(C), 1), V0),  # the old set's height
        wire(Checkpoint(C - 10, digest(0), state(0), 1), V0),
        wire(Prepare(0, C + L + 1, digest(1), 1)),
        wire(Checkpoint(C + L + 10, digest(1), state(1), 1)),
        wire(Commit(0, C + 1, digest(C + 1), 4), outsider),
        wire(PrePrepare(0, C + 1, digest(C + 1), 1), blocks=(block(C + 1),)),
        wire(Prepare(0, C + 1, digest(C + 1), 1), epoch=0),
        wire(Prepare(0, C + 1, digest(C + 1), 4)),  # its own (signed with its key)
        b"\xc0",
    ]
    assert not any(kept.keep(data, scheduled(ADDED), 9) for data in refused)
    assert len(kept) == 0
    plain = JoinBuffer(PARAMS, KeyVerifier(), V0[1])  # a member of every set: joins nothing
    assert not plain.keep(round_of(C + 1)[1], scheduled(ADDED), 9)


def test_a_member_flooding_keeps_one_message_per_kind_and_height() -> None:
    """Again and again, in higher views and at every height of the window: one message per
    kind and height, the one of the highest view (a copy in the same view does not replace
    the first); at most members x 4 kinds x (L + 1) in all."""
    kept = buffer()
    for view in (0, 0, 1, 0):
        kept.keep(wire(Prepare(view, C + 1, keccak(b"%d" % view), 2)), scheduled(ADDED), 9)
    [data] = kept.take()
    assert WireMessage.decode(data).signed.body.view == 1
    for n in range(C - 5, C + L + 10):
        for _ in range(3):
            kept.keep(wire(Prepare(n, n, digest(n), 2)), scheduled(ADDED), 9)
            kept.keep(wire(Commit(n, n, digest(n), 2)), scheduled(ADDED), 9)
    assert len(kept) == 2 * L


BOUND = 100_000  # the byte bound, scaled down (64 MiB at the defaults)
SEVEN = (*V0, NEWCOMER, *POOL[5:7])  # 4 -> 7: f = 2


@pytest.fixture
def bounded(monkeypatch: pytest.MonkeyPatch) -> JoinBuffer:
    """The newcomer's buffer, with the byte bound scaled to BOUND."""
    monkeypatch.setattr(EngineParams, "future_block_bytes", property(lambda self: BOUND))
    return buffer()


def proposal(view: int, n: int, size: int, epoch_set: tuple[bytes, ...] = ADDED) -> bytes:
    """View `view`'s primary's PRE-PREPARE of n, with a block of about `size` bytes."""
    proposed = b"block %d of view %d " % (n, view) + b"." * size
    primary = view % len(epoch_set)
    return wire(PrePrepare(view, n, keccak(proposed), primary), epoch_set, (proposed,))


def heights(kept: JoinBuffer, sender: bytes) -> list[int]:
    return sorted(seq_no for who, _, seq_no in kept._kept if who == sender)


def test_blocks_over_the_byte_bound_push_out_the_heaviest_senders_own(
        bounded: JoinBuffer) -> None:
    """A member that is primary of some view floods PRE-PREPAREs with large blocks at every
    height: over the bound, its own highest go; the new primary's block stays."""
    honest = wire(PrePrepare(0, C + 1, digest(C + 1), 0), blocks=(block(C + 1),))
    assert bounded.keep(honest, scheduled(ADDED), 9)
    for n in range(C + 1, C + L + 1):  # replica 1 is view 1's primary
        bounded.keep(proposal(1, n, 10_000), scheduled(ADDED), 9)
    assert bounded.kept_bytes <= BOUND
    assert heights(bounded, V0[1]) == list(range(C + 1, C + 10))  # its lowest nine
    assert bounded.take()[0] == honest


def test_f_members_flooding_at_once_leave_the_new_primarys_first_proposal(
        bounded: JoinBuffer) -> None:
    """Seven validators (f = 2). The honest new primary (V0[0]) holds c+1 .. c+3 with 20 kB
    blocks (60 kB of the 100 kB bound), the honest members their votes of c+1; the two
    byzantine members (V0[1], V0[2]: the primaries of views 1 and 2) flood 5 kB proposals at
    every height from c+1 up. The primary's c+1 (20 kB <= (bound - the votes) / (f + 1)) and
    every honest vote stay; each flooder keeps its lowest proposals, as many as leave it no
    lighter than the primary, which loses c+2 and c+3."""
    schedule = scheduled(SEVEN)
    first = proposal(0, C + 1, 20_000, SEVEN)
    honest = [first, *(proposal(0, n, 20_000, SEVEN) for n in (C + 2, C + 3)),
              *(wire(kind(0, C + 1, digest(C + 1), i), SEVEN)
                for kind in (Prepare, Commit) for i in (3, 5, 6))]
    for data in honest:
        assert bounded.keep(data, schedule, 9)
    for n in range(C + 1, C + L + 1):
        for view in (1, 2):
            bounded.keep(proposal(view, n, 5_000, SEVEN), schedule, 9)
    assert bounded.kept_bytes <= BOUND
    assert heights(bounded, V0[0]) == [C + 1]
    assert heights(bounded, V0[1]) == list(range(C + 1, C + 8))  # (36 kB and 41 kB: each
    assert heights(bounded, V0[2]) == list(range(C + 1, C + 9))  # more than the primary's)
    assert set(honest) - set(bounded.take()) == {honest[1], honest[2]}


def test_a_flood_from_above_then_below_costs_the_flooder_its_highest(
        bounded: JoinBuffer) -> None:
    """A byzantine member (V0[1]) fills the bound with 5 kB proposals at c+21 .. c+40 before
    the new primary proposes; the primary's c+1 .. c+3 (20 kB blocks) then come, and the
    flooder goes on at c+1 .. c+9, below what it holds. What went is the flooder's highest,
    whenever they came, and the primary's c+3: the primary's c+1 stays, and the flooder
    keeps its lowest (the oldest of the heaviest would have pushed out the primary's c+1,
    the newest the flooder's lowest)."""
    schedule = scheduled(ADDED)
    for n in range(C + 21, C + L + 1):
        bounded.keep(proposal(1, n, 5_000), schedule, 9)
    primarys = [proposal(0, n, 20_000) for n in (C + 1, C + 2, C + 3)]
    for data in primarys:
        assert bounded.keep(data, schedule, 9)
    for n in range(C + 1, C + 10):
        assert bounded.keep(proposal(1, n, 5_000), schedule, 9)
    assert bounded.kept_bytes <= BOUND
    assert heights(bounded, V0[0]) == [C + 1, C + 2]
    assert heights(bounded, V0[1]) == [*range(C + 1, C + 10), C + 21, C + 22]
    assert primarys[0] in bounded.take()


def test_the_engine_keeps_an_observers_messages_and_feeds_them_after_the_join() -> None:
    """The adapter's side: an observer with a node key keeps the validators' messages (charged
    to their budget), and the replica it starts when it joins is stepped with them, in order."""
    stepped: list[object] = []
    schedule = scheduled(ADDED)
    engine = PbftEngine.__new__(PbftEngine)
    engine.feed = EpochFeed(schedule, lambda block_hash: schedule)
    engine.feed.refresh(9, b"head 9")
    engine.budget = PeerBudget(lambda: 0.0)
    engine.replica = None
    engine.join_buffer = buffer()
    engine.on_message(V0[0], round_of(C + 1)[0])
    engine.on_message(V0[1], wire(Checkpoint(C, digest(C), state(C), 1), V0))
    assert len(engine.join_buffer) == 2
    engine.replica = SimpleNamespace(  # type: ignore[assignment]
        view=0, active=True, fetching=None, step=stepped.append)
    engine._perform = lambda ready: None  # type: ignore[method-assign]
    engine._feed_kept()
    assert [WireMessage.decode(e.data).signed.body.TYPE.name  # type: ignore[attr-defined]
            for e in stepped] == ["CHECKPOINT", "PRE_PREPARE"]
    assert len(engine.join_buffer) == 0


def test_a_validator_voted_out_and_in_again_that_leaves_at_its_handover_joins_at_once() -> None:
    """V0[0] is voted out (c = 10) and in again (c = 20); its replica leaves
    (`LeftValidatorSet`) only once it executed a block above 10, here by one fetch that
    ended at 20, the block before the epoch that counts it again. The observer the engine
    starts then stops at 20 (this node votes from 21) and imports nothing, and only an
    import or a fetch made the engine look for a join: it never joined, however much the
    new set's quorum needed it (the simulator's nodes look at every poll: honest seed 236
    at N = 5 joined 250 ms after it left). The engine looks as it leaves."""
    again = (*REMOVED, V0[0])
    schedule = scheduled(REMOVED).schedule(again, passed_at=12)
    assert schedule.epochs[-1].first == 2 * C + 1
    engine = PbftEngine.__new__(PbftEngine)
    engine.feed = EpochFeed(schedule, lambda block_hash: schedule)
    engine.context = SimpleNamespace(  # type: ignore[assignment]
        validator_key=PrivateKey(keccak(b"validator 0")),
        head=lambda: SimpleNamespace(block_number=2 * C, hash=digest(2 * C)))
    engine.log = SimpleNamespace(info=lambda *a: None)  # type: ignore[assignment]
    engine._timers, engine._armed, engine._joining = {}, {}, False
    engine.replica, engine.sync, engine.observer = None, None, None
    engine._start_observer = lambda address: setattr(  # type: ignore[method-assign]
        engine, "observer", SimpleNamespace())
    spawned: list[str] = []

    def spawn(work: Any, name: str) -> None:
        work.close()
        spawned.append(name)

    engine._tasks = SimpleNamespace(spawn=spawn)  # type: ignore[assignment]
    asyncio.run(engine._leave(LeftValidatorSet(1, C + 1)))
    assert engine.observer is not None and spawned == ["joining the validator set"]
