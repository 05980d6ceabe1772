"""The simulator's chain and pool model: accounts with nonces, a base fee, one pool per node.

It is as strict as the real chain where the request timer can be fooled: a block is valid only
if its transactions apply in order (each nonce the sender's next, each fee cap covering the
block's base fee, the gas within the limit), and a pool holds transactions no primary could
include (nonce gaps, fee caps below the base fee), replaces them, evicts them. The pool hands
out executable transactions each sender's in nonce order, across senders in `POOL_ORDER`: the
way `chain.txpool.TxPool.executable` does today (arrival order, the arrival that closes a gap
making the run behind it ready), or in the order they became ready.

Blocks carry transaction hashes; the bodies are looked up in one registry shared by every node
(content-addressed, so this is what carrying the bodies would give, without the bytes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

import rlp
from eth_hash.auto import keccak

from pbft_engine.core import ChainHead

GENESIS_HASH = keccak(b"genesis")
GENESIS_ROOT = keccak(b"genesis state")
PRICE_BUMP_PERCENT = 10  # a replacement must raise the fee cap this much (geth's rule)
OPAQUE_FEE_CAP = 2**62  # transactions given only as a hash (unit tests) always pay
BASE_FEE_CHANGE_DENOMINATOR = 8  # EIP-1559: at most 1/8 up or down per block
# The order in which a pool hands out executable transactions (`Pool.executable`):
#
# "arrival"  chain/txpool.py today (geth's walk): by arrival, the arrival that closes a nonce
#            gap making the run behind it ready; a fee bump is a new arrival. This is not the
#            order in which the engine learnt they were ready (its "oldest waiting request"):
#            a bump moves its sender's run to the back, and when a late gap-closer commits,
#            the run behind it jumps back to its own arrivals, ahead of requests older to
#            the engine. Under a backlog of more than MAX_PASSED_OVER blocks the replicas take
#            the honest primary for a censor.
# "ready"    in the order they became ready, as reported to the engine (a bump takes the place
#            of the transaction it replaces): the primary serves the replicas' oldest first.
POOL_ORDER = "arrival"


@dataclass(frozen=True)
class Tx:
    """A transaction: what the pool and the chain need of it. `label` names an opaque one."""

    sender: bytes
    nonce: int
    fee_cap: int
    gas: int = 1
    salt: int = 0
    label: bytes = b""

    @cached_property
    def hash(self) -> bytes:
        if self.label:
            return self.label
        return keccak(rlp.encode([self.sender, self.nonce, self.fee_cap, self.gas, self.salt]))

    @classmethod
    def opaque(cls, tx_hash: bytes) -> Tx:
        """A transaction known only by its hash: its own sender, nonce 0, always executable."""
        return cls(keccak(b"opaque sender" + tx_hash)[:20], 0, OPAQUE_FEE_CAP, label=tx_hash)


def make_block(seq_no: int, parent_hash: bytes, tx_hashes: tuple[bytes, ...], salt: bytes) -> bytes:
    """A header (number, parent, transactions root, salt) and its body, the transactions. The
    digest is the header's hash, as a real block's is: a false body can sit under a true
    header, and only execution (`valid`) finds it."""
    header = [seq_no, parent_hash, _transactions_root(tx_hashes), salt]
    return rlp.encode([header, list(tx_hashes)])


def with_body(block: bytes, tx_hashes: tuple[bytes, ...]) -> bytes:
    """The same header over another body: a lying peer's copy that hashes to the digest."""
    return rlp.encode([rlp.decode(block)[0], list(tx_hashes)])


def _transactions_root(tx_hashes: Iterable[bytes]) -> bytes:
    return keccak(rlp.encode(list(tx_hashes)))


def block_digest(block: bytes) -> bytes | None:
    """The digest a block claims: its header's hash (None for bytes that are no block)."""
    try:
        header = rlp.decode(block)[0]
    except (rlp.exceptions.RLPException, IndexError, TypeError):
        return None
    return keccak(rlp.encode(header)) if isinstance(header, list) else None


