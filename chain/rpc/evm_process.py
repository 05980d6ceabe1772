"""eth_call and eth_estimateGas in a process of their own, at the lowest CPU priority.

Why: every thread of the node shares one interpreter lock with the event loop that carries
consensus. An EVM thread kept it for its 5 ms switch interval at every turn, so each wake-up
of the loop (a vote, a commit) waited for it, and the block executor competed too: 4 clients
looping eth_call against the primary took the honest transfers' p50 / p99 from 29 / 36 ms to
128 / 297 ms (issue 29's hostile row), however the in-process governor paced the EVM. In a
child process at nice 19 (`python -m chain.rpc.evm_child`) the EVM holds its own interpreter,
and the kernel, not the interpreter lock, keeps it from the validator.

The child cannot open LevelDB (one process per database): it reads the chain keyspace
through the parent, one `get(key)` at a time, answered by the thread that asked for the
execution (a worker of the RPC's, never the event loop: a LevelDB get and a pipe write), and
keeps what is immutable (`chain.rpc.evm_child`). Each request carries the header of the block
to execute on, so the child never reads the canonical head.

The conversation, one request at a time over the child's stdin and stdout, in frames of a
4-byte length and at most MAX_FRAME_BYTES:
  parent: the chain (pickled: its chain id and system contracts), once
  child:  [ready]
  parent: an ExecutionRequest (pickled)
  child:  [get, key]  parent: FOUND + value or MISSING  (as many as it needs)
  child:  [output, bytes] | [error, code, message(, data)] | [failure, text]
What the child says is RLP, never pickled: it runs whatever code clients send.
A child that dies or overruns its deadline is killed; the call in flight gets a one-line
error and the next call starts a new child.
"""

from __future__ import annotations

import math
import os
import pickle
import queue
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import rlp

from chain.rpc.errors import RpcError, ServerError
from chain.system_contracts import SystemContract
from encoding.rlp import check_rlp_bounds
from storage import Keyspace

CHILD_MODULE = "chain.rpc.evm_child"
# A frame: a call's input is within the body limit (5 MiB), an output within what 50M gas of
# memory holds (~5 MB), a value of the chain keyspace (a trie node, code, a header) far less.
MAX_FRAME_BYTES = 16 * 1024 * 1024
FRAME_LENGTH = struct.Struct(">I")
# The child stops itself at the deadline (at its jumps and calls); this much later it is
# killed (it is starved at nice 19 on a busy machine, or stuck).
KILL_GRACE_SECONDS = 2.0
START_SECONDS = 60.0  # to import py-evm and build the chain, at nice 19 on a busy machine
STOP_SECONDS = 2.0  # for an idle child to exit when its stdin closes; then it is killed

MESSAGE_DEPTH, MESSAGE_ITEMS = 1, 5  # a message is one flat list: a tag and up to 3 fields
READY, GET, OUTPUT, ERROR, FAILURE = b"ready", b"get", b"output", b"error", b"failure"
FOUND, MISSING = b"\x01", b"\x00"


@dataclass(frozen=True)
class ExecutionRequest:
    """One eth_call (or eth_estimateGas: `estimate`), parsed and bounded by the parent."""

    estimate: bool
    header: bytes  # RLP: the block to execute on
    sender: bytes
    to: bytes  # b"": a contract creation
    data: bytes
    gas: int  # within the gas cap
    gas_price: int
    value: int
    timeout: float


def timeout_error(timeout: float) -> ServerError:
    return ServerError(f"execution aborted (timeout = {timeout:g}s)")


class EvmProcessFailure(Exception):
    """The child failed other than by the call's fault (a bug): an internal error."""


class _Late(Exception):
    """The deadline passed before the child spoke or listened."""


class _Gone(Exception):
    """The child's pipe closed: it exited."""


