"""`pbft_getBlockBundles(first, last)`: what the audit ETL exports of a range of blocks, in
one answer, as the bytes the certificates bind rather than as JSON objects.

Per block: the RLP block (as `debug_getRawBlock`), each receipt's consensus encoding (what
the receipts root hashes), each transaction's sender (the read store's, recovered at
commit: the ETL would otherwise recover every signature itself; the audit checks them), the
commit certificate (as `pbft_getCommitCertificate`) and the checkpoints of that sequence
number (the entries of `pbft_getCheckpoints`). The ETL derives every column from these bytes,
so neither side formats or parses a JSON object per transaction.

Bounded before the work: at most MAX_BUNDLE_BLOCKS blocks asked (else -32602); the blocks,
their certificates and checkpoints are read on the read workers' threads, under the governor
of client work (chain/rpc/served.py), and the answer stops before the block that would
take it past the node's response byte limit (`BatchLimits.max_response_bytes`), the first
block always answered: the client asks again from the block after the last it got. The
answer also stops at the first block the node does not have (an empty list: none).

The certificates and checkpoints come from the engine's own `pbft_getCommitCertificate` and
`pbft_getCheckpoints` (the chain knows no engine), so the method is served by nodes whose
engine serves those, and by no other."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import rlp
from eth.abc import BlockHeaderAPI
from eth_bloom import BloomFilter

from chain.blockchain import Blockchain
from chain.read_store import TxRecord, encode_block
from chain.rpc.child_process import ByteBoundedCache
from chain.rpc.errors import InvalidParams
from chain.rpc.hexcodec import data, parse_quantity, quantity
from chain.rpc.read_process import BUNDLES, ReadRequest, ReadWorkers, parts
from chain.rpc.served import WorkerPool, paced

METHOD = "pbft_getBlockBundles"
CERTIFICATE_METHOD = "pbft_getCommitCertificate"
CHECKPOINTS_METHOD = "pbft_getCheckpoints"
MAX_BUNDLE_BLOCKS = 1_000  # blocks asked at once, as a batch's calls (BatchLimits.max_items)
# Answer bytes counted per block beside its hex: the JSON around it, its certificate (Q
# signed COMMITs of ~150 bytes, hex) and its checkpoints' proofs, when it has any
BLOCK_ALLOWANCE = 8 * 1024
# Certificates kept as JSON, by block (each of a committed block is permanent): decoding one
# cost the worker about what encoding the block did, and the blocks moved to a read process.
CERTIFICATE_CACHE_BYTES = 8 * 1024 * 1024
# Closed blocks (the read process's part with the certificate and checkpoints) as JSON, by
# block, once final: closing cost the node ~25 us a block, ~0.3 s of its interpreter for a
# batch of 25 bundles of 500 blocks (issue 29's hostile row). 32 MiB hold ~20,000 small blocks.
CLOSED_CACHE_BYTES = 32 * 1024 * 1024
EngineMethod = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class RawBlock:
    """One block's bytes, as the bundle serves them (hex)."""

    number: int
    block: str
    receipts: list[str]
    senders: list[str]

    def answer_bytes(self) -> int:
        """Bytes this block adds to the answer (an upper bound of the JSON)."""
        strings = (self.block, *self.receipts, *self.senders)
        return sum(len(s) + 3 for s in strings) + BLOCK_ALLOWANCE


def receipt_encoding(record: TxRecord) -> bytes:
    """The receipt's consensus encoding, byte for byte as py-evm's (eth/rlp/receipts.py):
    rlp([status, cumulative gas, bloom (256 bytes), [[address, [topics], data], ...]]),
    behind the transaction's type byte when it is typed (EIP-2718)."""
    bloom = BloomFilter()
    for log in record.logs:
        bloom.add(log.address)
        for topic in log.topics:
            bloom.add(topic)
    payload = rlp.encode([
        b"\x01" if record.status else b"",
        record.cumulative_gas_used,
        int(bloom).to_bytes(256, "big"),
        [[log.address, list(log.topics), log.data] for log in record.logs],
    ])
    return payload if record.raw[0] >= 0xC0 else record.raw[:1] + payload


def raw_block(header: BlockHeaderAPI, records: tuple[TxRecord, ...]) -> RawBlock:
    return RawBlock(
        number=header.block_number,
        block=data(encode_block(header, records)),
        receipts=[data(receipt_encoding(r)) for r in paced(records)],
        senders=[data(r.sender) for r in records],
    )


def parse_range(first: Any, last: Any) -> tuple[int, int]:
    start = parse_quantity(first, "first block", bits=64)
    stop = parse_quantity(last, "last block", bits=64)
    if stop < start or stop - start >= MAX_BUNDLE_BLOCKS:
        raise InvalidParams(
            f"a block range must be ascending and at most {MAX_BUNDLE_BLOCKS} blocks wide")
    return start, stop


