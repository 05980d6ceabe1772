"""The heavy reads answered in a process of their own, at the lowest CPU priority.

Why: whole-block reads (a full `eth_getBlockBy*`, `eth_getBlockReceipts`), the block bundles
(chain/rpc/bundles.py) and `eth_getLogs` over ranges decode records and format JSON in Python.
On the read workers' threads that work took turns at the interpreter lock with the event loop
that votes (~54% of samples each under 8 clients posting batches of heavy reads: the honest
transfers' p50 / p99 at 3.2 / 4.4 times those without them; issue 29's hostile row), however
the governor (chain/rpc/served.py) paced it. In a child at nice 19 (`python -m
chain.rpc.read_child`) it holds an interpreter of its own, as eth_call's does
(chain/rpc/evm_process.py; the frames and lifecycle are chain/rpc/child_process.py's).

Each read worker has a child (`ReadProcesses`). A read comes in two parts: on a read worker
its cheap part resolves the request's blocks (a tag, a hash, the bloom index's candidates)
and reads the head, and answers at once (a small block: chain/rpc/eth.py) or makes a
`ReadRequest`; a thread of the children's own (`ReadWorkers.waits`, one per child, not
governed: it only waits and reads LevelDB) sends it and answers the child's questions, so a
starved nice-19 child never holds a read worker (the attack review s12-rpc, finding 4):
`[blocks, numbers]` is answered with each block's stored header and its read-store
records, as stored, in one frame (per block two gets and one range read, ~13 us; a question
per block cost the worker ~10 times that in frames). The child never asks above the
request's head, so everything it reads is final (BFT), and it keeps it
(chain/rpc/read_child.py). Its answer is JSON, built in the child and spliced into the
response unparsed (`orjson.Fragment`).

The conversation, after the settings (the cache's bytes) and [ready]:
  parent: a ReadRequest (pickled)
  child:  [blocks, numbers]  parent: for each, its size and FOUND + header + records, or
          MISSING, until BLOCKS_ANSWER_BYTES  (as many questions as it needs)
  child:  [output] json | [parts, sizes] fragments | [error, code, message] | [failure, text]
          (the JSON in a frame of its own: `raw_tail`)
A child that dies or overruns the deadline is killed; the read in flight gets a one-line
error and the next read starts a new child. The bounds are the in-process reads': pending
reads (the workers' pool, and as many waiting for a child), the answers' bytes and results
(in the request), and a deadline.
"""

from __future__ import annotations

import pickle
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from eth.db.schema import SchemaV1
from eth_typing import BlockNumber

from chain.blockchain import Blockchain
from chain.rpc.child_process import FOUND, MISSING, ChildFailure, ChildPool, ChildProcess
from chain.rpc.errors import LIMIT_EXCEEDED, RpcError, ServerError
from chain.rpc.filters import LogCriteria
from chain.rpc.served import MAX_PENDING_READS, READ_WORKERS, WorkerPool

CHILD_MODULE = "chain.rpc.read_child"
# An answer: within the response byte limit (25 MB by default: a bundle's blocks stop at
# it); a block asked, its header and records (a full block of transfers: ~0.5 MB).
MAX_FRAME_BYTES = 64 * 1024 * 1024
MESSAGE_ITEMS = 5  # the list, a tag and up to 3 fields
READ_SECONDS = 30.0  # a read's deadline, in the child (as an HTTP client's usual timeout)
CACHE_BYTES = 64 * 1024 * 1024  # each child's: blocks read and the JSON made of them
# Of a core, at most, a read process computes while the chain makes blocks (as an
# eth_call's: chain/rpc/child_process.py's `_Child._pace`): with its cache cold (an
# attacker's ranges over a large chain) each computed full time.
READ_CPU_SHARE = 0.25
BLOCKS, OUTPUT, PARTS = b"blocks", b"output", b"parts"
SIZE = struct.Struct(">I")  # a part's size, in PARTS' sizes and BLOCKS' answers
NUMBER = struct.Struct(">Q")
MAX_BLOCKS_ASKED = 64  # blocks in one question
# An answer to a question holds blocks until it passes this; the child asks for the rest.
BLOCKS_ANSWER_BYTES = 8 * 1024 * 1024
# What a request asks the child for.
FULL_BLOCK, BLOCK_HASHES, RECEIPTS, BUNDLES, LOGS = "full", "hashes", "receipts", "bundles", "logs"


@dataclass(frozen=True)
class ReadRequest:
    """A read of committed blocks up to `head` (none above it exists for the child)."""

    kind: str
    head: int
    first: int  # the block (or the range's first)
    last: int = -1  # the range's last (bundles)
    numbers: tuple[int, ...] = ()  # the blocks to read (logs: the bloom index's candidates)
    criteria: LogCriteria | None = None  # logs
    max_results: int = 0  # logs, more: an error
    max_bytes: int = 0  # bundles: the answer stops before the block that passes it
    timeout: float = READ_SECONDS


def timeout_error(timeout: float) -> ServerError:
    return ServerError(f"read aborted (timeout = {timeout:g}s)")


def too_many_logs(max_results: int) -> RpcError:
    return RpcError(LIMIT_EXCEEDED, f"query returned more than {max_results} results")


def number_key(number: int) -> bytes:
    return number.to_bytes(8, "big")


