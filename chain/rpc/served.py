"""Committed blocks as the read methods serve them.

Every lookup reads the read store (chain/read_store.py): a receipt or transaction by hash is
two index reads (its location, then its record; ~35 us with the header cached). Blocks that
are read whole (a full `eth_getBlockBy*`, `eth_getBlockReceipts`) are kept decoded and
formatted in a cache bounded by blocks and by transactions, most recently read last: clients
mostly ask for the head and the blocks just behind it, so those are served from memory, and
a single lookup in such a block is a dictionary read.

Whole-block reads and logs run on worker threads (`WorkerPool`), which have them answered
by processes of their own (chain/rpc/read_process.py; `ServedBlock` makes their JSON there);
single lookups run on the event loop, where they cost less than the hop to a thread would (0.1 to
0.3 ms of CPU a call under polling). The cache takes a lock. Every worker thread works in
turns under one governor (`Governor`), which bounds what client work takes of the
interpreter from the loop that carries consensus. Execution (eth_call, eth_estimateGas)
runs in processes of its own (chain/rpc/evm_process.py), with a deadline checked inside the
EVM (`with_deadline`); its threads only wait on them, ungoverned.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

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
# The governor's pace (see Governor): a turn's holder looks at the loop's pulse after every
# slice of work, and rests as long as it worked when the loop is this late behind its pulse.
SLICE_SECONDS = 0.002
PULSE_SECONDS = 0.05
LOOP_LATE_SECONDS = 0.01
# The opcodes a long execution cannot avoid: every loop jumps back, every deeper frame is a
# call or a create. The deadline is checked at these only.
DEADLINE_OPCODES = frozenset({
    0x56, 0x57,  # JUMP, JUMPI
    0xF0, 0xF1, 0xF2, 0xF4, 0xF5, 0xFA,  # CREATE, CALL, CALLCODE, DELEGATECALL, CREATE2, STATICCALL
})


T = TypeVar("T")


# Client work and the event loop.
#
# Every Python thread of the node shares one interpreter lock with the event loop, which
# carries consensus. A computing thread keeps that lock until the interpreter makes it switch
# (every 5 ms: sys.getswitchinterval), and then every waiting thread races for it, the loop
# among them: n busy threads take up to n/(n+1) of the interpreter, and the loop waits 5 ms or
# more at every wake-up (8 clients reading block bundles from the primary tripled the honest
# transfers' latency; at a backup the view changed). So all client work of this process
# (reads, bundles, decoding large bodies) goes through one governor (execution left the
# process, chain/rpc/evm_process.py: paced as it was, an EVM thread still cost the loop a
# wait at its wake-ups):
# - Turns. A unit of client work runs holding the turn, a FIFO lock: whatever the number of
#   clients and pools, one client thread at a time wants the interpreter beside the loop (the
#   others wait on the turn, which does not hold the interpreter).
# - The pulse. While client work is in flight, a callback on the loop every PULSE_SECONDS
#   notes how late it runs behind its schedule: the loop's lag, which any thread can read.
# - Rests. At checkpoints (between blocks, records and units), after every slice of work,
#   the holder looks at the pulse. When the loop is late by more than LOOP_LATE_SECONDS (its
#   last beat, or the one it owes now: two switch intervals, so more than one thread's share
#   of the interpreter kept it waiting, or its thread was not scheduled in time on a loaded
#   machine), the holder rests as long as it worked (its CPU time), keeping the turn: client
#   work then takes at most half of the interpreter (and of a core) until the loop is on
#   time, the bound the decoder kept before on its own. When the loop is on time it goes on:
#   a read alone keeps its speed. (Every beat costs the holder a thread switch, 0.1 to a few
#   ms on a loaded machine: hence a pulse of 50 ms, and no pause at every beat. Pausing at
#   every due beat halved a read's speed on a machine at a load of 8, for the beat's sake
#   only: a consensus message the loop wakes up for is not seen by any beat.)
# - After each slice the turn passes to the next waiting unit: a long one (a wide
#   eth_getLogs) does not hold the others back.


class _Turns:
    """A FIFO lock: units get the turn in the order they asked for it."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._issued = 0
        self._serving = 0

    def take(self) -> None:
        with self._changed:
            ticket = self._issued
            self._issued += 1
            self._changed.wait_for(lambda: self._serving == ticket)

    def give(self) -> None:
        with self._changed:
            self._serving += 1
            self._changed.notify_all()

    def others_waiting(self) -> bool:
        return self._issued - self._serving > 1


