"""Attack review of session 8's handover commits (issue 31): 712db5f (779086e as amended), a
replica that missed a view change joins the others' view by a commit certificate of its
installed set (`new_view.join_certified_view`), and block sync passes on the certificate of
a STATUS answer's head that the replica holds too when the answer's NEW-VIEW is above its
view; and 00a9d58, a node restored at a checkpoint multiple its core never heard of signs
its CHECKPOINT there (`handover.checkpoint_restored_head`).

Finding (a strict xfail naming the interleaving; it passes once fixed):
1. LIVENESS (a regression of the amendment): 779086e let block sync pass on the head's
certificate when the replica was not active in the certificate's view; 712db5f passes it on
only when the STATUS answer's NEW-VIEW is ABOVE the replica's view. A replica that asked for
view v in epoch k (its VIEW-CHANGE is epoch k's) and was cut off while the others completed
v and went on in it past two handovers waits in v, not active, once it catches up: the
others' NEW-VIEW of v is two epochs old (refused), it is not above v (block sync does not
even offer it), and on a quiet chain every peer's head is the replica's own, so the
certificate that would take it into v, active (the core does: `test_handover_gaps`'s
`test_a_replica_waiting_in_the_view_a_certificate_proves_goes_active`), never reaches it.
One new-view timeout later (`leave_old_epoch_view`, or the stale NEW-VIEW answering its
resent VIEW-CHANGE) it asks alone for v + 1 and is stranded there, out of the quorum, until
the others change view: the harm issue 31's seed 4 names.

Held (passing tests): a certificate mixing views (a byzantine member's COMMIT for the last
view first) moves nothing, nor does an empty or undecodable one; a replica that waits in v
holding a block prepared above its head (its VIEW-CHANGE carries it) is not made active in
v by a certificate of v (core8's fork, by the waiting route); a lower view's certificate
never moves a replica back; a node restored at c after its records were wiped (amnesia)
still signs CHECKPOINT(c), the same one any correct member signs, and no vote; a removed
validator restored at a multiple above c signs nothing and only leaves.

Why the certificate move holds against a fork (checked, no test: every interleaving needs a
quorum that cannot exist): the first certificate of view v needs Q - f correct members that
entered v by a NEW-VIEW, whose O carries every block committed below v; a conflicting block
at n in v then needs Q - f correct replicas without O's entry at n, the movers, of which
there are at most (N - f) - (Q - f) = N - Q, and f + N - Q < Q. Amnesia does not change
that count (an amnesiac voter that moves is one of the N - Q).
"""

from __future__ import annotations

import asyncio

import pytest
from eth_hash.auto import keccak

from encoding.rlp import MAX_UINT64
from pbft_engine.core import (
    BlockBuilt,
    ChainHead,
    LeftValidatorSet,
    Mode,
    PeerCommitted,
    Replica,
    ReplicaStatus,
    RequestReceived,
    ScheduleChange,
    TimerFired,
    TimerKind,
)
from pbft_engine.core.signing_bound import SigningBound
from pbft_engine.messages import (
    Authenticator,
    Commit,
    KeyVerifier,
    NewView,
    Prepare,
    encode_commit_certificate,
)
from pbft_engine.record_store import MemoryConsensusStore
from pbft_engine.sync import BlockSync
from pbft_engine.sync_messages import Status, encode_sync
from tests.unit.pbft.helpers import GENESIS, PARAMS, fixed_feed
from tests.unit.pbft.test_pbft_catch_up import CHAIN_ID, SyncPeers
from tests.unit.pbft.test_pbft_catch_up import SIGNERS as SYNC_SIGNERS
from tests.unit.pbft.test_pbft_catch_up import VALIDATORS as SYNC_VALIDATORS
from tests.unit.pbft.test_pbft_epochs import ADDED, KEYS, REMOVED, V0, scheduled, signed
from tests.unit.test_attack_review_core8 import (
    E4,
    N,
    member_of_epoch_4,
    prepared_x,
    view_1_commits_y,
)
from tests.unit.test_handover_gaps import certified, checkpoints_sent
from tests.unit.test_replica_handover import (
    PASSED_AT,
    C,
    Driven,
    backup,
    block,
    checkpoint_from,
    commit_through,
    digest,
    state,
)

