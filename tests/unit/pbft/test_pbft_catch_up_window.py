"""After a catch-up to a head that is no stable checkpoint here, a replica votes only within
L of its stable checkpoint (issue 28; found by an attacker's review, both tests failed then).

A catch-up to a peer's certified head (any height) moves h there and leaves the stable
checkpoint where it was: the checkpoints it fetched over were never executed here. The
replica used to vote in (h, h + L], so its VIEW-CHANGE carried prepared entries above
stable + L, which every other replica refuses (a VIEW-CHANGE reports at most L entries above
its checkpoint); with the byzantine primary silent after proposing, only two VIEW-CHANGEs
were valid, in every later view too: the cluster halted for good.
"""

from __future__ import annotations

from eth_hash.auto import keccak

from pbft_engine.core import (
    Action,
    BlockValidated,
    Broadcast,
    CommitBlock,
    FetchCompleted,
    MessageReceived,
    PeerCommitted,
    Replica,
    RequestReceived,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.messages import (
    Checkpoint,
    Commit,
    MessageType,
    NewView,
    Prepare,
    PrePrepare,
    ViewChange,
    WireMessage,
)
from tests.unit.pbft.helpers import PARAMS, from_peer
from tests.unit.pbft.test_pbft_request_timer import WAITING, start_replica

HEAD = PARAMS.log_size + PARAMS.checkpoint_interval // 2  # 45: no checkpoint
CHECKPOINT = HEAD + PARAMS.checkpoint_interval // 2  # 50
BLOCK_HASH, STATE_ROOT = keccak(b"block 50"), keccak(b"state 50")


def view_changes(actions: list[Action]) -> list[bytes]:
    return [a.data for a in actions if isinstance(a, Broadcast)
            and WireMessage.decode(a.data).signed.body.TYPE is MessageType.VIEW_CHANGE]


def caught_up() -> Replica:
    """Replica 2 restarts at genesis and catches up to the peers' head 45 (stable: 0)."""
    replica = start_replica(2)
    replica.step(RequestReceived(WAITING))
    replica.step(PeerCommitted(HEAD, keccak(b"block 45"), b""))
    replica.step(FetchCompleted(HEAD, keccak(b"block 45"), keccak(b"state"), ()))
    assert (replica.last_exec, replica.low_watermark, replica.stable_checkpoint) == (HEAD, HEAD, 0)
    return replica


def propose(replica: Replica, seq_no: int, view: int = 0) -> list[Action]:
    block = b"block %d" % seq_no
    return replica.step(from_peer(PrePrepare(view, seq_no, keccak(block), view), (block,))).actions


def test_beyond_stable_plus_l_it_signs_nothing_and_its_view_change_is_accepted() -> None:
    replica = caught_up()
    (validate,) = [a for a in propose(replica, HEAD + 1) if isinstance(a, ValidateBlock)]
    actions = replica.step(BlockValidated(validate.seq_no, validate.digest, True)).actions
    actions += replica.step(from_peer(Prepare(0, HEAD + 1, validate.digest, 3))).actions
    assert not [a for a in actions if isinstance(a, Broadcast)]  # no PREPARE, no COMMIT
    (data,) = view_changes(replica.step(TimerFired(TimerKind.REQUEST, b"")).actions)
    new_primary = start_replica(1)
    new_primary.step(RequestReceived(WAITING))
    new_primary.step(TimerFired(TimerKind.REQUEST, b""))  # its own VIEW-CHANGE(1)
    actions = new_primary.step(from_peer(ViewChange(1, 0, (), (), (), 3))).actions
    actions += new_primary.step(MessageReceived(data)).actions
    sent = [WireMessage.decode(a.data).signed.body for a in actions if isinstance(a, Broadcast)]
    assert any(isinstance(b, NewView) for b in sent) and new_primary.active, (
        f"three honest replicas formed no NEW-VIEW: {dict(new_primary.dropped)}")


def test_beyond_stable_plus_l_it_commits_on_the_others_certificate() -> None:
    """It takes the others' messages and executes the block they commit (the simulator
    found that dropping them made such a replica blame a correct primary, honest seed 735)."""
    replica = caught_up()
    (validate,) = [a for a in propose(replica, HEAD + 1) if isinstance(a, ValidateBlock)]
    replica.step(BlockValidated(validate.seq_no, validate.digest, True))
    actions: list[Action] = []
    for peer in (0, 1, 3):
        actions += replica.step(from_peer(Commit(0, HEAD + 1, validate.digest, peer))).actions
    assert [a.seq_no for a in actions if isinstance(a, CommitBlock)] == [HEAD + 1]


def test_it_votes_again_once_a_later_checkpoint_is_stable_here() -> None:
    replica = caught_up()
    for peer in (0, 1):
        replica.step(from_peer(Checkpoint(CHECKPOINT, BLOCK_HASH, STATE_ROOT, peer)))
    replica.step(PeerCommitted(CHECKPOINT, BLOCK_HASH, b""))  # fetched up to it
    assert replica.fetching == CHECKPOINT
    replica.step(FetchCompleted(CHECKPOINT, BLOCK_HASH, STATE_ROOT, ()))
    assert replica.stable_checkpoint == CHECKPOINT
    (validate,) = [a for a in propose(replica, CHECKPOINT + 1) if isinstance(a, ValidateBlock)]
    actions = replica.step(BlockValidated(validate.seq_no, validate.digest, True)).actions
    sent = [WireMessage.decode(a.data).signed.body.TYPE for a in actions
            if isinstance(a, Broadcast)]
    assert MessageType.PREPARE in sent
