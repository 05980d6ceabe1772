"""The process that answers a node's heavy reads (`python -m chain.rpc.read_child`, started by
chain/rpc/read_process.py, which describes the conversation).

It runs at nice 19 and reads committed blocks through its parent (`ParentBlocks`): a block's
header and records in one question. It never asks for a block above the request's head, and
every committed block is final (BFT: never replaced), so all it reads it may keep: the stored
blocks, and the JSON made of them (a full block, its receipts, its bundle part), in one cache
bounded in bytes. The JSON is built by the in-process code (chain/rpc/served.py's
`ServedBlock`, chain/rpc/bundles.py's `raw_block`, chain/rpc/filters.py's `matching_logs`), so
the answers are the same.
"""

from __future__ import annotations

import functools
import pickle
import time
from collections.abc import Callable, Iterator, Sequence

import orjson
import rlp
from eth.abc import BlockHeaderAPI
from eth.vm.header import HeaderSedes

from chain.read_store import TxRecord, encode_block
from chain.rpc.bundles import raw_block
from chain.rpc.child_process import (
    FOUND,
    ByteBoundedCache,
    Channel,
    ChildFailure,
    child_main,
    error_message,
)
from chain.rpc.errors import RpcError, ServerError
from chain.rpc.filters import matching_logs
from chain.rpc.read_process import (
    BLOCK_HASHES,
    BLOCKS,
    BUNDLES,
    FULL_BLOCK,
    LOGS,
    MAX_BLOCKS_ASKED,
    MAX_FRAME_BYTES,
    NUMBER,
    OUTPUT,
    PARTS,
    RECEIPTS,
    SIZE,
    ReadRequest,
    number_key,
    timeout_error,
    too_many_logs,
)
from chain.rpc.served import ServedBlock

# Room in a frame for the answer's RLP around its JSON.
MAX_ANSWER_BYTES = MAX_FRAME_BYTES - 1024


class _Late(Exception):
    """The request's deadline passed (checked between blocks)."""


def _split(stored: bytes) -> tuple[BlockHeaderAPI, tuple[TxRecord, ...]]:
    """A block as the parent sends it: its header's RLP, then its records' (see read_store)."""
    header_end = _item_end(stored, 0)
    header = rlp.decode(stored[:header_end], sedes=HeaderSedes)
    records = []
    at = header_end
    while at < len(stored):
        end = _item_end(stored, at)
        records.append(TxRecord.decode(stored[at:end]))
        at = end
    return header, tuple(records)


def _item_end(data: bytes, at: int) -> int:
    """Where the RLP list at `at` ends."""
    prefix = data[at]
    if prefix < 0xF8:
        return at + 1 + prefix - 0xC0
    size = prefix - 0xF7
    return at + 1 + size + int.from_bytes(data[at + 1:at + 1 + size], "big")


class ParentBlocks:
    """Committed blocks through the parent, and what is made of them, kept (all final)."""

    def __init__(self, channel: Channel, cache: ByteBoundedCache) -> None:
        self._channel = channel
        self._cache = cache
        self.deadline = float("inf")

    def block(self, number: int) -> tuple[BlockHeaderAPI, tuple[TxRecord, ...]]:
        return _split(self.stored([number])[number])

    def stored(self, numbers: Sequence[int]) -> dict[int, bytes]:
        """The blocks as stored (at most MAX_BLOCKS_ASKED), the ones not kept asked for in
        as few questions as the parent's answers allow."""
        found = {}
        for number in numbers:
            kept = self._cache.get(_block_key(number))
            if kept is not None:
                found[number] = kept
        missing = [number for number in numbers if number not in found]
        while missing:
            answer = self._channel.ask([BLOCKS, b"".join(map(NUMBER.pack, missing))])
            at = 0
            while at < len(answer):
                (size,) = SIZE.unpack_from(answer, at)
                at += SIZE.size
                block, at = answer[at:at + size], at + size
                number = missing.pop(0)
                if block[:1] != FOUND:
                    raise ChildFailure(f"block {number}, at or below the head, is missing")
                found[number] = block[1:]
                self._cache.put(_block_key(number), block[1:])
        return found

    def made(self, kind: str, number: int, make: Callable[[], bytes]) -> bytes:
        """`make()`'s JSON of block `number`, kept (checked against the deadline first)."""
        self.check()
        key = kind.encode() + b"/" + number_key(number)
        value = self._cache.get(key)
        if value is None:
            value = make()
            self._cache.put(key, value)
        return value

    def check(self) -> None:
        """Between blocks: the request's deadline."""
        if time.monotonic() > self.deadline:
            raise _Late

    def is_made(self, kind: str, number: int) -> bool:
        return self._cache.get(kind.encode() + b"/" + number_key(number)) is not None


