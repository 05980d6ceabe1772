"""A deterministic cluster of real PBFT cores over a simulated network, clock, chain and pool.

Everything random comes from one `random.Random(seed)`; time is a simulated millisecond
counter; events run in (time, sequence) order. Each node has a chain and a pool (the adapter's
side, `ledger.py`), ONE executor that builds, validates, imports and fetches blocks one job at
a time, each taking time in proportion to the block's transactions, an in-memory consensus
store that survives crashes, and the real `Replica`. Like the real node, the adapter reports
to the core only transactions that are executable at its head, and reports every way one
stops being so. The cluster records what honest replicas sign and commit, and when each
transaction became executable and committed on each node, so safety and liveness can be
checked after (and during) a run.

The adapter answers as `pbft_engine/engine.py` does (issue 28): a refused validation says
whose fault it was (`Refusal`), a fetch commits a range of 32 blocks at a time and one that
fails part-way reports the head it reached, a CommitBlock for a block the chain already holds
is answered from the chain, and a step writes its store batch, then the signing bound, then
sends. The world can be hostile (`ExecutorFaults`, `poisoners`, `fetch_failure`,
`arm_crash`): an executor that raises, loses an answer or stalls, a primary whose blocks do
not execute, fetches that fail part-way, and crashes between any two writes.

The validator set can change (issue 31): `spare` nodes follow the chain as observers, a
`vote` that passes in a committed block schedules a change on every node that commits it
(`ScheduleChange`), a removed validator's replica leaves (`LeftValidatorSet`) and its node
follows, and a follower that finds itself in the set of its next height joins there
(`Replica.join`). Messages to one replica are routed by its address in the sender's
installed epoch.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, assert_never

import rlp
from eth_hash.auto import keccak

from pbft_engine.core import (
    Alarm,
    BlockBuilt,
    BlockCommitted,
    BlockReceived,
    BlockValidated,
    Broadcast,
    BuildBlock,
    CancelTimer,
    CommitBlock,
    CommitRefused,
    EngineParams,
    Event,
    FetchBlock,
    FetchCommitted,
    FetchCompleted,
    FetchFailed,
    FetchProgressed,
    LeftValidatorSet,
    MessageReceived,
    PeerCommitted,
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
from pbft_engine.core.epochs import EpochSchedule, Membership, message_height
from pbft_engine.core.joining import JoinBuffer
from pbft_engine.core.params import DEFAULT_MAX_IN_FLIGHT
from pbft_engine.core.records import META_NEW_VIEW, StoreName
from pbft_engine.core.signing_bound import SigningBound
from pbft_engine.errors import MessageError
from pbft_engine.messages import (
    Body,
    KeySigner,
    KeyVerifier,
    NewView,
    Signed,
    Verifier,
    WireMessage,
    decode_commit_certificate,
    decode_signed,
    decode_signed_bytes,
    encode_commit_certificate,
)
from pbft_engine.record_store import MemoryConsensusStore
from tests.simulation.ledger import (
    GENESIS_HASH,
    GENESIS_ROOT,
    ChainBlock,
    FeeMarket,
    Pool,
    SimChain,
    Tx,
    block_digest,
    block_txs,
    decode_block,
    make_block,
    with_body,
)

__all__ = [
    "CHAIN_ID", "CRASH_POINTS", "GENESIS_HASH", "GENESIS_ROOT", "MAX_TXS_PER_BLOCK",
    "ChainBlock", "Cluster", "Execution", "ExecutorFaults", "FeeMarket", "NetworkFaults", "Node",
    "PoisonKept", "RestartAmnesia", "SafetyViolation", "SimChain", "Tx", "block_digest",
    "block_txs", "make_block",
]

CHAIN_ID = 1337
MAX_TXS_PER_BLOCK = 8  # the default cap for the unit tests' cluster (scenarios lift it)
FETCH_OVERHEAD_MS = 5
BYZANTINE_FETCH_MS = 2_000  # how long a lying catch-up source may hold a fetch
BLOCKS_PER_RANGE = 32  # pbft_engine.sync.MAX_BLOCKS_PER_REQUEST: a fetch commits a range at once
MAX_EXECUTED = 64  # pbft_engine.engine.MAX_EXECUTED: executed blocks the adapter keeps
# The adapter's write order in a step (pbft_engine/engine.py `_write_records`): the store
# batch, then the validator state file. False is the order before issue 28 (the file first),
# kept so a test can show that a crash between the two writes then restarts an amnesic
# replica.
STORE_FIRST = True
# The adapter's group commit (pbft_engine/group_commit.py) as a write of this many ms: a step
# that writes (or one behind a waiting step) waits for the next write; the steps taken while
# one is on disk share the next, and their actions follow it in step order. 0: one write per
# step, performed at once (the default). TIMERS_AS_STEPS_END: a step's SetTimer/CancelTimer
# replace the node's timer as the step ends (`PbftEngine._note_timers`), not when performed.
GROUP_COMMIT_MS = 0
TIMERS_AS_STEPS_END = True
# ROUTES_AS_STEPS_END: a waiting step's SendTo/RelayRequests go to the member its index named
# as the step ended (False: the epoch installed when it is performed, as s10-gc's adapter).
ROUTES_AS_STEPS_END = True
# Where a crash can fall (`Cluster.arm_crash`): before a step's store batch ("step": the event
# is lost), between the store batch and the signing bound ("bound"), between two actions of a
# step ("send": some messages out, some not, timers unset), after a block's chain commit before
# the core hears of it ("chain": the store still says the block was not executed), and after a
# fetched range is committed, before the next ("range").
CRASH_POINTS = ("step", "bound", "send", "chain", "range")


def signed_part(data: bytes) -> Signed[Body]:
    """The signed message in a wire message this simulation sent, however many blocks it
    carries (a PRE-PREPARE resent without the block it no longer holds is no valid wire
    message since the decoder wants exactly one)."""
    return decode_signed(rlp.decode(data)[:3])


class CachingVerifier(Verifier):
    """Signature recovery memoized across the cluster (each message is checked N-1 times)."""

    def __init__(self) -> None:
        self._inner = KeyVerifier()
        self._cache: dict[tuple[bytes, bytes], bytes] = {}

    def recover(self, message_hash: bytes, signature: bytes) -> bytes:
        key = (message_hash, signature)
        if key not in self._cache:
            self._cache[key] = self._inner.recover(message_hash, signature)
        return self._cache[key]


@dataclass(frozen=True)
class Execution:
    """How long block work takes. A node's executor runs one job at a time; executing a block
    costs cost_us_per_tx x its transactions x the node's slowness (1.0 = the fastest); an import
    after validation costs commit_share of that (the state is already computed)."""

    cost_us_per_tx: int = 0
    slowness: tuple[float, ...] = ()  # per node; missing entries are 1.0
    commit_share: float = 0.1

    def of(self, index: int) -> float:
        return self.slowness[index] if index < len(self.slowness) else 1.0

    def block_ms(self, index: int, tx_count: int, share: float = 1.0) -> int:
        """One job: 1 ms of overhead plus the transactions' execution time."""
        return 1 + math.ceil(tx_count * self.cost_us_per_tx * self.of(index) * share / 1000)

    def count_within(self, index: int, budget_ms: int) -> int | None:
        """How many transactions this node executes within budget_ms (None: no limit). At
        least one: a transaction dearer than the budget must still go into some block."""
        if self.cost_us_per_tx == 0:
            return None
        return max(1, math.floor(budget_ms * 1000 / (self.cost_us_per_tx * self.of(index))))


@dataclass(frozen=True)
class ExecutorFaults:
    """How one node's block executor fails (its machine, not its code), per job:

    raises  the job raises something the adapter does not expect; its catch-all answers: a
            validation `Refusal.UNAVAILABLE`, a build with no block, a fetch `FetchFailed`
            with the head it reached; a commit's re-execution (of a block not executed here
            since the restart) `CommitRefused` (chain.validate_encoded makes every error a
            BlockValidationError), and a commit's write stops the node (a StorageFailure:
            it restarts after `restart_ms`). Only the job kinds in `raises_in`.
    lose    a validation's answer never reaches the core (the task died after the executor
            ran the job: the executor is free again, so later jobs run; a thread that never
            returns would stop every later job too, and that node is simply dead).
    stall   the job holds the executor stall_ms longer (swapping, a disk stall, a GC pause):
            every job behind it waits, and its answer comes late (after the deadline, if the
            stall is long enough), so the hang is bounded, as a real one is unless the node
            is dead.
    """

    raises: float = 0.0
    lose: float = 0.0
    stall: float = 0.0
    stall_ms: tuple[int, int] = (0, 0)
    raises_in: frozenset[str] = frozenset(("build", "validate", "commit", "fetch"))
    restart_ms: int = 500