class _Child:
    """One child process; the parent's ends of its pipes are non-blocking, read and written
    within deadlines (a thread waiting on them does not hold the interpreter)."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, bufsize=0)
        assert self._process.stdin is not None and self._process.stdout is not None
        self._to = self._process.stdin.fileno()
        self._from = self._process.stdout.fileno()
        os.set_blocking(self._to, False)
        os.set_blocking(self._from, False)
        # poll, not select: a node's descriptors (LevelDB's files, clients) pass 1024
        self._writable, self._readable = select.poll(), select.poll()
        self._writable.register(self._to, select.POLLOUT)
        self._readable.register(self._from, select.POLLIN)
        self.ready = False  # told the chain, and said it is ready

    @property
    def pid(self) -> int:
        return self._process.pid

    def alive(self) -> bool:
        return self._process.poll() is None

    def send(self, payload: bytes, deadline: float) -> None:
        if len(payload) > MAX_FRAME_BYTES:
            raise EvmProcessFailure(f"a message of {len(payload)} bytes to the EVM process")
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
        if length > MAX_FRAME_BYTES:
            raise EvmProcessFailure(f"a message of {length} bytes from the EVM process")
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
        (self._writable if writing else self._readable).poll(math.ceil(left * 1000))

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


class EvmProcess:
    """Executes requests in a child process, one at a time, started again after it dies."""

    def __init__(self, chain_id: int, contracts: Sequence[SystemContract],
                 keyspace: Keyspace) -> None:
        self._chain = pickle.dumps((chain_id, tuple(contracts)))
        self._keyspace = keyspace
        self._child: _Child | None = None

    @property
    def pid(self) -> int | None:
        return None if self._child is None else self._child.pid

    def start(self) -> None:
        """Starts the child unless one is running (it imports py-evm meanwhile; the first
        request tells it the chain and waits for it)."""
        if self._child is None or not self._child.alive():
            if self._child is not None:
                self._child.kill()
            self._child = _Child()

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop()
            self._child = None

    def execute(self, request: ExecutionRequest) -> bytes:
        """The call's output (eth_estimateGas: the gas, big-endian); RpcError as the
        in-process execution raised it."""
        self.start()
        assert self._child is not None
        child = self._child
        try:
            if not child.ready:
                self._await_ready(child)
            deadline = time.monotonic() + request.timeout + KILL_GRACE_SECONDS
            child.send(pickle.dumps(request), deadline)
            while True:
                message = _decoded(child.receive(deadline))
                if message[0] != GET:
                    return _answer(message)
                child.send(self._lookup(message), deadline)
        except _Late:
            self._discard()
            raise timeout_error(request.timeout) from None
        except _Gone:
            raise ServerError(f"execution failed: the EVM process {self._discard()}; "
                              "the next call starts a new one") from None
        except RpcError:
            raise  # the call's answer (or a child discarded already)
        except BaseException:
            self._discard()  # the conversation broke off: a bug, or the database failed
            raise

    def _await_ready(self, child: _Child) -> None:
        """Tells a new child the chain and waits until it is ready (its imports done)."""
        deadline = time.monotonic() + START_SECONDS
        try:
            child.send(self._chain, deadline)
            message = _decoded(child.receive(deadline))
        except _Late:
            self._discard()
            raise ServerError(f"execution failed: the EVM process did not start within "
                              f"{START_SECONDS:g} s") from None
        if message != [READY]:
            raise EvmProcessFailure(f"the EVM process began with {message!r:.100}")
        child.ready = True

    def _lookup(self, message: list[bytes]) -> bytes:
        if len(message) != 2:
            raise EvmProcessFailure("a malformed get from the EVM process")
        value = self._keyspace.get(message[1])
        return MISSING if value is None else FOUND + value

    def _discard(self) -> str:
        """Kills the child whose conversation broke off; how it ended."""
        assert self._child is not None
        ended = self._child.kill()
        self._child = None
        return ended


def _decoded(frame: bytes) -> list[bytes]:
    try:
        check_rlp_bounds(frame, max_depth=MESSAGE_DEPTH, max_items=MESSAGE_ITEMS,
                         max_list_items=MESSAGE_ITEMS)
        message = rlp.decode(frame)
    except (rlp.exceptions.RLPException, ValueError):
        message = None
    if not (isinstance(message, list) and message
            and all(isinstance(field, bytes) for field in message)):
        raise EvmProcessFailure(f"a malformed message from the EVM process: {frame!r:.100}")
    return message


def _answer(message: list[bytes]) -> bytes:
    tag, fields = message[0], message[1:]
    if tag == OUTPUT and len(fields) == 1:
        return fields[0]
    if tag == ERROR and len(fields) in (2, 3):
        code, text = int(fields[0]), fields[1].decode()
        raise RpcError(code, text, fields[2].decode() if len(fields) == 3 else None)
    if tag == FAILURE and len(fields) == 1:
        raise EvmProcessFailure(f"the EVM process failed: {fields[0].decode()}")
    raise EvmProcessFailure(f"an unknown answer from the EVM process: {message!r:.100}")


class EvmProcesses:
    """`count` children, each executing one request at a time for whichever execution
    thread takes it (as many threads as children: one is always free for a thread)."""

    def __init__(self, count: int, chain_id: int, contracts: Sequence[SystemContract],
                 keyspace: Keyspace) -> None:
        self._processes = [EvmProcess(chain_id, contracts, keyspace) for _ in range(count)]
        self._idle: queue.SimpleQueue[EvmProcess] = queue.SimpleQueue()
        for process in self._processes:
            self._idle.put(process)

    @property
    def pids(self) -> list[int | None]:
        return [process.pid for process in self._processes]

    def start(self) -> None:
        for process in self._processes:
            process.start()

    def execute(self, request: ExecutionRequest) -> bytes:
        process = self._idle.get()
        try:
            return process.execute(request)
        finally:
            self._idle.put(process)

    def close(self) -> None:
        """After the execution threads ended (no request in flight)."""
        for process in self._processes:
            process.stop()
