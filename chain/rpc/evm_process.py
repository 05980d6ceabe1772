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
error and the next call starts a new child (the frames and the lifecycle are
chain/rpc/child_process.py's, shared with the heavy reads' process).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass

from chain.rpc.child_process import (
    FOUND,
    MISSING,
    ChildFailure,
    ChildPool,
    ChildProcess,
)
from chain.rpc.errors import ServerError
from chain.system_contracts import SystemContract
from storage import Keyspace

CHILD_MODULE = "chain.rpc.evm_child"
# A frame: a call's input is within the body limit (5 MiB), an output within what 50M gas of
# memory holds (~5 MB), a value of the chain keyspace (a trie node, code, a header) far less.
MAX_FRAME_BYTES = 16 * 1024 * 1024
MESSAGE_ITEMS = 5  # a message is one flat list: a tag and up to 3 fields
GET, OUTPUT = b"get", b"output"


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


class EvmProcess(ChildProcess):
    """Executes requests in a child process, one at a time, started again after it dies."""

    def __init__(self, chain_id: int, contracts: Sequence[SystemContract],
                 keyspace: Keyspace, cpu_share: float = 1.0) -> None:
        super().__init__(CHILD_MODULE, "EVM process", "execution failed",
                         pickle.dumps((chain_id, tuple(contracts))),
                         max_frame=MAX_FRAME_BYTES, max_items=MESSAGE_ITEMS,
                         cpu_share=cpu_share)
        self._keyspace = keyspace

    def execute(self, request: ExecutionRequest) -> bytes:
        """The call's output (eth_estimateGas: the gas, big-endian); RpcError as the
        in-process execution raised it."""
        message = self.converse(pickle.dumps(request), request.timeout, self._lookup,
                                lambda: timeout_error(request.timeout))
        if message[0] == OUTPUT and len(message) == 2:
            return message[1]
        raise ChildFailure(f"an unknown answer from the EVM process: {message!r:.100}")

    def _lookup(self, message: list[bytes]) -> bytes | None:
        if message[0] != GET:
            return None
        if len(message) != 2:
            raise ChildFailure("a malformed get from the EVM process")
        value = self._keyspace.get(message[1])
        return MISSING if value is None else FOUND + value


class EvmProcesses(ChildPool[EvmProcess]):
    """`count` children, each executing one request at a time for whichever execution
    thread takes it (as many threads as children: one is always free for a thread)."""

    def __init__(self, count: int, chain_id: int, contracts: Sequence[SystemContract],
                 keyspace: Keyspace, cpu_share: float = 1.0) -> None:
        super().__init__([EvmProcess(chain_id, contracts, keyspace, cpu_share)
                          for _ in range(count)])

    def execute(self, request: ExecutionRequest) -> bytes:
        with self.taken() as process:
            return process.execute(request)
