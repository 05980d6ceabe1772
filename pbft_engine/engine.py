"""The PBFT engine adapter: chain's `ConsensusEngine` around the pure `Replica`.

It feeds peer messages, pool arrivals, timers and block outcomes into `Replica.step` and carries
out its `Ready`: the step's `Persist` is written (synced LevelDB batch, then the signing bound)
before anything of that step is performed, then the actions in order; the steps taken while
one write is on disk share the next one (`group_commit`). Block work (build, validate, commit)
runs through the node's context off the event loop and comes back as the matching event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, assert_never

from eth.abc import BlockHeaderAPI

from chain.blockchain import ExecutedBlock, block_hash_of, committed_block
from chain.engine import ConsensusEngine, EngineContext, InvalidParams, RpcHandler, TimerHandle
from chain.errors import BlockValidationError, EngineError, FalseBodyError, StaleParentError
from encoding import EncodingError
from encoding.hexcodec import parse_quantity
from pbft_engine.core import (
    Action,
    Alarm,
    BlockBuilt,
    BlockCommitted,
    BlockValidated,
    Broadcast,
    BuildBlock,
    CancelTimer,
    ChainHead,
    CommitBlock,
    CommitRefused,
    EngineParams,
    Event,
    FetchBlock,
    FetchCommitted,
    FetchCompleted,
    FetchFailed,
    LeftValidatorSet,
    MessageReceived,
    Ready,
    Refusal,
    RelayRequests,
    Replica,
    RequestDropped,
    RequestReceived,
    ScheduleChange,
    SendTo,
    SetTimer,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.core.joining import JoinBuffer, handover_to_join
from pbft_engine.core.records import META_STATE, StoreName, StoreOp, u64
from pbft_engine.core.signing_bound import SigningBound
from pbft_engine.epoch_feed import EpochFeed
from pbft_engine.errors import ConfigError, LostRecordsError, PbftError, StoreError
from pbft_engine.group_commit import GroupCommit
from pbft_engine.messages import KeySigner, KeyVerifier, decode_commit_certificate
from pbft_engine.metrics import PbftMetrics
from pbft_engine.observer import Observer, forwarding_shortfall
from pbft_engine.overrides import check_overrides
from pbft_engine.peer_budget import GOSSIP, MESSAGES, PeerBudget
from pbft_engine.record_store import LevelDBConsensusStore
from pbft_engine.registry import REGISTRY_ADDRESS, ValidatorRegistry, schedule_from
from pbft_engine.rpc_records import MAX_RANGE, ConsensusRecords
from pbft_engine.sync import BlockSync
from pbft_engine.tasks import BackgroundTasks
from pbft_engine.validator_rpc import validator_rpc_methods
from pbft_engine.validator_state import ValidatorStateFile
from storage import StorageFailure

log = logging.getLogger(__name__)

# Failures of this node itself, not of what a peer sent: they stop the node (the database
# reports its own failure) or the task (cancellation), and are never a refusal.
_LOCAL_FAILURES = (StorageFailure, asyncio.CancelledError)


class _AncestorFailed(PbftError):
    """A block validated here before failed when executed again: the chain moved under it."""


class _SetUnknown(PbftError):
    """The set that decides the block after this one is not known here yet (this replica
    has not committed far enough): nobody's fault, asked again later."""


# Events after which the head may have moved: committed state may have scheduled a change.
_AFTER_IMPORT = (BlockCommitted, FetchCompleted, FetchFailed)

# Blocks executed and not committed that the adapter keeps: the pipeline's, and some of the
# views that did not survive (two full windows of the default checkpoint interval).
MAX_EXECUTED = 64


class ConsensusLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Every consensus log line starts with the replica's view, seqNo and low watermark."""

    def __init__(self, logger: logging.Logger, replica: Callable[[], Replica | None]) -> None:
        super().__init__(logger, {})
        self._replica = replica

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        replica = self._replica()
        if replica is None:
            return msg, kwargs
        return (f"view={replica.view} seqNo={replica.seq_no} h={replica.low_watermark} "
                f"mode={replica.mode.value} | {msg}", kwargs)


