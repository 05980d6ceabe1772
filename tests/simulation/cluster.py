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
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, assert_never

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
    MessageReceived,
    PeerCommitted,
    Ready,
    RelayRequests,
    Replica,
    RequestDropped,
    RequestReceived,
    SendTo,
    SetTimer,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.core.params import DEFAULT_MAX_IN_FLIGHT
from pbft_engine.core.records import META_NEW_VIEW, StoreName
from pbft_engine.core.signing_bound import SigningBound
from pbft_engine.errors import MessageError
from pbft_engine.messages import (
    KeySigner,
    KeyVerifier,
    NewView,
    Verifier,
    WireMessage,
    decode_commit_certificate,
    decode_signed_bytes,
    encode_commit_certificate,
    verify_commit_certificate,
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
    "CHAIN_ID", "GENESIS_HASH", "GENESIS_ROOT", "MAX_TXS_PER_BLOCK", "ChainBlock", "Cluster",
    "Execution", "FeeMarket", "NetworkFaults", "Node", "SafetyViolation", "SimChain", "Tx",
    "block_digest", "block_txs", "make_block",
]

CHAIN_ID = 1337
MAX_TXS_PER_BLOCK = 8  # the default cap for the unit tests' cluster (scenarios lift it)
FETCH_OVERHEAD_MS = 5
BYZANTINE_FETCH_MS = 2_000  # how long a lying catch-up source may hold a fetch


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
    jobs: deque[Callable[[], tuple[int, Callable[[], None]]]] = field(default_factory=deque)
    busy: bool = False  # the executor runs a job
    ready: dict[bytes, dict[bytes, None]] = field(default_factory=dict)  # reported, by sender
    last_view: int = 0
    last_progress: int = -1  # last_executed at the previous status poll
    view_changes: int = 0  # times this node's view went up (across restarts)

    @property
    def up(self) -> bool:
        return self.replica is not None


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
class _Poll:
    pass


@dataclass(frozen=True)
class _Status:
    peer: int


@dataclass(frozen=True)
class _BlockAsk:
    """Ask one peer for a block body the replica wants (`FetchBlock`), then again later."""

    seq_no: int
    digest: bytes


MessageFilter = Callable[[int, int, WireMessage], bool]  # (src, dst, message) -> deliver?
Job = Callable[[], tuple[int, Callable[[], None]]]  # start: (duration, what happens at the end)