def block_txs(block: bytes) -> tuple[bytes, ...]:
    return tuple(rlp.decode(block)[1])


def decode_block(block: bytes) -> tuple[int, bytes, tuple[bytes, ...]] | None:
    """(number, parent hash, tx hashes), or None for bytes that are no block or whose body is
    not the one its header commits to."""
    try:
        (number, parent, root, _), txs = rlp.decode(block)
        if not isinstance(txs, list) or not all(isinstance(tx, bytes) for tx in txs):
            return None
        if root != _transactions_root(txs):
            return None
        return int.from_bytes(number, "big"), parent, tuple(txs)
    except (rlp.exceptions.RLPException, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class FeeMarket:
    """The base fee: EIP-1559's rule, clamped to [floor, ceiling], a function of the chain only
    (every replica computes the same). floor == ceiling gives a constant base fee."""

    initial: int = 0
    floor: int = 0
    ceiling: int = 0
    gas_limit: int = 1_000_000

    def next_base_fee(self, base_fee: int, gas_used: int) -> int:
        target = max(1, self.gas_limit // 2)
        delta = base_fee * (gas_used - target) // (target * BASE_FEE_CHANGE_DENOMINATOR)
        if gas_used > target:
            delta = max(delta, 1)  # a full block always raises it (as EIP-1559)
        return min(self.ceiling, max(self.floor, base_fee + delta))


@dataclass
class ChainBlock:
    block_hash: bytes
    block: bytes
    state_root: bytes
    certificate: bytes
    base_fee: int
    gas_used: int


@dataclass
class SimChain:
    """The chain a node imports blocks into (survives crashes, like the node's chain DB)."""

    market: FeeMarket
    registry: dict[bytes, Tx]
    blocks: list[ChainBlock] = field(default_factory=list)
    tx_hashes: set[bytes] = field(default_factory=set)
    nonces: dict[bytes, int] = field(default_factory=dict)  # account nonces at the head

    @property
    def head(self) -> ChainHead:
        return ChainHead(len(self.blocks), self.blocks[-1].block_hash if self.blocks
                         else GENESIS_HASH, self.state_root)

    @property
    def state_root(self) -> bytes:
        return self.blocks[-1].state_root if self.blocks else GENESIS_ROOT

    @property
    def base_fee(self) -> int:
        """The base fee of the next block."""
        if not self.blocks:
            return self.market.initial
        last = self.blocks[-1]
        return self.market.next_base_fee(last.base_fee, last.gas_used)

    def nonce(self, sender: bytes) -> int:
        return self.nonces.get(sender, 0)

    def tip(self) -> Tip:
        return Tip(self, self.head, self.state_root, self.base_fee)

    def extended(self, ancestors: Iterable[bytes]) -> Tip | None:
        """The head extended by uncommitted blocks (oldest first, those committed meanwhile
        skipped), as a block built or validated on them sees it; None if one is invalid."""
        tip: Tip | None = self.tip()
        for block in ancestors:
            decoded = decode_block(block)
            if tip is None or decoded is None:
                return None
            number = decoded[0]
            if number <= len(self.blocks):
                if self.blocks[number - 1].block != block:
                    return None
                continue
            tip = tip.extend(block)
        return tip

    def executes(self, txs: Iterable[bytes]) -> int | None:
        return self.tip().executes(txs)

    def valid(self, seq_no: int, digest: bytes, block: bytes) -> bool:
        return self.tip().valid(seq_no, digest, block)

    def append(self, block: bytes, certificate: bytes) -> ChainBlock:
        txs = block_txs(block)
        gas_used = self.executes(txs)
        assert gas_used is not None, "append() after valid()"
        block_hash = block_digest(block)
        assert block_hash is not None
        entry = ChainBlock(block_hash, block, keccak(self.state_root + block_hash), certificate,
                           self.base_fee, gas_used)
        self.blocks.append(entry)
        self.tx_hashes.update(txs)
        for tx_hash in txs:
            sender = self.registry[tx_hash].sender
            self.nonces[sender] = self.nonce(sender) + 1
        return entry


@dataclass
class Tip:
    """The chain as a block on top of `head` sees it: the head's state, or the state after
    uncommitted blocks (a pipeline's ancestors, executed but not committed)."""

    chain: SimChain
    head: ChainHead
    state_root: bytes
    base_fee: int  # of the block after head
    nonces: dict[bytes, int] = field(default_factory=dict)  # changed since the chain's head

    @property
    def market(self) -> FeeMarket:
        return self.chain.market

    def nonce(self, sender: bytes) -> int:
        return self.nonces.get(sender, self.chain.nonce(sender))

    def executes(self, txs: Iterable[bytes]) -> int | None:
        """The gas the transactions use when applied in order here, None if invalid."""
        gas = 0
        nonces: dict[bytes, int] = {}
        seen: set[bytes] = set()
        for tx_hash in txs:
            tx = self.chain.registry.get(tx_hash)
            if tx is None or tx_hash in seen:
                return None
            seen.add(tx_hash)
            expected = nonces.get(tx.sender, self.nonce(tx.sender))
            gas += tx.gas
            if tx.nonce != expected or tx.fee_cap < self.base_fee or gas > self.market.gas_limit:
                return None
            nonces[tx.sender] = expected + 1
        return gas

    def valid(self, seq_no: int, digest: bytes, block: bytes) -> bool:
        if block_digest(block) != digest:  # a block travels unsigned: it must hash to the digest
            return False
        decoded = decode_block(block)
        if decoded is None:
            return False
        number, parent, txs = decoded
        return (number == seq_no == self.head.seq_no + 1 and parent == self.head.block_hash
                and self.executes(txs) is not None)

    def extend(self, block: bytes) -> Tip | None:
        """This tip with `block` executed on it, None if it is invalid here."""
        digest = block_digest(block)
        if digest is None or not self.valid(self.head.seq_no + 1, digest, block):
            return None
        txs = block_txs(block)
        gas_used = self.executes(txs)
        assert gas_used is not None
        nonces = dict(self.nonces)
        for tx_hash in txs:
            sender = self.chain.registry[tx_hash].sender
            nonces[sender] = nonces.get(sender, self.chain.nonce(sender)) + 1
        return Tip(self.chain, ChainHead(self.head.seq_no + 1, digest),
                   keccak(self.state_root + digest),
                   self.market.next_base_fee(self.base_fee, gas_used), nonces)


@dataclass
class PoolEntry:
    tx: Tx
    arrival: int


@dataclass
class Pool:
    """One node's pending transactions, by sender and nonce (survives crashes: a journal)."""

    by_hash: dict[bytes, PoolEntry] = field(default_factory=dict)
    senders: dict[bytes, dict[int, PoolEntry]] = field(default_factory=dict)
    arrivals: int = 0
    order: str = field(default_factory=lambda: POOL_ORDER)
    ready_since: dict[bytes, int] = field(default_factory=dict)  # "ready" order: the sequence
    readies: int = 0

    def __contains__(self, tx_hash: bytes) -> bool:
        return tx_hash in self.by_hash

    def add(self, tx: Tx, chain: SimChain) -> bool:
        """Admit `tx` as geth would (known, nonce too low and underpriced replacements are
        refused); a replaced transaction leaves the pool. True if admitted."""
        if tx.hash in self.by_hash or tx.nonce < chain.nonce(tx.sender):
            return False
        queue = self.senders.setdefault(tx.sender, {})
        replaced = queue.get(tx.nonce)
        if replaced is not None:
            if tx.fee_cap < replaced.tx.fee_cap * (100 + PRICE_BUMP_PERCENT) // 100:
                return False
            place = self.ready_since.get(replaced.tx.hash)
            self.remove(replaced.tx.hash)
            if place is not None:
                self.ready_since[tx.hash] = place  # "ready" order: the bump keeps the place
            queue = self.senders.setdefault(tx.sender, {})
        self.arrivals += 1
        # chain/txpool.py: a bump also keeps its place in arrival order
        entry = PoolEntry(tx, replaced.arrival if replaced is not None else self.arrivals)
        self.by_hash[tx.hash] = entry
        queue[tx.nonce] = entry
        return True

    def remove(self, tx_hash: bytes) -> Tx | None:
        entry = self.by_hash.pop(tx_hash, None)
        self.ready_since.pop(tx_hash, None)
        if entry is None:
            return None
        queue = self.senders[entry.tx.sender]
        del queue[entry.tx.nonce]
        if not queue:
            del self.senders[entry.tx.sender]
        return entry.tx

    def prune(self, chain: SimChain) -> None:
        """Drop what the head made invalid: nonces already used (committed or replaced)."""
        for sender in list(self.senders):
            head_nonce = chain.nonce(sender)
            for nonce in [n for n in self.senders.get(sender, {}) if n < head_nonce]:
                self.remove(self.senders[sender][nonce].tx.hash)

    def ready_run(self, sender: bytes, chain: SimChain | Tip) -> list[tuple[int, Tx]]:
        """The sender's executable run at the head, each with its key in the pool's order
        (`POOL_ORDER`): the latest arrival up to it, or when it became ready."""
        queue = self.senders.get(sender, {})
        nonce, latest = chain.nonce(sender), 0
        base_fee, gas_limit = chain.base_fee, chain.market.gas_limit
        run: list[tuple[int, Tx]] = []
        while nonce in queue:
            entry = queue[nonce]
            if entry.tx.fee_cap < base_fee or entry.tx.gas > gas_limit:
                break  # this one waits for the base fee to fall; the later nonces with it
            latest = max(latest, entry.arrival)
            run.append((latest, entry.tx))
            nonce += 1
        if self.order == "ready":
            run = [(self._ready_key(tx), tx) for _, tx in run]
            still = {tx.hash for _, tx in run}
            for entry in queue.values():
                if entry.tx.hash not in still:
                    self.ready_since.pop(entry.tx.hash, None)  # ready again: a new place
        return run

    def _ready_key(self, tx: Tx) -> int:
        if tx.hash not in self.ready_since:
            self.readies += 1
            self.ready_since[tx.hash] = self.readies
        return self.ready_since[tx.hash]

    def executable(self, chain: SimChain | Tip, senders: Iterable[bytes] | None = None
                   ) -> list[tuple[int, Tx]]:
        """Executable transactions in the order a primary takes them: (ready key, nonce)."""
        ready = [item for sender in (self.senders if senders is None else senders)
                 for item in self.ready_run(sender, chain)]
        return sorted(ready, key=lambda item: (item[0], item[1].nonce))

    def select(self, chain: SimChain | Tip, max_count: int | None, skip: bytes | None = None
               ) -> tuple[Tx, ...]:
        """A block's transactions: executable ones in order, within the gas limit (a sender
        whose next transaction does not fit waits, the others go on, as geth's walk) and at
        most max_count; `skip` is a sender a censoring primary leaves out."""
        batch: list[Tx] = []
        blocked: set[bytes] = {skip} if skip is not None else set()
        next_nonce: dict[bytes, int] = {}
        gas = 0
        for _, tx in self.executable(chain):
            if max_count is not None and len(batch) >= max_count:
                break
            expected = next_nonce.get(tx.sender, chain.nonce(tx.sender))
            if tx.sender in blocked or tx.nonce != expected:
                blocked.add(tx.sender)  # never a nonce before its predecessor
                continue
            if gas + tx.gas > chain.market.gas_limit:
                blocked.add(tx.sender)
                continue
            batch.append(tx)
            next_nonce[tx.sender] = tx.nonce + 1
            gas += tx.gas
        return tuple(batch)