class PbftEngine(ConsensusEngine):
    name = "pbft"
    updatable_params = frozenset({"transitions"})  # overrides, by a coordinated restart
    # With a node key (from `start`): what it keeps for the replica it starts if it joins an
    # epoch (an observer voted in, or a validator voted out and in again: `core.joining`).
    join_buffer: JoinBuffer | None = None

    def __init__(self, context: EngineContext, params: Mapping[str, Any]) -> None:
        super().__init__(context, params)
        self.engine_params = self._params(context.chain_id, params)
        self.store = LevelDBConsensusStore(context.database)
        self.replica: Replica | None = None
        self._timers: dict[tuple[TimerKind, bytes], TimerHandle] = {}
        # Each timer as the core's steps left it: its last SetTimer, none once cancelled.
        self._armed: dict[tuple[TimerKind, bytes], SetTimer] = {}
        self._executed: dict[bytes, ExecutedBlock] = {}  # digest -> block executed here
        self._tasks = BackgroundTasks()
        self._records: GroupCommit[EpochSchedule | None] = GroupCommit(
            self._write_records, self._perform_actions)
        self._chain_lock = asyncio.Lock()  # one block import at a time (commit or catch-up)
        self.metrics = PbftMetrics(context.metrics, lambda: self.replica)
        self.log = ConsensusLog(log, lambda: self.replica)
        self.sync: BlockSync | None = None
        self.observer: Observer | None = None  # a node outside the set follows with it
        self.state_file: ValidatorStateFile | None = None  # known once the key is
        self.alarms: list[Alarm] = []
        self.budget = PeerBudget(time.monotonic)
        self.feed = EpochFeed(EpochSchedule.genesis(self.engine_params), self._read_schedule)
        self._joining = False  # an observer's switch to validator is under way
        self.records = ConsensusRecords(self.store, lambda: self.feed.schedule)

    @staticmethod
    def _params(chain_id: int, params: Mapping[str, Any]) -> EngineParams:
        try:
            return EngineParams.from_genesis(chain_id, params)
        except PbftError as exc:
            raise EngineError(str(exc)) from None

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        cls._params(1, params)

    @classmethod
    def system_contracts(cls, chain_id: int, params: Mapping[str, Any]
                         ) -> tuple[ValidatorRegistry]:
        """The validator registry: votes on the set, tallied in state (`registry`)."""
        return (ValidatorRegistry(cls._params(chain_id, params)),)

    # Lifecycle.

    async def start(self) -> None:
        head = self.context.head()
        self.feed.refresh(head.block_number, head.hash)
        try:
            for line in check_overrides(self.feed.schedule, head.block_number,
                                        self.engine_params.chain_id, self._certificate_at):
                self.log.warning("%s", line)
        except ConfigError as exc:
            raise EngineError(str(exc)) from None
        key = self.context.validator_key
        address = key.public_key.to_canonical_address() if key is not None else None
        if address is not None:
            self.join_buffer = JoinBuffer(self.engine_params, KeyVerifier(), address)
        deciding = self.feed.schedule.set_at(head.block_number)
        if key is None or address not in {*deciding,
                                          *self.feed.schedule.set_at(head.block_number + 1)}:
            self._start_observer(address)  # (a validator voted out at c still votes for c)
            return
        if address not in deciding and self.store.get(StoreName.META, META_STATE) is None:
            self._run_replica(self._joined_replica(head))  # stopped at c, before it joined
            return
        self.state_file = ValidatorStateFile(self.context.datadir, address)
        try:
            replica = Replica.restore(
                self.engine_params,
                None,
                KeySigner(key.to_bytes()),
                KeyVerifier(),
                ChainHead(head.block_number, head.hash, head.state_root),
                self.store,
                block_digest=block_hash_of,
                signing_bound=self.state_file.read(),
                fresh_validator=self.context.fresh_validator,
                schedule=self.feed.schedule,
            )
        except LostRecordsError as exc:
            raise EngineError(
                f"{exc}: restore {self.state_file.path} from a backup; only if this validator "
                "never voted on this chain, start it once with --fresh-validator") from None
        except (StoreError, ConfigError) as exc:
            raise EngineError(str(exc)) from None
        if replica.amnesia is not None:
            self.log.warning(
                "this validator's consensus records are gone: it follows the cluster and votes "
                "again once its stable checkpoint reaches %d and its view reaches %d (%s)",
                replica.amnesia.seq_no, replica.amnesia.view, self.state_file.path)
        self._run_replica(replica)

    def _certificate_at(self, number: int) -> bytes | None:
        return self.store.get(StoreName.COMMIT_CERTIFICATES, u64(number))

    def _run_replica(self, replica: Replica) -> None:
        """Vote with `replica` from here (at start, or when an observer joins the set)."""
        self.replica = replica
        self.sync = BlockSync(
            self.context, self.store, self.feed,
            deliver=self._step, replica_status=replica.status,
            held_block=replica.block_for,
            chain_lock=self._chain_lock, poll_interval=self._poll_interval(),
            on_peer_fault=self.metrics.peer_fault, sources=self._connected_validators,
            hedge_after=self.engine_params.request_timeout_ms / 2000,  # (`catch_up.stalled`)
        )
        self.sync.start()
        self._perform(replica.start())

    async def _join(self) -> None:
        """This observer's address decides the next height: the handover checkpoint c that
        installed its epoch is committed here, so it votes from c + 1 (`Replica.join`), in
        the view of c's commit certificate (views stay monotonic across epochs)."""
        assert self.observer is not None
        await self.observer.stop()
        self.observer = None
        self._run_replica(self._joined_replica(self.context.head()))
        self._feed_kept()

    def _feed_kept(self) -> None:
        """The consensus messages kept while this node followed, in order (`core.joining`):
        among them the new primary's PRE-PREPARE of c+1, which may have gone out before this
        node held c; dropped, it would come again only after the request timers ran out."""
        for data in self.join_buffer.take() if self.join_buffer is not None else ():
            self._step(MessageReceived(data))  # (its signer's own: `joining.relayed_copy`)

    def _joined_replica(self, head: BlockHeaderAPI) -> Replica:
        """The replica of a validator added by a vote, at `head` = c (`Replica.join`)."""
        key = self.context.validator_key
        assert key is not None
        address = key.public_key.to_canonical_address()
        self.state_file = ValidatorStateFile(self.context.datadir, address)
        certificate = self.store.get(StoreName.COMMIT_CERTIFICATES, u64(head.block_number))
        view = decode_commit_certificate(certificate)[0].body.view if certificate else 0
        replica = Replica.join(
            self.engine_params, KeySigner(key.to_bytes()), KeyVerifier(),
            ChainHead(head.block_number, head.hash), block_digest=block_hash_of,
            schedule=self.feed.schedule, view=view, signing_bound=self.state_file.read())
        self.log.info("joined the validator set of epoch %d at block %d, as validator 0x%s",
                      replica.epochs.current.number, head.block_number + 1, address.hex())
        return replica

    def _joins_now(self) -> bool:
        """An observer whose key is in the set that decides the block after its head."""
        key = self.context.validator_key
        if self.observer is None or key is None or self._joining:
            return False
        head = self.context.head()
        self.feed.refresh(head.block_number, head.hash)
        return (key.public_key.to_canonical_address()
                in self.feed.schedule.set_at(head.block_number + 1))

    def _handover_to_join(self) -> int | None:
        """The handover checkpoint c of the next epoch that counts this node's key: an
        observer imports up to c and no further, so that it votes from c + 1 (and holds
        every checkpoint of its epoch) instead of joining late."""
        key = self.context.validator_key
        if key is None:
            return None
        return handover_to_join(self.feed.schedule, key.public_key.to_canonical_address(),
                                self.context.head().block_number)

    def _on_observer_progress(self) -> None:
        if self._joins_now():
            self._joining = True
            self._tasks.spawn(self._join_once(), "joining the validator set")

    async def _join_once(self) -> None:
        try:
            await self._join()
        finally:
            self._joining = False

    async def _leave(self, action: LeftValidatorSet) -> None:
        """Voted out: this replica voted up to the handover checkpoint and sends nothing any
        more; the node follows the chain as an observer from here."""
        self.log.info("left the validator set: epoch %d decides from block %d without this "
                      "node; following the chain as an observer", action.epoch,
                      action.first_height)
        self._cancel_timers()
        self.replica = None
        sync, self.sync = self.sync, None
        if sync is not None:
            await sync.stop()
        key = self.context.validator_key
        self._start_observer(None if key is None else key.public_key.to_canonical_address())
        # Voted in again at the head it left at (its replica left on a fetch that ended at
        # that change's c): the observer stops there and imports nothing, so join now.
        self._on_observer_progress()

    def _feed_schedule(self) -> None:
        """After a commit: the changes committed state scheduled that the core has not heard
        of (the registry's record, read from the new head's state)."""
        head = self.context.head()
        self.feed.refresh(head.block_number, head.hash)
        replica = self.replica
        if replica is None:
            return
        known = {(e.passed_at, e.validators) for e in replica.epochs.schedule.epochs}
        for epoch in self.feed.schedule.epochs:  # (a change may come before an override)
            if epoch.passed_at is None or (epoch.passed_at, epoch.validators) in known:
                continue
            self.log.info("validator-set change passed in block %d: epoch %d (%d validators) "
                          "decides from block %d", epoch.passed_at, epoch.number, epoch.n,
                          epoch.first)
            self._perform(replica.step(ScheduleChange(epoch.validators, epoch.passed_at)))

    def _read_schedule(self, block_hash: bytes) -> EpochSchedule:
        """The schedule the registry's state after canonical block `block_hash` implies."""
        genesis = EpochSchedule.genesis(self.engine_params)
        storage = self.context.system_storage(block_hash, REGISTRY_ADDRESS)
        return genesis if storage is None else schedule_from(storage, genesis)

    def _connected_validators(self) -> frozenset[bytes]:
        return self.context.peers() & self.feed.members()

    def _start_observer(self, address: bytes | None) -> None:
        """Not a validator: follow the certified chain, vote on nothing (`observer`)."""
        self.observer = Observer(
            self.context, self.store, self.feed,
            chain_lock=self._chain_lock, poll_interval=self._poll_interval(),
            on_peer_fault=self.metrics.peer_fault, on_progress=self._on_observer_progress,
            stop_at=self._handover_to_join)
        self.sync = self.observer.sync
        self.observer.start()
        who = f"0x{address.hex()}" if address is not None else "without a node key"
        self.log.info("observer %s: not in config.pbft.validators, following the chain "
                      "(no votes)", who)
        shortfall = forwarding_shortfall(self.context.dialed_peers,
                                         self.feed.schedule.set_at(self.feed.head + 1))
        if shortfall is not None:
            self.log.warning(shortfall)

    def _poll_interval(self) -> float:
        """How long without progress before asking peers where they are."""
        return min(2.0, max(0.25, self.engine_params.request_timeout_ms / 4000))

    async def stop(self) -> None:
        self._cancel_timers()
        await self._records.close()  # before the database closes; nothing performed after
        if self.observer is not None:
            await self.observer.stop()
        elif self.sync is not None:
            await self.sync.stop()
        await self._tasks.cancel_all()

    # Inputs.

    def on_transactions(self, tx_hashes: list[bytes]) -> None:
        for tx_hash in tx_hashes:
            self._step(RequestReceived(tx_hash))

    def on_transactions_dropped(self, tx_hashes: list[bytes]) -> None:
        for tx_hash in tx_hashes:
            self._step(RequestDropped(tx_hash))

    def on_message(self, sender: bytes, payload: bytes) -> None:
        if sender not in self.feed.members():
            return  # an observer's (or anyone's): never part of a decision, not even decoded
        if not self.budget.allows(sender):
            self.metrics.peer_dropped(sender)
            return
        if self.replica is not None:
            self._step(MessageReceived(payload, sender), sender)
        if self.join_buffer is not None:
            self._keep_for_join(self.join_buffer, sender, payload)

    def _keep_for_join(self, buffer: JoinBuffer, sender: bytes, payload: bytes) -> None:
        """Kept if the replica this node starts when it joins an epoch will take it
        (`core.joining`: nothing, undecoded, for a member staying in the set), charged to
        the sender as a step is."""
        started = time.thread_time()  # (CPU: see `_step`)
        buffer.keep(payload, self.feed.schedule, self.feed.head, sender)
        self._charge(sender, time.thread_time() - started)

    def on_sync_message(self, sender: bytes, payload: bytes) -> None:
        """Charged to the sender's budget as consensus messages are, and so is serving the
        blocks it asks for (reading, certificates, encoding, sending): an observer's requests
        (or a peer's announcements to an observer) cannot take the loop or the disk either.
        A sender out of budget starts no serve."""
        if self.sync is None:
            return
        if not self.budget.allows(sender):
            self.metrics.peer_dropped(sender)
            return
        started = time.perf_counter()
        self.sync.on_message(sender, payload, partial(self._charge, sender))
        self._charge(sender, time.perf_counter() - started)

    def on_gossip(self, sender: bytes, admit: Callable[[], None]) -> None:
        """A gossiped transaction is decoded on the loop (RLP, static checks, the sender's
        recovery): charged to the sender, validator or observer, from its gossip bucket."""
        if not self.budget.allows(sender, GOSSIP):
            self.metrics.peer_dropped(sender)
            return
        started = time.perf_counter()
        admit()
        self._charge(sender, time.perf_counter() - started, GOSSIP)

    def is_validator(self, peer: bytes) -> bool:
        return peer in self.feed.members()

    def is_proposer(self) -> bool:
        return self.replica is not None and self.replica.me == self.replica.primary

    def _step(self, event: Event, sender: bytes | None = None) -> None:
        """One step of the core; a peer's message is charged to its sender's share of the
        loop (`peer_budget`): the core's own time on it (decoding, signature checks, the
        protocol), not the writes and sends that follow, which an honest load causes too.
        That time is the loop thread's CPU time: the core does no I/O, so the rest of a
        step's wall time is the thread waiting, on the host's other processes or the GIL.
        Charged the wall time, a peer paid for the host's load: beside other processes, a
        step took 1.8-1.9 x its CPU time, and the hostile-validator test's 3,000 duplicates
        (~280 us of CPU each here) ran their sender dry after about half of them, under
        any server code (tests/integration/test_peer_hardening.py)."""
        replica = self.replica
        if replica is None:
            return
        if isinstance(event, _AFTER_IMPORT):
            self._feed_schedule()  # the core hears of a change before it moves past it
        before = (replica.view, replica.active, replica.fetching)
        started = time.thread_time()
        ready = replica.step(event)
        if sender is not None:
            self._charge(sender, time.thread_time() - started)
        if (replica.view, replica.active, replica.fetching) != before:
            self.log.info("consensus state changed (was view=%d active=%s fetching=%s)", *before)
        self._perform(ready)

    def _charge(self, sender: bytes, seconds: float, work: str = MESSAGES) -> None:
        if self.budget.charge(sender, seconds, work):
            self.metrics.peer_fault(sender, "over_budget")
            self.log.warning("peer 0x%s used up its budget for %s: what it sends of them is "
                             "dropped while it refills", sender.hex(), work)

    # A step's writes, then its actions in order.

    def _perform(self, ready: Ready) -> None:
        """The step's actions wait for its write (`group_commit`); what they name is fixed as
        the step ends: its timers, and the replica indices of its sends, whose epoch a later
        step may install meanwhile (the step that installs one drops its own,
        `handover.install`)."""
        self._note_timers(ready.actions)
        self._records.submit(ready, None if self.replica is None else self.replica.epochs.schedule)

    def _note_timers(self, actions: Sequence[Action]) -> None:
        """A step re-arms or cancels a timer as it ends, though its SetTimer and CancelTimer
        wait for its write (`group_commit`): meanwhile the handle it replaced must not fire
        into the core, which would take it for the timer it just armed."""
        for action in actions:
            if isinstance(action, SetTimer):
                self._armed[(action.kind, action.key)] = action
            elif isinstance(action, CancelTimer):
                self._armed.pop((action.kind, action.key), None)

    def _write_records(self, ops: Sequence[StoreOp], signing_bound: SigningBound | None
                       ) -> None:
        """The records of one or more steps, then the signing bound, then (`GroupCommit`)
        their actions: on the writer thread. A crash between the two writes leaves the store
        ahead of the file, which a restart joins and writes again before it sends anything; a
        file ahead of the store means records were lost (`core.signing_bound`), so the file
        must never get there first."""
        try:
            with self.metrics.record_writes.time():
                self.store.apply(ops)  # one synced batch
                if signing_bound is not None:
                    self._write_signing_bound(signing_bound)
        except StorageFailure:
            raise  # (reported by the database)
        except Exception as exc:  # a write that fails otherwise stops the node the same way:
            failure = StorageFailure(f"the consensus records could not be written: {exc!r}")
            self.context.database.on_failure(failure)  # (nothing after it is performed)
            raise failure from exc

    def _perform_actions(self, actions: Sequence[Action], schedule: EpochSchedule | None
                         ) -> None:
        for action in actions:
            self._perform_one(action, schedule)

    def _perform_one(self, action: Action, schedule: EpochSchedule | None) -> None:
        match action:
            case Broadcast():
                self.context.broadcast(action.data)
                for peer in self._members_dialing_in(schedule):
                    self.context.send(peer, action.data)
            case SendTo():
                assert schedule is not None  # (only a replica's steps send)
                self.context.send(schedule.current.validators[action.replica], action.data)
            case RelayRequests():
                assert schedule is not None
                self.context.relay_transactions(schedule.current.validators[action.replica],
                                                action.tx_hashes)
            case LeftValidatorSet():
                self._tasks.spawn(self._leave(action), "leaving the validator set")
            case SetTimer():
                self._set_timer(action)
            case CancelTimer():
                handle = self._timers.pop((action.kind, action.key), None)
                if handle is not None:
                    handle.cancel()
            case BuildBlock():
                self.metrics.block_started(action.seq_no)
                self._tasks.spawn(self._build(action), "block build")
            case ValidateBlock():
                self.metrics.block_started(action.seq_no)
                self._tasks.spawn(self._validate(action), "block validation")
            case CommitBlock():
                self._tasks.spawn(self._commit(action), "block commit")
            case FetchCommitted():
                assert self.sync is not None
                self._tasks.spawn(self._fetch(action, self.sync), "catch-up")
            case FetchBlock():
                assert self.sync is not None
                self.sync.want_block(action.seq_no, action.digest)
            case Alarm():
                self._alarm(action)
            case _:
                assert_never(action)

    def _write_signing_bound(self, bound: SigningBound) -> None:
        """A failed write stops the node as a failed database write does (nothing of the
        steps it covers is sent: a vote must never leave uncovered by the file)."""
        assert self.state_file is not None
        try:
            self.state_file.write(bound)
        except StoreError as exc:
            failure = StorageFailure(str(exc))
            self.context.database.on_failure(failure)
            raise failure from None

    def _cancel_timers(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._armed.clear()

    def _alarm(self, alarm: Alarm) -> None:
        self.alarms.append(alarm)
        self.log.error("alarm %s: %s", alarm.kind, alarm.detail)

    def _set_timer(self, action: SetTimer) -> None:
        key = (action.kind, action.key)
        previous = self._timers.pop(key, None)
        if previous is not None:
            previous.cancel()

        def fire() -> None:
            if self._armed.get(key) is not action:
                return  # re-armed or cancelled by a step whose actions wait for its write
            del self._armed[key]
            self._timers.pop(key, None)
            if action.kind is TimerKind.VALIDATION:  # (cancelled when answered in time)
                self.metrics.block_refused("timeout")
            self._step(TimerFired(action.kind, action.key))

        self._timers[key] = self.context.call_later(action.duration_ms / 1000, fire)

    async def _build(self, action: BuildBlock) -> None:
        executed: ExecutedBlock | None = None
        try:
            parent = await self._parent(action.ancestors)
            executed = await self.context.build_block(
                coinbase=self._coinbase(), extra_data=self._extra_data(action.seq_no),
                time_budget=action.time_budget_ms / 1000, parent=parent)
        except (BlockValidationError, _SetUnknown) as exc:
            self.log.warning("cannot build block %d: %s", action.seq_no, exc)
        except _LOCAL_FAILURES:
            raise
        except Exception:  # the core must hear back, whatever went wrong (logged)
            self.log.exception("cannot build block %d", action.seq_no)
        if executed is None or executed.number != action.seq_no:
            # The chain it was to go on is gone (the head moved past it): nothing to propose.
            self._step(BlockBuilt(action.seq_no, b"", b"", ()))
            return
        self._keep_executed(executed)
        self._step(
            BlockBuilt(action.seq_no, executed.hash, executed.encode(), executed.tx_hashes)
        )

    async def _validate(self, action: ValidateBlock) -> None:
        """Every outcome reaches the core: valid, or refused with whose fault it is."""
        refusal: Refusal | None = None
        try:
            executed = self._executed.get(action.digest)
            if executed is None:
                parent = await self._parent(action.ancestors)
                executed = await self.context.validate_block(action.block, parent)
            if executed.hash == action.digest and executed.number == action.seq_no:
                self._check_extra_data(executed)
                self._keep_executed(executed)
            else:
                refusal = Refusal.FALSE_COPY
        except (FalseBodyError, StaleParentError, _AncestorFailed, _SetUnknown) as exc:
            refusal = Refusal.FALSE_COPY if isinstance(exc, FalseBodyError) else (
                Refusal.UNAVAILABLE)
            self.log.info("block %d not validated here (%s): %s", action.seq_no,
                          refusal.value, exc)
        except BlockValidationError as exc:
            refusal = Refusal.INVALID
            self.log.warning("block %d 0x%s proposed by validator 0x%s refused: %s",
                             action.seq_no, action.digest.hex()[:12],
                             self._member_at(action.seq_no, action.proposer).hex(), exc)
        except _LOCAL_FAILURES:
            raise
        except Exception:
            refusal = Refusal.UNAVAILABLE
            self.log.exception("block %d could not be validated", action.seq_no)
        if refusal is not None:
            self.metrics.block_refused(refusal.value)
        self._step(BlockValidated(action.seq_no, action.digest, refusal is None, refusal))

    async def _parent(self, ancestors: tuple[bytes, ...]) -> ExecutedBlock | None:
        """The executed state of the newest of `ancestors` (None: the chain head), executing
        again, in order, those not held here (after a restart, or evicted)."""
        head = self.context.head().hash
        missing: list[bytes] = []
        parent: ExecutedBlock | None = None
        for block in reversed(ancestors):
            digest = block_hash_of(block)
            if digest == head:
                break
            parent = self._executed.get(digest or b"")
            if parent is not None:
                break
            missing.append(block)
        for block in reversed(missing):
            try:
                parent = await self.context.validate_block(block, parent)
            except BlockValidationError as exc:  # validated here before: the chain moved
                raise _AncestorFailed(str(exc)) from None
            self._keep_executed(parent)
        return parent

    def _keep_executed(self, executed: ExecutedBlock) -> None:
        """Blocks executed here and not committed, by hash (bounded: the oldest goes first;
        one evicted is executed again from its bytes if it is needed)."""
        self._executed[executed.hash] = executed
        while len(self._executed) > MAX_EXECUTED:
            del self._executed[next(iter(self._executed))]

    async def _commit(self, action: CommitBlock) -> None:
        async with self._chain_lock:
            head = self.context.head().block_number
            if head >= action.seq_no:
                # A catch-up imported it meanwhile: the chain says what was committed.
                self._step(await self._committed_from_chain(action.seq_no))
                return
            executed = self._executed.get(action.digest)
            if executed is not None and executed.block.header.parent_hash != (
                    self.context.head().hash):
                executed = None  # executed on a chain that was not committed
            if executed is None:
                try:
                    executed = await self.context.validate_block(action.block)
                except FalseBodyError as exc:  # a quorum certified the header: the body is false
                    self.log.warning("the copy of certified block %d is false, fetching "
                                     "another: %s", action.seq_no, exc)
                    self.metrics.block_refused(Refusal.FALSE_COPY.value)
                    self._step(CommitRefused(action.seq_no, action.digest))
                    return
                except BlockValidationError as exc:  # its body is the header's: ours failed
                    self.log.error("certified block %d did not execute here, trying again: "
                                   "%s", action.seq_no, exc)
                    self._step(CommitRefused(action.seq_no, action.digest, false_copy=False))
                    return
            if executed.hash != action.digest:
                self._alarm(Alarm("commit", f"block {action.seq_no} is not the certified one"))
                return
            try:
                await self.context.commit_block(executed)
            except _LOCAL_FAILURES:
                raise
            except Exception:  # the copy is the certified one: keep it, try again
                self.log.exception("block %d not committed", action.seq_no)
                self._step(CommitRefused(action.seq_no, action.digest, false_copy=False))
                return
            if self.sync is not None:
                self.sync.announce(action.seq_no)
        self.metrics.block_committed(action.seq_no)
        self.log.debug("committed block %d 0x%s in view %d", action.seq_no,
                      executed.hash.hex()[:12], self.replica.view if self.replica else -1)
        self._executed = {d: e for d, e in self._executed.items() if e.number > executed.number}
        self._step(
            BlockCommitted(action.seq_no, executed.hash, executed.state_root, executed.tx_hashes)
        )

    async def _committed_from_chain(self, seq_no: int) -> BlockCommitted:
        """The canonical block at seq_no as the reply to its CommitBlock: the core compares
        its hash with the certified one (a mismatch is an alarm)."""
        encoded = (await self.context.canonical_blocks(seq_no, 1))[0]
        block = committed_block(encoded)
        return BlockCommitted(seq_no, block.hash, block.state_root, block.tx_hashes)

    async def _fetch(self, action: FetchCommitted, sync: BlockSync) -> None:
        """The replica's catch-up, on the replica's block sync: one that left the set in the
        same step (`LeftValidatorSet`) fetches nothing, since the observer it becomes follows
        on its own (run on the observer's sync, it imported outside the observer's loop, whose
        epoch feed then stayed below the head: it stopped following for good)."""
        if self.replica is None or sync is not self.sync:
            return
        self.log.info("catching up to block %d from peers", action.target_seq_no)
        try:
            outcome = await sync.fetch(action.target_seq_no, action.block_hash)
        except _LOCAL_FAILURES:
            raise
        except Exception:
            self.log.exception("catch-up to block %d failed", action.target_seq_no)
            outcome = sync.failed(action.target_seq_no)
        self._step(outcome)

    def _extra_data(self, seq_no: int) -> bytes:
        """Block n's extraData: the hash of the set that decides n+1 (`epoch_feed`). A
        primary builds n only with n - max_in_flight committed, which fixes that set."""
        committed = self.feed.next_set_hash(seq_no)
        if committed is None:
            raise _SetUnknown(f"the set after block {seq_no} is not known yet")
        return committed

    def _check_extra_data(self, executed: ExecutedBlock) -> None:
        """A proposed block commits to the set that decides the next height (or, carried
        across an override, to the one before it), or is invalid."""
        expected = self._extra_data(executed.number)
        if executed.block.header.extra_data not in (
                expected, self.feed.carried_set_hash(executed.number)):
            raise BlockValidationError(
                f"extraData 0x{executed.block.header.extra_data.hex()} does not commit to the "
                f"validator set of block {executed.number + 1} (0x{expected.hex()})")

    def _coinbase(self) -> bytes:
        assert self.replica is not None
        return self.replica.address

    def _members_dialing_in(self, schedule: EpochSchedule | None) -> frozenset[bytes]:
        """Validators added by a vote that this node was configured to let in as observers:
        the transport's broadcast reaches only the peers it dials, so they are sent to one
        by one (those of the installed epoch and of every scheduled one, as the step that
        broadcasts ended)."""
        if schedule is None or self.replica is None:
            return frozenset()
        members = {v for e in schedule.epochs[schedule.installed:] for v in e.validators}
        return (frozenset(members) & self.context.peers()) - self.context.dialed_peers - {
            self.replica.address}

    def _installed_member(self, index: int) -> bytes:
        assert self.replica is not None
        return self.replica.epochs.current.validators[index]

    def _member_at(self, height: int, index: int) -> bytes:
        return self.feed.schedule.set_at(height)[index]

    # Observability.

    def status(self) -> dict[str, Any]:
        if self.observer is not None:
            key = self.context.validator_key
            return {
                "engine": self.name,
                "role": "observer",
                "node": (None if key is None
                         else key.public_key.to_checksum_address()),
                "checkpointInterval": self.engine_params.checkpoint_interval,
                "peers": len(self.context.peers()),
                **self.observer.describe(),
                **self._epoch_status(),
            }
        if self.replica is None:
            return {"engine": self.name, "mode": "stopped"}
        status = self.replica.status()
        return {
            "engine": self.name,
            "role": "validator",
            "view": status.view,
            "seqNo": status.seq_no,
            "h": status.low_watermark,
            "H": status.high_watermark,
            "primary": "0x" + self._installed_member(status.primary).hex(),
            "stableCheckpoint": status.stable_checkpoint,
            "lastExecuted": status.last_executed,
            "checkpointInterval": self.engine_params.checkpoint_interval,
            "validator": "0x" + self.replica.address.hex(),
            **self._epoch_status(),
            "peers": len(self._connected_validators()),
            "observers": len(self.context.peers() - self._connected_validators()),
            "mode": status.mode.value,
            "misbehaviour": self.metrics.misbehaviour(),
        }

    def _epoch_status(self) -> dict[str, Any]:
        """pbft_status's epoch fields: the epoch installed here and the change scheduled."""
        schedule = self.replica.epochs.schedule if self.replica else self.feed.schedule
        epoch = (schedule.current if self.replica
                 else schedule.epoch_at(self.context.head().block_number + 1))
        later = schedule.epochs[epoch.number + 1:]
        return {
            "epoch": epoch.number,
            "validators": len(epoch.validators),
            "scheduled": None if not later else {
                "epoch": later[0].number, "firstBlock": later[0].first,
                "validators": ["0x" + v.hex() for v in later[0].validators]},
        }

    def rpc_methods(self) -> dict[str, RpcHandler]:
        records = self.records

        async def pbft_status() -> dict[str, Any]:
            return self.status()

        async def pbft_getValidators() -> list[str]:  # noqa: N802
            return ["0x" + v.hex() for v in self.feed.schedule.set_at(self.feed.head + 1)]

        async def pbft_getCommitCertificate(block_number: Any) -> dict[str, Any] | None:  # noqa: N802
            return records.commit_certificate(_seq_no(block_number, "block number"))

        async def pbft_getCheckpoint(seq_no: Any) -> dict[str, Any] | None:  # noqa: N802
            return records.checkpoint(_seq_no(seq_no, "seqNo"))

        async def pbft_getCheckpoints(first: Any, last: Any) -> list[dict[str, Any]]:  # noqa: N802
            return records.checkpoints(*_range(first, last, "seqNo"))

        async def pbft_getViewChanges(first: Any, last: Any) -> list[dict[str, Any]]:  # noqa: N802
            return records.view_changes(*_range(first, last, "view"))

        async def pbft_getEvidence() -> list[dict[str, Any]]:  # noqa: N802
            return records.evidence()

        return {
            "pbft_status": pbft_status,
            "pbft_getValidators": pbft_getValidators,
            "pbft_getCommitCertificate": pbft_getCommitCertificate,
            "pbft_getCheckpoint": pbft_getCheckpoint,
            "pbft_getCheckpoints": pbft_getCheckpoints,
            "pbft_getViewChanges": pbft_getViewChanges,
            "pbft_getEvidence": pbft_getEvidence,
            **validator_rpc_methods(self.context, self.engine_params, self.log),
        }


def _seq_no(value: Any, what: str) -> int:
    try:
        return parse_quantity(value, what, bits=64)
    except EncodingError as exc:
        raise InvalidParams(f"invalid argument: {exc}") from None


def _range(first: Any, last: Any, what: str) -> tuple[int, int]:
    """[first, last], at most MAX_RANGE wide (one bounded read per call)."""
    start, stop = _seq_no(first, f"first {what}"), _seq_no(last, f"last {what}")
    if stop < start or stop - start >= MAX_RANGE:
        raise InvalidParams(f"a {what} range must be ascending and at most {MAX_RANGE} wide")
    return start, stop
