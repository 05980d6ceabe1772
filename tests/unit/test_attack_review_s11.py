"""Attack review of session 11's "a relayed copy is charged to its relayer" (70e8f22:
`MessageReceived.sender`; `log.hold_future` and `JoinBuffer.keep` charged the member whose
link delivered a message, and the signer's own copy replaced a relayed one held for the same
key and view): at most f byzantine members relaying, and a network that delays, duplicates
or reorders, against the replica's future buffer and the joiner's buffer.

Fixed since (both findings' tests were strict xfails): neither buffer holds a copy that
another member than its signer delivered (`joining.relayed_copy`): correct members relay
no consensus message, so a relay is never needed later, and its bytes are nobody's charge.

Finding 1 (liveness: a request timeout's wait, or a view change): a
relayer is now a holder of its own, and a node hears every validator of the epochs from
its committed head's on (`EpochFeed.members`, the engine's filter). A validator voted out at
c is still such a member while the head is in its epoch (at c itself, on purpose: the
handover needs its CHECKPOINT at c), but once the new set is installed it signs nothing
either buffer holds (the heights above c are the new set's): before 70e8f22 whatever it
delivered was charged to the signer, so it held nothing; now its relays are its charge, and
it is one more heavy holder than the f faulty members of the new set that the bound's
promise counts ("(bound - what the other honest senders hold) / (f + 1)", `core.joining`
and `log.hold_future`). In the replica's buffer this stays within each set's own f: the
voted-out validator is the one faulty member of the old set of four, the new set of three
(f = 0) is all correct, and the new primary loses its lowest held PRE-PREPARE once it holds
over half the bound. In the join buffer (a removal queued before the change adding this
node, its head still in the removed validator's epoch) it takes one faulty member of the set
joined besides: the sets are the same size there, so that is one more faulty member than
the old epoch allowed, unless its key is counted faulty only once it is gone (its operator
has no reason left to guard it: `test_attack_review_carry.py`'s finding 2, stolen keys of
gone validators, assumed the same).

What held is below, one test for each attack tried that no test covered yet. Why it holds:
a correct member's link delivers only what it signed (no correct member relays another's
consensus message: the engine passes the link's authenticated address, and the core
forwards only transactions; b"", "not known", comes only with a NEW-VIEW from block sync,
which is never held), and a correct signer signs one body per key and view. So "own copy
replaces relayed" can only swap the block beside a correct signer's body, or let a faulty
signer choose which of its own versions is held, as it could by sending that version alone;
and a correct holder only ever holds its own messages, so a relay's bytes are a flood of
the faulty relayer's own (the heaviest holder's highest goes first), as long as the relayer
is one of the f that the promise counts (finding 1 is where it is not).

Settings: the replica's tests as `tests/unit/pbft/test_pbft_resource_bounds.py` (four
validators, replica 3 in view 0, max_in_flight 2); the joiner's as
`tests/unit/pbft/test_join_buffer.py` (4 -> 5 at c = 10; finding 1: 4 -> 3 passed at 8,
then 3 -> 4 adding the newcomer passed at 9, so c = 20).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from eth_hash.auto import keccak

from pbft_engine.core import ChainHead, MessageReceived, Replica
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.core.params import EngineParams
from pbft_engine.epoch_feed import EpochFeed
from pbft_engine.messages import (
    Checkpoint,
    Commit,
    KeyVerifier,
    MessageType,
    NewView,
    Prepare,
    PrePrepare,
    ViewChange,
)
from tests.unit.pbft.helpers import AUTH, GENESIS, PARAMS, SIGNERS, from_peer
from tests.unit.pbft.test_join_buffer import NEWCOMER, buffer, wire
from tests.unit.pbft.test_pbft_epochs import ADDED, REMOVED, V0, scheduled
from tests.unit.test_replica_handover import (
    C,
    Driven,
    block,
    checkpoint_from,
    commit_through,
    digest,
    state,
)
from tests.unit.test_replica_handover import backup as handover_backup

JUNK = b"\x01" * 16_384  # a relayer's block: no body hashes to the signed digest


# --- finding 1: a validator voted out relays as one more holder than the f counted --------

NEW_SET = (*REMOVED, NEWCOMER)  # V0[1], V0[2], V0[3], the newcomer: n = 4, f = 1
QUEUED = EpochSchedule.genesis(PARAMS).schedule(REMOVED, passed_at=8).schedule(
    NEW_SET, passed_at=9)  # V0[0] leaves at 10; the newcomer joins at 20, the FIFO's next
JOINS_AT = 20


def new_proposal(view: int, n: int, size: int) -> bytes:
    """The new set's view `view` primary's PRE-PREPARE of n (epoch 2), a block of `size`."""
    proposed = b"block %d of view %d " % (n, view) + b"." * size
    return wire(PrePrepare(view, n, keccak(proposed), view % 4), NEW_SET, (proposed,), epoch=2)



def test_a_validator_voted_out_before_the_joiners_change_cannot_cost_the_new_primary_c_plus_1(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The newcomer follows at head 9 (epoch 0), knowing both queued changes: V0[0] is
    voted out at 10, and the newcomer joins the set V0[1..3] + itself at c = 20. V0[0]
    is still a member it hears (the engine's filter), and relays a PRE-PREPARE of 23 that
    the new set's faulty member V0[2] (view 1's primary there) signed, with a 39 kB block:
    kept, charged to V0[0]. Later (head 15: V0[0] is no member any more, its charge stays)
    V0[2] sends its own of 22 (39 kB), and the honest new primary V0[1] its PRE-PREPARE
    of c+1 (40 kB): 118 kB over the 100 kB bound, and the primary is the heaviest holder,
    so c+1 goes, though it holds 40 kB, under the bound / (f + 1) = 50 kB that
    `core.joining` promises whatever f = 1 faulty members send (V0[0] a second one, gone:
    see the module's doc). Before 70e8f22 the relay
    was V0[2]'s charge (78 kB, the heaviest: its 23 went). The joiner waits for the
    primary's resend (a request timeout), or, if the new quorum needs it, a view change."""
    monkeypatch.setattr(EngineParams, "future_block_bytes", property(lambda self: 100_000))
    feed = EpochFeed(QUEUED, lambda _: QUEUED)
    feed.refresh(9, keccak(b"block 9"))
    voted_out, faulty, primary = V0[0], NEW_SET[1], NEW_SET[0]
    assert voted_out in feed.members() and voted_out not in NEW_SET
    kept = buffer()
    assert not kept.keep(new_proposal(1, JOINS_AT + 3, 39_000), QUEUED, 9, voted_out)  # fixed
    assert kept.keep(new_proposal(1, JOINS_AT + 2, 39_000), QUEUED, 15, faulty)
    first = new_proposal(0, JOINS_AT + 1, 40_000)
    kept.keep(first, QUEUED, 15, primary)
    assert first in kept.take()


