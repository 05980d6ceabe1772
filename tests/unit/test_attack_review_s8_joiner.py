"""Attack review of the JoinBuffer (session 8, issue 31: commits 2e16599, 089aa79, 6ccade8 on
s8-joiner): what a follower keeps for the epoch it joins, its bounds against a flooding
member, and what its replica does with kept messages it would not have taken live.

The buffer only ever holds messages signed by their senders, and the replica verifies each
one again as it is fed (`MessageReceived`), so feeding them is the network delivering them
late: what held below is that the replica judges them as it would live (an old view, a
signer outside the set it joins, a primary's second proposal for one slot). The finding is
in the guess the buffer makes of the handover it may join at, and in the byte bound's choice
of what goes.

Finding 1 (fixed: the guess appends it to `EpochSchedule.after_changes`; not consensus, the
adapter): `lowest_handover` asked the schedule for a change
that appends this node to the last set known; with an override scheduled (config.pbft.
transitions) that removes only this node, the last of its set, that change is the set before
the override, and `EpochSchedule.schedule` raises ConfigError ("the change leaves the
validator set as it is"). `JoinBuffer.keep` raises it for every consensus message the node
hears until the override's block is near (the engine offers it each one after its replica's
step; the transport logs a traceback per message and charges nothing).

Finding 2 (liveness, a view change; fixed in session 10: the heaviest sender's highest
message goes, by height then phase): over the byte bound the oldest message of the sender
holding the most bytes went. A byzantine member that keeps below the honest new primary's
bytes makes that primary the heaviest, and its oldest message is its PRE-PREPARE of c+1,
the one the buffer exists to keep, once the primary's blocks in flight pass bound / (f + 1).

Setting (as `tests/unit/pbft/test_join_buffer.py`): four validators (K = 10, L = 40, W = 2)
vote a fifth in; the change passes in block 8, so c = 10 and the newcomer votes from 11.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from eth_hash.auto import keccak

from pbft_engine.core import ChainHead, MessageReceived, Replica
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.core.joining import FOLLOWER_LAG, JoinBuffer
from pbft_engine.core.params import EngineParams
from pbft_engine.messages import (
    Authenticator,
    Checkpoint,
    Commit,
    KeyVerifier,
    Prepare,
    PrePrepare,
    Signed,
    WireMessage,
)
from tests.unit.pbft.helpers import PARAMS
from tests.unit.pbft.test_join_buffer import (
    GENESIS_SCHEDULE,
    NEWCOMER,
    buffer,
    old_checkpoints,
    round_of,
    wire,
)
from tests.unit.pbft.test_pbft_epochs import ADDED, KEYS, POOL, REMOVED, V0, scheduled
from tests.unit.test_replica_handover import C, Driven, block, digest

L = PARAMS.log_size
JOINED = scheduled(ADDED)


def joined(schedule: EpochSchedule = JOINED, c: int = C, view: int = 0) -> Driven:
    """The newcomer's replica, joined at c (its head) in `view`."""
    return Driven(Replica.join(PARAMS, KEYS[NEWCOMER], KeyVerifier(), ChainHead(c, digest(c)),
                               block_digest=keccak, schedule=schedule, view=view))


def fed(driven: Driven, kept: JoinBuffer) -> Driven:
    for data in kept.take():
        driven.step(MessageReceived(data))
    return driven


def senders(kept: JoinBuffer) -> Counter[bytes]:
    return Counter(key[0] for key in kept._kept)


# --- finding 1 -----------------------------------------------------------------------------