@dataclass
class Node:
    index: int
    signer: KeySigner
    chain: SimChain
    store: MemoryConsensusStore = field(default_factory=MemoryConsensusStore)
    pool: Pool = field(default_factory=Pool)
    replica: Replica | None = None
    signing_bound: SigningBound | None = None  # the validator state file: survives a wipe
    epoch: int = 0  # bumped on crash: events scheduled for an older epoch are void
    timers: dict[tuple[TimerKind, bytes], int] = field(default_factory=dict)
    alarms: list[Alarm] = field(default_factory=list)
    jobs: deque[_Queued] = field(default_factory=deque)
    busy: bool = False  # the executor runs a job
    # steps behind the write (group commit), each with the installed set as it ended
    waiting: list[tuple[Ready, tuple[bytes, ...]]] = field(default_factory=list)
    writing: bool = False  # a group write is on disk
    armed: dict[tuple[TimerKind, bytes], SetTimer] = field(default_factory=dict)
    ready: dict[bytes, dict[bytes, None]] = field(default_factory=dict)  # reported, by sender
    last_view: int = 0
    last_progress: int = -1  # last_executed at the previous status poll
    view_changes: int = 0  # times this node's view went up (across restarts)
    amnesic: bool = False  # its records were lost (wiped), or it followed when it crashed
    # Blocks executed here since the start and not committed (the adapter's `_executed`, by
    # digest, with their parent): a commit of one of them on that parent executes nothing.
    executed: dict[bytes, bytes] = field(default_factory=dict)
    restarts: int = 0  # restarts after a crash at a write point (`Cluster.arm_crash`)
    # Membership (issue 31): the schedule its own chain's votes make (the registry in state),
    # the changes committed here not yet fed to its replica, and while it runs no replica
    # (a spare, or removed) it follows as an observer; the consensus messages it keeps for
    # an epoch it is to join (`JoinBuffer`, in memory: a restart starts a new one).
    schedule: EpochSchedule | None = None
    unfed: list[ScheduleChange] = field(default_factory=list)
    following: bool = False
    join_buffer: JoinBuffer | None = None

    @property
    def up(self) -> bool:
        return self.replica is not None

    @property
    def address(self) -> bytes:
        return self.signer.address


@dataclass(frozen=True)
class NetworkFaults:
    min_delay_ms: int = 2
    max_delay_ms: int = 20
    drop: float = 0.0
    duplicate: float = 0.0


@dataclass(frozen=True)
class _Arrival:
    tx: Tx


@dataclass(frozen=True)
class _Evict:
    tx_hash: bytes


@dataclass(frozen=True)
class _JobDone:
    finish: Callable[[], None]


@dataclass(frozen=True)
class _Written:
    """A group write returned: the steps it covered, in order."""

    group: tuple[tuple[Ready, tuple[bytes, ...]], ...]


@dataclass(frozen=True)
class _Poll:
    pass


@dataclass(frozen=True)
class _Status:
    peer: int


@dataclass(frozen=True)
class _Follow:
    """A follower's block sync poll: import what a peer holds, join if its epoch came."""


@dataclass(frozen=True)
class _Call:
    """Something the world does at a time, whatever the state of the nodes."""

    action: Callable[[], None]


@dataclass(frozen=True)
class _Queued:
    """A job in a node's executor queue, with the kind of block work it is."""

    kind: str  # "build", "validate", "commit" or "fetch"
    start: Job
    action: BuildBlock | ValidateBlock | CommitBlock | FetchCommitted | None = None


@dataclass
class _CrashPlan:
    point: str  # one of CRASH_POINTS
    countdown: int  # crash at the countdown-th time this node reaches that point
    restart_after_ms: int


class _Crashed(Exception):  # noqa: N818 (an event of the world, not an error)
    """The node crashed at a write point: the rest of its step never happens."""


@dataclass(frozen=True)
class _BlockAsk:
    """Ask one peer for a block body the replica wants (`FetchBlock`), then again later."""

    seq_no: int
    digest: bytes


MessageFilter = Callable[[int, int, WireMessage], bool]  # (src, dst, message) -> deliver?
Job = Callable[[], tuple[int, Callable[[], None]]]  # start: (duration, what happens at the end)


class SafetyViolation(AssertionError):
    pass


class RestartAmnesia(AssertionError):
    """A replica that lost no records restarted as if it had (it would follow, not vote)."""


class UndecodableSent(AssertionError):
    """A correct replica sent a message its peers' decoders refuse (e.g. a PRE-PREPARE
    without its block): wasted at best, a lost proposal at worst."""


class PoisonKept(AssertionError):
    """A correct replica validated a block that breaks the rules, in its view, and stayed in
    that view: its primary should be replaced at once, not after a timer."""


