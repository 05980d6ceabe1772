"""Child processes at nice 19 that do client work off the validator's interpreter: the EVM's
(chain/rpc/evm_process.py) and the heavy reads' (chain/rpc/read_process.py).

What they share: the frames (a 4-byte length, then at most `max_frame` bytes) over the child's
stdin and stdout, the lifecycle (started at the first request, told its settings once, then
one request at a time; killed at its deadline or when the conversation breaks off, replaced
by the next request), and the child's side of the pipes (`Channel`, `child_main`) and its
cache (`ByteBoundedCache`). A child reads the chain through its parent (it cannot open
LevelDB: one process per database): it asks, the thread that asked for the work answers.

What a child says is RLP, never pickled: a flat list, a tag and its fields.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

import rlp

from chain.rpc.errors import RpcError, ServerError
from encoding.rlp import check_rlp_bounds

FRAME_LENGTH = struct.Struct(">I")
# A chain that committed a block within this long is making blocks (`chain_busy`): a child
# then computes at most its share of a core (`_Child._pace`).
BUSY_SECONDS = 2.0
PACE_SECONDS = 0.05  # a working child's CPU is looked at this often (its ticks: 10 ms)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The child stops itself at the deadline; this much later it is killed (it is starved at
# nice 19 on a busy machine, or stuck).
KILL_GRACE_SECONDS = 2.0
START_SECONDS = 60.0  # to import py-evm and build the chain, at nice 19 on a busy machine
STOP_SECONDS = 2.0  # for an idle child to exit when its stdin closes; then it is killed
LOWEST_PRIORITY = 19
# `python -m module` at the lowest priority from its first import on (py-evm's take ~0.6 s of
# CPU: at nice 0, a node's children starting at their first requests slowed its consensus).
# It is killed with its parent (prctl PR_SET_PDEATHSIG, SIGKILL): a node killed while its
# child was stopped (`_Child._pace`) would leave the child stopped for good; a parent gone
# before the prctl is one that is no longer its parent (not "adopted by pid 1": a node that
# is pid 1, a container's, had every child exit at once, the attack review s14-rpc).
LAUNCH = ("import ctypes, os, runpy, signal; "
          "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL); "
          "os.getppid() != {parent} and os._exit(1); "
          "os.setpriority(os.PRIO_PROCESS, 0, {priority}); "
          "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
PIPE_BYTES = 1024 * 1024  # the child's stdout (Linux's default limit for a pipe's size)
ENTRY_BYTES = 150  # what a cached entry costs beyond its key and value (objects, links)

READY, ERROR, FAILURE = b"ready", b"error", b"failure"
FOUND, MISSING = b"\x01", b"\x00"


class ChildFailure(Exception):
    """The child failed other than by the request's fault (a bug): an internal error."""


_last_block = -math.inf  # when this node last committed a block (time.monotonic)


def mark_block() -> None:
    """A block committed here now: the children's work yields for BUSY_SECONDS."""
    global _last_block
    _last_block = time.monotonic()


def chain_busy() -> bool:
    """Whether the chain makes blocks: one committed here within BUSY_SECONDS."""
    return time.monotonic() - _last_block < BUSY_SECONDS


class _Working:
    """The children paced lately (looked at within two PACE_SECONDS): the share of a core is
    the node's, divided among them. Each child held to it alone, a node's EVM child and its
    read children computed three shares together (the attack review s14-rpc, finding 5)."""

    def __init__(self) -> None:
        self._looked: dict[int, float] = {}  # pid: when its pacing last looked (or stops) it
        self._lock = threading.Lock()  # (children are paced on several worker threads)

    def count(self, pid: int, now: float) -> int:
        """How many children work now, `pid` among them."""
        with self._lock:
            self._looked[pid] = max(now, self._looked.get(pid, now))
            for other in [p for p, t in self._looked.items() if now - t > 2 * PACE_SECONDS]:
                del self._looked[other]
            return len(self._looked)

    def stopped_until(self, pid: int, until: float) -> None:
        """A child stopped by its pacing still works (its share is held for it)."""
        with self._lock:
            self._looked[pid] = until


_working = _Working()


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (its user and system ticks), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class _Late(Exception):
    """The deadline passed before the child spoke or listened."""


class _Gone(Exception):
    """The child's pipe closed: it exited."""


