"""Attack review of session 8's handover commits (issue 31): 712db5f (779086e as amended), a
replica that missed a view change joins the others' view by a commit certificate of its
installed set (`new_view.join_certified_view`), and block sync passes on the certificate of
a STATUS answer's head that the replica holds too when the answer's NEW-VIEW is above its
view; and 00a9d58, a node restored at a checkpoint multiple its core never heard of signs
its CHECKPOINT there (`handover.checkpoint_restored_head`).

Finding (was a strict xfail naming the interleaving; fixed, it passes):
1. LIVENESS (a regression of the amendment): 779086e let block sync pass on the head's
certificate when the replica was not active in the certificate's view; 712db5f passes it on
only when the STATUS answer's NEW-VIEW is ABOVE the replica's view. A replica that asked for
view v in epoch k (its VIEW-CHANGE is epoch k's) and was cut off while the others completed
v and went on in it past two handovers waits in v, not active, once it catches up: the
others' NEW-VIEW of v is two epochs old (refused), it is not above v (block sync does not
even offer it), and on a quiet chain every peer's head is the replica's own, so the
certificate that takes it into v, active (the core does), never reaches it. It stays out of
the quorum (one of the f faults spent) until the next block or view change: with its stable
checkpoint still epoch k's it cannot even ask for v + 1; with a later one, one new-view
timeout after the stale NEW-VIEW it asks alone and is stranded there. Fixed: the held
head's certificate is passed on when the replica is not active as well (one condition in
`BlockSync._on_status` and the simulator's `_on_status` / `_useful_peer`).

Held (passing tests): lying peers' STATUS answers with an unverified NEW-VIEW far above
open block sync's gate, but the held head's certificate then moves nothing it does not
prove (the gate saves work; the core checks); a certificate mixing views (a byzantine
member's COMMIT for the last view first) moves nothing, nor does an empty or undecodable
one; a replica that waits in v holding a block prepared above its head (its VIEW-CHANGE
carries it) is not made active in v by a certificate of v (core8's fork, by the waiting
route); a lower view's certificate never moves a replica back; a node restored at c after
its records were wiped (amnesia) still signs CHECKPOINT(c), the same one any correct member
signs, and no vote; a removed validator restored at a multiple above c signs nothing and
only leaves.

Why the certificate move holds against a fork (checked, no test: every interleaving needs a
quorum that cannot exist): the first certificate of view v at a height of the installed
epoch needs Q - f correct members that entered v otherwise than by a certificate: by a
NEW-VIEW of that epoch, whose O carries every block committed below v; or by a join at c or
the old set's NEW-VIEW, below which nothing of that epoch was committed. A conflicting block
at n in v then needs Q - f correct replicas without O's entry at n, the movers, of which
there are at most (N - f) - (Q - f) = N - Q, and f + N - Q < Q. Amnesia does not change
that count (an amnesiac voter that moves is one of the N - Q). A mover never votes again
at a height it executed (a PRE-PREPARE there is dropped).
"""

from __future__ import annotations

import asyncio

from eth_hash.auto import keccak

from encoding.rlp import MAX_UINT64
from pbft_engine.core import (
    ChainHead,
    FetchCompleted,
    LeftValidatorSet,
    MessageReceived,
    PeerCommitted,
    Replica,
    RequestReceived,
    TimerFired,
    TimerKind,
)
from pbft_engine.core.records import u64
from pbft_engine.core.signing_bound import SigningBound
from pbft_engine.epoch_feed import EpochFeed
from pbft_engine.messages import (
    Commit,
    KeyVerifier,
    NewView,
    ViewChange,
    WireMessage,
    encode_commit_certificate,
)
from pbft_engine.record_store import MemoryConsensusStore
from pbft_engine.sync import BlockSync
from pbft_engine.sync_messages import Status, encode_sync
from tests.unit.pbft.helpers import PARAMS
from tests.unit.pbft.test_pbft_catch_up import SyncPeers
from tests.unit.pbft.test_pbft_epochs import ADDED, KEYS, REMOVED, V0, scheduled, signed
from tests.unit.test_attack_review_core8 import (
    E4,
    SETS,
    E,
    N,
    member_of_epoch_4,
    prepared_x,
    rotation,
    view_1_commits_y,
)
from tests.unit.test_handover_gaps import certified, checkpoints_sent
from tests.unit.test_replica_handover import (
    C,
    Driven,
    backup,
    checkpoint_from,
    commit_through,
    digest,
    removed_primary_through_c,
    state,
)

# --- finding 1: block sync never passes on the head's certificate of the view it waits in ----

