"""Two handover gaps of issue 31, closed: a replica that missed a view change joins the
others' view by a commit certificate of its installed epoch (`new_view.join_certified_view`;
chaos seed 4 at N = 7), and a node restored at a checkpoint multiple its core never heard of
signs its CHECKPOINT there (`handover.checkpoint_restored_head`; chaos seed 39 at N = 1).
docs/epochs.md says why the first is safe; the simulator's tests
(`test_a_replica_keeps_no_view_of_an_older_epoch`,
`test_a_replica_that_crashed_as_it_committed_c_still_hands_over`) run both whole.

The view tests use the rotation of `test_attack_review_core8`: E, a member of epoch 4
(C, D, E, F: first height 41, Q = 3), at block 40 in view 0; A and B are retired, D is
byzantine. The restore tests use `test_replica_handover`'s setting: V0[2], the change to
ADDED passed in block 8, so c = 10.
"""

from __future__ import annotations

import asyncio

from eth_hash.auto import keccak

from pbft_engine.core import (
    Broadcast,
    ChainHead,
    Mode,
    PeerCommitted,
    Replica,
    ReplicaStatus,
    RequestReceived,
    TimerFired,
    TimerKind,
)
from pbft_engine.messages import (
    Authenticator,
    Checkpoint,
    Commit,
    KeyVerifier,
    NewView,
    WireMessage,
    encode_commit_certificate,
)
from pbft_engine.sync import BlockSync
from pbft_engine.sync_messages import Status, encode_sync
from tests.unit.pbft.helpers import PARAMS, fixed_feed
from tests.unit.pbft.test_pbft_catch_up import CHAIN_ID, SyncPeers
from tests.unit.pbft.test_pbft_catch_up import SIGNERS as SYNC_SIGNERS
from tests.unit.pbft.test_pbft_catch_up import VALIDATORS as SYNC_VALIDATORS
from tests.unit.pbft.test_pbft_epochs import ADDED, KEYS, V0, scheduled, signed
from tests.unit.test_attack_review_core8 import (
    E3,
    E4,
    HANDOVER,
    N,
    member_of_epoch_4,
    prepared_x,
    view_1_commits_y,
)
from tests.unit.test_replica_handover import C, Driven, backup, commit_through, digest, state


def certificate(height: int, view: int, signers: tuple[int, ...],
                epoch_set: tuple[bytes, ...] = E4, epoch: int = 4) -> bytes:
    """COMMITs for block `height` in `view`, by these members of `epoch_set`."""
    return encode_commit_certificate(
        signed(Commit(view, height, digest(height), i), epoch_set, epoch) for i in signers)


def certified(height: int, view: int, signers: tuple[int, ...],
              epoch_set: tuple[bytes, ...] = E4, epoch: int = 4) -> PeerCommitted:
    return PeerCommitted(height, digest(height),
                         certificate(height, view, signers, epoch_set, epoch))


# --- a view proved by a commit certificate ------------------------------------------------


def test_a_certificate_of_the_installed_set_takes_the_replica_to_its_view() -> None:
    """Q of epoch 4 committed block 41 in view 2: E, in view 0, goes there, active."""
    driven = member_of_epoch_4()
    driven.step(certified(N, 2, (0, 1, 3)))
    replica = driven.replica
    assert (replica.view, replica.active) == (2, True)
    assert replica.view_change_reasons["new_view"] == 1


def test_a_replica_waiting_in_the_view_a_certificate_proves_goes_active() -> None:
    """E timed its primary out and asked for view 1 (no block prepared: its VIEW-CHANGE
    carries none), which a quorum of epoch 4 is active in already."""
    driven = member_of_epoch_4()
    driven.step(RequestReceived(keccak(b"a transfer")))
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    assert (driven.replica.view, driven.replica.active) == (1, False)
    driven.step(certified(N, 1, (0, 1, 3)))
    assert (driven.replica.view, driven.replica.active) == (1, True)


def test_no_certificate_of_another_epoch_or_below_quorum_moves_the_view() -> None:
    """Block 40 is epoch 3's (its NEW-VIEWs and certificates are checked with an older set,
    which retired keys may sign); epoch 0's keys (A, B retired, D byzantine) name epoch 0
    for a height of epoch 4; two of epoch 4 are fewer than Q."""
    driven = member_of_epoch_4()
    for event in (certified(HANDOVER, 5, (0, 1, 2, 3), E3, 3),
                  certified(N, 5, (0, 1, 3), V0, 0),
                  certified(N, 5, (1, 3))):
        driven.step(event)
        assert (driven.replica.view, driven.replica.active) == (0, True)


