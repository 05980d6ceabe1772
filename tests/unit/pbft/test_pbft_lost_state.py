"""Issue 14: a replica that lost its consensus records (amnesia), stray sequence numbers, block
copies checked against their digest, and a slow replica left to finish its own work."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import rlp
from eth_hash.auto import keccak

from chain.errors import BlockValidationError, FalseBodyError
from pbft_engine.core import (
    Action,
    Alarm,
    BlockCommitted,
    BlockReceived,
    BlockValidated,
    Broadcast,
    ChainHead,
    CommitBlock,
    CommitRefused,
    FetchBlock,
    FetchCommitted,
    FetchFailed,
    Mode,
    PeerCommitted,
    Ready,
    Replica,
    RequestReceived,
    SendTo,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.core.records import u64
from pbft_engine.core.signing_bound import SigningBound
from pbft_engine.engine import PbftEngine
from pbft_engine.errors import LostRecordsError, StoreError
from pbft_engine.messages import (
    Checkpoint,
    Commit,
    KeyVerifier,
    MessageType,
    Prepare,
    PrePrepare,
    WireMessage,
    encode_commit_certificate,
)
from pbft_engine.record_store import MemoryConsensusStore
from pbft_engine.validator_state import ValidatorStateFile
from tests.simulation.cluster import Cluster
from tests.unit.pbft.helpers import (
    AUTH,
    GENESIS,
    PARAMS,
    SIGNERS,
    capture,
    commit,
    drop_from,
    drop_type,
    from_peer,
    tx_hashes,
)

ME = 2  # a backup in views 0 and 1
H = PARAMS.log_size  # the high watermark at genesis


@dataclass
class Disk:
    """What the adapter keeps for one replica: its store and its validator state file."""

    store: MemoryConsensusStore = field(default_factory=MemoryConsensusStore)
    bound: SigningBound | None = None
    bound_writes: int = 0
    crash_before_bound: bool = False  # the next step that raises the bound dies in between

    def start(self, head: int = 0, fresh: bool = False) -> Replica:
        replica = Replica.restore(PARAMS, ME, SIGNERS[ME], KeyVerifier(), ChainHead(head, GENESIS),
                                  self.store, block_digest=keccak, signing_bound=self.bound,
                                  fresh_validator=fresh)
        self.run(replica.start())
        return replica

    def run(self, ready: Ready) -> list[Action]:
        """As the adapter performs a step: the store, then the bound, then the actions."""
        if ready.persist is not None:
            self.store.apply(ready.persist.ops)
            if ready.persist.signing_bound is not None:
                if self.crash_before_bound:
                    self.crash_before_bound = False
                    raise Crashed
                self.bound, self.bound_writes = ready.persist.signing_bound, self.bound_writes + 1
        return ready.actions


class Crashed(Exception):
    """The process died between two writes of one step; nothing of the step was sent."""


def votes(actions: list[Action]) -> list[tuple[MessageType, int, int, bytes]]:
    """(type, view, seqNo, digest) of every PREPARE and COMMIT sent."""
    sent = [WireMessage.decode(a.data).signed.body for a in actions
            if isinstance(a, Broadcast | SendTo)]
    return [(b.TYPE, b.view, b.seq_no, b.digest) for b in sent if isinstance(b, Prepare | Commit)]


def sent_types(actions: list[Action]) -> set[MessageType]:
    return {WireMessage.decode(a.data).signed.body.TYPE for a in actions
            if isinstance(a, Broadcast | SendTo)}


def pre_prepare(seq_no: int, tag: bytes, view: int = 0) -> tuple[bytes, object]:
    block = b"block %d: %s" % (seq_no, tag)
    return keccak(block), from_peer(PrePrepare(view, seq_no, keccak(block), 0), (block,))


def test_a_wiped_replica_never_votes_again_where_it_voted() -> None:
    """Issue 14's fork at N = 4: byzantine primary 0 sends d' to replicas 1 and 2 (R), which
    prepare and commit it; R is wiped and rejoins; 0 sends d to R and 3. R must not vote for
    d: with its vote, 3 would commit d while 1 can still commit d' with R's earlier COMMIT."""
    disk = Disk()
    replica = disk.start()
    first, message = pre_prepare(1, b"d' for replicas 1 and 2")
    sent = disk.run(replica.step(message))
    sent += disk.run(replica.step(BlockValidated(1, first, True)))
    sent += disk.run(replica.step(from_peer(Prepare(0, 1, first, 1))))
    assert votes(sent) == [(MessageType.PREPARE, 0, 1, first), (MessageType.COMMIT, 0, 1, first)]
    assert disk.bound == SigningBound(0, H)  # written before the first vote left

    disk.store = MemoryConsensusStore()  # rebuilt: a new chaindata, the state file kept
    wiped = disk.start()
    assert wiped.amnesia == SigningBound(0, H) and wiped.status().mode is Mode.FOLLOWING
    second, message = pre_prepare(1, b"d for replicas 2 and 3")
    sent = disk.run(wiped.step(message))
    sent += disk.run(wiped.step(BlockValidated(1, second, True)))
    for peer in (0, 3):
        sent += disk.run(wiped.step(from_peer(Prepare(0, 1, second, peer))))
        sent += disk.run(wiped.step(from_peer(Commit(0, 1, second, peer))))
    sent += disk.run(wiped.step(RequestReceived(keccak(b"waiting"))))
    sent += disk.run(wiped.step(TimerFired(TimerKind.REQUEST, b"")))
    assert votes(sent) == []
    assert MessageType.VIEW_CHANGE not in sent_types(sent)  # it may have sent one for view 1


def test_a_store_older_than_the_state_file_is_amnesia_too() -> None:
    """A store restored from a backup taken before the validator moved to view 1: the state
    file says it may have signed in view 1 (its VIEW-CHANGE), the store does not. It follows,
    and sends no second VIEW-CHANGE for view 1 (the first may have reported other blocks)."""
    disk = Disk()
    replica = disk.start()
    digest, message = pre_prepare(1, b"prepared in view 0")
    disk.run(replica.step(message))
    disk.run(replica.step(BlockValidated(1, digest, True)))
    assert disk.bound == SigningBound(0, H)
    backup = copy.deepcopy(disk.store)  # it holds this replica's PREPARE in view 0
    sent = disk.run(replica.step(RequestReceived(keccak(b"waiting"))))
    sent += disk.run(replica.step(TimerFired(TimerKind.REQUEST, b"")))
    assert MessageType.VIEW_CHANGE in sent_types(sent) and disk.bound == SigningBound(1, H)
    assert Disk(copy.deepcopy(disk.store), disk.bound).start().amnesia is None  # its own store

    disk.store = backup
    restored = disk.start()
    assert restored.amnesia == SigningBound(1, H) and restored.status().mode is Mode.FOLLOWING
    sent = disk.run(restored.step(RequestReceived(keccak(b"waiting"))))
    sent += disk.run(restored.step(TimerFired(TimerKind.REQUEST, b"")))
    assert MessageType.VIEW_CHANGE not in sent_types(sent)


def test_a_wiped_replica_votes_again_beyond_everything_it_may_have_signed() -> None:
    """In a cluster: wiped mid-run, it follows (catching up, checkpointing), votes again once
    its stable checkpoint passes its old window, and then counts towards a view change; no
    honest replica ever signs two messages for one slot (the simulator checks every send)."""
    cluster = Cluster(4)
    commit(cluster, tx_hashes(3, "before"))
    cluster.wipe(2)
    wiped = cluster.nodes[2]
    bound = wiped.replica.amnesia
    assert bound is not None and bound.seq_no >= 3
    before = len(cluster.signed_by)
    commit(cluster, tx_hashes(1, "while it follows"))
    assert not any(key[0] == 2 and key[1] in (MessageType.PREPARE, MessageType.COMMIT)
                   for key in list(cluster.signed_by)[before:])
    while wiped.replica.stable_checkpoint < bound.seq_no:
        commit(cluster, tx_hashes(1, f"block {len(wiped.chain.blocks)}"))
    assert wiped.replica.amnesia is None
    before = len(cluster.signed_by)
    commit(cluster, tx_hashes(1, "voting again"))
    assert any(key[0] == 2 and key[1] is MessageType.PREPARE
               for key in list(cluster.signed_by)[before:])
    cluster.filters.append(drop_from(0))  # the primary falls silent: 1, 2 and 3 move on
    commit(cluster, tx_hashes(2, "view 1"), nodes=cluster.nodes[1:])
    assert wiped.replica.view >= 1
    cluster.check_safety()


def test_lost_records_without_a_state_file_refuse_to_start_unless_fresh() -> None:
    with pytest.raises(LostRecordsError):
        Disk().start(head=5)
    assert Disk().start(head=5, fresh=True).amnesia is None  # the operator's word
    new = Disk()
    assert new.start(head=0).amnesia is None  # a new validator on a new chain
    assert new.bound == SigningBound()  # written at once: it has signed nothing yet
    synced = Disk(bound=SigningBound())  # it synced blocks, never voted (the N = 3 long run)
    assert synced.start(head=5).amnesia is None


def test_the_signing_bound_moves_a_window_at_a_time() -> None:
    """The state file is rewritten when a vote passes the bound, not for every vote."""
    cluster = Cluster(4)
    for i in range(3 * cluster.params.log_size):
        commit(cluster, tx_hashes(1, f"block {i}"))
    node = cluster.nodes[2]
    assert node.signing_bound is not None
    assert node.signing_bound.seq_no >= len(node.chain.blocks)
    disk = Disk()
    replica = disk.start()
    for seq_no in range(1, 4):
        digest, message = pre_prepare(seq_no, b"x")
        disk.run(replica.step(message))
        disk.run(replica.step(BlockValidated(seq_no, digest, True)))
        for peer in (0, 1):
            disk.run(replica.step(from_peer(Prepare(0, seq_no, digest, 1))))
            disk.run(replica.step(from_peer(Commit(0, seq_no, digest, peer))))
        disk.run(replica.step(_committed(seq_no, digest)))
    assert disk.bound_writes == 2 and disk.bound == SigningBound(0, H)  # at start, 1st vote


def _committed(seq_no: int, digest: bytes) -> BlockCommitted:
    return BlockCommitted(seq_no, digest, keccak(digest), ())


def test_a_pre_prepare_beyond_the_pipeline_waits_and_never_raises_the_seq_no() -> None:
    """A backup takes PRE-PREPAREs up to max_in_flight past its last certified block (a
    correct primary is never further ahead), validates each on the one before it, and votes
    for block n only once n-1 is prepared here: any view change's O then keeps n's parent."""
    assert PARAMS.max_in_flight == 2
    disk = Disk()
    replica = disk.start()
    _, message = pre_prepare(5, b"stray")
    assert not any(isinstance(a, ValidateBlock) for a in disk.run(replica.step(message)))
    assert replica.seq_no == 0 and (0, 5) not in replica.log.certs
    third, early = pre_prepare(3, b"third")
    disk.run(replica.step(early))  # beyond 0 + max_in_flight: held
    assert (0, 3) not in replica.log.certs
    second, early = pre_prepare(2, b"second")
    actions = disk.run(replica.step(early))  # inside the pipeline, but its parent is unknown
    assert (0, 2) in replica.log.certs and not any(isinstance(a, ValidateBlock) for a in actions)
    first, message = pre_prepare(1, b"first")
    actions = disk.run(replica.step(message))
    assert [(a.seq_no, a.ancestors) for a in actions if isinstance(a, ValidateBlock)] == [(1, ())]
    actions = disk.run(replica.step(BlockValidated(1, first, True)))
    assert votes(actions) == [(MessageType.PREPARE, 0, 1, first)]
    assert [(a.seq_no, a.ancestors) for a in actions if isinstance(a, ValidateBlock)] == [
        (2, (b"block 1: first",))]
    actions = disk.run(replica.step(BlockValidated(2, second, True)))
    assert votes(actions) == []  # block 1 is not prepared here yet
    actions = disk.run(replica.step(from_peer(Prepare(0, 1, first, 1))))
    assert votes(actions) == [(MessageType.COMMIT, 0, 1, first),
                              (MessageType.PREPARE, 0, 2, second)]
    disk.run(replica.step(from_peer(Commit(0, 1, first, 0))))
    actions = disk.run(replica.step(from_peer(Commit(0, 1, first, 1))))
    assert any(isinstance(a, CommitBlock) for a in actions)
    assert replica.log.certs[(0, 3)].digest == third  # block 1 certified: 3 is inside now
    assert replica.seq_no == 3


def test_a_restarted_replica_takes_its_seq_no_from_what_it_signed() -> None:
    """A PRE-PREPARE accepted but not validated must not leave a restarted replica, once
    primary, waiting for a seqNo it never proposed (seq_no != last_exec: no proposal)."""
    disk = Disk()
    replica = disk.start()
    _, message = pre_prepare(1, b"accepted, never validated")
    disk.run(replica.step(message))
    assert replica.seq_no == 1
    assert disk.start().seq_no == 0


def test_a_replica_still_validating_is_not_pushed_into_catch_up() -> None:
    disk = Disk()
    replica = disk.start()
    digest, message = pre_prepare(1, b"slow to validate")
    disk.run(replica.step(message))
    assert replica.log.certs[(0, 1)].validating
    assert not any(isinstance(a, FetchCommitted)
                   for a in disk.run(replica.step(PeerCommitted(1, digest, b""))))
    far = H + PARAMS.checkpoint_interval
    for peer in (0, 1):
        checkpoint = Checkpoint(far, keccak(b"head"), keccak(b"root"), peer)
        assert not any(isinstance(a, FetchCommitted)
                       for a in disk.run(replica.step(from_peer(checkpoint))))
    actions = disk.run(replica.step(BlockValidated(1, digest, True)))
    assert any(isinstance(a, FetchCommitted) and a.target_seq_no == far for a in actions)


def test_view_change_messages_carry_digests_whatever_the_blocks_hold() -> None:
    """Blocks of 1 MB, several above the stable checkpoint: VIEW-CHANGE and NEW-VIEW stay a
    few kB (they carried every prepared block, and past the frame cap they were dropped)."""
    cluster = Cluster(4, checkpoint_interval=8, block_padding=1 << 20)
    for i in range(6):
        commit(cluster, tx_hashes(1, f"large {i}"))
    messages: list[WireMessage] = []
    cluster.filters += [drop_from(0), capture(MessageType.VIEW_CHANGE, messages),
                        capture(MessageType.NEW_VIEW, messages)]
    commit(cluster, tx_hashes(1, "view 1"), nodes=cluster.nodes[1:])
    view_changes = [m for m in messages if m.signed.body.TYPE is MessageType.VIEW_CHANGE]
    assert any(len(m.signed.body.pset) >= 6 for m in view_changes)
    assert any(m.signed.body.TYPE is MessageType.NEW_VIEW for m in messages)
    assert max(len(m.encode()) for m in messages) < 64 * 1024


def test_a_missing_body_is_fetched_and_a_false_copy_refused() -> None:
    """Block 1 prepared at 0, 2 and 3, never committed; the next primary (1) never saw it.
    The NEW-VIEW names it by digest; 1 asks its peers for the body, refuses a copy that is
    another block, and commits the genuine one."""
    cluster = Cluster(4)
    cluster.filters += [drop_type(MessageType.COMMIT),
                        lambda src, dst, wire: not (dst == 1 and src == 0)]
    cluster.submit(keccak(b"prepared"))
    assert cluster.run_until(lambda: all(1 in cluster.nodes[i].replica.log.pset for i in (0, 2, 3)),
                             20_000)
    digest = cluster.nodes[2].replica.log.pset[1].pre_prepare.body.digest
    primary = cluster.nodes[1]
    cluster.filters[:] = [drop_from(0)]
    assert cluster.run_until(lambda: (1, digest) in primary.replica.wanted, 20_000)
    false_copy = BlockReceived(1, digest, b"another block")
    cluster.feed(1, false_copy)
    assert primary.replica.dropped["unwanted or false block copy"] == 1
    assert (1, digest) in primary.replica.wanted
    assert cluster.run_until(lambda: all(n.chain.blocks for n in cluster.nodes[1:]), 20_000)
    assert primary.chain.blocks[0].block_hash == digest
    cluster.check_safety()


def test_the_adapter_refuses_to_commit_a_block_other_than_the_certified_one() -> None:
    committed: list[object] = []
    other = SimpleNamespace(hash=keccak(b"another block"), number=1)

    async def validate_block(data: bytes) -> object:
        return other

    engine, committed, _ = _adapter(validate_block)
    action = CommitBlock(1, keccak(b"the certified block"), b"a copy", b"certificate")
    asyncio.run(engine._commit(action))
    assert committed == [] and [a.kind for a in engine.alarms] == ["commit"]
    assert isinstance(engine.alarms[0], Alarm)


# An encoded block as the chain serves it: a header (its state root fourth) and transactions.
CHAIN_BLOCK = rlp.encode([[b"parent", b"uncles", b"coinbase", b"root"], [b"tx"], [], []])


def _adapter(validate_block: Callable[[bytes], Awaitable[object]], head: int = 0
             ) -> tuple[PbftEngine, list[object], list[object]]:
    """The engine adapter's commit path alone, on a chain at `head`: the engine, what it
    committed and the events it stepped the replica with."""
    committed: list[object] = []
    stepped: list[object] = []

    async def commit_block(executed: object) -> None:
        committed.append(executed)

    async def canonical_blocks(first: int, count: int) -> list[bytes]:
        return [CHAIN_BLOCK] if first <= head else []

    engine = PbftEngine.__new__(PbftEngine)
    engine.context = SimpleNamespace(validate_block=validate_block, commit_block=commit_block,
                                     head=lambda: SimpleNamespace(block_number=head),
                                     canonical_blocks=canonical_blocks)
    engine._executed, engine._chain_lock, engine.alarms = {}, asyncio.Lock(), []
    engine.log = SimpleNamespace(error=lambda *args: None, warning=lambda *args: None)
    engine.metrics = SimpleNamespace(block_refused=lambda reason: None)
    engine._step = stepped.append  # type: ignore[method-assign]
    return engine, committed, stepped


def test_a_certified_block_whose_copy_does_not_execute_is_fetched_again() -> None:
    """A copy that hashes to the certified digest hashes only its header: its body may still be
    false (bodies travel unsigned). The adapter's refusal frees the replica, which forgets
    the copy and fetches the block again, then commits the genuine one (4.4)."""
    disk = Disk()
    replica = disk.start()
    digest, message = pre_prepare(1, b"certified")
    disk.run(replica.step(message))
    disk.run(replica.step(BlockValidated(1, digest, True)))
    for peer in (1, 3):
        disk.run(replica.step(from_peer(Prepare(0, 1, digest, peer))))
    sent: list[Action] = []
    for peer in (0, 1):
        sent += disk.run(replica.step(from_peer(Commit(0, 1, digest, peer))))
    commit = next(a for a in sent if isinstance(a, CommitBlock))
    assert replica.executing == 1

    sent = disk.run(replica.step(CommitRefused(1, digest)))
    assert replica.executing is None and replica.block_for(1, digest) is None
    assert [a for a in sent if isinstance(a, FetchBlock)] == [FetchBlock(1, digest)]
    assert replica.dropped["false copy of a certified block"] == 1
    assert disk.run(replica.step(CommitRefused(1, digest))) == []  # not executing: ignored

    sent = disk.run(replica.step(BlockReceived(1, digest, commit.block)))
    assert [a for a in sent if isinstance(a, CommitBlock)] == [commit]
    disk.run(replica.step(BlockCommitted(1, digest, keccak(b"root"), ())))
    assert replica.last_exec == 1 and not replica.halted


def test_the_adapter_reports_a_certified_copy_that_does_not_execute() -> None:
    """`_commit` of a held copy that fails validation commits nothing and raises nothing: the
    replica hears `CommitRefused` and fetches another copy. A block a catch-up imported
    while the commit waited for the chain is reported committed as the chain holds it (it
    used to be left without an answer: a replica whose head the catch-up did not reach then
    waited in "executing" for good)."""

    async def validate_block(data: bytes) -> object:
        raise FalseBodyError("the block's body does not match the roots in its header")

    engine, committed, stepped = _adapter(validate_block)
    digest = keccak(b"the certified header")
    asyncio.run(engine._commit(CommitBlock(1, digest, b"a false body", b"certificate")))
    assert committed == [] and engine.alarms == []
    assert stepped == [CommitRefused(1, digest)]

    async def fails_here(data: bytes) -> object:  # the header's body; our executor raised
        raise BlockValidationError("invalid block: RuntimeError: the executor broke")

    engine, committed, stepped = _adapter(fails_here)
    asyncio.run(engine._commit(CommitBlock(1, digest, b"the body", b"certificate")))
    assert stepped == [CommitRefused(1, digest, false_copy=False)] and committed == []

    engine, committed, stepped = _adapter(validate_block, head=1)
    asyncio.run(engine._commit(CommitBlock(1, digest, b"a false body", b"certificate")))
    assert committed == engine.alarms == []
    header = rlp.decode(CHAIN_BLOCK)[0]
    assert stepped == [BlockCommitted(1, keccak(rlp.encode(header)), b"root", (keccak(b"tx"),))]


def test_a_proven_head_commits_the_next_block_here_and_a_failed_fetch_keeps_blocks() -> None:
    """A byzantine peer committed block 1 with our PREPARE-phase partners' COMMITs, proves it
    (STATUS carries the certificate) and then serves nothing. The replica commits block 1 on
    that certificate with the body it holds; asked to catch up further, a failed fetch costs
    it no uncommitted block (they used to be dropped at once, and with them the only honest
    copies: simulator seeds 74 and 310, N = 4)."""
    disk = Disk()
    replica = disk.start()
    digest, message = pre_prepare(1, b"prepared here")
    disk.run(replica.step(message))
    disk.run(replica.step(BlockValidated(1, digest, True)))
    disk.run(replica.step(from_peer(Prepare(0, 1, digest, 1))))
    certificate = encode_commit_certificate(
        [AUTH.sign(Commit(0, 1, digest, i), SIGNERS[i]) for i in (0, 1, 3)])
    actions = disk.run(replica.step(PeerCommitted(1, digest, b"forged")))  # catch-up, then
    assert any(isinstance(a, FetchCommitted) for a in actions)
    disk.run(replica.step(FetchFailed(1)))  # the peer serves nothing
    assert replica.block_for(1, digest) is not None
    actions = disk.run(replica.step(PeerCommitted(1, digest, certificate)))
    assert [a.seq_no for a in actions if isinstance(a, CommitBlock)] == [1]
    assert not any(isinstance(a, FetchCommitted) for a in actions)
    disk.run(replica.step(_committed(1, digest)))
    second, message = pre_prepare(2, b"prepared, then a head far ahead")
    disk.run(replica.step(message))
    disk.run(replica.step(BlockValidated(2, second, True)))
    actions = disk.run(replica.step(PeerCommitted(7, keccak(b"head"), b"")))
    assert any(isinstance(a, FetchCommitted) for a in actions)  # too far ahead: catch up


def test_the_validator_state_file_round_trips_and_refuses_what_is_not_its_own(
    tmp_path: Path,
) -> None:
    mine = ValidatorStateFile(tmp_path, SIGNERS[ME].address)
    assert mine.read() is None  # a new validator
    mine.write(SigningBound(3, 160))
    assert mine.read() == SigningBound(3, 160)
    assert json.loads(mine.path.read_text())["address"] == "0x" + SIGNERS[ME].address.hex()
    with pytest.raises(StoreError, match="belongs to validator"):
        ValidatorStateFile(tmp_path, SIGNERS[0].address).read()
    mine.path.write_text("{not json")
    with pytest.raises(StoreError, match="restore it from a backup"):
        mine.read()


@pytest.mark.parametrize("crash_at", range(3))
def test_a_crash_between_the_two_writes_of_a_step_restarts_a_replica_that_votes(
    crash_at: int,
) -> None:
    """Each step of a run that raises the signing bound (the first vote of the window, a
    VIEW-CHANGE, the next VIEW-CHANGE) dies after its store write and before its state file:
    the restarted replica is not amnesic (with the file written first it was, and with f
    silent validators nothing committed again), writes the bound before anything leaves,
    and sends what the crash kept from leaving."""
    disk = Disk()
    replica = disk.start()
    expected = [MessageType.PREPARE, MessageType.VIEW_CHANGE, MessageType.VIEW_CHANGE]
    for index, step in enumerate(_steps_raising_the_bound()):
        disk.crash_before_bound = index == crash_at
        try:
            step(disk, replica)
        except Crashed:
            break
    writes = disk.bound_writes
    restarted = Replica.restore(PARAMS, ME, SIGNERS[ME], KeyVerifier(), ChainHead(0, GENESIS),
                                disk.store, block_digest=keccak, signing_bound=disk.bound)
    assert restarted.amnesia is None and restarted.status().mode is not Mode.FOLLOWING
    sent = disk.run(restarted.start())
    assert disk.bound_writes == writes + 1  # the bound written again, before any send
    assert disk.bound == SigningBound(restarted.view, H)
    assert expected[crash_at] in sent_types(sent)


def _steps_raising_the_bound() -> Iterator[Callable[[Disk, Replica], None]]:
    """Steps that each raise the signing bound once (the first write of the bound included:
    the first start writes it)."""

    def vote(disk: Disk, replica: Replica) -> None:
        digest, message = pre_prepare(1, b"voted for")
        disk.run(replica.step(message))
        disk.run(replica.step(BlockValidated(1, digest, True)))

    def view_change(disk: Disk, replica: Replica) -> None:
        disk.run(replica.step(RequestReceived(keccak(b"waiting"))))
        disk.run(replica.step(TimerFired(TimerKind.REQUEST, b"")))

    def new_view_vote(disk: Disk, replica: Replica) -> None:
        view_change(disk, replica)  # view 2, never installed: the next VIEW-CHANGE
        disk.run(replica.step(TimerFired(TimerKind.NEW_VIEW, u64(replica.view))))

    yield vote
    yield view_change
    yield new_view_vote
