"""Group commit of the core's records: one synced write for the steps taken while the last
one was on disk, and each step's actions only once the write that covers it returned.

Every step of the core that changes its log asks for a synced write before anything of the
step is sent (persist before send, `Ready`). Done one step at a time on the event loop, those
writes were 8 fsyncs per block on each validator and a sixth of the loop's time (issue 29).
A WAL's classic answer is group commit (PostgreSQL's group commit of WAL flushes, LevelDB's
own writer queue): while one write is on disk, on a writer thread, the records of the next
steps accumulate and go in the next write, one batch, in step order. The core moves on
meanwhile, in memory only; what it produced stays here until its write returns:

- nothing of a step (a message, a timer, a block build or commit) is performed before that
  step's records and its signing bound are durable, and actions keep their step order (a
  step with nothing to write waits behind the steps before it);
- a crash between two writes loses whole steps whose effects nobody saw, as if their events
  never came (one batch is atomic; the signing bound follows the store, as one step did);
- a failed write stops the node as before (the database reports it) and nothing of the
  steps it covered, or of any later one, is performed;
- a step that performs nothing (a peer's vote short of a quorum) starts no write of its
  own at once: its records wait up to QUIET_STEP_DELAY for a step that performs, and go in
  its write (nothing of theirs is visible, so losing them in a crash is losing their events);
- what waits is bounded in bytes: a step that would pass `max_bytes` waits on the loop
  for the write in flight and writes what waits there (the old way, one write at a time).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pbft_engine.core import Action, Ready
from pbft_engine.core.records import Put, StoreOp
from pbft_engine.core.signing_bound import SigningBound
from storage import StorageFailure

log = logging.getLogger(__name__)

# Records and actions waiting for a write: a burst of full blocks' PRE-PREPAREs fits.
MAX_PENDING_BYTES = 8 * 1024 * 1024
# How long the records of steps that perform nothing (a peer's vote short of a quorum: over
# 40% of the writes) wait for a step that does, to share its write (PostgreSQL's
# commit_delay). Nothing waits on them meanwhile; only readers of the stores see them later.
QUIET_STEP_DELAY = 0.01  # seconds

WriteRecords = Callable[[Sequence[StoreOp], SigningBound | None], None]
C = TypeVar("C")  # what a step's actions are performed with, as it was when the step ended
PerformActions = Callable[[Sequence[Action], C], None]


@dataclass
class _Group(Generic[C]):
    """Steps that one write covers, in step order."""

    ops: list[StoreOp] = field(default_factory=list)
    signing_bound: SigningBound | None = None
    actions: list[tuple[list[Action], C]] = field(default_factory=list)  # one per step
    size: int = 0
    performs: bool = False  # a step of the group has actions: they wait for the write

    def add(self, ready: Ready, context: C, size: int) -> None:
        if ready.persist is not None:
            self.ops.extend(ready.persist.ops)
            if ready.persist.signing_bound is not None:  # raised step by step: the last is
                self.signing_bound = ready.persist.signing_bound  # the highest
        self.actions.append((ready.actions, context))
        self.size += size
        self.performs = self.performs or bool(ready.actions)


class GroupCommit(Generic[C]):
    """`submit` each step's `Ready` in step order, with the context its actions are to be
    performed in (what they mean may change while they wait: the set of validators that a
    `SendTo`'s index names); `write` runs on one writer thread."""

    def __init__(self, write: WriteRecords, perform: PerformActions[C],
                 max_bytes: int = MAX_PENDING_BYTES) -> None:
        self._write = write
        self._perform = perform
        self._max_bytes = max_bytes
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="pbft-records")
        self._pending: _Group[C] = _Group()
        self._in_flight: tuple[_Group[C], Future[None]] | None = None
        self._start: asyncio.Handle | None = None  # the next write, once none is in flight
        self._start_soon = False  # ... on the next loop iteration (else QUIET_STEP_DELAY)
        self.failed = False  # a write failed (or the engine stopped): nothing more is performed

    @property
    def idle(self) -> bool:
        """No step waits for a write."""
        return self._in_flight is None and not self._pending.actions

    def submit(self, ready: Ready, context: C) -> None:
        if self.failed:
            return
        if ready.persist is None and self.idle:
            self._perform(ready.actions, context)  # nothing to write and nothing before it
            return
        size = _ready_size(ready)
        if self._pending.actions and self._pending.size + size > self._max_bytes:
            self._drain()
        self._pending.add(ready, context, size)
        if self._in_flight is None:  # (else its return starts the next write)
            self._schedule()

    def _schedule(self) -> None:
        """The next write: on the next loop iteration if a step waits for it (the steps of
        this iteration go in it too), else after QUIET_STEP_DELAY."""
        soon = self._pending.performs
        if self._start is not None:
            if self._start_soon or not soon:
                return
            self._start.cancel()
        loop = asyncio.get_running_loop()
        self._start = (loop.call_soon(self._write_pending) if soon
                       else loop.call_later(QUIET_STEP_DELAY, self._write_pending))
        self._start_soon = soon

    def _write_pending(self) -> None:
        if self._start is not None:
            self._start.cancel()
            self._start = None
        if self._in_flight is not None or not self._pending.actions or self.failed:
            return
        group, self._pending = self._pending, _Group()
        future = self._writer.submit(self._write_group, group)
        self._in_flight = (group, future)
        loop = asyncio.get_running_loop()
        future.add_done_callback(
            lambda _: loop.call_soon_threadsafe(self._written_in_background, group))

    def _write_group(self, group: _Group[C]) -> None:
        if group.ops or group.signing_bound is not None:
            self._write(group.ops, group.signing_bound)

    def _written_in_background(self, group: _Group[C]) -> None:
        if self._in_flight is None or self._in_flight[0] is not group:
            return  # `_drain` finished it already
        if self.failed:  # stopped meanwhile: nothing more is performed
            self._in_flight = None
            return
        error = self._in_flight[1].exception()
        if error is not None:
            log.error("the consensus records could not be written: %s", error)
        try:
            self._finish(group, error)
        finally:
            if self._pending.performs and not self.failed:
                self._write_pending()
            elif self._pending.actions and not self.failed:
                self._schedule()

    def _finish(self, group: _Group[C], error: BaseException | None) -> None:
        """The write covering `group` returned: its steps' actions, in order (none if it
        failed, and none of any later step)."""
        self._in_flight = None
        if error is not None:
            self._fail()
            return
        for actions, context in group.actions:
            try:
                self._perform(actions, context)
            except StorageFailure:
                pass  # the database reported it: the node stops
            except Exception:  # the step's own failure (it was its caller's): not the next's
                log.exception("the actions of a consensus step failed")

    def _fail(self) -> None:
        self.failed = True
        self._pending = _Group()

    def _drain(self) -> None:
        """The bound is reached: wait here for the write in flight, then write what waits
        (a failure raises to the step's caller, as a write on the loop did)."""
        if self._in_flight is not None:
            group, future = self._in_flight
            error = future.exception()
            self._finish(group, error)
            if error is not None:
                raise error
        group, self._pending = self._pending, _Group()
        try:
            self._write_group(group)
        except BaseException:
            self._fail()
            raise
        self._finish(group, None)

    async def close(self) -> None:
        """Wait for the write in flight (the database closes after this) and perform
        nothing more: as a crash after that write, which a restart recovers from."""
        self._fail()
        if self._start is not None:
            self._start.cancel()
        if self._in_flight is not None:
            await asyncio.wait([asyncio.wrap_future(self._in_flight[1])])
            self._in_flight = None
        self._writer.shutdown(wait=True)


def _ready_size(ready: Ready) -> int:
    """Bytes a step holds while it waits: its records' keys and values, its actions' data."""
    records = sum(len(op.key) + len(op.value) for op in ready.persist.ops
                  if isinstance(op, Put)) if ready.persist is not None else 0
    return records + sum(_action_size(action) for action in ready.actions)


def _action_size(action: Action) -> int:
    size = 64  # the action itself
    for item in dataclasses.fields(action):
        value = getattr(action, item.name)
        if isinstance(value, bytes):
            size += len(value)
        elif isinstance(value, (tuple, list)):
            size += sum(len(v) for v in value if isinstance(v, bytes))
    return size
