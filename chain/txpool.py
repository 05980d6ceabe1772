"""The transaction pool: geth's admission rules and messages, bounded in count and bytes.

Executable transactions (contiguous nonces from the sender's account nonce) are handed out in
arrival order, each sender's in nonce order; transactions with future nonces are held until
the gap closes. Fairness over price, because this is a permissioned chain.

The pool also keeps which transactions are ready (executable at the head: in the sender's
run, fee cap at least the next base fee) and reports what became ready and what stopped
being ready (`ready_changes`), so the consensus engine times only what a primary could
include.

Admission is economic (issue 29): a fee cap under the floor (the next base fee, or
`price_limit` if higher) is refused, a sender must afford its transactions and, for a
transaction behind a nonce gap, the cheapest transactions that could fill the gap; what waits
behind a gap (queued) is bounded per sender and in all, gives way to what can execute when
the pool is full, and expires when its sender has shown no activity for `lifetime`.
"""

from __future__ import annotations

import itertools
import logging
import time
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import rlp
from eth.abc import SignedTransactionAPI, TransactionBuilderAPI
from eth.exceptions import UnrecognizedTransactionType
from eth_keys.exceptions import BadSignature
from eth_utils import ValidationError

from chain.errors import TxPoolError
from encoding import EncodingError
from encoding.rlp import check_rlp_bounds

log = logging.getLogger(__name__)

PRICE_BUMP_PERCENT = 10
MAX_TRANSACTION_DEPTH = 8  # an access list or authorization list nests three levels
# RLP items in a transaction, checked before pyrlp decodes it (its time grows with the square
# of a list's length: 131,000 one-byte items in 128 KiB take 0.25 s). A 128 KiB transaction
# holds at most ~4,000 storage keys or ~5,700 access-list addresses, ~17,000 items in all.
MAX_TRANSACTION_ITEMS = 32_768
MAX_TRANSACTION_LIST_ITEMS = 8_192
# The cheapest transaction that could fill a nonce gap: a sender must afford one per gap.
GAP_FILLER_GAS = 21_000
DROP_REASONS = ("expired", "evicted")  # why the pool dropped a queued transaction


@dataclass(frozen=True)
class PoolLimits:
    max_transactions: int = 20_000
    max_bytes: int = 64 * 1024 * 1024
    max_transaction_size: int = 128 * 1024  # geth's txMaxSize
    max_per_sender: int = 1_024
    # gapped transactions per sender: Besu's refusal bound (geth's AccountQueue, 64, is where
    # geth silently drops what it accepted)
    max_queued_per_sender: int = 200
    max_queued: int = 4_000  # gapped transactions in all (geth: GlobalQueue, 1/5 of slots)
    price_limit: int = 1  # wei: the lowest fee cap admitted (geth's --txpool.pricelimit)
    lifetime: float = 3 * 3600.0  # seconds a sender's queued transactions wait (geth's)


class AccountReader(ABC):
    """Account state at the chain head, as the pool needs it."""

    @abstractmethod
    def nonce(self, address: bytes) -> int: ...

    @abstractmethod
    def balance(self, address: bytes) -> int: ...


@dataclass(frozen=True)
class ReadyChanges:
    """Transactions that became ready, and ready ones that stopped being ready other than by
    being committed (replaced, evicted, pruned, priced out by the base fee)."""

    ready: tuple[bytes, ...] = ()
    unready: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class FeeBounds:
    """The fee caps a sender's ready run depends on: the lowest one in the run, and the one
    that stopped it (the next nonce's, under the base fee), if a fee cap stopped it."""

    lowest: int | None
    stopped_by: int | None

    def moved_by(self, base_fee: int) -> bool:
        """Whether the run at `base_fee` differs: shorter, or longer."""
        return ((self.lowest is not None and self.lowest < base_fee)
                or (self.stopped_by is not None and self.stopped_by >= base_fee))