E1, E2 = SETS[0], SETS[1]  # epoch 1 (A, B, C, D, E) decides 11..20, epoch 2 (B, C, D, E) 21..30
HEAD_41 = certified(N, 1, (0, 1, 3))  # C, D and F of epoch 4, in view 1
NEW_VIEW_1 = signed(NewView(1, tuple(signed(ViewChange(1, 20, (), (), (), i), E2, 2)
                                     for i in (0, 1, 2)), (), 1), E2, 2)  # C: view 1's primary


def waits_in_view_1_past_two_handovers() -> Driven:
    """E in epoch 2 (block 20 committed, stable with Q of epoch 1) asks for view 1 when its
    primary keeps a transaction waiting: its VIEW-CHANGE is epoch 2's. It is cut off while
    the others complete view 1 there and go on in it past the handovers at 30 and 40 to
    block 41, committed in view 1 by C, D and F; then the chain goes quiet. The head's
    certificate reaches E while epoch 2 is installed (it cannot move it: another epoch's
    height), so E fetches to 41, which installs epoch 4; the others' NEW-VIEW of view 1,
    answering its resent VIEW-CHANGE, is two epochs old (refused), and when the new-view
    timer it arms runs out E cannot ask for view 2 either (its stable checkpoint is epoch
    2's). It waits in view 1, not active, at the others' head."""
    driven = Driven(Replica(PARAMS, None, KEYS[E], KeyVerifier(), ChainHead(19, digest(19)),
                            block_digest=keccak, schedule=rotation()))
    commit_through(driven, 20, voters=range(5), epoch_set=E1)
    checkpoint_from(driven, (0, 1, 2, 3), 20, E1)
    driven.step(RequestReceived(keccak(b"a transfer")))
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    driven.step(HEAD_41)
    driven.step(FetchCompleted(N, digest(N), state(N), ()))
    driven.step(MessageReceived(WireMessage(NEW_VIEW_1).encode()))
    driven.step(TimerFired(TimerKind.NEW_VIEW, u64(1)))
    replica = driven.replica
    assert (replica.epochs.current.number, replica.last_exec, replica.stable_checkpoint) == (
        4, N, 20)
    assert (replica.view, replica.active) == (1, False)
    return driven


def after_a_quiet_poll(driven: Driven, certificate: bytes = HEAD_41.certificate,
                       new_view: bytes = NEW_VIEW_1.encode()) -> Driven:
    """E's block sync finds no progress for a poll and asks every peer where it is; each
    answers with head 41, its certificate, and the NEW-VIEW it is in (by default view 1's,
    of epoch 2)."""
    feed = EpochFeed(rotation(), lambda block_hash: rotation())
    feed.refresh(N, digest(N))
    peers = SyncPeers(chain_id=PARAMS.chain_id)
    sync = BlockSync(peers, None, feed, deliver=driven.step,  # type: ignore[arg-type]
                     replica_status=driven.replica.status, held_block=driven.replica.block_for,
                     chain_lock=asyncio.Lock(), poll_interval=1.0)
    sync.start()
    peers.tick()  # progress seen
    peers.tick()  # none since: ask every peer where it is
    for peer in peers.peers():
        sync.on_message(peer, encode_sync(Status(N, digest(N), certificate, new_view)))
    return driven


def test_a_replica_waiting_in_the_others_view_joins_it_on_a_quiet_chain() -> None:
    """The STATUS answers carry what `join_certified_view` takes E into view 1 with (the
    head's certificate: Q of its installed set in view 1, and E holds nothing prepared), but
    block sync passes it on only when the answer's NEW-VIEW is above E's view, and view 1's
    is not: E stays out of the quorum until a block or a view change."""
    driven = after_a_quiet_poll(waits_in_view_1_past_two_handovers())
    assert (driven.replica.view, driven.replica.active) == (1, True)


def test_the_head_s_certificate_takes_the_waiting_replica_into_the_view() -> None:
    """The control of finding 1: the same certificate, handed to the core, does (the gap is
    block sync's gate only)."""
    driven = waits_in_view_1_past_two_handovers()
    driven.step(HEAD_41)
    assert (driven.replica.view, driven.replica.active) == (1, True)


def test_a_lying_peer_s_new_view_opens_the_gate_but_moves_nothing() -> None:
    """Block sync decodes a STATUS answer's NEW-VIEW but does not verify it: lying peers
    answer with D's NEW-VIEW for view 99 (no VIEW-CHANGE in it) to have E's own head's
    certificate (view 0) passed on. The NEW-VIEW is refused and the certificate proves no
    view E is not active in (today's gate passes it on: it only saves work, it is no
    check; a fix of finding 1 may close it to such lies too)."""
    driven = member_of_epoch_4()
    commit_through(driven, N, voters=range(4), epoch_set=E4)
    forged = signed(NewView(99, (), (), 1), E4, 4).encode()
    after_a_quiet_poll(driven, certified(N, 0, (0, 1, 3)).certificate, forged)
    replica = driven.replica
    assert (replica.view, replica.active, replica.halted) == (0, True, False)
    assert driven.sent(ViewChange) == []