def parts(message: list[bytes]) -> Iterator[bytes]:
    """The fragments of a [parts, sizes, fragments] answer."""
    if message[0] != PARTS or len(message) != 3 or len(message[1]) % SIZE.size:
        raise ChildFailure(f"an unknown answer from the read process: {message!r:.100}")
    at = 0
    fragments = message[2]
    for (size,) in SIZE.iter_unpack(message[1]):
        yield fragments[at:at + size]
        at += size


class ReadProcess(ChildProcess):
    """Reads in a child process, one at a time, started again after it dies."""

    def __init__(self, blockchain: Blockchain, cache_bytes: int = CACHE_BYTES) -> None:
        super().__init__(CHILD_MODULE, "read process", "read failed", pickle.dumps(cache_bytes),
                         max_frame=MAX_FRAME_BYTES, max_items=MESSAGE_ITEMS, raw_tail=True,
                         cpu_share=READ_CPU_SHARE)
        self._chain = blockchain.chain_keyspace
        self._store = blockchain.read_store

    def read(self, request: ReadRequest) -> list[bytes]:
        """The child's answer ([output, json] or [parts, ...]); RpcError as the in-process
        read raised it."""
        def lookup(message: list[bytes]) -> bytes | None:
            if message[0] != BLOCKS:
                return None
            asked = message[1] if len(message) == 2 else b""
            if not asked or len(asked) > MAX_BLOCKS_ASKED * NUMBER.size or len(asked) % NUMBER.size:
                raise ChildFailure("malformed blocks asked by the read process")
            return self._blocks(asked, request.head)

        return self.converse(pickle.dumps(request), request.timeout, lookup,
                             lambda: timeout_error(request.timeout))

    def _blocks(self, asked: bytes, head: int) -> bytes:
        """The blocks asked (packed numbers), each behind its size, until the answer passes
        BLOCKS_ANSWER_BYTES."""
        answer: list[bytes] = []
        size = 0
        for (number,) in NUMBER.iter_unpack(asked):
            block = self._block(number, head)
            answer += (SIZE.pack(len(block)), block)
            size += SIZE.size + len(block)
            if size > BLOCKS_ANSWER_BYTES:
                break
        return b"".join(answer)

    def _block(self, number: int, head: int) -> bytes:
        """A committed block's stored header and records (MISSING above the head: what the
        child keeps must be final)."""
        if number > head:
            return MISSING
        hash_rlp = self._chain.get(
            SchemaV1.make_block_number_to_hash_lookup_key(BlockNumber(number)))
        header = None if hash_rlp is None else self._chain.get(hash_rlp[1:])  # rlp(32 bytes)
        if header is None:
            return MISSING
        return b"".join((FOUND, header, self._store.encoded_records(number)))


class ReadProcesses(ChildPool[ReadProcess]):
    """A child per read worker (`count`), each reading for whichever worker takes it."""

    def __init__(self, count: int, blockchain: Blockchain,
                 cache_bytes: int = CACHE_BYTES) -> None:
        super().__init__([ReadProcess(blockchain, cache_bytes) for _ in range(count)])

    def read(self, request: ReadRequest) -> list[bytes]:
        with self.taken() as process:
            return process.read(request)


class ReadWorkers(WorkerPool):
    """The read workers, with a read child each (`children`), and a thread per child
    (`waits`) that waits for it: a read's cheap part runs on a read worker, its child's
    part is waited for apart, so a starved nice-19 child never holds a read worker (the
    attack review s12-rpc, finding 4)."""

    def __init__(self, blockchain: Blockchain, threads: int = READ_WORKERS,
                 max_pending: int = MAX_PENDING_READS, cache_bytes: int = CACHE_BYTES) -> None:
        super().__init__(threads, max_pending, "read")
        self.children = ReadProcesses(threads, blockchain, cache_bytes)
        # Each only waits on its child and answers its questions (LevelDB reads): not client
        # work of this interpreter's, so not governed (as eth_call's executions).
        self.waits = WorkerPool(threads, max_pending, "heavy read", governed=False)

    async def read(self, locate: Callable[..., Any], *args: Any) -> Any:
        """`locate(*args)` (the read's cheap part) on a read worker: its answer, or for a
        ReadRequest the child's JSON, waited for on a thread of `waits`."""
        located = await self.run(locate, *args)
        if isinstance(located, ReadRequest):
            return await self.waits.run(self.json, located)
        return located

    async def answer(self, request: ReadRequest) -> list[bytes]:
        """The child's answer, waited for on a thread of `waits`."""
        return await self.waits.run(self.in_child, request)

    def in_child(self, request: ReadRequest) -> list[bytes]:
        """The child's answer (blocking: on a thread of `waits`)."""
        return self.children.read(request)

    def json(self, request: ReadRequest) -> orjson.Fragment:
        """The JSON of an [output, json] answer, to splice into the response (blocking)."""
        message = self.in_child(request)
        if message[0] != OUTPUT or len(message) != 2:
            raise ChildFailure(f"an unknown answer from the read process: {message!r:.100}")
        return orjson.Fragment(message[1])

    def close(self) -> None:
        """The workers, the waits (each ends within its read's deadline), the children."""
        super().close()
        self.waits.close()
        self.children.close()