@dataclass
class PoolEntry:
    tx: SignedTransactionAPI
    sender: bytes
    size: int
    arrival: int
    gossiped: bool = False  # accepted by another validator first (see `_check_queue`)

    @property
    def cost(self) -> int:
        return self.tx.gas * self.tx.max_fee_per_gas + self.tx.value


def decode_raw_transaction(
    builder: type[TransactionBuilderAPI], raw: bytes, max_size: int
) -> SignedTransactionAPI:
    """A client's or a peer's transaction, bounded in bytes and RLP items before decoding."""
    if len(raw) > max_size:
        raise TxPoolError(f"oversized data: {len(raw)} bytes, at most {max_size}")
    try:
        check_rlp_bounds(raw[1:] if raw[:1] < b"\x80" else raw, max_depth=MAX_TRANSACTION_DEPTH,
                         max_items=MAX_TRANSACTION_ITEMS,
                         max_list_items=MAX_TRANSACTION_LIST_ITEMS)
        return builder.decode(raw)
    except EncodingError as exc:
        raise TxPoolError(f"invalid raw transaction: {exc}") from None
    except UnrecognizedTransactionType:
        raise TxPoolError("transaction type not supported") from None
    except (rlp.DecodingError, rlp.DeserializationError, ValidationError, ValueError,
            TypeError) as exc:  # (TypeError: pyrlp on a list where a field wants bytes)
        raise TxPoolError(f"invalid raw transaction: {exc}") from None


def recover_sender(tx: SignedTransactionAPI) -> bytes:
    """The sender's address (kept by the transaction object), or TxPoolError."""
    # One recovery: py-evm's check_signature_validity recovers the key and then verifies
    # the signature against that same key, which cannot fail (both normalise s).
    try:
        return tx.sender
    except (BadSignature, ValidationError):
        raise TxPoolError("invalid sender") from None


@dataclass(frozen=True)
class Candidate:
    """A decoded transaction with its sender, as a client or another validator sent it."""

    tx: SignedTransactionAPI
    sender: bytes
    size: int
    gossiped: bool = False  # a validator accepted it first (an observer's forward is a client's)


class GossipBacklog:
    """Candidate transactions waiting for admission, in arrival order and by sender, bounded
    in count and bytes, and per sender like the pool. Indexed by sender so that a
    transaction's predecessors waiting here are admitted before it (`take_before`): a gap
    this node already holds the filling of is no gap."""

    def __init__(self, limits: PoolLimits) -> None:
        self._limits = limits
        self._arrivals: OrderedDict[bytes, Candidate] = OrderedDict()  # hash -> item
        self._by_sender: dict[bytes, dict[bytes, Candidate]] = {}  # sender -> hash -> item
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._arrivals)

    def __contains__(self, tx_hash: bytes) -> bool:
        return tx_hash in self._arrivals

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def push(self, item: Candidate) -> bool:
        """Keep `item` (not here yet) unless a bound is reached (False: dropped)."""
        tx_hash = item.tx.hash
        mine = self._by_sender.get(item.sender, {})
        if (tx_hash in self._arrivals or len(self._arrivals) >= self._limits.max_transactions
                or self._bytes + item.size > self._limits.max_bytes
                or len(mine) >= self._limits.max_per_sender):
            return False
        self._arrivals[tx_hash] = item
        self._by_sender.setdefault(item.sender, mine)[tx_hash] = item
        self._bytes += item.size
        return True

    def pop(self) -> Candidate:
        """The lowest nonce of the sender of the oldest item (IndexError if there is none):
        admitting it takes no predecessor along, so each pop is one admission."""
        if not self._arrivals:
            raise IndexError("the gossip backlog is empty")
        oldest = next(iter(self._arrivals.values()))
        item = min(self._by_sender[oldest.sender].values(), key=lambda i: i.tx.nonce)
        self._forget(item)
        return item

    def discard(self, tx_hash: bytes) -> None:
        item = self._arrivals.get(tx_hash)
        if item is not None:
            self._forget(item)

    def take_before(self, sender: bytes, nonce: int, limit: int) -> list[Candidate]:
        """Remove and return `sender`'s lowest `limit` items with nonces below `nonce`, in
        nonce order."""
        mine = self._by_sender.get(sender)
        if not mine:
            return []
        earlier = sorted((i for i in mine.values() if i.tx.nonce < nonce),
                         key=lambda i: i.tx.nonce)[:limit]
        for item in earlier:
            self._forget(item)
        return earlier

    def _forget(self, item: Candidate) -> None:
        tx_hash = item.tx.hash
        del self._arrivals[tx_hash]
        mine = self._by_sender[item.sender]
        del mine[tx_hash]
        if not mine:
            del self._by_sender[item.sender]
        self._bytes -= item.size