class Cluster:
    def __init__(
        self,
        n: int,
        seed: int = 0,
        *,
        faults: NetworkFaults | None = None,
        checkpoint_interval: int = 4,
        log_multiplier: int = 2,
        request_timeout_ms: int = 800,
        new_view_timeout_ms: int = 500,
        new_view_timeout_cap_ms: int = 4_000,
        empty_blocks: bool = False,
        market: FeeMarket | None = None,
        execution: Execution | None = None,
        max_txs_per_block: int | None = MAX_TXS_PER_BLOCK,
        gossip_delays: bool = False,
        block_padding: int = 0,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        spare: int = 0,
    ) -> None:
        self.rng = random.Random(seed)
        self.faults = faults or NetworkFaults()
        # `spare` nodes beyond the n validators of genesis follow the chain, to be voted in.
        signers = [KeySigner(keccak(b"validator %d" % i)) for i in range(n + spare)]
        self.params = EngineParams(
            chain_id=CHAIN_ID,
            validators=tuple(s.address for s in signers[:n]),
            checkpoint_interval=checkpoint_interval,
            log_multiplier=log_multiplier,
            request_timeout_ms=request_timeout_ms,
            new_view_timeout_ms=new_view_timeout_ms,
            new_view_timeout_cap_ms=new_view_timeout_cap_ms,
            block_period_ms=200,
            empty_blocks=empty_blocks,
            max_in_flight=max_in_flight,
        )
        self.market = market or FeeMarket()
        self.execution = execution or Execution()
        self.max_txs_per_block = max_txs_per_block
        self.gossip_delays = gossip_delays  # False: a submitted transaction is everywhere at once
        self.block_padding = block_padding  # bytes added to every block built (large blocks)
        self.registry: dict[bytes, Tx] = {}  # every transaction ever submitted, by hash
        self.verifier = CachingVerifier()
        # The sets the simulator's adapter checks every certificate with: a height's own.
        self.epochs = Membership.of(self.params, self.verifier)
        self.nodes = [Node(i, s, SimChain(self.market, self.registry),
                           schedule=self.epochs.schedule) for i, s in enumerate(signers)]
        self.by_address = {s.address: i for i, s in enumerate(signers)}
        # Simulated votes that pass: the transaction's hash -> (subject, add). A block that
        # holds one schedules the change on every node that commits it, as state would.
        self.votes: dict[bytes, tuple[bytes, bool]] = {}
        self.now = 0
        self._queue: list[tuple[int, int, int, int, Any]] = []
        self._sequence = 0
        self.partition: list[set[int]] | None = None
        self.filters: list[MessageFilter] = []
        self.outgoing: dict[int, Callable[[int, bytes], list[tuple[int, bytes]]]] = {}
        self.byzantine: set[int] = set()
        self.censors: dict[int, bytes] = {}  # node -> the sender its builds leave out
        # Defence in depth: a byzantine primary's STATUS claims reach its backups' cores
        # unchecked (as if block sync did not verify a head's certificate), each a head above
        # the backup's; it offers to serve them, slowly, and claims again as the fetch fails.
        self.unchecked_claims = False
        self.signed_by: dict[tuple[int, int, int, int], bytes] = {}
        self.delivered: list[bytes] = []  # every message delivered (replay material)
        # Liveness material: when each transaction last became executable (was reported) and
        # when it committed, per node; every transaction ever reported anywhere.
        self.ready_at: dict[bytes, dict[int, int]] = {}
        self.commit_at: dict[bytes, dict[int, int]] = {}
        self.reported: set[bytes] = set()
        # The hostile world (none by default): per node, how its executor fails; the
        # byzantine primaries whose blocks do not execute (node -> (how, chance per block));
        # the chance that a fetched range fails outright (every peer timed out); the chance
        # that block sync takes the chain lock before a CommitBlock queued ahead of it; the
        # crashes armed at write points.
        self.executor_faults: dict[int, ExecutorFaults] = {}
        self.poisoners: dict[int, tuple[str, float]] = {}
        self.poisoned: dict[bytes, str] = {}  # digests of the poisoners' blocks: how
        self.fetch_failure = 0.0
        # Blocks a peer serves per range request: 32, or fewer when blocks are large (block
        # sync's server stops at MAX_RESPONSE_BYTES), so a fetch takes more ranges.
        self.range_blocks = BLOCKS_PER_RANGE
        # None: only a peer that holds the whole range serves it. Else, when none does, an
        # honest peer that holds its start (drawn from this generator) serves the prefix it
        # has, as block sync's server answers a range request, and the importer goes on
        # to the next range: a fetch of a head nobody holds then imports blocks and fails.
        self.short_answers: random.Random | None = None
        # How long a served range takes to arrive, before it is executed (large blocks over a
        # slow link): a catch-up slower than the timers whatever the executor's speed.
        self.range_transfer_ms = 0
        self.lock_race = 0.0
        self.seen: Counter[str] = Counter()  # the hostile world's events that happened
        self.crash_plans: dict[int, _CrashPlan] = {}
        self.write_crashes: list[tuple[int, int, str]] = []  # (time, node, point): what fell
        self._in_event = False  # crashes fall only inside an event (not in the test's code)
        for node in self.nodes:
            self.restart(node.index)

    # --- scheduling ---------------------------------------------------------------------

    def _schedule(self, delay: int, node: Node, item: Any) -> None:
        self._sequence += 1
        heapq.heappush(self._queue, (self.now + delay, self._sequence, node.index, node.epoch,
                                     item))

    def at(self, delay: int, action: Callable[[], None]) -> None:
        """Do `action` after delay ms, whatever the nodes' state (a crash, a restart)."""
        self._sequence += 1
        heapq.heappush(self._queue, (self.now + delay, self._sequence, -1, 0, _Call(action)))

    def run_until(self, done: Callable[[], bool], limit_ms: int) -> bool:
        deadline = self.now + limit_ms
        while not done():
            if not self._queue or self._queue[0][0] > deadline:
                self.now = max(self.now, deadline)
                return done()
            self._pop()
        return True

    def run_for(self, ms: int) -> None:
        self.run_until(lambda: False, ms)

    def _pop(self) -> None:
        when, _, index, epoch, item = heapq.heappop(self._queue)
        self.now = max(self.now, when)
        self._in_event = True
        try:
            self._dispatch(index, epoch, when, item)
        except _Crashed:
            pass  # the node crashed at a write point: the rest of the event never happened
        finally:
            self._in_event = False

    def _dispatch(self, index: int, epoch: int, when: int, item: Any) -> None:
        if isinstance(item, _Call):
            item.action()
            return
        node = self.nodes[index]
        if isinstance(item, _Written):
            if node.up and node.epoch == epoch and not node.following:
                self._written(node, item)
            return
        if node.following and node.epoch == epoch:
            self._while_following(node, item)
            return
        if not node.up or node.epoch != epoch:
            return
        if isinstance(item, tuple):  # a timer: fire only if still armed with this deadline
            kind, key = item
            if node.timers.get((kind, key)) != when:
                return
            del node.timers[(kind, key)]
            self.feed(index, TimerFired(kind, key))
        elif isinstance(item, _JobDone):
            item.finish()
            if node.up:
                self._start_next_job(node)
        elif isinstance(item, _Arrival):
            self._gossip(index, item.tx)
        elif isinstance(item, _Evict):
            self._evict(node, item.tx_hash)
        elif isinstance(item, _Poll):
            self._poll(node)
        elif isinstance(item, _Status):
            self._on_status(node, self.nodes[item.peer])
        elif isinstance(item, _BlockAsk):
            self._ask_block(node, item)
        else:
            if isinstance(item, MessageReceived):
                self._keep_for_join(node, item)
            self.feed(index, item)

    def feed(self, index: int, event: Event) -> None:
        node = self.nodes[index]
        assert node.replica is not None
        if isinstance(event, MessageReceived):
            self.delivered.append(event.data)
        self._submit(node, node.replica.step(event))
        if node.replica is not None and node.replica.view > node.last_view:
            node.last_view = node.replica.view
            node.view_changes += 1

    # --- the adapter side ---------------------------------------------------------------

    def _submit(self, node: Node, ready: Ready) -> None:
        """A step's Ready: performed now (one write per step), or behind the group write."""
        if not GROUP_COMMIT_MS or (ready.persist is None and not node.waiting
                                   and not node.writing):
            self.perform(node, ready)
            return
        if TIMERS_AS_STEPS_END:
            for action in ready.actions:
                if isinstance(action, SetTimer | CancelTimer):
                    node.timers.pop((action.kind, action.key), None)
                if isinstance(action, SetTimer):
                    node.armed[(action.kind, action.key)] = action
                elif isinstance(action, CancelTimer):
                    node.armed.pop((action.kind, action.key), None)
        node.waiting.append((ready, node.replica.epochs.current.validators))
        if not node.writing:
            self._start_write(node)

    def _start_write(self, node: Node) -> None:
        group, node.waiting = tuple(node.waiting), []
        node.writing = True
        self._schedule(GROUP_COMMIT_MS, node, _Written(group))

    def _written(self, node: Node, item: _Written) -> None:
        node.writing = False
        for ready, members in item.group:
            if node.replica is None:
                break  # (left the set: nothing more of it)
            self.perform(node, ready, members if ROUTES_AS_STEPS_END else None, deferred=True)
        if node.waiting and node.replica is not None:
            self._start_write(node)

    def perform(self, node: Node, ready: Ready, members: tuple[bytes, ...] | None = None,
                deferred: bool = False) -> None:
        """The step's store batch, then its signing bound, then its actions in order (the
        adapter's `_write_records` and `_perform_one`); a crash may fall between any two of
        them. One write per step, unless GROUP_COMMIT_MS models the adapter's group commit
        (`_submit`: `deferred`, the steps of one group write, performed after it, routed to
        `members`); its LevelDB side is tested on the engine
        (tests/unit/pbft/test_group_commit.py)."""
        if ready.persist is not None:  # before anything of the step is sent
            persist = ready.persist
            self._write_point(node, "step")
            if STORE_FIRST:
                node.store.apply(persist.ops)
                if persist.signing_bound is not None:
                    self._write_point(node, "bound")
                    node.signing_bound = persist.signing_bound
            else:
                if persist.signing_bound is not None:
                    node.signing_bound = persist.signing_bound
                    self._write_point(node, "bound")
                node.store.apply(persist.ops)
        for position, action in enumerate(ready.actions):
            if position:
                self._write_point(node, "send")
            match action:
                case Broadcast():
                    self._send(node, None, action.data)
                case SendTo():
                    self._send(node, self._node_of(node, action.replica, members), action.data)
                case RelayRequests():
                    self._relay(node, self._node_of(node, action.replica, members),
                                action.tx_hashes)
                case LeftValidatorSet():
                    self._leave(node)
                    return  # (nothing else of the step is done: the replica is gone)
                case SetTimer():
                    if (deferred and TIMERS_AS_STEPS_END
                            and node.armed.get((action.kind, action.key)) is not action):
                        continue  # re-armed or cancelled by a later step already
                    node.timers[(action.kind, action.key)] = self.now + action.duration_ms
                    self._schedule(action.duration_ms, node, (action.kind, action.key))
                case CancelTimer():
                    node.timers.pop((action.kind, action.key), None)
                case Alarm():
                    node.alarms.append(action)
                case FetchBlock():
                    self._schedule(0, node, _BlockAsk(action.seq_no, action.digest))
                case BuildBlock() | ValidateBlock() | CommitBlock() | FetchCommitted():
                    self._block_action(node, action)
                case _:
                    assert_never(action)

    def _block_action(self, node: Node,
                      action: BuildBlock | ValidateBlock | CommitBlock | FetchCommitted) -> None:
        """Block work goes to the node's one executor, in order."""
        queued: _Queued
        match action:
            case BuildBlock():
                queued = _Queued("build", partial(self._build, node, action), action)
            case ValidateBlock():
                queued = _Queued("validate", partial(self._validate, node, action), action)
            case CommitBlock():
                queued = _Queued("commit", partial(self._commit, node, action), action)
            case FetchCommitted():
                queued = _Queued("fetch", partial(self._fetch, node, action.target_seq_no),
                                 action)
            case _:
                assert_never(action)
        if (queued.kind == "fetch" and self.lock_race
                and self.rng.random() < self.lock_race):
            # Block sync runs beside the commit task and takes the chain lock first: a
            # CommitBlock waiting for the executor finds its block in the chain.
            commits = [i for i, q in enumerate(node.jobs) if q.kind == "commit"]
            node.jobs.insert(commits[0] if commits else len(node.jobs), queued)
        else:
            node.jobs.append(queued)
        if not node.busy:
            self._start_next_job(node)

    def _start_next_job(self, node: Node) -> None:
        """The executor takes the next job: it starts now and its outcome lands when it ends
        (a job sees the chain as the jobs before it left it: they ran one at a time)."""
        if not node.jobs:
            node.busy = False
            return
        node.busy = True
        queued = node.jobs.popleft()
        duration, finish = queued.start()
        faults = self.executor_faults.get(node.index)
        if faults is not None and queued.kind != "fetch":  # (a fetch fails range by range)
            duration, finish = self._executor_fault(node, faults, queued, duration, finish)
        self._schedule(duration, node, _JobDone(finish))

    def _executor_fault(self, node: Node, faults: ExecutorFaults, queued: _Queued,
                        duration: int, finish: Callable[[], None]
                        ) -> tuple[int, Callable[[], None]]:
        """A job of a faulty executor: stalled, raising (the adapter's catch-all answers), or
        a validation whose answer is lost."""
        if faults.stall and self.rng.random() < faults.stall:
            duration += self.rng.randint(*faults.stall_ms)
            self.seen["stall"] += 1
        action = queued.action
        if (queued.kind in faults.raises_in and faults.raises
                and self.rng.random() < faults.raises):
            failed: Event
            match action:
                case BuildBlock():
                    failed = BlockBuilt(action.seq_no, b"", b"", ())
                case ValidateBlock():
                    failed = BlockValidated(action.seq_no, action.digest, False,
                                            Refusal.UNAVAILABLE)
                case CommitBlock() if self._executed_on_head(node, action):
                    # Nothing to execute: the write failed, and the node stops.
                    return duration, partial(self._fail_stop, node, faults.restart_ms)
                case CommitBlock():  # its body is the header's: the copy is kept, tried again
                    failed = CommitRefused(action.seq_no, action.digest, false_copy=False)
                case _:
                    return duration, finish
            self.seen[f"{queued.kind} raised"] += 1
            return self.rng.randint(1, duration), partial(self.feed, node.index, failed)
        if (isinstance(action, ValidateBlock) and faults.lose
                and self.rng.random() < faults.lose):
            self.seen["validation answer lost"] += 1
            return duration, lambda: None
        return duration, finish

    def _fail_stop(self, node: Node, restart_ms: int) -> None:
        """A database write failed: the node stops, and its supervisor starts it again."""
        self.seen["commit write failed"] += 1
        self.crash(node.index)
        epoch = node.epoch
        self.at(restart_ms, lambda: self._restart_crashed(node.index, epoch))
        raise _Crashed

    @staticmethod
    def _executed_on_head(node: Node, action: CommitBlock) -> bool:
        return node.executed.get(action.digest) == node.chain.head.block_hash

    def _executed_here(self, node: Node, digest: bytes, block: bytes) -> None:
        decoded = decode_block(block)
        if decoded is not None:
            node.executed[digest] = decoded[1]
            while len(node.executed) > MAX_EXECUTED:
                del node.executed[next(iter(node.executed))]

    def _build(self, node: Node, action: BuildBlock) -> tuple[int, Callable[[], None]]:
        limits = [self.max_txs_per_block,
                  self.execution.count_within(node.index, action.time_budget_ms)]
        max_count = min((x for x in limits if x is not None), default=None)
        tip = node.chain.extended(action.ancestors)
        if tip is None or tip.head.block_hash != action.parent_hash:
            failed = BlockBuilt(action.seq_no, b"", b"", ())  # its parent chain is gone
            return FETCH_OVERHEAD_MS, lambda: self.feed(node.index, failed)
        txs = node.pool.select(tip, max_count, skip=self.censors.get(node.index))
        hashes = tuple(tx.hash for tx in txs)
        parent = action.parent_hash
        poison = self.poisoners.get(node.index)
        if poison is not None and self.rng.random() < poison[1]:
            if poison[0] == "parent":  # a header of its own naming a parent that is not
                parent = keccak(b"poisoned parent %d" % action.seq_no)
            else:  # a body that matches its header and does not execute (an undecodable tx)
                hashes = (*hashes, keccak(b"poisoned transaction %d" % action.seq_no))
        block = make_block(action.seq_no, parent, hashes, bytes(self.block_padding))
        digest = block_digest(block)
        assert digest is not None
        if parent != action.parent_hash or len(hashes) > len(txs):
            self.poisoned[digest] = "parent" if parent != action.parent_hash else "body"
            self.seen[f"poisoned {self.poisoned[digest]}"] += 1
        built = BlockBuilt(action.seq_no, digest, block, hashes)

        def finish() -> None:
            self._executed_here(node, digest, block)
            self.feed(node.index, built)

        return self.execution.block_ms(node.index, len(txs)), finish

    def _validate(self, node: Node, action: ValidateBlock) -> tuple[int, Callable[[], None]]:
        decoded = decode_block(action.block)
        size = len(decoded[2]) if decoded is not None else 0

        def finish() -> None:
            refusal = self._refusal(node, action)
            if refusal is not None:
                self.seen[f"refused {refusal.value}"] += 1
            if refusal is None:
                self._executed_here(node, action.digest, action.block)
            replica = node.replica
            assert replica is not None
            slot = replica.log.certs.get((replica.view, action.seq_no))
            current = slot is not None and slot.validating and slot.digest == action.digest
            view = replica.view
            tip = node.chain.extended(action.ancestors)
            extends = (tip is not None and decoded is not None
                       and decoded[1] == tip.head.block_hash)  # (else the chain moved)
            self.feed(node.index, BlockValidated(action.seq_no, action.digest, refusal is None,
                                                 refusal))
            if (current and extends and self.poisoned.get(action.digest) == "body"
                    and node.index not in self.byzantine and node.replica is not None
                    and node.replica.view <= view
                    # (a replica that lost its records may not leave the view it signed in)
                    and node.replica.amnesia is None):
                raise PoisonKept(f"replica {node.index} validated the invalid block "
                                 f"{action.seq_no} of view {view} and stayed in that view")

        return self.execution.block_ms(node.index, size), finish

    @staticmethod
    def _refusal(node: Node, action: ValidateBlock) -> Refusal | None:
        """Whose fault a block that does not validate here is, as the adapter tells it
        (`PbftEngine._validate`): a copy whose body is not its header's, or that is not the
        block it claims to be, is FALSE_COPY (fetched again); ancestors that no longer
        execute, or a block that does not extend them, say nothing about the proposer
        (UNAVAILABLE, a StaleParentError); a block whose body matches its header and does not
        execute is the proposer's fault (INVALID)."""
        decoded = decode_block(action.block)
        if block_digest(action.block) != action.digest or decoded is None:
            return Refusal.FALSE_COPY
        tip = node.chain.extended(action.ancestors)
        if tip is None:
            return Refusal.UNAVAILABLE  # an ancestor validated before fails: the chain moved
        number, parent, txs = decoded
        if parent != tip.head.block_hash:
            return Refusal.UNAVAILABLE
        if number != tip.head.seq_no + 1 or tip.executes(txs) is None:
            return Refusal.INVALID  # (py-evm checks the number against the parent's)
        return None

    def _commit(self, node: Node, action: CommitBlock) -> tuple[int, Callable[[], None]]:
        def finish() -> None:
            if len(node.chain.blocks) >= action.seq_no:
                # A catch-up imported it meanwhile: the chain says what was committed (the
                # core compares the hash with the certified one: a mismatch is an alarm).
                self.seen["commit answered from the chain"] += 1
                entry = node.chain.blocks[action.seq_no - 1]
                self.feed(node.index, BlockCommitted(action.seq_no, entry.block_hash,
                                                     entry.state_root, block_txs(entry.block)))
                return
            if block_digest(action.block) == action.digest and decode_block(action.block) is None:
                # a lying peer's body under the certified header: the adapter refuses it
                self.feed(node.index, CommitRefused(action.seq_no, action.digest))
                return
            if not node.chain.valid(action.seq_no, action.digest, action.block):
                raise SafetyViolation(f"replica {node.index} committed an invalid block "
                                      f"{action.seq_no}")
            self.epochs.verify_certificate(action.certificate, action.seq_no, action.digest)
            entry = self._import(node, action.block, action.certificate)
            self._write_point(node, "chain")
            self.feed(node.index, BlockCommitted(action.seq_no, entry.block_hash,
                                                 entry.state_root, block_txs(action.block)))
            self._feed_changes(node)
            self._refresh(node)  # after the commit: first BlockCommitted, then the deltas

        # Executed here on this head (validated, or built): only the import; else the
        # adapter executes it first (a block certified before this replica validated it).
        size = len(block_txs(action.block)) if decode_block(action.block) is not None else 0
        share = self.execution.commit_share if self._executed_on_head(node, action) else 1.0
        return self.execution.block_ms(node.index, size, share), finish

    def _fetch(self, node: Node, target: int, imported: tuple[bytes, ...] = (),
               lied: frozenset[int] = frozenset()) -> tuple[int, Callable[[], None]]:
        """Catch-up as block sync does it (`BlockSync.fetch`): a range of up to 32 certified
        blocks at a time, asked of the peers in turn, every certificate verified and every
        block executed (so it takes as long as executing them), each range committed in one
        batch; then the next range, queued behind whatever the executor holds. A byzantine
        source serves wrong blocks or partial certificates, slowly: nothing verifies, and the
        next peer is asked (an `unchecked_claims` liar offers to serve any range, as it claims
        any head). With `short_answers`, when no peer holds the whole range, one that holds
        its start serves the prefix it has, and the next range is asked for; the peers that
        `lied` in this fetch are then asked last, as block sync asks them. A fetch that fails
        part-way (no peer served a range, the network failed, the executor raised) answers
        `FetchFailed` with the head it reached. `imported`: the transactions of the ranges
        this fetch committed so far."""
        first = len(node.chain.blocks) + 1
        self.seen["fetched range"] += 1
        if first > target:
            return FETCH_OVERHEAD_MS, lambda: self._fetch_done(node, target, imported, True)
        count = min(self.range_blocks, target - first + 1)
        last = first + count - 1
        sources = [p for p in self.nodes if p is not node and p.up
                   and (len(p.chain.blocks) >= last or self._unchecked(p, node))
                   and self._connected(node.index, p.index)]
        self.rng.shuffle(sources)
        sources.sort(key=lambda p: p.index in lied)  # (stable: the shuffle's order otherwise)
        duration, lies = FETCH_OVERHEAD_MS, []
        hedge = max(FETCH_OVERHEAD_MS, self.params.request_timeout_ms // 2)
        while sources and sources[0].index in self.byzantine and not (
                sources[0].index in lied and self._holders(node, first)):
            liar = sources.pop(0)
            # (block sync asks the next peer too once one is slow: `sync.HEDGE_AFTER_S`)
            duration += self.rng.randint(FETCH_OVERHEAD_MS, min(BYZANTINE_FETCH_MS, hedge))
            lies.append(liar)
        faults = self.executor_faults.get(node.index)
        lost = (bool(sources) and self.fetch_failure > 0
                and self.rng.random() < self.fetch_failure)
        raised = (faults is not None and faults.raises > 0
                  and self.rng.random() < faults.raises)
        if self.short_answers is not None:  # (seeds without keep their draws: any order)
            lied |= {liar.index for liar in lies}
        if lost or raised:
            source = None
        elif sources and sources[0].index not in self.byzantine:
            source = sources[0]
        else:
            # (The peer that holds the range's start as the range is asked, not once the liars
            # let go: then the censor's blocks committed meanwhile would keep its fetch alive.)
            source = self._short_answer(node, first)
        if source is not None:
            return self._serve(node, target, imported, lied, source, tuple(lies), duration)
        self.seen["fetch failed part-way" if imported else "fetch failed"] += 1
        if lies and not (lost or raised):
            duration += max(0, BYZANTINE_FETCH_MS - hedge)  # (no other peer: the last holds)

        def give_up() -> None:
            for liar in lies:
                self._forged_range(node, liar, first)
            self._fetch_done(node, target, imported, False)
            for liar in lies:
                if self._unchecked(liar, node):
                    self._ask_status(node, liar)  # it tells its head again at once

        return duration, give_up

    def _serve(self, node: Node, target: int, imported: tuple[bytes, ...], lied: frozenset[int],
               source: Node, lies: tuple[Node, ...] = (), duration: int = FETCH_OVERHEAD_MS
               ) -> tuple[int, Callable[[], None]]:
        """The range from the node's head served by `source` (after the `lies`): as much of
        it as the source holds, executed and committed; then the next range, if the fetch
        goes on."""
        first = len(node.chain.blocks) + 1
        entries = source.chain.blocks[first - 1:min(target, first + self.range_blocks - 1)]
        last = first + len(entries) - 1  # (a short answer ends at the source's head)
        faults = self.executor_faults.get(node.index)
        duration += self.range_transfer_ms
        # Block sync tells the replica it executes the answer, then its head (`FetchProgressed`).
        self._schedule(duration, node, FetchProgressed(target, last, executing=True))
        duration += sum(
            self.execution.block_ms(node.index, len(block_txs(e.block))) for e in entries)
        if faults is not None and faults.stall and self.rng.random() < faults.stall:
            duration += self.rng.randint(*faults.stall_ms)

        def finish() -> None:
            for liar in lies:
                self._forged_range(node, liar, first)
            txs = list(imported)
            for seq_no, entry in enumerate(entries, start=first):
                self.epochs.verify_certificate(entry.certificate, seq_no, entry.block_hash)
                assert node.chain.valid(seq_no, entry.block_hash, entry.block)
                self._import(node, entry.block, entry.certificate)
                txs.extend(block_txs(entry.block))
            self._write_point(node, "range")
            head = len(node.chain.blocks)
            self.feed(node.index, FetchProgressed(target, head, executing=False))
            if last >= target:
                self._fetch_done(node, target, tuple(txs), True)
            else:
                node.jobs.append(_Queued("fetch", partial(self._fetch, node, target, tuple(txs),
                                                          lied)))

        return duration, finish

    def _holders(self, node: Node, first: int) -> list[Node]:
        """The honest connected peers that hold block `first`, if short answers are served
        (`short_answers`; none otherwise)."""
        if self.short_answers is None:
            return []
        return [p for p in self.nodes if p is not node and p.up
                and p.index not in self.byzantine and len(p.chain.blocks) >= first
                and self._connected(node.index, p.index)]

    def _short_answer(self, node: Node, first: int) -> Node | None:
        """One of the `_holders` of block `first`, drawn from the short answers' own
        generator, so that the seed's other draws stay what they were."""
        holders = self._holders(node, first)
        if self.short_answers is None or not holders:
            return None
        self.seen["short answer"] += 1
        return self.short_answers.choice(holders)

    def _fetch_done(self, node: Node, target: int, imported: tuple[bytes, ...], done: bool
                    ) -> None:
        """FetchCompleted at the head, or FetchFailed with the head reached (None: nothing
        imported), as `BlockSync.fetch` / `BlockSync.failed` answer."""
        head = node.chain.blocks[-1] if node.chain.blocks else None
        reached = FetchCompleted(len(node.chain.blocks), node.chain.head.block_hash,
                                 head.state_root if head is not None else GENESIS_ROOT,
                                 imported)
        self._feed_changes(node)  # (before the head above them: c is past b + W)
        if done:
            self.feed(node.index, reached)
        else:
            self.feed(node.index, FetchFailed(target, reached if imported else None))
        self._refresh(node)

    def _forged_range(self, node: Node, source: Node, seq_no: int) -> None:
        """What a lying source serves for the first block wanted, slowly: the true header over
        a false body, or another block, each with the true certificate, or the true block
        with a certificate short of a quorum. The node's checks (the certificate over the
        header's hash, then execution) must refuse every one."""
        if len(source.chain.blocks) < seq_no:
            return
        entry = source.chain.blocks[seq_no - 1]
        block, certificate = entry.block, entry.certificate
        lie = self.rng.choice(("false body", "other block", "short certificate"))
        if lie == "false body":
            block = with_body(block, (keccak(b"forged transaction"),))
        elif lie == "other block":
            block = make_block(seq_no, keccak(b"forged parent"), (), b"forged")
        else:
            commits = decode_commit_certificate(certificate)
            certificate = encode_commit_certificate(commits[: self.epochs.quorum_at(seq_no) - 1])
        digest = block_digest(block)
        try:
            self.epochs.verify_certificate(certificate, seq_no, digest or b"")
        except MessageError:
            return
        if digest is not None and node.chain.valid(seq_no, digest, block):
            raise SafetyViolation(f"a forged block {seq_no} passed the catch-up checks")

    def _import(self, node: Node, block: bytes, certificate: bytes) -> ChainBlock:
        entry = node.chain.append(block, certificate)
        self._check_agreement(node, len(node.chain.blocks))
        self._count_votes(node, block)
        for tx_hash in block_txs(block):
            self.commit_at.setdefault(tx_hash, {})[node.index] = self.now
        node.pool.prune(node.chain)
        return entry

    # --- membership: votes in committed blocks, followers, joining and leaving -----------

    def vote(self, subject: int, add: bool, to: int | None = None) -> bytes:
        """A vote that passes, to add node `subject` to the set or remove it: a transaction
        which, once committed in block b, schedules the change on every node (the registry's
        rules are `pbft_engine.registry`'s; here only the outcome of a vote is simulated)."""
        tx_hash = keccak(b"membership vote %d %d %d" % (len(self.votes), subject, add))
        self.votes[tx_hash] = (self.nodes[subject].address, add)
        return self.submit(tx_hash, to)

    def _count_votes(self, node: Node, block: bytes) -> None:
        """The changes block b passes, applied to this node's schedule (as its state's
        registry would be): the set after every scheduled change, plus or minus the subject
        (added at the end); a vote for what is already so, or one that would empty the set,
        passes nothing."""
        number = len(node.chain.blocks)
        for tx_hash in block_txs(block):
            if tx_hash not in self.votes:
                continue
            assert node.schedule is not None
            subject, add = self.votes[tx_hash]
            last = node.schedule.epochs[-1].validators
            if add == (subject in last) or (not add and len(last) == 1):
                continue
            validators = (*last, subject) if add else tuple(v for v in last if v != subject)
            node.schedule = node.schedule.schedule(validators, passed_at=number)
            node.unfed.append(ScheduleChange(validators, number))
            if len(node.schedule.epochs) > len(self.epochs.schedule.epochs):
                self.epochs.schedule = node.schedule  # (honest chains agree: the same history)
                self.seen["membership change"] += 1

    def _feed_changes(self, node: Node) -> None:
        """After the commit (or the catch-up) that passed them: ScheduleChange to the core."""
        changes, node.unfed = node.unfed, []
        for change in changes:
            if node.replica is not None:
                self.feed(node.index, change)

    def _node_of(self, node: Node, replica: int, members: tuple[bytes, ...] | None = None
                 ) -> int:
        """The node replica `replica` of this node's installed epoch runs on (route by
        address: an index names another member in another epoch), or of `members`."""
        assert node.replica is not None
        return self.by_address[(members or node.replica.epochs.current.validators)[replica]]

    def _leave(self, node: Node) -> None:
        """LeftValidatorSet: the replica is gone, the node follows as an observer. It polls
        at once, as the engine looks for a join as it leaves (`PbftEngine._leave`): voted
        in again, it may have left at that change's c."""
        self.seen["left the set"] += 1
        node.replica, node.timers = None, {}
        node.waiting, node.writing, node.armed = [], False, {}
        node.jobs.clear()
        node.busy = False
        self._follow(node, 0)

    def _follow(self, node: Node, delay_ms: int | None = None) -> None:
        node.following = True
        self._schedule(self.poll_interval_ms if delay_ms is None else delay_ms, node, _Follow())

    def _while_following(self, node: Node, item: Any) -> None:
        """What reaches a follower: its poll, transactions to pool, and the consensus
        messages for the epoch it may join, kept for its replica (`JoinBuffer`)."""
        if isinstance(item, _Follow):
            self._follow_poll(node)
        elif isinstance(item, _Arrival):
            self._gossip(node.index, item.tx)
        elif isinstance(item, _Evict):
            self._evict(node, item.tx_hash)
        elif isinstance(item, MessageReceived):
            self._keep_for_join(node, item)

    def _keep_for_join(self, node: Node, received: MessageReceived) -> None:
        """Every consensus message a node hears is offered to its `JoinBuffer`: kept if it
        is to join an epoch (a follower voted in, or a validator voted out and in again)."""
        assert node.join_buffer is not None and node.schedule is not None
        node.join_buffer.keep(received.data, node.schedule, len(node.chain.blocks),
                              received.sender)

    def _follow_poll(self, node: Node) -> None:
        """Block sync as an observer does it: the certified blocks a connected peer holds
        beyond this node's head, a range at a time (every certificate checked with its
        height's set); then, if the set of the next height has this node in it, it joins."""
        peers = [p for p in self.nodes if p is not node and (p.up or p.following)
                 and self._connected(node.index, p.index)]
        source = max(peers, key=lambda p: len(p.chain.blocks), default=None)
        first = len(node.chain.blocks) + 1
        if source is not None and self.rng.random() >= self.faults.drop:
            last = min(len(source.chain.blocks), first + self.range_blocks - 1)
            for seq_no in range(first, last + 1):
                entry = source.chain.blocks[seq_no - 1]
                self.epochs.verify_certificate(entry.certificate, seq_no, entry.block_hash)
                assert node.chain.valid(seq_no, entry.block_hash, entry.block)
                self._import(node, entry.block, entry.certificate)
            node.unfed.clear()  # (no replica: the schedule is given whole when it joins)
        self._forward(node)
        if not self._maybe_join(node):
            self._schedule(self.poll_interval_ms, node, _Follow())

    def _forward(self, node: Node) -> None:
        """An observer forwards the transactions it holds to the validators, again each
        poll until they are committed (research/membership.md 8.5)."""
        for entry in list(node.pool.by_hash.values()):
            for peer in self.nodes:
                if peer.up and self._connected(node.index, peer.index) and (
                        entry.tx.hash not in peer.pool):
                    self._schedule(self._delay(), peer, _Arrival(entry.tx))

    def _maybe_join(self, node: Node) -> bool:
        """Voted in and at (or past) the handover checkpoint of its epoch: `Replica.join`, in
        the view of the head's certificate, then the consensus messages it kept."""
        assert node.schedule is not None
        head = node.chain.head
        if node.address not in node.schedule.epoch_at(head.seq_no + 1).validators:
            return False
        view = decode_commit_certificate(node.chain.blocks[-1].certificate)[0].body.view
        node.replica = Replica.join(self.params, node.signer, self.verifier, head,
                                    block_digest=block_digest, schedule=node.schedule,
                                    view=view, signing_bound=node.signing_bound)
        node.following = False
        self.seen["joined the set"] += 1
        node.last_view = max(node.last_view, view)
        self.perform(node, node.replica.start())
        assert node.join_buffer is not None
        for data in node.join_buffer.take():
            if node.replica is not None:
                self.feed(node.index, MessageReceived(data))
        node.ready = {}
        self._refresh(node)
        node.last_progress = -1
        self._schedule(self.poll_interval_ms, node, _Poll())
        return True

    def check_certificates(self) -> None:
        """Every block of every honest chain carries Q signatures of its own height's set."""
        for node in self.honest():
            for seq_no, entry in enumerate(node.chain.blocks, start=1):
                try:
                    self.epochs.verify_certificate(entry.certificate, seq_no, entry.block_hash)
                except MessageError as exc:
                    raise SafetyViolation(f"block {seq_no} on node {node.index}: {exc}") from None

    # --- readiness: what the core is told about the pool --------------------------------

    def _refresh(self, node: Node, senders: Iterable[bytes] | None = None) -> None:
        """Report the change in this node's executable set: RequestDropped for each reported
        transaction that is no longer executable and was not committed (replaced, evicted,
        made invalid, priced out), then RequestReceived for each newly executable one, in the
        order the pool hands them out."""
        if not node.up:
            return
        chain = node.chain
        todo = set(node.pool.senders) | set(node.ready) if senders is None else set(senders)
        dropped: list[bytes] = []
        added: list[tuple[int, int, bytes]] = []
        for sender in sorted(todo):  # sorted: set order is not deterministic across runs
            old = node.ready.pop(sender, {})
            run = {tx.hash: (key, tx.nonce) for key, tx in node.pool.ready_run(sender, chain)}
            dropped += [h for h in old if h not in run and h not in chain.tx_hashes]
            added += [(key, nonce, h) for h, (key, nonce) in run.items() if h not in old]
            if run:
                node.ready[sender] = dict.fromkeys(run)
        for tx_hash in dropped:
            self.feed(node.index, RequestDropped(tx_hash))
        for _, _, tx_hash in sorted(added):
            self.ready_at.setdefault(tx_hash, {})[node.index] = self.now
            self.reported.add(tx_hash)
            self.feed(node.index, RequestReceived(tx_hash))

    def executable(self, node: Node) -> list[bytes]:
        """What this node reported as executable and has not committed."""
        return [h for run in node.ready.values() for h in run]

    # --- block sync's status poll (pbft_engine/sync.py) ---------------------------------

    @property
    def poll_interval_ms(self) -> int:
        return min(2_000, max(250, self.params.request_timeout_ms // 4))  # as the engine's

    def _poll(self, node: Node) -> None:
        """No progress since the last poll: ask the peers where they are. Only peers whose
        answer could matter are asked (ahead, or in a later view): the others' answers would
        be ignored, and skipping them keeps the simulation cheap. Byzantine peers answer too
        (a head they can prove, as a certificate is checked) and then serve no blocks
        (`_fetch`): the asking replica falls behind, drops its uncommitted blocks and must
        still recover them."""
        assert node.replica is not None
        status = node.replica.status()
        if status.fetching is None and status.last_executed == node.last_progress:
            for peer in self.nodes:
                if peer is not node and peer.up and (
                        self._useful_peer(peer, status.view, status.last_executed,
                                          status.active) or self._unchecked(peer, node)):
                    self._ask_status(node, peer)
        node.last_progress = status.last_executed
        self._schedule(self.poll_interval_ms, node, _Poll())

    @staticmethod
    def _useful_peer(peer: Node, view: int, last_executed: int, active: bool) -> bool:
        """A peer ahead, in a later view, or (to a replica waiting in a view) at its head,
        whose certificate may prove a view."""
        assert peer.replica is not None
        new_view = peer.replica.last_new_view
        return (len(peer.chain.blocks) > last_executed - (not active)
                or (new_view is not None and new_view.body.view > view))

    def _ask_status(self, node: Node, peer: Node) -> None:
        if not self._connected(node.index, peer.index):
            return
        if self.rng.random() < self.faults.drop or self.rng.random() < self.faults.drop:
            return  # the request or the answer was lost
        self._schedule(self._delay() + self._delay(), node, _Status(peer.index))

    def _on_status(self, node: Node, peer: Node) -> None:
        """STATUS from a peer: the NEW-VIEW it is in, if later than ours, and its head, if
        ahead of ours (or ours, with that NEW-VIEW: its view may be proved by the head's
        certificate) and its certificate proves it (checked as block sync checks it: a
        byzantine peer claims heads it cannot prove)."""
        assert node.replica is not None
        new_view, later = peer.store.get(StoreName.META, META_NEW_VIEW), False
        if new_view is not None:
            signed = decode_signed_bytes(new_view, NewView)
            later = signed.body.view > node.replica.view
            if later:
                self.feed(node.index, MessageReceived(WireMessage(signed).encode()))
        if node.replica is None or not (peer.chain.blocks or self._unchecked(peer, node)):
            return
        number, head_hash, certificate = self._claimed_head(peer, node)
        status = node.replica.status()
        if number < status.last_executed or (
                number == status.last_executed and status.active and not later):
            return
        try:
            if self._unchecked(peer, node):
                self.seen["unchecked claim"] += 1
            else:
                self.epochs.verify_certificate(certificate, number, head_hash)
        except MessageError:
            return
        self.feed(node.index, PeerCommitted(number, head_hash, certificate))

    def _unchecked(self, peer: Node, asker: Node) -> bool:
        """The peer lies to the asker unchecked (`unchecked_claims`): it is byzantine and the
        primary the asker's request timer times, whom the lie is to shield."""
        replica = asker.replica
        if not (self.unchecked_claims and peer.index in self.byzantine
                and replica is not None and peer.replica is not None):
            return False
        return replica.epochs.current.validators[replica.primary] == peer.replica.address

    def _claimed_head(self, peer: Node, asker: Node) -> tuple[int, bytes, bytes]:
        """(number, hash, certificate) of the head a peer's STATUS claims: its own, or, from
        a byzantine peer, now and then a higher one or another block, with its own
        head's certificate (`unchecked_claims`: always one above the asker's head, with no
        certificate)."""
        number = len(peer.chain.blocks)
        if self._unchecked(peer, asker):
            above = max(number, len(asker.chain.blocks)) + self.rng.randint(1, 5)
            return above, keccak(b"unprovable"), b""
        head = peer.chain.blocks[-1]
        if peer.index in self.byzantine and self.rng.random() < 0.5:
            if self.rng.random() < 0.5:
                return number + self.rng.randint(1, 5), keccak(b"unprovable"), head.certificate
            return number, keccak(b"another head"), head.certificate
        return number, head.block_hash, head.certificate

    # --- block bodies by digest (pbft_engine/sync.py's GET_BLOCK) --------------------------

    def _ask_block(self, node: Node, ask: _BlockAsk) -> None:
        """One random connected peer answers with its copy, if it has one; a byzantine peer
        with a forged block. Asked again every poll interval while the replica wants it."""
        assert node.replica is not None
        if (ask.seq_no, ask.digest) not in node.replica.wanted:
            return
        peers = [p for p in self.nodes if p is not node and p.up
                 and self._connected(node.index, p.index)]
        if peers and self.rng.random() >= self.faults.drop:
            peer = peers[self.rng.randrange(len(peers))]
            if peer.index in self.byzantine:
                copy: bytes | None = self._forged_copy(peer, ask)
            else:
                copy = self._copy_of(peer, ask.seq_no, ask.digest)
            if copy is not None:
                answer = BlockReceived(ask.seq_no, ask.digest, copy)
                self._schedule(self._delay() + self._delay(), node, answer)
        self._schedule(self.poll_interval_ms, node, ask)

    def _forged_copy(self, peer: Node, ask: _BlockAsk) -> bytes:
        """Another block, or (when the liar holds the block) its true header over a false
        body, which only execution tells apart."""
        genuine = self._copy_of(peer, ask.seq_no, ask.digest)
        if genuine is not None and self.rng.random() < 0.5:
            return with_body(genuine, (keccak(b"forged transaction"),))
        return make_block(ask.seq_no, keccak(b"forged parent"), (), b"forged")

    @staticmethod
    def _copy_of(peer: Node, seq_no: int, digest: bytes) -> bytes | None:
        assert peer.replica is not None
        held = peer.replica.block_for(seq_no, digest)
        if held is None and len(peer.chain.blocks) >= seq_no:
            entry = peer.chain.blocks[seq_no - 1]
            held = entry.block if entry.block_hash == digest else None
        return held

    # --- network ------------------------------------------------------------------------

    def _send(self, node: Node, to: int | None, data: bytes) -> None:
        self._record_signed(node.index, data)
        targets = [to] if to is not None else [i for i in range(len(self.nodes))
                                               if i != node.index]
        for dst in targets:
            rewrite = self.outgoing.get(node.index)
            for real_dst, payload in rewrite(dst, data) if rewrite else [(dst, data)]:
                self.transmit(node.index, real_dst, payload)

    def _connected(self, src: int, dst: int) -> bool:
        return not self.partition or any(src in g and dst in g for g in self.partition)

    def _delay(self) -> int:
        return self.rng.randint(self.faults.min_delay_ms, self.faults.max_delay_ms)

    def transmit(self, src: int, dst: int, data: bytes) -> None:
        if not self._connected(src, dst):
            return
        if self.filters:
            wire = WireMessage.decode(data)
            if not all(f(src, dst, wire) for f in self.filters):
                return
        copies = 0 if self.rng.random() < self.faults.drop else 1
        if copies and self.rng.random() < self.faults.duplicate:
            copies = 2
        for _ in range(copies):
            self._schedule(self._delay(), self.nodes[dst],
                           MessageReceived(data, self.nodes[src].address))

    def _record_signed(self, index: int, data: bytes) -> None:
        """No honest replica signs two different messages for one (type, view, seqNo)."""
        if index in self.byzantine:
            return
        signed = signed_part(data)
        try:
            WireMessage.decode(data)
        except MessageError as exc:  # (its peers drop it as a MessageError)
            raise UndecodableSent(f"replica {index} sent an undecodable "
                                  f"{signed.body.TYPE.name}: {exc}") from None
        body = signed.body
        validators = self.epochs.schedule.epoch_at(message_height(body)).validators
        if body.replica < len(validators) and validators[body.replica] != self.nodes[index].address:
            return  # another's message it passes on (a stable checkpoint's proof)
        key = (index, body.TYPE, getattr(body, "view", 0), getattr(body, "seq_no", -1))
        encoded = signed.encode()
        if self.signed_by.setdefault(key, encoded) != encoded:
            raise SafetyViolation(f"replica {index} signed two different {body.TYPE.name} "
                                  f"for {key[2:]}")

    def _check_agreement(self, node: Node, seq_no: int) -> None:
        mine = node.chain.blocks[seq_no - 1].block_hash
        for other in self.nodes:
            if other.index in self.byzantine or len(other.chain.blocks) < seq_no:
                continue
            if other.chain.blocks[seq_no - 1].block_hash != mine:
                raise SafetyViolation(f"replicas {node.index} and {other.index} committed "
                                      f"different blocks at {seq_no}")

    # --- faults and clients -------------------------------------------------------------

    def submit(self, tx: Tx | bytes, to: int | None = None) -> bytes:
        """A client sends a transaction to one node, which gossips it to all validators (at
        once, or after a network delay each with `gossip_delays`). A bare hash stands for an
        always-executable transaction of its own sender. Returns the transaction's hash."""
        if isinstance(tx, bytes):
            tx = Tx.opaque(tx)
        self.registry[tx.hash] = tx
        entry = self.rng.randrange(len(self.nodes)) if to is None else to
        self._gossip(entry, tx)
        for dst in range(len(self.nodes)):
            reached = dst != entry and self._connected(entry, dst)
            if not reached or self.rng.random() < self.faults.drop:
                continue
            if self.gossip_delays:
                self._schedule(self._delay(), self.nodes[dst], _Arrival(tx))
            else:
                self._gossip(dst, tx)
        return tx.hash

    def _relay(self, node: Node, to: int, tx_hashes: tuple[bytes, ...]) -> None:
        """A backup's waiting transactions, from its pool to the primary, as gossip travels."""
        for tx_hash in tx_hashes:
            entry = node.pool.by_hash.get(tx_hash)
            if (entry is not None and self._connected(node.index, to)
                    and self.rng.random() >= self.faults.drop):
                self._schedule(self._delay(), self.nodes[to], _Arrival(entry.tx))

    def _gossip(self, index: int, tx: Tx) -> None:
        node = self.nodes[index]
        if node.pool.add(tx, node.chain):
            self._refresh(node, (tx.sender,))

    def evict(self, tx_hash: bytes, nodes: Iterable[int] | None = None) -> None:
        """The transaction leaves these pools (default: all; a lifetime expiring), each after
        a network delay with `gossip_delays` (pools do not agree on the instant)."""
        for index in range(len(self.nodes)) if nodes is None else nodes:
            if self.gossip_delays:
                self._schedule(self._delay(), self.nodes[index], _Evict(tx_hash))
            else:
                self._evict(self.nodes[index], tx_hash)

    def _evict(self, node: Node, tx_hash: bytes) -> None:
        tx = node.pool.remove(tx_hash)
        if tx is not None:
            self._refresh(node, (tx.sender,))

    def crash(self, index: int) -> None:
        node = self.nodes[index]
        if node.replica is not None:
            node.amnesic = node.replica.amnesia is not None
        node.replica, node.following = None, False
        node.epoch += 1
        node.timers.clear()
        node.waiting, node.writing, node.armed = [], False, {}
        node.jobs.clear()
        node.busy = False

    def wipe(self, index: int) -> None:
        """The operator rebuilt this validator's consensus store (its chain and its validator
        state file stay): it restarts with no records of what it signed."""
        self.crash(index)
        self.nodes[index].store = MemoryConsensusStore()
        self.nodes[index].amnesic = True
        self.restart(index)

    def arm_crash(self, index: int, point: str, countdown: int = 1,
                  restart_after_ms: int = 100) -> None:
        """The node crashes the countdown-th time it reaches `point` (one of CRASH_POINTS)
        from now, and restarts restart_after_ms later; RestartAmnesia if it then restarts
        as one that lost its records."""
        assert point in CRASH_POINTS, point
        self.crash_plans[index] = _CrashPlan(point, countdown, restart_after_ms)

    def _write_point(self, node: Node, point: str) -> None:
        """Between two writes of the adapter: the armed crash falls here, if it is due."""
        plan = self.crash_plans.get(node.index)
        if plan is None or plan.point != point or not self._in_event or not node.up:
            return
        plan.countdown -= 1
        if plan.countdown > 0:
            return
        del self.crash_plans[node.index]
        self.write_crashes.append((self.now, node.index, point))
        self.seen[f"crash at {point}"] += 1
        self.crash(node.index)
        epoch = node.epoch
        self.at(plan.restart_after_ms,
                lambda: self._restart_crashed(node.index, epoch))
        raise _Crashed

    def crash_for(self, index: int, down_ms: int) -> None:
        """Crash the node now and restart it down_ms later (unless something else does)."""
        self.crash(index)
        epoch = self.nodes[index].epoch
        self.at(down_ms, lambda: self._restart_crashed(index, epoch))

    def _restart_crashed(self, index: int, epoch: int) -> None:
        node = self.nodes[index]
        if not node.up and node.epoch == epoch:  # nobody restarted it, or crashed it for good
            node.restarts += 1
            self.restart(index)

    def restart(self, index: int) -> None:
        """Start (or restart) a node from its persisted store, chain and pool journal."""
        node = self.nodes[index]
        node.epoch += 1
        node.timers.clear()
        node.waiting, node.writing, node.armed = [], False, {}
        node.jobs.clear()
        node.busy = False
        node.executed.clear()  # the adapter's memory
        node.unfed.clear()  # (the schedule its chain's state says is given whole)
        node.join_buffer = JoinBuffer(self.params, self.verifier, node.address)  # (in memory)
        if node.signing_bound is None and node.address not in self.params.validators:
            self._follow(node)  # a spare that never voted: it follows until voted in
            return
        node.replica = Replica.restore(self.params, None, node.signer, self.verifier,
                                       node.chain.head, node.store, block_digest=block_digest,
                                       signing_bound=node.signing_bound,
                                       schedule=node.schedule)
        if node.replica.amnesia is not None and not node.amnesic:
            raise RestartAmnesia(
                f"replica {index} lost no records and restarted amnesic (bound "
                f"{node.signing_bound}, store at view {node.replica.view}, high watermark "
                f"{node.replica.high_watermark}); crashes at write points: "
                f"{self.write_crashes[-3:]}")
        node.last_view = max(node.last_view, node.replica.view)
        self.perform(node, node.replica.start())
        if node.replica is None:  # removed from the set: it follows
            return
        node.ready = {}  # a new replica knows nothing: report the whole executable set
        self._refresh(node)
        node.last_progress = -1
        self._schedule(self.poll_interval_ms, node, _Poll())

    # --- observations -------------------------------------------------------------------

    def honest(self) -> list[Node]:
        return [node for node in self.nodes if node.index not in self.byzantine]

    def committed(self, tx_hash: bytes) -> int:
        """How many honest nodes have the transaction in their chain."""
        return sum(tx_hash in node.chain.tx_hashes for node in self.honest())

    def heights(self) -> list[int]:
        return [len(node.chain.blocks) for node in self.nodes]

    def views(self) -> list[int | None]:
        return [node.replica.view if node.replica else None for node in self.nodes]

    def all_committed(self, tx_hashes: list[bytes], nodes: list[Node] | None = None) -> bool:
        return all(tx in node.chain.tx_hashes for node in nodes or self.honest()
                   for tx in tx_hashes)

    def check_safety(self) -> None:
        """Agreement at every height across honest chains, and no alarm anywhere honest."""
        for node in self.honest():
            for seq_no in range(1, len(node.chain.blocks) + 1):
                self._check_agreement(node, seq_no)
            if node.alarms:
                raise SafetyViolation(f"replica {node.index} raised {node.alarms}")