def test_a_replica_holding_a_prepared_block_takes_no_certified_view() -> None:
    """core8's finding 1 by a certificate instead of the retired set's NEW-VIEW: E holds X
    prepared at 41 (C committed it in view 0). Moved to view 1 with no NEW-VIEW to carry
    X, it would prepare and commit D's Y at 41: whoever signed the certificate, E waits
    for a NEW-VIEW (or executes 41) before it leaves view 0."""
    driven = prepared_x()
    driven.step(certified(N + 1, 1, (0, 1, 3)))
    assert driven.replica.view == 0
    assert view_1_commits_y(driven) == [], "Y committed at 41 where C committed X"


def test_block_sync_passes_on_the_certificate_of_the_head_held_from_a_later_view() -> None:
    """On a quiet chain every peer's head is ours: a STATUS answer's certificate of it
    reaches the replica if the answer's NEW-VIEW is above the replica's view (another
    epoch's, the replica may not take it), and only then (decoding costs)."""
    peers = SyncPeers()
    delivered: list[object] = []
    status = ReplicaStatus(view=1, active=True, seq_no=5, low_watermark=0, high_watermark=40,
                           primary=1, stable_checkpoint=0, last_executed=5, fetching=None,
                           mode=Mode.NORMAL)
    sync = BlockSync(peers, None, fixed_feed(SYNC_VALIDATORS),  # type: ignore[arg-type]
                     deliver=delivered.append, replica_status=lambda: status,
                     held_block=lambda n, d: None,  # type: ignore[arg-type,return-value]
                     chain_lock=asyncio.Lock(), poll_interval=1.0)
    sync.start()
    peers.tick()  # progress seen
    peers.tick()  # none since: ask every peer where it is
    head = keccak(b"head 5")

    auth = Authenticator(CHAIN_ID, SYNC_VALIDATORS, KeyVerifier())
    certificate = encode_commit_certificate(
        auth.sign(Commit(2, 5, head, i), SYNC_SIGNERS[i]) for i in range(3))

    def answer(sender: bytes, view: int) -> None:
        new_view = auth.sign(NewView(view, (), (), view % 4), SYNC_SIGNERS[view % 4])
        sync.on_message(sender, encode_sync(Status(5, head, certificate, new_view.encode())))

    answer(b"a" * 20, 1)  # the view it is in: nothing new
    assert delivered == []
    answer(b"b" * 20, 2)
    assert delivered[1:] == [PeerCommitted(5, head, certificate)]


# --- a restored head at a checkpoint multiple ----------------------------------------------


def checkpoints_sent(driven: Driven) -> list[Checkpoint]:
    return [body for a in driven.actions if isinstance(a, Broadcast)
            if isinstance(body := WireMessage.decode(a.data).signed.body, Checkpoint)]


def restored_at_c(driven: Driven, state_root: bytes) -> Driven:
    """V0[2] restarted from `driven`'s store on a chain whose head is block c."""
    return Driven(Replica.restore(PARAMS, None, KEYS[V0[2]], KeyVerifier(),
                                  ChainHead(C, digest(C), state_root), driven.store,
                                  block_digest=keccak, signing_bound=driven.replica.signing_bound,
                                  schedule=scheduled(ADDED)))


def test_a_node_restored_at_c_its_core_never_heard_of_signs_its_checkpoint() -> None:
    """Its chain committed block 10 and the node crashed before the core heard of it (the
    store stops at 9): restored at head 10, it signs CHECKPOINT(10) with the head's state
    root."""
    driven = backup(2, ADDED)
    commit_through(driven, C - 1)
    restored = restored_at_c(driven, state(C))
    assert [(c.seq_no, c.block_hash, c.state_root) for c in checkpoints_sent(restored)] == [
        (C, digest(C), state(C))]


def test_a_head_without_its_state_root_signs_nothing() -> None:
    """The control: the core before the fix (the head carried no state root)."""
    driven = backup(2, ADDED)
    commit_through(driven, C - 1)
    assert checkpoints_sent(restored_at_c(driven, b"")) == []


def test_a_checkpoint_signed_before_the_crash_is_not_signed_again() -> None:
    driven = backup(2, ADDED)
    commit_through(driven, C)
    assert [c.seq_no for c in checkpoints_sent(driven)] == [C]
    restored = restored_at_c(driven, state(C))
    assert not restored.replica.halted
    assert checkpoints_sent(restored) == []