class _Child:
    """One child process; the parent's ends of its pipes are non-blocking, read and written
    within deadlines (a thread waiting on them does not hold the interpreter)."""

    def __init__(self, module: str, what: str, max_frame: int, cpu_share: float) -> None:
        self._share = cpu_share
        self._looked = time.monotonic()
        self._cpu: float | None = None  # its CPU when last looked at (None: not yet)
        self._process = subprocess.Popen(
            [sys.executable, "-c", LAUNCH.format(priority=LOWEST_PRIORITY, module=module,
                                                 parent=os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        assert self._process.stdin is not None and self._process.stdout is not None
        self._what = what
        self._max_frame = max_frame
        self._to = self._process.stdin.fileno()
        self._from = self._process.stdout.fileno()
        os.set_blocking(self._to, False)
        os.set_blocking(self._from, False)
        with contextlib.suppress(OSError):  # fewer wake-ups to read a large answer
            fcntl.fcntl(self._from, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        # poll, not select: a node's descriptors (LevelDB's files, clients) pass 1024
        self._writable, self._readable = select.poll(), select.poll()
        self._writable.register(self._to, select.POLLOUT)
        self._readable.register(self._from, select.POLLIN)
        self.ready = False  # told its settings, and said it is ready

    @property
    def pid(self) -> int:
        return self._process.pid

    def alive(self) -> bool:
        return self._process.poll() is None

    def send(self, payload: bytes, deadline: float) -> None:
        if len(payload) > self._max_frame:
            raise ChildFailure(f"a message of {len(payload)} bytes to the {self._what}")
        view = memoryview(FRAME_LENGTH.pack(len(payload)) + payload)
        while view:
            self._wait(deadline, writing=True)
            try:
                view = view[os.write(self._to, view):]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise _Gone from None

    def receive(self, deadline: float) -> bytes:
        (length,) = FRAME_LENGTH.unpack(self._read(FRAME_LENGTH.size, deadline))
        if length > self._max_frame:
            raise ChildFailure(f"a message of {length} bytes from the {self._what}")
        return self._read(length, deadline)

    def _read(self, size: int, deadline: float) -> bytes:
        chunks, left = [], size
        while left:
            self._wait(deadline, writing=False)
            try:
                chunk = os.read(self._from, min(left, 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise _Gone
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _wait(self, deadline: float, *, writing: bool) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Late
        if self._share < 1:  # woken to look at its CPU at least every PACE_SECONDS
            left = min(left, PACE_SECONDS)
        (self._writable if writing else self._readable).poll(math.ceil(left * 1000))
        self._pace()

    def _pace(self) -> None:
        """While the chain makes blocks the child computes at most its share of a core:
        every PACE_SECONDS of a request the parent looks at the CPU it took, and stops it
        (SIGSTOP) for (1/share - 1) times that. Why: on this 2-core machine a process
        computing at any priority (nice 19, even SCHED_IDLE) slowed the validators'
        consensus 1.6-1.9 times (their threads share the cores' caches and the hypervisor's
        time); and only from outside is all of it paced, a precompile or any C code and
        the work between two requests too (the attack review s13-rpc, findings 1 and 4:
        paced from inside, at its EVM's jumps, BLAKE2F computed a whole core until the
        deadline's kill, and calls shorter than a slice never rested)."""
        now = time.monotonic()
        if self._share >= 1 or now - self._looked < PACE_SECONDS:
            return  # (unpaced: a wait sleeps until the child speaks or its deadline)
        cpu = cpu_seconds(self.pid)
        worked = cpu - (cpu if self._cpu is None else self._cpu)
        self._cpu, self._looked = cpu, now
        share = self._share / _working.count(self.pid, now)  # the node's, among those working
        if worked > 0 and chain_busy():
            rest = worked * (1 / share - 1)
            _working.stopped_until(self.pid, now + rest)
            self._process.send_signal(signal.SIGSTOP)
            try:
                time.sleep(rest)
            finally:
                self._process.send_signal(signal.SIGCONT)
            self._looked = time.monotonic()

    def kill(self) -> str:
        """Kills it (if still running) and says how it ended."""
        self._process.kill()
        return self._reaped()

    def stop(self) -> None:
        """Closes its stdin (an idle child exits at once); killed if it is still running."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()
        else:
            self._reaped()

    def _reaped(self) -> str:
        code = self._process.wait()
        assert self._process.stdout is not None
        self._process.stdout.close()
        if self._process.stdin is not None:
            self._process.stdin.close()
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with status {code}"


# What the parent does with a message of the child's: the frame to answer it with, or None
# when the message is the request's answer.
Answerer = Callable[[list[bytes]], bytes | None]


class ChildProcess:
    """Requests to a child process (`python -m module`), one at a time, in a child started
    again after it dies. `settings` is its first frame; `failed` begins the errors of a
    request whose child died ("execution failed", "read failed"). With `raw_tail`, the last
    field of an answer (not of an error) comes in a frame of its own, not RLP: a large JSON
    answer is then neither encoded nor decoded (`child_main`'s `raw_tail` must agree)."""

    def __init__(self, module: str, what: str, failed: str, settings: bytes, *,
                 max_frame: int, max_items: int, raw_tail: bool = False,
                 cpu_share: float = 1.0) -> None:
        self._module = module
        self._share = cpu_share  # of a core, at most, while the chain makes blocks
        self._raw_tail = raw_tail
        self._what = what
        self._failed = failed
        self._settings = settings
        self._max_frame = max_frame
        self._max_items = max_items
        self._child: _Child | None = None

    @property
    def pid(self) -> int | None:
        return None if self._child is None else self._child.pid

    def start(self) -> None:
        """Starts the child unless one is running (it imports meanwhile; the first request
        tells it the settings and waits for it)."""
        if self._child is None or not self._child.alive():
            if self._child is not None:
                self._child.kill()
            self._child = _Child(self._module, self._what, self._max_frame, self._share)

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop()
            self._child = None

    def converse(self, request: bytes, seconds: float, answer: Answerer,
                 late: Callable[[], RpcError]) -> list[bytes]:
        """Sends `request` and answers the child's questions until its answer, which it
        returns (an error it raises); raises `late()` if that does not come within
        `seconds` (and the grace), a one-line ServerError if the child died."""
        self.start()
        assert self._child is not None
        child = self._child
        try:
            if not child.ready:
                self._await_ready(child)
            deadline = time.monotonic() + seconds + KILL_GRACE_SECONDS
            child.send(request, deadline)
            while True:
                message = self.decoded(child.receive(deadline))
                reply = answer(message)
                if reply is not None:
                    child.send(reply, deadline)
                elif message[0] in (ERROR, FAILURE):
                    raise self._refusal(message)
                else:
                    if self._raw_tail:
                        message.append(child.receive(deadline))
                    return message
        except _Late:
            self._discard()
            raise late() from None
        except _Gone:
            raise ServerError(f"{self._failed}: the {self._what} {self._discard()}; "
                              "the next call starts a new one") from None
        except RpcError:
            raise  # the request's answer (or a child discarded already)
        except BaseException:
            self._discard()  # the conversation broke off: a bug, or the database failed
            raise

    def _await_ready(self, child: _Child) -> None:
        """Tells a new child its settings and waits until it is ready (its imports done)."""
        deadline = time.monotonic() + START_SECONDS
        try:
            child.send(self._settings, deadline)
            message = self.decoded(child.receive(deadline))
        except _Late:
            self._discard()
            raise ServerError(f"{self._failed}: the {self._what} did not start within "
                              f"{START_SECONDS:g} s") from None
        if message != [READY]:
            raise ChildFailure(f"the {self._what} began with {message!r:.100}")
        child.ready = True

    def _discard(self) -> str:
        """Kills the child whose conversation broke off; how it ended."""
        assert self._child is not None
        ended = self._child.kill()
        self._child = None
        return ended

    def decoded(self, frame: bytes) -> list[bytes]:
        try:
            check_rlp_bounds(frame, max_depth=1, max_items=self._max_items,
                             max_list_items=self._max_items)
            message = rlp.decode(frame)
        except (rlp.exceptions.RLPException, ValueError):
            message = None
        if not (isinstance(message, list) and message
                and all(isinstance(field, bytes) for field in message)):
            raise ChildFailure(f"a malformed message from the {self._what}: {frame!r:.100}")
        return message

    def _refusal(self, message: list[bytes]) -> RpcError:
        """The request's error ([error, code, message(, data)]), as the in-process work
        raised it; a failure ([failure, text]: a bug) raises ChildFailure."""
        tag, fields = message[0], message[1:]
        if tag == ERROR and len(fields) in (2, 3):
            code, text = int(fields[0]), fields[1].decode()
            return RpcError(code, text, fields[2].decode() if len(fields) == 3 else None)
        if tag == FAILURE and len(fields) == 1:
            raise ChildFailure(f"the {self._what} failed: {fields[0].decode()}")
        raise ChildFailure(f"an unknown answer from the {self._what}: {message!r:.100}")


P = TypeVar("P", bound=ChildProcess)


class ChildPool(Generic[P]):
    """Children each doing one request at a time for whichever thread takes one (as many
    threads as children: one is always free for a thread)."""

    def __init__(self, processes: Sequence[P]) -> None:
        self._processes = list(processes)
        self._idle: queue.SimpleQueue[P] = queue.SimpleQueue()
        for process in self._processes:
            self._idle.put(process)

    @property
    def pids(self) -> list[int | None]:
        return [process.pid for process in self._processes]

    def start(self) -> None:
        for process in self._processes:
            process.start()

    @contextlib.contextmanager
    def taken(self) -> Iterator[P]:
        process = self._idle.get()
        try:
            yield process
        finally:
            self._idle.put(process)

    def close(self) -> None:
        """After the threads that use them ended (no request in flight)."""
        for process in self._processes:
            process.stop()


# The child's side.


class Channel:
    """Frames over two pipes (blocking: the child does nothing else meanwhile)."""

    def __init__(self, incoming: BinaryIO, outgoing: BinaryIO, max_frame: int) -> None:
        self._in = incoming
        self._out = outgoing
        self._max_frame = max_frame

    def receive(self) -> bytes | None:
        """The next frame; None when the parent closed the pipe (or left)."""
        head = self._in.read(FRAME_LENGTH.size)
        if len(head) < FRAME_LENGTH.size:
            return None
        (length,) = FRAME_LENGTH.unpack(head)
        if length > self._max_frame:
            raise ValueError(f"a frame of {length} bytes from the parent")
        payload = self._in.read(length)
        return payload if len(payload) == length else None

    def send(self, message: list[bytes]) -> None:
        payload = rlp.encode(message)
        self._out.write(FRAME_LENGTH.pack(len(payload)) + payload)
        self._out.flush()

    def send_raw(self, payload: bytes) -> None:
        self._out.write(FRAME_LENGTH.pack(len(payload)))
        self._out.write(payload)
        self._out.flush()

    def ask(self, message: list[bytes]) -> bytes:
        """The parent's answer to a question."""
        self.send(message)
        answer = self.receive()
        if answer is None:
            raise EOFError("the parent left")
        return answer


def error_message(exc: RpcError) -> list[bytes]:
    fields = [ERROR, str(exc.code).encode(), exc.message.encode()]
    if exc.data is not None:
        fields.append(str(exc.data).encode())
    return fields


class ByteBoundedCache:
    """Values by key, least recently used out first once they hold over `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._values: OrderedDict[bytes, bytes] = OrderedDict()

    def get(self, key: bytes) -> bytes | None:
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def put(self, key: bytes, value: bytes) -> None:
        size = len(key) + len(value) + ENTRY_BYTES
        if key in self._values or size > self.limit:
            return
        self._values[key] = value
        self.bytes += size
        while self.bytes > self.limit:
            old_key, old_value = self._values.popitem(last=False)
            self.bytes -= len(old_key) + len(old_value) + ENTRY_BYTES


# A child's work: made from its settings (the parent's first frame) and the channel it asks
# the parent on, it answers each request.
Answer = Callable[[Any], list[bytes]]


def serve(channel: Channel, start: Callable[[bytes, Channel], Answer], raw_tail: bool) -> None:
    """The conversation: the settings, then requests until the parent closes the pipe."""
    settings = channel.receive()
    if settings is None:
        return
    answer = start(settings, channel)
    channel.send([READY])
    try:
        while (frame := channel.receive()) is not None:
            message = _answered(answer, pickle.loads(frame))
            if raw_tail and message[0] not in (ERROR, FAILURE):
                channel.send(message[:-1])
                channel.send_raw(message[-1])
            else:
                channel.send(message)
    except (EOFError, BrokenPipeError):
        return  # the parent left mid-request


def _answered(answer: Answer, request: Any) -> list[bytes]:
    try:
        return answer(request)
    except (EOFError, BrokenPipeError):
        raise
    except Exception as exc:  # a bug: the parent answers "internal error" and logs it
        traceback.print_exc()
        return [FAILURE, f"{type(exc).__name__}: {exc}".encode()]


def child_main(start: Callable[[bytes, Channel], Answer], max_frame: int, *,
               raw_tail: bool = False) -> None:
    """A child's main (at the lowest priority since `LAUNCH`): ^C ignored, frames on the
    original stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C: the parent stops it
    # The frames go out on the original stdout; anything printed goes to stderr (the node's).
    outgoing = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(Channel(sys.stdin.buffer, outgoing, max_frame), start, raw_tail)