class LoopPulse:
    """A callback on the event loop every PULSE_SECONDS while client work is in flight; how
    late it ran behind its schedule (or is now) is the loop's lag. Counted on the loop."""

    def __init__(self) -> None:
        self.lag = 0.0
        self.due = math.inf  # the next beat's time; inf: not beating
        self._in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def work_started(self) -> None:
        self._in_flight += 1
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self.due == math.inf:  # a test's new loop: beat on it
            self._loop, self.lag = loop, 0.0
            self._schedule(loop, time.monotonic())

    def work_ended(self) -> None:
        self._in_flight -= 1

    def _schedule(self, loop: asyncio.AbstractEventLoop, now: float) -> None:
        self.due = now + PULSE_SECONDS
        loop.call_later(PULSE_SECONDS, self._beat, loop)

    def _beat(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # a beat of a loop the pulse left
        now = time.monotonic()
        self.lag = now - self.due
        if self._in_flight > 0:
            self._schedule(loop, now)
        else:
            self.lag, self.due = 0.0, math.inf

    def late(self, now: float) -> bool:
        """Whether the loop is late: its last beat, or the one it owes now (any thread)."""
        return max(self.lag, now - self.due) > LOOP_LATE_SECONDS


class Governor:
    """The turns and rests of all client work (see above); one per process."""

    def __init__(self) -> None:
        self.pulse = LoopPulse()
        self._turns = _Turns()
        self._holder: int | None = None
        self._since = 0.0  # when the holders' work since the last pause began
        self._cpu_since = 0.0  # the holder's CPU time then (time.thread_time: its own)
        self._handed_on = False  # the last holder gave the turn to a waiting unit

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Runs the block as a unit of client work (on a worker thread)."""
        self._turns.take()
        self._holder = threading.get_ident()
        self._cpu_since = time.thread_time()
        if not self._handed_on:
            self._since = time.monotonic()  # the turn was free: no work since a pause
        try:
            yield
        finally:
            self.checkpoint()
            self._holder = None
            self._handed_on = self._turns.others_waiting()
            self._turns.give()

    def checkpoint(self) -> None:
        """A point where the turn's holder may pause; elsewhere (the loop, a test) nothing."""
        if self._holder != threading.get_ident():
            return
        now = time.monotonic()
        if now - self._since < SLICE_SECONDS:
            return
        # What it worked is its CPU time: a loaded machine's scheduler may have kept the
        # thread from running for much of the slice, and that was no one's interpreter time.
        if self.pulse.late(now):
            time.sleep(time.thread_time() - self._cpu_since)
        self._since, self._cpu_since = time.monotonic(), time.thread_time()
        if self._turns.others_waiting():
            self._holder = None
            self._turns.give()
            self._turns.take()
            self._holder = threading.get_ident()
            self._since, self._cpu_since = time.monotonic(), time.thread_time()


GOVERNOR = Governor()


def paced(items: Iterable[T]) -> Iterator[T]:
    """`items`, with a checkpoint of the governor's before each."""
    for item in items:
        GOVERNOR.checkpoint()
        yield item


class WorkerPool:
    """Threads for one kind of client-driven work (long reads, execution, decoding big
    requests), so that none of it holds the event loop, which also carries consensus
    messages and commits, for its whole length; every call is a unit of the governor's
    (`GOVERNOR`) unless the pool is not `governed` (its threads mostly wait on another
    process: execution's). Bounded: at most `max_pending` calls run or wait for a thread at
    once; one more is refused at once with -32005 "server busy", never queued."""

    def __init__(self, threads: int, max_pending: int, what: str, *,
                 governed: bool = True) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="rpc-" + what)
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._governed = governed
        self._busy = (f"server busy: {max_pending} {what} requests are already running or "
                      "waiting; retry later")

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        with self._lock:
            if self._pending >= self._max_pending:
                raise RpcError(LIMIT_EXCEEDED, self._busy)
            self._pending += 1
        if self._governed:
            GOVERNOR.pulse.work_started()
        future = self._executor.submit(self._counted, function, args)
        try:
            return await asyncio.wrap_future(future)
        finally:
            if self._governed:
                GOVERNOR.pulse.work_ended()
            if future.cancelled():  # its caller was cancelled before a thread took it
                self._release()

    def _counted(self, function: Callable[..., T], args: tuple[Any, ...]) -> T:
        """Runs on a worker: the slot is free when the work ends, even if its caller left
        (a call cancelled before it reached a thread frees it in `run`: the attack review
        s11-rpc, finding 4)."""
        try:
            with GOVERNOR.turn() if self._governed else contextlib.nullcontext():
                return function(*args)
        finally:
            self._release()

    def _release(self) -> None:
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