def test_a_validator_voted_out_cannot_cost_the_new_sets_primary_its_lowest_in_the_future_buffer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 1 in the replica's buffer, within each set's own f: V0[3] committed 9 and
    10 (c) and holds c stable, so the set V0[1..3] (n = 3, f = 0) is installed; its head
    is c, in epoch 0, so V0[0], voted out at c (the one faulty member epoch 0 allows), is
    still a member it hears. The new primary V0[1] is two blocks ahead of V0[3]'s
    certificates (it proposed 13 and 14; V0[3] holds them beyond its pipeline's end, 12):
    V0[0] relays 14 ahead of the primary's own copy with a 59 kB junk block, then the
    primary's own 13 (60 kB) arrives: over the 100 kB bound with the primary the heaviest
    holder, so 13, the lowest, the one it needs first, goes, though the primary holds
    60 kB and `hold_future` promises a sender (bound - the other honest senders' bytes) /
    (f + 1) = 100 kB whatever f = 0 faulty members of the set send. Before 70e8f22 the
    relay was the primary's own charge, and its highest, 14, went. At the defaults (64
    MiB) the primary loses its lowest once it holds more than half the bound."""
    monkeypatch.setattr(EngineParams, "future_block_bytes", property(lambda self: 100_000))
    driven = handover_backup(3, REMOVED)
    commit_through(driven, C)
    checkpoint_from(driven, (0, 1, 2))
    assert driven.replica.epochs.current.validators == REMOVED  # V0[3] is replica 2 there
    feed = EpochFeed(scheduled(REMOVED), lambda _: scheduled(REMOVED))
    feed.refresh(C, digest(C))
    voted_out, primary = V0[0], REMOVED[0]
    assert voted_out in feed.members() and voted_out not in REMOVED
    own = {n: b"block %d " % n + b"." * 60_000 for n in (C + 3, C + 4)}
    relayed = wire(PrePrepare(0, C + 4, keccak(own[C + 4]), 0), REMOVED, (b"\x01" * 59_000,))
    driven.step(MessageReceived(relayed, voted_out))
    driven.step(MessageReceived(
        wire(PrePrepare(0, C + 3, keccak(own[C + 3]), 0), REMOVED, (own[C + 3],)), primary))
    assert (0, MessageType.PRE_PREPARE, C + 3) in driven.replica.future


# --- what held (as fixed: relays are not held) ---------------------------------------------


def backup() -> Driven:
    """Replica 3 at genesis, in view 0 (primary: replica 0)."""
    return Driven(Replica(PARAMS, 3, SIGNERS[3], KeyVerifier(), ChainHead(0, GENESIS),
                          block_digest=keccak))


def test_a_relayed_copy_for_later_is_not_held_and_the_signers_own_is_taken() -> None:
    """A PRE-PREPARE beyond the pipeline's end relayed with a junk block is dropped; the
    primary's own copy, late, is held, and once within the pipeline its block is taken."""
    driven = backup()
    ahead = 4  # beyond the pipeline's end (max_in_flight 2) before block 2
    pre_prepare = PrePrepare(0, ahead, digest(ahead), 0)
    driven.step(from_peer(pre_prepare, (JUNK,), relayed_by=1))
    key = (0, MessageType.PRE_PREPARE, ahead)
    assert key not in driven.replica.future
    assert driven.replica.dropped["relayed copy of a message for later"] == 1
    driven.step(from_peer(pre_prepare, (block(ahead),)))  # the primary's own copy, late
    assert driven.replica.future[key].blocks == (block(ahead),)
    commit_through(driven, 2)  # 4 within the pipeline now: replayed and taken
    assert key not in driven.replica.future
    assert driven.replica.log.block_for(ahead, digest(ahead)) == block(ahead)
    assert (ahead, digest(ahead)) not in driven.replica.wanted


def test_the_join_buffers_bytes_by_sender_stay_the_sum_of_what_it_keeps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Any interleaving of copies (own, relayed by any member, b"" not known; several
    views, junk or genuine blocks, votes, CHECKPOINTs) leaves `_bytes` equal to what each
    sender's kept messages weigh, within the bound, and a relayed copy is never kept."""
    bound = 60_000
    monkeypatch.setattr(EngineParams, "future_block_bytes", property(lambda self: bound))
    rng = random.Random(11)
    messages = [wire(Checkpoint(C, digest(C), state(C), i), V0) for i in range(4)]
    for n in range(C + 1, C + 5):
        for view in (0, 5, 1):  # views 0 and 5: replica 0 proposes; 1: replica 1
            genuine = b"block %d of view %d " % (n, view) + b"." * rng.randrange(20_000)
            for proposed in (genuine, JUNK):
                messages.append(wire(PrePrepare(view, n, keccak(genuine), view % 5),
                                     blocks=(proposed,)))
        messages += [wire(Prepare(0, n, digest(n), i)) for i in (1, 2, 3)]
        messages += [wire(Commit(1, n, digest(n), i)) for i in range(4)]
    deliverers = [*ADDED[:4], b""]
    kept = buffer()
    for _ in range(400):
        deliverer = rng.choice(deliverers)
        if kept.keep(rng.choice(messages), scheduled(ADDED), 9, deliverer):
            assert deliverer in (b"", *(key[0] for key in kept._kept))
        weighed: Counter[bytes] = Counter()
        for (sender, _, _), held in kept._kept.items():
            weighed[sender] += len(held.data)
        assert +weighed == +kept._bytes
        assert kept.kept_bytes <= bound


def test_a_faulty_primarys_relayed_version_is_not_held_and_its_own_is() -> None:
    """An equivocating primary: view 6's faulty primary (replica 2) has an accomplice
    (replica 1) relay version A of its PRE-PREPARE of 1 to replica 3, still in view 0, then
    sends version B itself: A is not held, B is. Replica 3 prepares B only, and A, once it
    comes in the view from its signer, is evidence and a view change."""
    driven = backup()
    first, second = b"version A of block 1", b"version B of block 1"
    driven.step(from_peer(PrePrepare(6, 1, keccak(first), 2), (first,), relayed_by=1))
    driven.step(from_peer(PrePrepare(6, 1, keccak(second), 2), (second,)))
    assert driven.replica.future[(2, MessageType.PRE_PREPARE, 1)].blocks == (second,)
    assert not driven.replica.evidence
    votes = tuple(AUTH.sign(ViewChange(6, 0, (), (), (), r), SIGNERS[r]) for r in (0, 1, 2))
    driven.step(from_peer(NewView(6, votes, (), 2)))
    assert driven.replica.view == 6 and driven.replica.active
    assert [p.digest for p in driven.sent(Prepare) if p.seq_no == 1] == [keccak(second)]
    driven.step(from_peer(PrePrepare(6, 1, keccak(first), 2), (first,)))  # A, live
    assert driven.replica.evidence
    assert [v.view for v in driven.sent(ViewChange)] == [7]