def _block_key(number: int) -> bytes:
    return b"block/" + number_key(number)


def _chunks(numbers: Sequence[int]) -> Iterator[Sequence[int]]:
    for start in range(0, len(numbers), MAX_BLOCKS_ASKED):
        yield numbers[start:start + MAX_BLOCKS_ASKED]


class Reader:
    def __init__(self, blocks: ParentBlocks) -> None:
        self._blocks = blocks
        self._kinds: dict[str, Callable[[ReadRequest], list[bytes]]] = {
            FULL_BLOCK: self._full, BLOCK_HASHES: self._hashes, RECEIPTS: self._receipts,
            BUNDLES: self._bundles, LOGS: self._logs}

    def answer(self, request: ReadRequest) -> list[bytes]:
        self._blocks.deadline = time.monotonic() + request.timeout
        try:
            answer = self._kinds[request.kind](request)
        except _Late:
            return error_message(timeout_error(request.timeout))
        except RpcError as exc:
            return error_message(exc)
        if sum(map(len, answer)) > MAX_ANSWER_BYTES:
            return error_message(ServerError(
                f"an answer of over {MAX_ANSWER_BYTES} bytes: ask for fewer blocks"))
        return answer

    def _served(self, number: int) -> ServedBlock:
        header, records = self._blocks.block(number)
        return ServedBlock(header, len(encode_block(header, records)), records)

    def _full(self, request: ReadRequest) -> list[bytes]:
        return [OUTPUT, self._blocks.made(FULL_BLOCK, request.first, lambda: orjson.dumps(
            self._served(request.first).json(True)))]

    def _hashes(self, request: ReadRequest) -> list[bytes]:
        return [OUTPUT, self._blocks.made(BLOCK_HASHES, request.first, lambda: orjson.dumps(
            self._served(request.first).json(False)))]

    def _receipts(self, request: ReadRequest) -> list[bytes]:
        return [OUTPUT, self._blocks.made(RECEIPTS, request.first, lambda: orjson.dumps(
            self._served(request.first).receipts))]

    def _bundle_part(self, number: int, stored: bytes | None) -> bytes:
        """The block's bundle without its certificate and checkpoints (the parent's: the
        engine's), behind its answer bytes as bundles.RawBlock counts them."""
        block = raw_block(*(self._blocks.block(number) if stored is None else _split(stored)))
        json = orjson.dumps({"number": hex(number), "block": block.block,
                             "receipts": block.receipts, "senders": block.senders})
        return SIZE.pack(block.answer_bytes()) + json[1:-1]  # the object's members

    def _bundles(self, request: ReadRequest) -> list[bytes]:
        """Blocks first.. up to last, the head, or the byte limit (the first always), as
        chain/rpc/bundles.py's `_raw_blocks`."""
        sizes: list[bytes] = []
        fragments: list[bytes] = []
        total = 0
        numbers = range(request.first, min(request.last, request.head) + 1)
        for chunk in _chunks(numbers):
            stored = self._blocks.stored([n for n in chunk if not self._blocks.is_made(BUNDLES, n)])
            for number in chunk:
                made = self._blocks.made(BUNDLES, number, functools.partial(
                    self._bundle_part, number, stored.get(number)))
                (answer_bytes,) = SIZE.unpack_from(made)
                total += answer_bytes
                if fragments and total > request.max_bytes:
                    return [PARTS, b"".join(sizes), b"".join(fragments)]
                fragments.append(made[SIZE.size:])
                sizes.append(SIZE.pack(len(made) - SIZE.size))
        return [PARTS, b"".join(sizes), b"".join(fragments)]

    def _logs(self, request: ReadRequest) -> list[bytes]:
        assert request.criteria is not None
        logs: list[bytes] = []
        numbers = [n for n in request.numbers if n <= request.head]
        for chunk in _chunks(numbers):
            self._blocks.check()
            stored = self._blocks.stored(chunk)
            for number in chunk:
                for log in matching_logs(request.criteria, *_split(stored[number])):
                    if len(logs) == request.max_results:
                        raise too_many_logs(request.max_results)
                    logs.append(orjson.dumps(log))
        return [OUTPUT, b"[" + b",".join(logs) + b"]"]


def start(cache_bytes: bytes, channel: Channel) -> Callable[[ReadRequest], list[bytes]]:
    return Reader(ParentBlocks(channel, ByteBoundedCache(pickle.loads(cache_bytes)))).answer


def main() -> None:
    child_main(start, MAX_FRAME_BYTES, raw_tail=True)


if __name__ == "__main__":
    main()