class SafetyViolation(AssertionError):
    pass


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
    ) -> None:
        self.rng = random.Random(seed)
        self.faults = faults or NetworkFaults()
        signers = [KeySigner(keccak(b"validator %d" % i)) for i in range(n)]
        self.params = EngineParams(
            chain_id=CHAIN_ID,
            validators=tuple(s.address for s in signers),
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
        self.nodes = [Node(i, s, SimChain(self.market, self.registry))
                      for i, s in enumerate(signers)]
        self.now = 0
        self._queue: list[tuple[int, int, int, int, Any]] = []
        self._sequence = 0
        self.partition: list[set[int]] | None = None
        self.filters: list[MessageFilter] = []
        self.outgoing: dict[int, Callable[[int, bytes], list[tuple[int, bytes]]]] = {}
        self.byzantine: set[int] = set()
        self.censors: dict[int, bytes] = {}  # node -> the sender its builds leave out
        self.signed_by: dict[tuple[int, int, int, int], bytes] = {}
        self.delivered: list[bytes] = []  # every message delivered (replay material)
        # Liveness material: when each transaction last became executable (was reported) and
        # when it committed, per node; every transaction ever reported anywhere.
        self.ready_at: dict[bytes, dict[int, int]] = {}
        self.commit_at: dict[bytes, dict[int, int]] = {}
        self.reported: set[bytes] = set()
        for node in self.nodes:
            self.restart(node.index)

    # --- scheduling ---------------------------------------------------------------------

    def _schedule(self, delay: int, node: Node, item: Any) -> None:
        self._sequence += 1
        heapq.heappush(self._queue, (self.now + delay, self._sequence, node.index, node.epoch,
                                     item))

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
        node = self.nodes[index]
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
            self.feed(index, item)

    def feed(self, index: int, event: Event) -> None:
        node = self.nodes[index]
        assert node.replica is not None
        if isinstance(event, MessageReceived):
            self.delivered.append(event.data)
        self.perform(node, node.replica.step(event))
        if node.replica is not None and node.replica.view > node.last_view:
            node.last_view = node.replica.view
            node.view_changes += 1

    # --- the adapter side ---------------------------------------------------------------

    def perform(self, node: Node, ready: Ready) -> None:
        if ready.persist is not None:  # before anything of the step is sent
            if ready.persist.signing_bound is not None:
                node.signing_bound = ready.persist.signing_bound
            node.store.apply(ready.persist.ops)
        for action in ready.actions:
            match action:
                case Broadcast():
                    self._send(node, None, action.data)
                case SendTo():
                    self._send(node, action.replica, action.data)
                case RelayRequests():
                    self._relay(node, action.replica, action.tx_hashes)
                case SetTimer():
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
        job: Job
        match action:
            case BuildBlock():
                job = partial(self._build, node, action)
            case ValidateBlock():
                job = partial(self._validate, node, action)
            case CommitBlock():
                job = partial(self._commit, node, action)
            case FetchCommitted():
                job = partial(self._fetch, node, action.target_seq_no)
            case _:
                assert_never(action)
        node.jobs.append(job)
        if not node.busy:
            self._start_next_job(node)

    def _start_next_job(self, node: Node) -> None:
        """The executor takes the next job: it starts now and its outcome lands when it ends
        (a job sees the chain as the jobs before it left it: they ran one at a time)."""
        if not node.jobs:
            node.busy = False
            return
        node.busy = True
        duration, finish = node.jobs.popleft()()
        self._schedule(duration, node, _JobDone(finish))

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
        block = make_block(action.seq_no, action.parent_hash, hashes,
                           bytes(self.block_padding))
        digest = block_digest(block)
        assert digest is not None
        built = BlockBuilt(action.seq_no, digest, block, hashes)
        return (self.execution.block_ms(node.index, len(txs)),
                lambda: self.feed(node.index, built))

    def _validate(self, node: Node, action: ValidateBlock) -> tuple[int, Callable[[], None]]:
        decoded = decode_block(action.block)
        size = len(decoded[2]) if decoded is not None else 0

        def finish() -> None:
            tip = node.chain.extended(action.ancestors)
            ok = tip is not None and tip.valid(action.seq_no, action.digest, action.block)
            self.feed(node.index, BlockValidated(action.seq_no, action.digest, ok))

        return self.execution.block_ms(node.index, size), finish

    def _commit(self, node: Node, action: CommitBlock) -> tuple[int, Callable[[], None]]:
        def finish() -> None:
            if block_digest(action.block) == action.digest and decode_block(action.block) is None:
                # a lying peer's body under the certified header: the adapter refuses it
                self.feed(node.index, CommitRefused(action.seq_no, action.digest))
                return
            if not node.chain.valid(action.seq_no, action.digest, action.block):
                raise SafetyViolation(f"replica {node.index} committed an invalid block "
                                      f"{action.seq_no}")
            verify_commit_certificate(
                action.certificate, validators=self.params.validators, chain_id=CHAIN_ID,
                block_number=action.seq_no, block_hash=action.digest, verifier=self.verifier)
            entry = self._import(node, action.block, action.certificate)
            self.feed(node.index, BlockCommitted(action.seq_no, entry.block_hash,
                                                 entry.state_root, block_txs(action.block)))
            self._refresh(node)  # after the commit: first BlockCommitted, then the deltas

        size = len(block_txs(action.block))
        return self.execution.block_ms(node.index, size, self.execution.commit_share), finish

    def _fetch(self, node: Node, target: int) -> tuple[int, Callable[[], None]]:
        """Catch-up from any peer that has the target: every certificate is verified, every
        block executed (so it takes as long as executing them). A byzantine source serves
        wrong blocks or partial certificates, slowly: nothing verifies, and the fetch fails
        after the sync's request timeout."""
        sources = [p for p in self.nodes if p is not node and p.up
                   and len(p.chain.blocks) >= target]
        if not sources or target <= len(node.chain.blocks):
            return FETCH_OVERHEAD_MS, lambda: self.feed(node.index, FetchFailed(target))
        source = sources[self.rng.randrange(len(sources))]
        if source.index in self.byzantine:
            return (self.rng.randint(FETCH_OVERHEAD_MS, BYZANTINE_FETCH_MS),
                    lambda: self.feed(node.index, self._forged_range(node, source, target)))
        entries = source.chain.blocks[len(node.chain.blocks):target]
        first = len(node.chain.blocks) + 1
        duration = FETCH_OVERHEAD_MS + sum(
            self.execution.block_ms(node.index, len(block_txs(e.block))) for e in entries)

        def finish() -> None:
            txs: list[bytes] = []
            for seq_no, entry in enumerate(entries, start=first):
                verify_commit_certificate(
                    entry.certificate, validators=self.params.validators, chain_id=CHAIN_ID,
                    block_number=seq_no, block_hash=entry.block_hash, verifier=self.verifier)
                assert node.chain.valid(seq_no, entry.block_hash, entry.block)
                self._import(node, entry.block, entry.certificate)
                txs.extend(block_txs(entry.block))
            head = node.chain.blocks[-1]
            self.feed(node.index, FetchCompleted(target, head.block_hash, head.state_root,
                                                 tuple(txs)))
            self._refresh(node)

        return duration, finish

    def _forged_range(self, node: Node, source: Node, target: int) -> FetchFailed:
        """What a lying source serves for the first block wanted, slowly: the true header over
        a false body, or another block, each with the true certificate, or the true block
        with a certificate short of a quorum. The node's checks (the certificate over the
        header's hash, then execution) must refuse every one."""
        seq_no = len(node.chain.blocks) + 1
        entry = source.chain.blocks[seq_no - 1]
        block, certificate = entry.block, entry.certificate
        lie = self.rng.choice(("false body", "other block", "short certificate"))
        if lie == "false body":
            block = with_body(block, (keccak(b"forged transaction"),))
        elif lie == "other block":
            block = make_block(seq_no, keccak(b"forged parent"), (), b"forged")
        else:
            commits = decode_commit_certificate(certificate)
            certificate = encode_commit_certificate(commits[: self.params.quorum - 1])
        digest = block_digest(block)
        try:
            verify_commit_certificate(
                certificate, validators=self.params.validators, chain_id=CHAIN_ID,
                block_number=seq_no, block_hash=digest or b"", verifier=self.verifier)
        except MessageError:
            return FetchFailed(target)
        if digest is not None and node.chain.valid(seq_no, digest, block):
            raise SafetyViolation(f"a forged block {seq_no} passed the catch-up checks")
        return FetchFailed(target)

    def _import(self, node: Node, block: bytes, certificate: bytes) -> ChainBlock:
        entry = node.chain.append(block, certificate)
        self._check_agreement(node, len(node.chain.blocks))
        for tx_hash in block_txs(block):
            self.commit_at.setdefault(tx_hash, {})[node.index] = self.now
        node.pool.prune(node.chain)
        return entry

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
                if (peer is not node and peer.up
                        and self._useful_peer(peer, status.view, status.last_executed)):
                    self._ask_status(node, peer)
        node.last_progress = status.last_executed
        self._schedule(self.poll_interval_ms, node, _Poll())

    @staticmethod
    def _useful_peer(peer: Node, view: int, last_executed: int) -> bool:
        assert peer.replica is not None
        new_view = peer.replica.last_new_view
        return (len(peer.chain.blocks) > last_executed
                or (new_view is not None and new_view.body.view > view))

    def _ask_status(self, node: Node, peer: Node) -> None:
        if not self._connected(node.index, peer.index):
            return
        if self.rng.random() < self.faults.drop or self.rng.random() < self.faults.drop:
            return  # the request or the answer was lost
        self._schedule(self._delay() + self._delay(), node, _Status(peer.index))

    def _on_status(self, node: Node, peer: Node) -> None:
        """STATUS from a peer: the NEW-VIEW it is in, if later than ours, and its head, if
        ahead of ours and its certificate proves it (checked as block sync checks it: a
        byzantine peer claims heads it cannot prove)."""
        assert node.replica is not None
        new_view = peer.store.get(StoreName.META, META_NEW_VIEW)
        if new_view is not None:
            signed = decode_signed_bytes(new_view, NewView)
            if signed.body.view > node.replica.view:
                self.feed(node.index, MessageReceived(WireMessage(signed).encode()))
        if node.replica is None or not peer.chain.blocks:
            return
        number, head_hash, certificate = self._claimed_head(peer)
        if number <= node.replica.status().last_executed:
            return
        try:
            verify_commit_certificate(
                certificate, validators=self.params.validators, chain_id=CHAIN_ID,
                block_number=number, block_hash=head_hash, verifier=self.verifier)
        except MessageError:
            return
        self.feed(node.index, PeerCommitted(number, head_hash, certificate))

    def _claimed_head(self, peer: Node) -> tuple[int, bytes, bytes]:
        """(number, hash, certificate) of the head a peer's STATUS claims: its own, or, from
        a byzantine peer, now and then a higher one or another block, with its own
        head's certificate."""
        head = peer.chain.blocks[-1]
        number = len(peer.chain.blocks)
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
            self._schedule(self._delay(), self.nodes[dst], MessageReceived(data))

    def _record_signed(self, index: int, data: bytes) -> None:
        """No honest replica signs two different messages for one (type, view, seqNo)."""
        if index in self.byzantine:
            return
        body = WireMessage.decode(data).signed.body
        key = (index, body.TYPE, getattr(body, "view", 0), getattr(body, "seq_no", -1))
        encoded = WireMessage.decode(data).signed.encode()
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
        node.replica = None
        node.epoch += 1
        node.timers.clear()
        node.jobs.clear()
        node.busy = False

    def wipe(self, index: int) -> None:
        """The operator rebuilt this validator's consensus store (its chain and its validator
        state file stay): it restarts with no records of what it signed."""
        self.crash(index)
        self.nodes[index].store = MemoryConsensusStore()
        self.restart(index)

    def restart(self, index: int) -> None:
        """Start (or restart) a node from its persisted store, chain and pool journal."""
        node = self.nodes[index]
        node.epoch += 1
        node.timers.clear()
        node.jobs.clear()
        node.busy = False
        node.replica = Replica.restore(self.params, index, node.signer, self.verifier,
                                       node.chain.head, node.store, block_digest=block_digest,
                                       signing_bound=node.signing_bound)
        node.last_view = max(node.last_view, node.replica.view)
        self.perform(node, node.replica.start())
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