def test_a_validator_an_override_removes_keeps_nothing_and_raises_nothing() -> None:
    """Interleaving: the operators schedule an override at block 30 (transitions) that
    removes V0[3], the last of the genesis set; V0[3] still votes up to 29 (its node runs
    with the new genesis). At head 5 a member's PREPARE reaches it: the engine steps its
    replica, then offers the message to its JoinBuffer, whose guess (a change appending
    V0[3] to the last set, the override's) is the genesis set again, which the schedule
    refuses with ConfigError. Fixed: the guess changes the set a change would change
    (`EpochSchedule.after_changes`), which holds V0[3]. Correct: nothing is kept (no change
    known or possible adds it before the override takes over), and keep returns False."""
    params = replace(PARAMS, transitions=((30, V0[:3]),))
    schedule = EpochSchedule.genesis(params)
    kept = JoinBuffer(params, KeyVerifier(), V0[3])
    assert not kept.keep(wire(Prepare(0, 6, digest(6), 1), V0), schedule, 5)
    assert len(kept) == 0


def test_a_member_cannot_push_the_new_primarys_first_proposal_out_of_the_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The module says a member's flood pushes out only its own. Interleaving (bound scaled
    to 100 kB, as test_join_buffer's own test does; at the defaults: 64 MiB, the honest
    primary's max_in_flight blocks over 32 MiB, e.g. W = 10 blocks of 3.3 MiB, or W = 2
    near the 16 MiB frame): the new primary (V0[0]) proposes c+1 .. c+3 with 20 kB blocks
    while the joiner still follows (60 kB, over half the bound); a byzantine member (V0[1],
    view 1's primary) sends PRE-PREPAREs of view 1 with 5 kB blocks until the bound is
    passed while holding less than the primary: the heaviest sender is then the honest
    primary, whose oldest kept message, the PRE-PREPARE of c+1, went. Correct: the new
    primary's proposal of c+1 is still there to be fed after the join. Fixed (session 10,
    was a strict xfail): the heaviest sender loses its highest message, here the primary's
    c+3."""
    monkeypatch.setattr(EngineParams, "future_block_bytes", property(lambda self: 100_000))
    kept = buffer()
    proposals = []
    for n in (C + 1, C + 2, C + 3):
        proposed = b"block %d " % n + b"." * 20_000
        proposals.append(wire(PrePrepare(0, n, keccak(proposed), 0), blocks=(proposed,)))
        assert kept.keep(proposals[-1], JOINED, 9)
    for n in range(C + 1, C + 10):
        flood = b"flood %d " % n + b"x" * 5_000
        kept.keep(wire(PrePrepare(1, n, keccak(flood), 1), blocks=(flood,)), JOINED, 9)
    assert kept.kept_bytes <= 100_000
    assert proposals[0] in kept.take()


# --- what held -------------------------------------------------------------------------------


def test_a_primary_equivocating_to_a_follower_gets_one_prepare_from_the_joiner() -> None:
    """The new primary (V0[0], byzantine) sends the follower PRE-PREPARE(0, 11, d1) and later,
    live after the join, PRE-PREPARE(0, 11, d2); a second copy with d2 sent while it still
    followed is not kept (the first stays). The joiner prepares d1 once and never d2."""
    forged = b"forged block 11"
    first = wire(PrePrepare(0, C + 1, digest(C + 1), 0), blocks=(block(C + 1),))
    second = wire(PrePrepare(0, C + 1, keccak(forged), 0), blocks=(forged,))
    kept = buffer()
    assert kept.keep(first, scheduled(ADDED), 9)
    assert not kept.keep(second, scheduled(ADDED), 9)
    for data in old_checkpoints():
        kept.keep(data, scheduled(ADDED), 9)
    driven = fed(joined(), kept)
    driven.step(MessageReceived(second))
    prepares = [p for p in driven.sent(Prepare) if p.seq_no == C + 1]
    assert prepares == [Prepare(0, C + 1, digest(C + 1), 4, epoch=1)]


def test_a_round_kept_from_a_view_the_joiner_does_not_start_in_is_not_voted_on() -> None:
    """c was committed in view 1 (a view change before the handover): the joiner starts in
    view 1. A view-0 round at c+1 from view 0's primary, kept while it followed (the buffer
    does not know the view its replica starts in), is dropped as an old view when fed: no
    PREPARE or COMMIT of view 0 is signed."""
    kept = buffer()
    for data in [*round_of(C + 1), *old_checkpoints()]:
        assert kept.keep(data, scheduled(ADDED), 9)
    driven = fed(joined(view=1), kept)
    assert not [m for m in [*driven.sent(Prepare), *driven.sent(Commit)] if m.view == 0]
    assert driven.replica.last_exec == C
    assert driven.replica.dropped["old view"] == len(round_of(C + 1))


def test_a_vote_kept_before_the_change_from_a_member_another_change_removes_is_not_counted(
        ) -> None:
    """Two changes queued: V0[1] removed (passes at 8, c = 10), the newcomer added (passes
    at 18, c = 20). At head 5 the follower knows neither and guesses c = 10: V0[1], a member
    of the last set it knows, signs votes naming epoch 2 at 21 and 22 (index 1: V0[2] there;
    index 3: the newcomer's), kept with the index unchecked. Imported to 19, the real window
    (21 .. 60) keeps them, unchecked again; the replica joined at 20 drops both as signed
    by a key other than the member they name, and counts neither."""
    both = scheduled(REMOVED).schedule((*REMOVED, NEWCOMER), passed_at=18)
    c = 20
    kept = buffer()
    for body in (Prepare(0, c + 1, digest(c + 1), 1), Commit(0, c + 2, digest(c + 2), 3)):
        forged = WireMessage(_signed_as(V0[1], body, epoch=2)).encode()
        assert kept.keep(forged, GENESIS_SCHEDULE, 5)
    kept.keep(b"\xc0", both, 19)  # (b imported: the real window)
    assert len(kept) == 2
    driven = fed(joined(both, c), kept)
    assert driven.replica.dropped["SignatureError"] == 2
    assert not driven.replica.log.slot(0, c + 1).prepares
    assert not driven.replica.log.slot(0, c + 2).commits


def _signed_as(address: bytes, body: Any, epoch: int) -> Signed[Any]:
    """`body` signed by `address`, naming `epoch`, whatever member its index names."""
    auth = Authenticator(PARAMS.chain_id, (address,) * 8, KeyVerifier(), epoch)
    return auth.sign(replace(body, epoch=epoch), KEYS[address])


def test_a_member_flooding_a_guessing_follower_holds_its_own_slots_only() -> None:
    """While the follower guesses (head 5, no change known), a byzantine member (V0[2]) signs
    every kind at every height of the guessed window and beyond, naming made-up epochs, in
    ever higher views: it holds at most 4 x (L + 1 + FOLLOWER_LAG) messages, the honest
    members' kept messages stay as they were, and a key outside the last set keeps nothing."""
    kept = buffer()
    honest = [*round_of(C + 1)[:2], *old_checkpoints()]
    for data in honest:
        assert kept.keep(data, GENESIS_SCHEDULE, 5)
    before = dict(kept._kept)
    top = C + L + FOLLOWER_LAG
    for view in (0, 7, 3):
        for n in range(C - 3, top + 5):
            for body in (PrePrepare(view, n, digest(n), 2), Prepare(view, n, digest(n), 2),
                         Commit(view, n, digest(n), 2),
                         Checkpoint(n, digest(n), digest(n), 2)):
                kept.keep(WireMessage(_signed_as(V0[2], body, 99)).encode(),
                          GENESIS_SCHEDULE, 5)
    assert senders(kept)[V0[2]] <= 4 * (L + 1 + FOLLOWER_LAG)
    assert all(kept._kept.get(k) == v for k, v in before.items() if k[0] != V0[2])
    outsider = WireMessage(_signed_as(POOL[6], Prepare(0, C + 1, digest(C + 1), 1), 1))
    assert not kept.keep(outsider.encode(), GENESIS_SCHEDULE, 5)
