"""Committed blocks as the read methods serve them.

Every lookup reads the read store (chain/read_store.py): a receipt or transaction by hash is
two index reads (its location, then its record; ~35 us with the header cached). Blocks that
are read whole (a full `eth_getBlockBy*`, `eth_getBlockReceipts`) are kept decoded and
formatted in a cache bounded by blocks and by transactions, most recently read last: clients
mostly ask for the head and the blocks just behind it, so those are served from memory, and
a single lookup in such a block is a dictionary read.

Whole-block reads, logs and execution run on worker threads (`WorkerPool`); single
lookups run on the event loop, where they cost less than the hop to a thread would (0.1 to
0.3 ms of CPU a call under polling). The cache takes a lock. Execution (eth_call,
eth_estimateGas) has threads of its own and a deadline checked inside the EVM
(`with_deadline`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from eth.abc import BlockHeaderAPI, ComputationAPI, StateAPI

from chain.blockchain import Blockchain
from chain.read_store import TxRecord, encode_block
from chain.rpc.errors import LIMIT_EXCEEDED, RpcError
from chain.rpc.filters import LogCriteria, matching_logs
from chain.rpc.formatters import block_json, header_json, receipt_json, transaction_json
from chain.rpc.hexcodec import data

READ_WORKERS = 2  # threads for reads: one long read (a wide eth_getLogs) does not stall the rest
MAX_PENDING_READS = 64  # reads running or waiting for a thread; one more: "server busy"
MAX_CACHED_BLOCKS = 256
MAX_CACHED_TRANSACTIONS = 4_000  # formatted transactions and receipts: ~3.6 KB a transfer
# An EVM thread rests as long as it worked after each slice of execution, so the event loop,
# which carries consensus, waits for the interpreter at most a slice (not the 5 ms switch
# interval, at every wake-up), and a looping call takes at most half a core from a machine
# that also runs the validator.
EVM_SLICE_SECONDS = 0.002
EVM_PAUSE_SECONDS = 0.002
# The opcodes a long execution cannot avoid: every loop jumps back, every deeper frame is a
# call or a create. The deadline is checked at these only.
DEADLINE_OPCODES = frozenset({
    0x56, 0x57,  # JUMP, JUMPI
    0xF0, 0xF1, 0xF2, 0xF4, 0xF5, 0xFA,  # CREATE, CALL, CALLCODE, DELEGATECALL, CREATE2, STATICCALL
})


T = TypeVar("T")


class WorkerPool:
    """Threads for one kind of client-driven work (long reads, execution, decoding big
    requests), so that none of it holds the event loop, which also carries consensus
    messages and commits, for its whole length (the interpreter switches threads every few
    milliseconds). Bounded: at most `max_pending` calls run or wait for a thread at once;
    one more is refused at once with -32005 "server busy", never queued."""

    def __init__(self, threads: int, max_pending: int, what: str) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="rpc-" + what)
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._busy = (f"server busy: {max_pending} {what} requests are already running or "
                      "waiting; retry later")

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        with self._lock:
            if self._pending >= self._max_pending:
                raise RpcError(LIMIT_EXCEEDED, self._busy)
            self._pending += 1
        return await asyncio.wrap_future(self._executor.submit(self._counted, function, args))

    def _counted(self, function: Callable[..., T], args: tuple[Any, ...]) -> T:
        """Runs on a worker: the slot is free when the work ends, even if its caller left."""
        try:
            return function(*args)
        finally:
            with self._lock:
                self._pending -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


# Execution with a deadline.


class ExecutionTimeout(Exception):
    """Raised inside the EVM at the deadline; not a VMError, so py-evm does not catch it and
    the whole call unwinds (its state is a throwaway copy)."""


class _Deadline(threading.local):
    expires = math.inf
    next_pause = math.inf


_deadline = _Deadline()


@contextlib.contextmanager
def evm_deadline(seconds: float) -> Iterator[None]:
    """Executions on this thread inside the block stop with ExecutionTimeout after `seconds`
    (their state must come from `with_deadline`)."""
    now = time.monotonic()
    _deadline.expires, _deadline.next_pause = now + seconds, now + EVM_SLICE_SECONDS
    try:
        yield
    finally:
        _deadline.expires = _deadline.next_pause = math.inf


def _check_deadline() -> None:
    now = time.monotonic()
    if now < _deadline.next_pause:
        return
    if now >= _deadline.expires:
        raise ExecutionTimeout
    time.sleep(EVM_PAUSE_SECONDS)
    _deadline.next_pause = time.monotonic() + EVM_SLICE_SECONDS


def _checked(opcode: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(opcode)
    def run(computation: ComputationAPI) -> None:
        _check_deadline()
        opcode(computation=computation)

    return run


@functools.cache
def _deadline_computation(base: type[ComputationAPI]) -> type[ComputationAPI]:
    opcodes = {number: _checked(opcode) if number in DEADLINE_OPCODES else opcode
               for number, opcode in base.opcodes.items()}
    return type(base.__name__ + "WithDeadline", (base,), {"opcodes": opcodes})


def with_deadline(state: StateAPI) -> StateAPI:
    """`state` (a throwaway one: eth_call's) executing with the thread's `evm_deadline`;
    consensus execution never pays for the checks."""
    state.computation_class = _deadline_computation(state.computation_class)  # type: ignore[misc]
    return state


@dataclass
class ServedBlock:
    """One committed block, its JSON parts formatted on first use."""

    header: BlockHeaderAPI
    size: int
    records: tuple[TxRecord, ...]

    @cached_property
    def header_json(self) -> dict[str, Any]:
        return header_json(self.header)

    @cached_property
    def transactions(self) -> list[dict[str, Any]]:
        header = self.header
        return [transaction_json(r.raw, r.hash, r.sender, header, i)
                for i, r in enumerate(self.records)]

    @cached_property
    def receipts(self) -> list[dict[str, Any]]:
        return [receipt_json(r, self.header, i) for i, r in enumerate(self.records)]

    def json(self, full_transactions: bool) -> dict[str, Any]:
        transactions = (
            self.transactions if full_transactions else [data(r.hash) for r in self.records]
        )
        return block_json(self.header_json, self.size, transactions)


@dataclass(frozen=True)
class Located:
    """A committed transaction: its block's header, its index and its record."""

    header: BlockHeaderAPI
    index: int
    record: TxRecord


class ServedBlocks:
    def __init__(self, blockchain: Blockchain) -> None:
        self.blockchain = blockchain
        self.store = blockchain.read_store
        self._cache: OrderedDict[int, ServedBlock] = OrderedDict()
        self._cached_transactions = 0
        self._lock = threading.Lock()

    # Blocks.

    def block(self, header: BlockHeaderAPI) -> ServedBlock:
        number = header.block_number
        with self._lock:
            served = self._cache.get(number)
            if served is not None and served.header.hash == header.hash:
                self._cache.move_to_end(number)
                return served
        info = self.store.block_info(number)
        if info is None:
            raise LookupError(f"block {number} is not in the read store")
        served = ServedBlock(header, info.size, self.store.records(number))
        self._remember(served)
        return served

    def _remember(self, served: ServedBlock) -> None:
        with self._lock:
            previous = self._cache.pop(served.header.block_number, None)
            if previous is not None:
                self._cached_transactions -= len(previous.records)
            self._cache[served.header.block_number] = served
            self._cached_transactions += len(served.records)
            while len(self._cache) > 1 and (
                len(self._cache) > MAX_CACHED_BLOCKS
                or self._cached_transactions > MAX_CACHED_TRANSACTIONS
            ):
                _, evicted = self._cache.popitem(last=False)
                self._cached_transactions -= len(evicted.records)

    def _cached(self, header: BlockHeaderAPI) -> ServedBlock | None:
        with self._lock:
            served = self._cache.get(header.block_number)
        return served if served is not None and served.header.hash == header.hash else None

    def transaction_count(self, header: BlockHeaderAPI) -> int:
        info = self.store.block_info(header.block_number)
        return 0 if info is None else info.transaction_count

    def raw_block(self, header: BlockHeaderAPI) -> bytes:
        served = self._cached(header)
        records = served.records if served else self.store.records(header.block_number)
        return encode_block(header, records)

    # Transactions.

    def locate(self, tx_hash: bytes) -> Located | None:
        location = self.blockchain.transaction_location(tx_hash)
        if location is None:
            return None
        number, index = location
        header = self.blockchain.header_by_number(number)
        return None if header is None else self._located(header, index)

    def _located(self, header: BlockHeaderAPI, index: int) -> Located | None:
        served = self._cached(header)
        if served is not None:
            records = served.records
            return Located(header, index, records[index]) if index < len(records) else None
        record = self.store.record(header.block_number, index)
        return None if record is None else Located(header, index, record)

    def _formatted(self, header: BlockHeaderAPI, part: str) -> list[dict[str, Any]] | None:
        """The block's formatted "transactions" or "receipts", if the cache has them made (a
        single lookup formats one record rather than make them for the whole block)."""
        served = self._cached(header)
        return None if served is None else served.__dict__.get(part)

    def transaction_at(self, header: BlockHeaderAPI, index: int) -> dict[str, Any] | None:
        located = self._located(header, index)
        return None if located is None else self.transaction(located)

    def transaction(self, located: Located) -> dict[str, Any]:
        made = self._formatted(located.header, "transactions")
        if made is not None:
            return made[located.index]
        record = located.record
        return transaction_json(record.raw, record.hash, record.sender, located.header,
                                located.index)

    def receipt(self, located: Located) -> dict[str, Any]:
        made = self._formatted(located.header, "receipts")
        if made is not None:
            return made[located.index]
        return receipt_json(located.record, located.header, located.index)

    # Logs.

    def logs(
        self, criteria: LogCriteria, first: int, last: int
    ) -> Iterator[dict[str, Any]]:
        """The matching logs of blocks first..last: only the blocks the bloom-bits index
        names are read."""
        for number in self.store.bloom_index.candidates(first, last, criteria.bloom_groups()):
            header = self.blockchain.header_by_number(number)
            if header is None:
                return
            yield from matching_logs(criteria, header, self.store.records(number))
