"""Lost messages and a replica that times nothing (issue 28): what a replica sent for a slot
still open a request timeout later is sent again, a block it could not validate in time is
validated again once, and a replica asking for a view change relays what it waits for to
every peer. And the idle chain (issue 29): one empty block follows a block with
transactions."""

from __future__ import annotations

from eth_hash.auto import keccak

from pbft_engine.core import (
    Action,
    BlockBuilt,
    BlockCommitted,
    BlockValidated,
    Broadcast,
    BuildBlock,
    ChainHead,
    EngineParams,
    Ready,
    RelayRequests,
    Replica,
    RequestReceived,
    SetTimer,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.core.catch_up import busy
from pbft_engine.core.records import u64
from pbft_engine.messages import Commit, KeyVerifier, Prepare, PrePrepare, WireMessage
from pbft_engine.record_store import MemoryConsensusStore
from tests.unit.pbft.helpers import GENESIS, PARAMS, SIGNERS, from_peer

BLOCK = b"block 1"
DIGEST = keccak(BLOCK)
TX = keccak(b"a transfer")


def primary_with_block_proposed() -> Replica:
    """Replica 0, primary of view 0, has proposed block 1 (holding TX) to the others."""
    replica = Replica(PARAMS, 0, SIGNERS[0], KeyVerifier(), ChainHead(0, GENESIS),
                      block_digest=keccak)
    replica.start()
    actions = replica.step(RequestReceived(TX)).actions
    assert any(isinstance(a, BuildBlock) for a in actions)
    actions = replica.step(BlockBuilt(1, DIGEST, BLOCK, (TX,))).actions
    assert pre_prepares(actions) == [(1, (BLOCK,))]
    assert timer(actions, TimerKind.RESEND) is not None
    return replica


def pre_prepares(actions: list[Action]) -> list[tuple[int, tuple[bytes, ...]]]:
    """The PRE-PREPAREs broadcast in these actions: (seqNo, blocks attached)."""
    wires = [WireMessage.decode(a.data) for a in actions if isinstance(a, Broadcast)]
    return [(w.signed.body.seq_no, w.blocks) for w in wires
            if isinstance(w.signed.body, PrePrepare)]


def timer(actions: list[Action], kind: TimerKind) -> int | None:
    armed = [a.duration_ms for a in actions if isinstance(a, SetTimer) and a.kind is kind]
    return armed[-1] if armed else None


def test_a_primary_sends_its_pre_prepare_again_while_its_block_stays_open() -> None:
    """A backup that restarted while the PRE-PREPARE travelled, and whose pool lost the
    block's transactions, has no request timer: only the primary's resend moves it
    (simulator: slow seed 2008 at N = 2 stayed at height 6 for ever)."""
    replica = primary_with_block_proposed()
    actions = replica.step(TimerFired(TimerKind.RESEND, b"")).actions
    assert pre_prepares(actions) == [(1, (BLOCK,))]
    assert timer(actions, TimerKind.RESEND) == PARAMS.request_timeout_ms


def test_nothing_is_sent_again_once_the_block_committed() -> None:
    replica = primary_with_block_proposed()
    for peer in (1, 2):
        replica.step(from_peer(Prepare(0, 1, DIGEST, peer)))
    for peer in (1, 2):
        replica.step(from_peer(Commit(0, 1, DIGEST, peer)))
    replica.step(BlockCommitted(1, DIGEST, keccak(b"state 1"), (TX,)))
    actions = replica.step(TimerFired(TimerKind.RESEND, b"")).actions
    assert not [a for a in actions if isinstance(a, Broadcast)]
    assert timer(actions, TimerKind.RESEND) is None  # nothing open: the timer stops


def test_a_block_unanswered_by_its_deadline_is_validated_again_once() -> None:
    """Two validators (f = 0): the backup's executor loses its answer for block 1 and its
    pool holds none of the block's transactions, so only its vote can commit the block. At
    the validation deadline the block is validated again at once (its executor failed, not
    the primary: no VIEW-CHANGE, which at N > 2 would strand it alone), and it votes. A
    second deadline gives the block up in this view: at most two validations of one block
    are ever outstanding."""
    signers = SIGNERS[:2]
    params = EngineParams(chain_id=PARAMS.chain_id, validators=tuple(s.address for s in signers))

    def backup_validating() -> Replica:
        replica = Replica(params, 1, signers[1], KeyVerifier(), ChainHead(0, GENESIS),
                          block_digest=keccak)
        replica.start()
        actions = replica.step(from_peer(PrePrepare(0, 1, DIGEST, 0), (BLOCK,))).actions
        assert [a.seq_no for a in actions if isinstance(a, ValidateBlock)] == [1]
        actions = replica.step(TimerFired(TimerKind.VALIDATION, u64(1))).actions
        assert [a.seq_no for a in actions if isinstance(a, ValidateBlock)] == [1]
        return replica

    replica = backup_validating()
    actions = replica.step(BlockValidated(1, DIGEST, True)).actions
    sent = [WireMessage.decode(a.data).signed.body for a in actions if isinstance(a, Broadcast)]
    assert any(isinstance(body, Commit) for body in sent)  # N = 2: prepared at once
    assert (replica.view, replica.active, replica.view_change_reasons) == (0, True, {})

    replica = backup_validating()
    actions = replica.step(TimerFired(TimerKind.VALIDATION, u64(1))).actions
    assert not [a for a in actions if isinstance(a, ValidateBlock)]
    assert replica.log.certs[(0, 1)].refused and not busy(replica)


def test_a_replica_asking_for_a_view_change_relays_its_oldest_requests_to_every_peer() -> None:
    """Cut off when its timer ran out, a backup asks alone for view 1 and holds transactions
    whose gossip never reached the others, who stay in view 0: each VIEW-CHANGE it sends
    relays its oldest requests to every peer, so they commit them there (simulator: chaos
    seed 31 at N = 6 never committed them)."""
    replica, actions = stranded_backup()
    assert relayed(actions) == {0: (TX,), 1: (TX,), 3: (TX,)}
    actions = replica.step(TimerFired(TimerKind.VIEW_CHANGE_RESEND, u64(1))).actions
    assert relayed(actions) == {0: (TX,), 1: (TX,), 3: (TX,)}


def stranded_backup() -> tuple[Replica, list[Action]]:
    """Backup 2, holding TX, whose request timer ran out: it asks for view 1 (alone)."""
    replica = Replica(PARAMS, 2, SIGNERS[2], KeyVerifier(), ChainHead(0, GENESIS),
                      block_digest=keccak)
    replica.start()
    replica.step(RequestReceived(TX))
    actions = replica.step(TimerFired(TimerKind.REQUEST, b"")).actions
    assert (replica.view, replica.active) == (1, False)
    return replica, actions


def relayed(actions: list[Action]) -> dict[int, tuple[bytes, ...]]:
    return {a.replica: a.tx_hashes for a in actions if isinstance(a, RelayRequests)}


def test_one_empty_block_follows_a_block_with_transactions() -> None:
    """A web3 1.x client that missed its receipt at block 1 waits for the next head: the
    primary proposes one empty block `trailing_empty_block` after it, and none after that
    empty block (an idle chain stays idle)."""
    replica = primary_with_block_proposed()
    for peer in (1, 2):
        replica.step(from_peer(Prepare(0, 1, DIGEST, peer)))
        replica.step(from_peer(Commit(0, 1, DIGEST, peer)))
    actions = replica.step(BlockCommitted(1, DIGEST, keccak(b"state 1"), (TX,))).actions
    assert timer(actions, TimerKind.TRAILING_BLOCK) == PARAMS.trailing_block_ms
    actions = replica.step(TimerFired(TimerKind.TRAILING_BLOCK, b"")).actions
    builds = [a for a in actions if isinstance(a, BuildBlock)]
    assert len(builds) == 1 and builds[0].seq_no == 2 and builds[0].allow_empty
    empty = b"block 2, empty"
    actions = replica.step(BlockBuilt(2, keccak(empty), empty, ())).actions
    assert pre_prepares(actions) == [(2, (empty,))]
    for peer in (1, 2):
        replica.step(from_peer(Prepare(0, 2, keccak(empty), peer)))
        replica.step(from_peer(Commit(0, 2, keccak(empty), peer)))
    actions = replica.step(BlockCommitted(2, keccak(empty), keccak(b"state 2"), ())).actions
    assert timer(actions, TimerKind.TRAILING_BLOCK) is None


def test_no_empty_block_while_a_block_is_in_flight() -> None:
    """The wait runs out while the primary's next block (with transactions) is proposed and
    not committed: no empty block goes on top of it (its commit arms the wait again)."""
    replica = primary_with_block_proposed()
    actions = replica.step(TimerFired(TimerKind.TRAILING_BLOCK, b"")).actions
    assert not [a for a in actions if isinstance(a, BuildBlock)]
    assert not replica.block_due


def test_a_restarted_primary_keeps_sending_its_open_pre_prepare() -> None:
    """The primary restarts with block 1 proposed and not certified: it sends the
    PRE-PREPARE again at once, and again every request timeout while the block stays open
    (the resend timer died with the process). Before, it sent it once: a validator that
    was not listening then never got it, and with one that cannot ask for a view change
    yet (an added validator, joined at the handover without its checkpoint's proof) the
    chain stopped for good (simulator: chaos seed 41 at N = 2 with set changes)."""
    store = MemoryConsensusStore()

    def written(ready: Ready) -> list[Action]:
        if ready.persist is not None:
            store.apply(ready.persist.ops)
        return list(ready.actions)

    replica = Replica(PARAMS, 0, SIGNERS[0], KeyVerifier(), ChainHead(0, GENESIS),
                      block_digest=keccak)
    written(replica.start())
    written(replica.step(RequestReceived(TX)))
    assert pre_prepares(written(replica.step(BlockBuilt(1, DIGEST, BLOCK, (TX,))))) == [
        (1, (BLOCK,))]
    restarted = Replica.restore(PARAMS, 0, SIGNERS[0], KeyVerifier(), ChainHead(0, GENESIS),
                                store, block_digest=keccak, signing_bound=replica.signing_bound)
    actions = written(restarted.start())
    assert pre_prepares(actions) == [(1, (BLOCK,))]
    assert timer(actions, TimerKind.RESEND) == PARAMS.request_timeout_ms
    actions = written(restarted.step(TimerFired(TimerKind.RESEND, b"")))
    assert pre_prepares(actions) == [(1, (BLOCK,))]
