"""A deterministic cluster of real PBFT cores over a simulated network, clock and chain.

Everything random comes from one `random.Random(seed)`; time is a simulated millisecond
counter; events run in (time, sequence) order. Each node has a toy chain (the adapter's side:
build, validate, import, fetch), an in-memory consensus store that survives crashes, and the
real `Replica`. The cluster records what honest replicas sign and commit so the safety
properties can be checked after (and during) a run.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import rlp
from eth_hash.auto import keccak

from pbft_engine.core import (
    Alarm,
    BlockBuilt,
    BlockCommitted,
    BlockValidated,
    Broadcast,
    BuildBlock,
    CancelTimer,
    ChainHead,
    CommitBlock,
    EngineParams,
    Event,
    FetchCommitted,
    FetchCompleted,
    FetchFailed,
    MessageReceived,
    Persist,
    Replica,
    RequestReceived,
    SendTo,
    SetTimer,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.messages import (
    KeySigner,
    KeyVerifier,
    Verifier,
    WireMessage,
    verify_commit_certificate,
)
from pbft_engine.store import MemoryConsensusStore

CHAIN_ID = 1337
GENESIS_HASH = keccak(b"genesis")
GENESIS_ROOT = keccak(b"genesis state")
MAX_TXS_PER_BLOCK = 8


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


def make_block(seq_no: int, parent_hash: bytes, tx_hashes: tuple[bytes, ...], salt: bytes) -> bytes:
    return rlp.encode([seq_no, parent_hash, list(tx_hashes), salt])


def block_txs(block: bytes) -> tuple[bytes, ...]:
    return tuple(rlp.decode(block)[2])


@dataclass
class ChainBlock:
    block_hash: bytes
    block: bytes
    state_root: bytes
    certificate: bytes


@dataclass
class SimChain:
    """The chain a node imports blocks into (survives crashes, like the node's chain DB)."""

    blocks: list[ChainBlock] = field(default_factory=list)
    tx_hashes: set[bytes] = field(default_factory=set)

    @property
    def head(self) -> ChainHead:
        return ChainHead(len(self.blocks), self.blocks[-1].block_hash if self.blocks
                         else GENESIS_HASH)

    @property
    def state_root(self) -> bytes:
        return self.blocks[-1].state_root if self.blocks else GENESIS_ROOT

    def valid(self, seq_no: int, digest: bytes, block: bytes) -> bool:
        if keccak(block) != digest:  # a block travels unsigned: it must hash to the digest
            return False
        try:
            number, parent, txs, _ = rlp.decode(block)
            number = int.from_bytes(number, "big")
        except (rlp.exceptions.RLPException, ValueError, TypeError):
            return False
        head = self.head
        return (
            number == seq_no == head.seq_no + 1
            and parent == head.block_hash
            and not any(tx in self.tx_hashes for tx in txs)
            and len(set(txs)) == len(txs)
        )

    def append(self, block: bytes, certificate: bytes) -> ChainBlock:
        block_hash = keccak(block)
        entry = ChainBlock(block_hash, block, keccak(self.state_root + block_hash), certificate)
        self.blocks.append(entry)
        self.tx_hashes.update(block_txs(block))
        return entry


@dataclass
class Node:
    index: int
    signer: KeySigner
    store: MemoryConsensusStore = field(default_factory=MemoryConsensusStore)
    chain: SimChain = field(default_factory=SimChain)
    pool: dict[bytes, None] = field(default_factory=dict)  # ordered set of known tx hashes
    replica: Replica | None = None
    epoch: int = 0  # bumped on crash: events scheduled for an older epoch are void
    timers: dict[tuple[TimerKind, bytes], int] = field(default_factory=dict)
    alarms: list[Alarm] = field(default_factory=list)

    @property
    def up(self) -> bool:
        return self.replica is not None


@dataclass(frozen=True)
class NetworkFaults:
    min_delay_ms: int = 2
    max_delay_ms: int = 20
    drop: float = 0.0
    duplicate: float = 0.0


MessageFilter = Callable[[int, int, WireMessage], bool]  # (src, dst, message) -> deliver?


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
        )
        self.verifier = CachingVerifier()
        self.nodes = [Node(i, s) for i, s in enumerate(signers)]
        self.now = 0
        self._queue: list[tuple[int, int, int, int, Any]] = []
        self._sequence = 0
        self.partition: list[set[int]] | None = None
        self.filters: list[MessageFilter] = []
        self.outgoing: dict[int, Callable[[int, bytes], list[tuple[int, bytes]]]] = {}
        self.byzantine: set[int] = set()
        self.signed_by: dict[tuple[int, int, int, int], bytes] = {}
        self.delivered: list[bytes] = []  # every message delivered (replay material)
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
            item = TimerFired(kind, key)
        self.feed(index, item)

    def feed(self, index: int, event: Event) -> None:
        node = self.nodes[index]
        assert node.replica is not None
        if isinstance(event, MessageReceived):
            self.delivered.append(event.data)
        self.perform(node, node.replica.step(event))

    # --- the adapter side ---------------------------------------------------------------

    def perform(self, node: Node, actions: list[Any]) -> None:
        persisted = False
        for action in actions:
            if isinstance(action, Persist):
                assert not persisted, "one Persist per step"
                node.store.apply(action.ops)
                persisted = True
            elif isinstance(action, Broadcast):
                self._send(node, None, action.data)
            elif isinstance(action, SendTo):
                self._send(node, action.replica, action.data)
            elif isinstance(action, SetTimer):
                node.timers[(action.kind, action.key)] = self.now + action.duration_ms
                self._schedule(action.duration_ms, node, (action.kind, action.key))
            elif isinstance(action, CancelTimer):
                node.timers.pop((action.kind, action.key), None)
            elif isinstance(action, Alarm):
                node.alarms.append(action)
            else:
                self._block_action(node, action)

    def _block_action(self, node: Node, action: Any) -> None:
        chain = node.chain
        if isinstance(action, BuildBlock):
            self._schedule(1, node, self._build(node, action))
        elif isinstance(action, ValidateBlock):
            ok = chain.valid(action.seq_no, action.digest, action.block)
            self._schedule(1, node, BlockValidated(action.seq_no, action.digest, ok))
        elif isinstance(action, CommitBlock):
            self._commit(node, action)
        elif isinstance(action, FetchCommitted):
            self._schedule(5, node, self._fetch(node, action.target_seq_no))
        else:
            raise AssertionError(f"unknown action {action!r}")

    def _build(self, node: Node, action: BuildBlock) -> BlockBuilt:
        txs = tuple(tx for tx in node.pool if tx not in node.chain.tx_hashes)
        txs = txs[:MAX_TXS_PER_BLOCK]
        block = make_block(action.seq_no, action.parent_hash, txs, b"")
        return BlockBuilt(action.seq_no, keccak(block), block, txs)

    def _commit(self, node: Node, action: CommitBlock) -> None:
        chain = node.chain
        if not chain.valid(action.seq_no, action.digest, action.block):
            raise SafetyViolation(f"replica {node.index} committed an invalid block "
                                  f"{action.seq_no}")
        verify_commit_certificate(
            action.certificate, validators=self.params.validators, chain_id=CHAIN_ID,
            block_number=action.seq_no, block_hash=action.digest, verifier=self.verifier)
        entry = chain.append(action.block, action.certificate)
        self._check_agreement(node, action.seq_no)
        self._schedule(1, node, BlockCommitted(action.seq_no, entry.block_hash,
                                               entry.state_root, block_txs(action.block)))

    def _fetch(self, node: Node, target: int) -> FetchCompleted | FetchFailed:
        """Catch-up from any peer that has the target: every certificate is verified."""
        sources = [p for p in self.nodes if p is not node and p.index not in self.byzantine
                   and len(p.chain.blocks) >= target]
        if not sources or target <= len(node.chain.blocks):
            return FetchFailed(target)
        source = sources[self.rng.randrange(len(sources))]
        txs: list[bytes] = []
        for seq_no in range(len(node.chain.blocks) + 1, target + 1):
            entry = source.chain.blocks[seq_no - 1]
            verify_commit_certificate(
                entry.certificate, validators=self.params.validators, chain_id=CHAIN_ID,
                block_number=seq_no, block_hash=entry.block_hash, verifier=self.verifier)
            assert node.chain.valid(seq_no, entry.block_hash, entry.block)
            node.chain.append(entry.block, entry.certificate)
            self._check_agreement(node, seq_no)
            txs.extend(block_txs(entry.block))
        head = node.chain.blocks[-1]
        return FetchCompleted(target, head.block_hash, head.state_root, tuple(txs))

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
            delay = self.rng.randint(self.faults.min_delay_ms, self.faults.max_delay_ms)
            self._schedule(delay, self.nodes[dst], MessageReceived(data))

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

    def submit(self, tx_hash: bytes, to: int | None = None) -> None:
        """A client sends a transaction to one node, which gossips it to all validators."""
        entry = self.rng.randrange(len(self.nodes)) if to is None else to
        self._gossip(entry, tx_hash)
        for dst in range(len(self.nodes)):
            reached = dst != entry and self._connected(entry, dst)
            if reached and self.rng.random() >= self.faults.drop:
                self._gossip(dst, tx_hash)

    def _gossip(self, index: int, tx_hash: bytes) -> None:
        node = self.nodes[index]
        node.pool[tx_hash] = None
        if node.up:
            self.feed(index, RequestReceived(tx_hash))

    def crash(self, index: int) -> None:
        node = self.nodes[index]
        node.replica = None
        node.epoch += 1
        node.timers.clear()

    def restart(self, index: int) -> None:
        """Start (or restart) a node from its persisted store and chain."""
        node = self.nodes[index]
        node.epoch += 1
        node.timers.clear()
        node.replica = Replica.restore(self.params, index, node.signer, self.verifier,
                                       node.chain.head, node.store)
        self.perform(node, node.replica.start())
        for tx_hash in list(node.pool):
            if tx_hash not in node.chain.tx_hashes:
                self.feed(index, RequestReceived(tx_hash))

    # --- observations -------------------------------------------------------------------

    def honest(self) -> list[Node]:
        return [node for node in self.nodes if node.index not in self.byzantine]

    def committed(self, tx_hash: bytes) -> int:
        """How many honest nodes have the transaction in their chain."""
        return sum(tx_hash in node.chain.tx_hashes for node in self.honest())

    def heights(self) -> list[int]:
        return [len(node.chain.blocks) for node in self.nodes]

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