class BlockBundles:
    def __init__(self, blockchain: Blockchain, reads: WorkerPool, max_answer_bytes: int,
                 engine: dict[str, EngineMethod]) -> None:
        self.blockchain = blockchain
        self.reads = reads
        self.max_answer_bytes = max_answer_bytes
        self.certificate = engine[CERTIFICATE_METHOD]
        self.checkpoints = engine[CHECKPOINTS_METHOD]
        self._certificates = ByteBoundedCache(CERTIFICATE_CACHE_BYTES)
        self._closed_blocks = ByteBoundedCache(CLOSED_CACHE_BYTES)
        self._cache_lock = threading.Lock()  # both caches: the read workers share them

    @classmethod
    def methods_for(cls, blockchain: Blockchain, reads: WorkerPool, max_answer_bytes: int,
                    engine: dict[str, EngineMethod]) -> dict[str, EngineMethod]:
        """{METHOD: handler} when the engine serves certificates and checkpoints, else {}."""
        if CERTIFICATE_METHOD not in engine or CHECKPOINTS_METHOD not in engine:
            return {}
        return {METHOD: cls(blockchain, reads, max_answer_bytes, engine).get_block_bundles}

    def _raw_blocks(self, first: int, last: int) -> list[RawBlock]:
        """Blocks first.. up to last, the first missing one, or the byte limit (on a read
        worker: LevelDB reads and encoding)."""
        blocks: list[RawBlock] = []
        size = 0
        for number in paced(range(first, last + 1)):
            header = self.blockchain.header_by_number(number)
            if header is None:
                break
            block = raw_block(header, self.blockchain.read_store.records(number))
            size += block.answer_bytes()
            if blocks and size > self.max_answer_bytes:
                break
            blocks.append(block)
        return blocks

    async def get_block_bundles(self, first: Any, last: Any) -> Any:
        start, stop = parse_range(first, last)
        if isinstance(self.reads, ReadWorkers):
            return await self._bundles_in_child(self.reads, start, stop)
        return await self.reads.run(self._bundles, start, stop)

    async def _bundles_in_child(self, reads: ReadWorkers, first: int,
                                last: int) -> orjson.Fragment:
        """The blocks' bytes from a read process (chain/rpc/read_process.py; waited for apart
        from the read workers) as JSON members, each closed on a read worker with its
        certificate and checkpoints."""
        request = await reads.run(self._request, first, last)
        blocks = list(parts(await reads.answer(request)))
        if not blocks:
            return orjson.Fragment(b"[]")
        return await reads.run(self._closing, first, blocks)

    def _request(self, first: int, last: int) -> ReadRequest:
        """On a read worker: the read process's request, up to the head."""
        return ReadRequest(BUNDLES, head=self.blockchain.head().block_number, first=first,
                           last=last, max_bytes=self.max_answer_bytes)

    def _closing(self, first: int, blocks: list[bytes]) -> orjson.Fragment:
        """On a read worker: the engine's methods on the worker's own event loop (as
        `_bundles`)."""
        return asyncio.run(self._closed(first, blocks))

    async def _closed(self, first: int, blocks: list[bytes]) -> orjson.Fragment:
        """The blocks' parts closed with their certificates and checkpoints. A block's is
        final (kept) once it has its certificate and a stable checkpoint is at or above it:
        the checkpoints below a stable one are never held again (core/log.py `stabilize`)."""
        checkpoints: dict[str, list[Any]] = {}
        stable = -1
        for entry in await self.checkpoints(quantity(first), quantity(first + len(blocks) - 1)):
            checkpoints.setdefault(entry["seqNo"], []).append(entry)
            if entry.get("stable") is True:
                stable = max(stable, int(entry["seqNo"], 16))
        closed = []
        for number, members in enumerate(paced(blocks), first):
            key = number.to_bytes(8, "big")
            with self._cache_lock:
                cached = self._closed_blocks.get(key)
            if cached is None:
                certificate = await self._certificate_json(number)
                cached = b"".join((
                    b"{", members, b',"certificate":', certificate, b',"checkpoints":',
                    orjson.dumps(checkpoints.get(quantity(number), [])), b"}"))
                if number <= stable and certificate != b"null":
                    with self._cache_lock:
                        self._closed_blocks.put(key, cached)
            closed.append(cached)
        return orjson.Fragment(b"[" + b",".join(closed) + b"]")

    async def _certificate_json(self, number: int) -> bytes:
        key = number.to_bytes(8, "big")
        with self._cache_lock:
            cached = self._certificates.get(key)
        if cached is not None:
            return cached
        certificate = await self.certificate(quantity(number))
        made = orjson.dumps(certificate)
        if certificate is not None:  # not yet written: asked again next time
            with self._cache_lock:
                self._certificates.put(key, made)
        return made

    def _bundles(self, first: int, last: int) -> list[dict[str, Any]]:
        """On a read worker, all of it: the certificates and checkpoints too (decoding a
        block's certificate costs about what encoding the block does: on the loop they were
        a third of its time under 8 clients asking for bundles). The engine's methods are
        coroutines that only read its records' keyspaces (LevelDB reads are thread-safe), so
        they run on the worker's own event loop, never touching the node's."""
        blocks = self._raw_blocks(first, last)
        return asyncio.run(self._bundled(first, blocks)) if blocks else []

    async def _bundled(self, first: int, blocks: list[RawBlock]) -> list[dict[str, Any]]:
        checkpoints: dict[str, list[Any]] = {}
        for entry in await self.checkpoints(quantity(first), quantity(blocks[-1].number)):
            checkpoints.setdefault(entry["seqNo"], []).append(entry)
        bundles = []
        for block in paced(blocks):
            number = quantity(block.number)
            bundles.append({
                "number": number,
                "block": block.block,
                "receipts": block.receipts,
                "senders": block.senders,
                "certificate": await self.certificate(number),
                "checkpoints": checkpoints.get(number, []),
            })
        return bundles