# --- held: what a certificate must be to move a replica --------------------------------------


def test_a_certificate_mixing_views_moves_nothing() -> None:
    """D (byzantine) puts its own COMMIT for the last view first, before C's and F's for
    view 1: the view read is the first COMMIT's, but the certificate is checked for one
    view, so E neither goes to view 2**64 - 1 (where it could never ask for another) nor
    anywhere."""
    driven = member_of_epoch_4()
    commits = [signed(Commit(MAX_UINT64, N, digest(N), 1), E4, 4),
               *(signed(Commit(1, N, digest(N), i), E4, 4) for i in (0, 3))]
    driven.step(PeerCommitted(N, digest(N), encode_commit_certificate(commits)))
    assert (driven.replica.view, driven.replica.active) == (0, True)


def test_an_empty_or_undecodable_certificate_moves_nothing() -> None:
    driven = member_of_epoch_4()
    for certificate in (encode_commit_certificate(()), b"\xc1\xc0", b"garbage"):
        driven.step(PeerCommitted(N, digest(N), certificate))
        assert (driven.replica.view, driven.replica.active) == (0, True)
    assert not driven.replica.halted


def test_a_replica_waiting_with_a_prepared_block_is_not_made_active_by_a_certificate() -> None:
    """core8's finding 1 by the waiting route: E holds X prepared at 41 (C committed it in
    view 0), times C out and asks for view 1, its VIEW-CHANGE carrying X. A certificate of
    view 1 (for 42, by C, D and F) does not make it active in view 1 without the NEW-VIEW
    that would carry X there: D's Y at 41 stays uncommitted here."""
    driven = prepared_x()
    driven.step(RequestReceived(keccak(b"a transfer")))
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    assert (driven.replica.view, driven.replica.active) == (1, False)
    driven.step(certified(N + 1, 1, (0, 1, 3)))
    assert (driven.replica.view, driven.replica.active) == (1, False)
    assert view_1_commits_y(driven) == [], "Y committed at 41 where C committed X"


def test_a_lower_view_s_certificate_never_moves_a_replica_back() -> None:
    driven = member_of_epoch_4()
    driven.step(certified(N, 2, (0, 1, 3)))
    driven.step(certified(N, 1, (0, 1, 3)))
    assert (driven.replica.view, driven.replica.active) == (2, True)


# --- held: the CHECKPOINT a restored node signs at its head ---------------------------------


def test_a_node_restored_at_c_without_its_records_signs_the_checkpoint_and_no_vote() -> None:
    """An operator rebuilt V0[2]'s consensus records (empty store, its state file says it
    voted up to c): at head c it signs CHECKPOINT(c) with the head's block hash and state
    root, the one every correct member signs there (a fact of the chain, not a vote), so
    the handover does not wait on it; amnesia keeps it from voting."""
    driven = backup(2, ADDED)
    commit_through(driven, C)
    restored = Driven(Replica.restore(PARAMS, None, KEYS[V0[2]], KeyVerifier(),
                                      ChainHead(C, digest(C), state(C)), MemoryConsensusStore(),
                                      block_digest=keccak, signing_bound=SigningBound(0, 40),
                                      schedule=scheduled(ADDED)))
    assert restored.replica.amnesia is not None
    assert [(c.seq_no, c.block_hash, c.state_root, c.replica)
            for c in checkpoints_sent(restored)] == [(C, digest(C), state(C), 2)]
    assert checkpoints_sent(driven) == checkpoints_sent(restored)


def test_a_removed_validator_restored_at_a_later_multiple_signs_nothing() -> None:
    """V0[0], removed at c = 10, left on block 11; its node followed the chain to block 20
    (a checkpoint multiple of the new set, which does not count it): restored there, it
    only leaves."""
    driven = removed_primary_through_c()
    checkpoint_from(driven, (1, 2))
    assert driven.replica.stable_checkpoint == C
    restored = Replica.restore(PARAMS, None, KEYS[V0[0]], KeyVerifier(),
                               ChainHead(2 * C, digest(2 * C), state(2 * C)), driven.store,
                               block_digest=keccak, schedule=scheduled(REMOVED),
                               signing_bound=driven.replica.signing_bound)
    assert restored.start().actions == [LeftValidatorSet(1, C + 1)]