# --- finding 1: block sync never passes on the head's certificate of the view it waits in ----


def sync_after_a_quiet_poll(status: ReplicaStatus, delivered: list[object]) -> BlockSync:
    """Block sync of a replica in `status` that made no progress for a poll: it asked every
    peer where it is (a quiet chain)."""
    peers = SyncPeers()
    sync = BlockSync(peers, None, fixed_feed(SYNC_VALIDATORS),  # type: ignore[arg-type]
                     deliver=delivered.append, replica_status=lambda: status,
                     held_block=lambda n, d: None,
                     chain_lock=asyncio.Lock(), poll_interval=1.0)
    sync.start()
    peers.tick()  # progress seen
    peers.tick()  # none since: ask every peer where it is
    return sync


def in_view_2(active: bool) -> ReplicaStatus:
    """At the peers' head, 5, in view 2: active, or asked for it and waiting."""
    return ReplicaStatus(view=2, active=active, seq_no=5, low_watermark=0, high_watermark=40,
                         primary=2, stable_checkpoint=0, last_executed=5, fetching=None,
                         mode=Mode.NORMAL if active else Mode.VIEW_CHANGE)


HEAD = keccak(b"head 5")
AUTH = Authenticator(CHAIN_ID, SYNC_VALIDATORS, KeyVerifier())
CERTIFIED_IN_2 = encode_commit_certificate(
    AUTH.sign(Commit(2, 5, HEAD, i), SYNC_SIGNERS[i]) for i in range(3))
NEW_VIEW_2 = AUTH.sign(NewView(2, (), (), 2), SYNC_SIGNERS[2]).encode()


def peers_answer_in_view_2(status: ReplicaStatus) -> list[object]:
    """Every peer is active in view 2 (its NEW-VIEW, of an epoch the replica cannot take it
    from) at head 5, committed in view 2: what reaches the replica."""
    delivered: list[object] = []
    sync = sync_after_a_quiet_poll(status, delivered)
    for peer in (b"a" * 20, b"b" * 20, b"c" * 20):
        sync.on_message(peer, encode_sync(Status(5, HEAD, CERTIFIED_IN_2, NEW_VIEW_2)))
    return delivered


@pytest.mark.xfail(strict=True, reason="the attack review s8, finding 1: block sync passes on "
                   "a held head's certificate only with a NEW-VIEW above the replica's view")
def test_a_replica_waiting_in_the_peers_view_gets_the_certificate_that_proves_it() -> None:
    """The replica asked for view 2 in an epoch two handovers back and was cut off; the
    others completed view 2 there and went on in it; it caught up by a fetch (in its old
    epoch when the peers' head came, so that certificate could not move it) and now waits
    in view 2, not active, at the peers' head, on a quiet chain. The certificate of that
    head, Q COMMITs of its installed set in view 2, is what `join_certified_view` takes it
    into view 2 with; block sync drops it, since the answers' NEW-VIEW is not above view 2."""
    assert PeerCommitted(5, HEAD, CERTIFIED_IN_2) in peers_answer_in_view_2(in_view_2(False))


def test_a_replica_active_in_the_peers_view_is_not_handed_its_own_head() -> None:
    """The control of finding 1: active in view 2, nothing in the answers is news."""
    assert peers_answer_in_view_2(in_view_2(True)) == []


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
    driven = Driven(Replica(PARAMS, 0, KEYS[V0[0]], KeyVerifier(), ChainHead(PASSED_AT, GENESIS),
                            block_digest=keccak))
    driven.step(ScheduleChange(REMOVED, PASSED_AT))
    for n in (9, 10):
        driven.step(BlockBuilt(n, digest(n), block(n), ()))
        for i in (1, 2):
            driven.receive(Prepare(0, n, digest(n), i), V0)
            driven.receive(Commit(0, n, digest(n), i), V0)
    checkpoint_from(driven, (1, 2))
    assert driven.replica.stable_checkpoint == C
    restored = Replica.restore(PARAMS, None, KEYS[V0[0]], KeyVerifier(),
                               ChainHead(2 * C, digest(2 * C), state(2 * C)), driven.store,
                               block_digest=keccak, schedule=scheduled(REMOVED),
                               signing_bound=driven.replica.signing_bound)
    assert restored.start().actions == [LeftValidatorSet(1, C + 1)]