_deadline = _Deadline()


@contextlib.contextmanager
def evm_deadline(seconds: float) -> Iterator[None]:
    """Executions on this thread inside the block stop with ExecutionTimeout after `seconds`
    (their state must come from `with_deadline`)."""
    _deadline.expires = time.monotonic() + seconds
    try:
        yield
    finally:
        _deadline.expires = math.inf


def _check_deadline() -> None:
    if time.monotonic() >= _deadline.expires:
        raise ExecutionTimeout


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
    """`state` (a throwaway one: eth_call's, in the EVM process) executing with the thread's
    `evm_deadline`; consensus execution never pays for the checks."""
    state.computation_class = _deadline_computation(state.computation_class)  # type: ignore[misc]
    return state


class _Made(Generic[T]):
    """functools.cached_property without its lock: in Python 3.11 that lock is one per class
    attribute, shared by every block, and held while the value is made, across the
    governor's checkpoints; a reader handing its turn on while formatting one block left the
    next reader blocked on the lock holding the turn, and every unit of client work waiting
    (attack review finding 1). Two threads may make the same block's value at once; both
    are equal and the last is kept (as in Python 3.12's cached_property)."""

    def __init__(self, make: Callable[[Any], T]) -> None:
        self._make = make
        self._name = make.__name__

    @overload
    def __get__(self, instance: None, owner: type) -> _Made[T]: ...

    @overload
    def __get__(self, instance: object, owner: type) -> T: ...

    def __get__(self, instance: object | None, owner: type) -> T | _Made[T]:
        if instance is None:
            return self
        value = self._make(instance)
        instance.__dict__[self._name] = value  # found before this descriptor from now on
        return value


@dataclass
class ServedBlock:
    """One committed block, its JSON parts formatted on first use."""

    header: BlockHeaderAPI
    size: int
    records: tuple[TxRecord, ...]

    @_Made
    def header_json(self) -> dict[str, Any]:
        return header_json(self.header)

    @_Made
    def transactions(self) -> list[dict[str, Any]]:
        header = self.header
        return [transaction_json(r.raw, r.hash, r.sender, header, i)
                for i, r in enumerate(paced(self.records))]

    @_Made
    def receipts(self) -> list[dict[str, Any]]:
        return [receipt_json(r, self.header, i) for i, r in enumerate(paced(self.records))]

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
        return encode_block(header, self._records(header))

    def _records(self, header: BlockHeaderAPI) -> tuple[TxRecord, ...]:
        served = self._cached(header)
        return served.records if served else self.store.records(header.block_number)

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
        yield from self.logs_of(
            criteria, self.store.bloom_index.candidates(first, last, criteria.bloom_groups()))

    def logs_of(self, criteria: LogCriteria, numbers: Iterable[int]) -> Iterator[dict[str, Any]]:
        """The matching logs of the blocks `numbers` (the bloom-bits index's candidates), up
        to the first the node does not have."""
        for number in paced(numbers):
            header = self.blockchain.header_by_number(number)
            if header is None:
                return
            yield from matching_logs(criteria, header, self._records(header))