class TxPool:
    """Pending transactions of one node."""

    def __init__(
        self,
        chain_id: int,
        accounts: AccountReader,
        block_gas_limit: int,
        limits: PoolLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.chain_id = chain_id
        self.accounts = accounts
        self.block_gas_limit = block_gas_limit
        self.limits = limits or PoolLimits()
        self._by_hash: dict[bytes, PoolEntry] = {}
        self._senders: dict[bytes, dict[int, PoolEntry]] = {}  # sender -> nonce -> entry
        # sender -> account nonce at the head, read when the sender's transaction was admitted
        # or its block committed (a state read costs ~0.1 ms of trie decoding); forgotten with
        # the sender's last transaction and whenever one of its transactions is removed.
        self._head_nonces: dict[bytes, int] = {}
        self._bytes = 0
        self._arrivals = itertools.count()
        self._ready: dict[bytes, tuple[bytes, ...]] = {}  # sender -> its ready run's hashes
        # sender -> the fee caps its ready run depends on (FeeBounds), for the senders whose
        # run a change of the base fee could lengthen or shorten
        self._fee_bounds: dict[bytes, FeeBounds] = {}
        self._base_fee: int | None = None  # the base fee of the last ready_changes
        # senders whose ready run may have changed, in the order they were touched
        self._touched: dict[bytes, None] = {}
        self._committed: set[bytes] = set()  # removed as committed: not reported unready
        self._out_of_order = False  # a replacement was inserted out of arrival order
        self._clock = clock
        # sender -> when it last showed activity (a transaction admitted, its nonce moved),
        # in that order: its queued transactions expire `lifetime` after it, and the least
        # recently active sender's give way first when room is needed (geth's heartbeats)
        self._heartbeats: OrderedDict[bytes, float] = OrderedDict()
        self._gapped: dict[bytes, int] = {}  # sender -> its transactions behind a nonce gap
        self._gapped_stale: set[bytes] = set()  # senders whose count must be taken again
        self.dropped: Counter[str] = Counter()  # queued transactions dropped, by reason

    def __len__(self) -> int:
        return len(self._by_hash)

    def __contains__(self, tx_hash: bytes) -> bool:
        return tx_hash in self._by_hash

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, tx_hash: bytes) -> PoolEntry | None:
        return self._by_hash.get(tx_hash)

    def entries(self) -> Iterable[PoolEntry]:
        return self._by_hash.values()

    def add(self, tx: SignedTransactionAPI, size: int, *, base_fee: int = 0,
            gossiped: bool = False) -> PoolEntry:
        """Admit `tx` (already decoded; `size` its encoded length) or raise TxPoolError;
        `base_fee` is the next block's, the fee floor unless `price_limit` is higher;
        `gossiped`: another validator accepted it first."""
        if tx.hash in self._by_hash:
            raise TxPoolError("already known")
        if size > self.limits.max_transaction_size:
            raise TxPoolError("oversized data")
        self.check_static(tx)
        self._check_fee_floor(tx, base_fee)
        sender = recover_sender(tx)
        account_nonce = self.accounts.nonce(sender)
        if tx.nonce < account_nonce:
            raise TxPoolError("nonce too low")
        queue = self._senders.get(sender)
        replaced = queue.get(tx.nonce) if queue else None
        gapped = replaced is None and tx.nonce > self._next_nonce(account_nonce, queue)
        if replaced is not None:
            self._check_replacement(replaced.tx, tx)
        elif gapped and not gossiped:
            self._check_queue(account_nonce, queue)
        # a replacement keeps its origin: a fee bump sent elsewhere launders nothing
        origin = replaced.gossiped if replaced is not None else gossiped
        entry = PoolEntry(tx, sender, size, next(self._arrivals), origin)
        self._check_funds(entry, account_nonce, queue, max(base_fee, self.limits.price_limit))
        self._check_capacity(entry, replaced, queue, gapped=gapped)
        if replaced is not None:
            self._drop(replaced)
            # A fee bump keeps its place in line, so the sender's later nonces, waiting behind
            # it, are not sent to the back of the pool (the engine counts their age).
            entry.arrival = replaced.arrival
            self._out_of_order = True
        self._insert(entry)
        self._head_nonces[sender] = account_nonce
        self._beat(sender)
        return entry

    def _check_fee_floor(self, tx: SignedTransactionAPI, base_fee: int) -> None:
        floor = max(base_fee, self.limits.price_limit)
        if tx.max_fee_per_gas < floor:
            raise TxPoolError(
                f"transaction underpriced: max fee per gas {tx.max_fee_per_gas} is below the "
                f"pool's floor of {floor} wei (the next block's base fee, or txpool.pricelimit)"
                "; raise maxFeePerGas")

    @staticmethod
    def _next_nonce(account_nonce: int, queue: dict[int, PoolEntry] | None) -> int:
        """The nonce after the sender's run of pending transactions: the gap for future
        nonces is counted from there, as geth does, so a long queue is not refused."""
        nonce = account_nonce
        while queue and nonce in queue:
            nonce += 1
        return nonce

    def _check_queue(self, account_nonce: int, queue: dict[int, PoolEntry] | None) -> None:
        """A client's gapped transactions are held up to Besu's per-account bound. The bound
        counts transactions, not the size of the gap: consecutive nonces sent to several
        validators at once arrive out of order, and gossip fills the gaps. It counts what
        this node's clients sent: what another validator accepted first is outstanding
        there whatever this node does (refusing its successors here would strand it), so
        gossip is bounded per sender by `max_per_sender` and in all by `max_queued`."""
        if not queue:
            return
        run_end = self._next_nonce(account_nonce, queue)
        gapped = sum(1 for nonce, entry in queue.items() if nonce > run_end and not entry.gossiped)
        if gapped >= self.limits.max_queued_per_sender:
            raise TxPoolError(
                f"nonce too high: {gapped} transactions with a nonce gap are already queued "
                "for this account; send the missing nonces first")

    def check_static(self, tx: SignedTransactionAPI) -> None:
        """What a transaction alone must satisfy (chain id, gas, fee caps), before its
        sender is recovered."""
        if tx.chain_id is None:
            raise TxPoolError("only replay-protected (EIP-155) transactions allowed over RPC")
        if tx.chain_id != self.chain_id:
            raise TxPoolError("invalid chain id for signer")
        if tx.gas > self.block_gas_limit:
            raise TxPoolError("exceeds block gas limit")
        if tx.max_priority_fee_per_gas > tx.max_fee_per_gas:
            raise TxPoolError("max priority fee per gas higher than max fee per gas")
        if tx.gas < tx.intrinsic_gas:
            raise TxPoolError("intrinsic gas too low")

    @staticmethod
    def _check_replacement(old: SignedTransactionAPI, new: SignedTransactionAPI) -> None:
        def bumped(old_value: int) -> int:
            return old_value * (100 + PRICE_BUMP_PERCENT) // 100

        if new.max_fee_per_gas < bumped(old.max_fee_per_gas) or (
            new.max_priority_fee_per_gas < bumped(old.max_priority_fee_per_gas)
        ):
            raise TxPoolError("replacement transaction underpriced")

    def _check_funds(
        self, entry: PoolEntry, account_nonce: int, queue: dict[int, PoolEntry] | None,
        floor: int,
    ) -> None:
        """The sender must afford this transaction after its pending ones with lower nonces
        and, for each nonce still missing below it, the cheapest transaction at the floor:
        a transaction that can never execute must not be held for a sender who could not
        pay for what it waits for."""
        earlier = [e.cost for n, e in (queue.items() if queue else ()) if n < entry.tx.nonce]
        missing = entry.tx.nonce - account_nonce - len(earlier)
        if self.accounts.balance(entry.sender) < sum(earlier) + entry.cost + (
                missing * GAP_FILLER_GAS * floor):
            raise TxPoolError("insufficient funds for gas * price + value")

    def _check_capacity(
        self, entry: PoolEntry, replaced: PoolEntry | None, queue: dict[int, PoolEntry] | None,
        *, gapped: bool,
    ) -> None:
        """Per-sender and pool bounds. Queued transactions of other senders, the least
        recently active first, give way to what needs room (geth's truncateQueue): so
        what can execute always finds room, and the queued ones are at most `max_queued`."""
        freed_count, freed_bytes = (1, replaced.size) if replaced else (0, 0)
        if queue and len(queue) - freed_count >= self.limits.max_per_sender:
            raise TxPoolError("account limit exceeded")
        limits = self.limits
        # Victims are chosen first and dropped only once the transaction is sure to fit: a
        # refused transaction (which its sender can send again and again) evicts nothing.
        victims, chosen = self._queued_victims(entry.sender), []
        queued, count = self.queued_count(), len(self._by_hash) - freed_count
        size = self._bytes - freed_bytes + entry.size
        while gapped and queued >= limits.max_queued:
            if (victim := next(victims, None)) is None:
                raise TxPoolError(
                    f"txpool is full: {limits.max_queued} transactions behind nonce gaps are "
                    "queued; send the missing nonces first")
            chosen.append(victim)
            queued, count, size = queued - 1, count - 1, size - victim.size
        while count >= limits.max_transactions or size > limits.max_bytes:
            if (victim := next(victims, None)) is None:
                raise TxPoolError("txpool is full")
            chosen.append(victim)
            count, size = count - 1, size - victim.size
        for victim in chosen:
            self._drop(victim)
            self.dropped["evicted"] += 1
            log.debug("evicted queued transaction 0x%s to make room", victim.tx.hash.hex())

    def queued_count(self) -> int:
        """Transactions behind a nonce gap, in all."""
        for sender in self._gapped_stale:
            self._count_gapped(sender)
        self._gapped_stale.clear()
        return sum(self._gapped.values())

    def _count_gapped(self, sender: bytes) -> None:
        queue = self._senders.get(sender)
        gapped = len(queue) - (self._next_nonce(self._head_nonce(sender), queue)
                               - self._head_nonce(sender)) if queue else 0
        if gapped:
            self._gapped[sender] = gapped
        else:
            self._gapped.pop(sender, None)

    def _queued_victims(self, keep: bytes) -> Iterator[PoolEntry]:
        """Queued transactions in the order they give way: the least recently active sender
        other than `keep` first, its highest nonce first (so no new gap opens)."""
        self.queued_count()
        for sender in [s for s in self._heartbeats if s != keep and s in self._gapped]:
            queue = self._senders[sender]
            run_end = self._next_nonce(self._head_nonce(sender), queue)
            for nonce in sorted((n for n in queue if n >= run_end), reverse=True):
                yield queue[nonce]

    def evict_expired(self) -> int:
        """Drop the queued transactions of senders inactive for `lifetime`; how many."""
        deadline = self._clock() - self.limits.lifetime
        self.queued_count()
        expired = []
        for sender, beat in self._heartbeats.items():
            if beat > deadline:
                break  # in order of activity: the rest are more recent
            if sender in self._gapped:
                expired.append(sender)
        count = 0
        for sender in expired:
            queue = self._senders[sender]
            run_end = self._next_nonce(self._head_nonce(sender), queue)
            for nonce in [n for n in queue if n >= run_end]:
                self._drop(queue[nonce])
                count += 1
        self.dropped["expired"] += count
        return count

    def _beat(self, sender: bytes) -> None:
        self._heartbeats[sender] = self._clock()
        self._heartbeats.move_to_end(sender)

    def _insert(self, entry: PoolEntry) -> None:
        self._touched[entry.sender] = None
        self._gapped_stale.add(entry.sender)
        self._by_hash[entry.tx.hash] = entry
        self._senders.setdefault(entry.sender, {})[entry.tx.nonce] = entry
        self._bytes += entry.size

    def _drop(self, entry: PoolEntry) -> None:
        self._touched[entry.sender] = None
        self._gapped_stale.add(entry.sender)
        del self._by_hash[entry.tx.hash]
        self._bytes -= entry.size
        queue = self._senders[entry.sender]
        del queue[entry.tx.nonce]
        if not queue:
            del self._senders[entry.sender]
            self._head_nonces.pop(entry.sender, None)
            self._heartbeats.pop(entry.sender, None)

    def pending_nonce(self, sender: bytes) -> int:
        """The next nonce `sender` should use, counting its executable pool transactions."""
        nonce = self.accounts.nonce(sender)
        queue = self._senders.get(sender)
        while queue and nonce in queue:
            nonce += 1
        return nonce

    def by_status(self) -> tuple[dict[bytes, list[PoolEntry]], dict[bytes, list[PoolEntry]]]:
        """geth's split of the pool, per sender in nonce order: pending (nonces contiguous
        from the account's; a fee cap under the base fee still counts, as in geth) and
        queued (behind a nonce gap)."""
        pending: dict[bytes, list[PoolEntry]] = {}
        queued: dict[bytes, list[PoolEntry]] = {}
        for sender, queue in self._senders.items():
            next_nonce = self._head_nonce(sender)
            for nonce in sorted(queue):
                if nonce == next_nonce:
                    pending.setdefault(sender, []).append(queue[nonce])
                    next_nonce += 1
                else:
                    queued.setdefault(sender, []).append(queue[nonce])
        return pending, queued

    def executable(
        self, *, base_fee: int, gas_limit: int, max_count: int,
        nonces: Mapping[bytes, int] | None = None,
    ) -> list[SignedTransactionAPI]:
        """A batch for the next block: arrival order (a replacement takes the place of the
        transaction it replaced), nonce order per sender, bounded by the
        block gas limit (sum of tx gas limits) and `max_count`; a sender whose next
        transaction cannot pay the base fee is skipped.

        A transaction is ready no earlier than the ones before it in its sender's nonce order:
        walking the pool in arrival order, the arrival that closes a sender's nonce gap makes
        the run of nonces behind it ready at once. The walk stops when the batch is full.
        `nonces` overrides the head's account nonces (a block built on uncommitted blocks:
        the nonces after them, so their transactions are left out).
        Account nonces come from `_head_nonces`: a nonce moved without a transaction of its
        own (an EIP-7702 authorization) makes that sender's transaction fail at block
        building, which removes it and so re-reads the nonce.
        """
        if self._out_of_order:
            self._by_hash = dict(sorted(self._by_hash.items(), key=lambda i: i[1].arrival))
            self._out_of_order = False
        next_nonce: dict[bytes, int] = {}
        batch: list[SignedTransactionAPI] = []
        gas = 0
        for arrived in self._by_hash.values():
            if len(batch) >= max_count:
                break
            sender = arrived.sender
            if sender not in next_nonce:
                next_nonce[sender] = (nonces[sender] if nonces and sender in nonces
                                      else self._head_nonce(sender))
            queue = self._senders[sender]
            nonce = arrived.tx.nonce
            while nonce == next_nonce[sender] and len(batch) < max_count:
                tx = queue[nonce].tx
                if tx.max_fee_per_gas < base_fee or gas + tx.gas > gas_limit:
                    break  # this sender's later nonces wait behind this one
                batch.append(tx)
                gas += tx.gas
                nonce = next_nonce[sender] = nonce + 1
                if nonce not in queue or queue[nonce].arrival > arrived.arrival:
                    break  # a later arrival, reached in its turn
        return batch

    def holds_sender(self, sender: bytes) -> bool:
        return sender in self._senders

    def _head_nonce(self, sender: bytes) -> int:
        nonce = self._head_nonces.get(sender)
        if nonce is None:
            nonce = self._head_nonces[sender] = self.accounts.nonce(sender)
        return nonce

    def remove(self, tx_hashes: Iterable[bytes], *, committed: bool = False) -> None:
        """Drop these transactions; `committed` ones are not reported as unready (the
        engine learns of them from the committed block)."""
        for tx_hash in tx_hashes:
            entry = self._by_hash.get(tx_hash)
            if entry is not None:
                self._drop(entry)
                self._head_nonces.pop(entry.sender, None)
                if committed:
                    self._committed.add(tx_hash)

    def prune(self, senders: Iterable[bytes]) -> None:
        """Drop what the new head made invalid for `senders` (nonces now used)."""
        for sender in set(senders):
            queue = self._senders.get(sender)
            if queue is None:
                continue
            account_nonce = self._head_nonces[sender] = self.accounts.nonce(sender)
            self._gapped_stale.add(sender)
            self._beat(sender)
            for nonce in [n for n in queue if n < account_nonce]:
                self._drop(queue[nonce])

    def ready_changes(self, base_fee: int) -> ReadyChanges:
        """What became ready, and what stopped being ready, since the last call: for the
        senders touched since then and, when the base fee moved, for those whose run it
        lengthens or shortens (a commit touches its own senders; the others' runs can change
        only with the fee, so a commit costs its block's senders, not the pool's)."""
        # In a stable order: the engine counts the age of requests in the order reported.
        senders = dict(self._touched)
        if base_fee != self._base_fee:
            senders.update(dict.fromkeys(
                sender for sender in self._senders
                if (bounds := self._fee_bounds.get(sender)) and bounds.moved_by(base_fee)))
            self._base_fee = base_fee
        ready: list[bytes] = []
        unready: list[bytes] = []
        for sender in senders:
            run = self._ready_run(sender, base_fee)
            before = self._ready.get(sender, ())
            was, now = set(before), set(run)
            ready += [h for h in run if h not in was]
            unready += [h for h in before if h not in now and h not in self._committed]
            if run:
                self._ready[sender] = run
            else:
                self._ready.pop(sender, None)
        self._touched.clear()
        self._committed.clear()
        return ReadyChanges(tuple(ready), tuple(unready))

    def _ready_run(self, sender: bytes, base_fee: int) -> tuple[bytes, ...]:
        """The sender's transactions a block on the head could include, in nonce order; keeps
        the fee caps the run depends on in `_fee_bounds`."""
        queue = self._senders.get(sender)
        run: list[bytes] = []
        lowest: int | None = None
        nonce = self._head_nonce(sender) if queue else 0
        while queue and nonce in queue:
            fee_cap = queue[nonce].tx.max_fee_per_gas
            if fee_cap < base_fee:
                self._fee_bounds[sender] = FeeBounds(lowest, fee_cap)
                return tuple(run)
            lowest = fee_cap if lowest is None else min(lowest, fee_cap)
            run.append(queue[nonce].tx.hash)
            nonce += 1
        if lowest is None:
            self._fee_bounds.pop(sender, None)
        else:
            self._fee_bounds[sender] = FeeBounds(lowest, None)
        return tuple(run)
