"""The `pbft_chain` Spark data source: nodes' JSON-RPC as DataFrames.

    spark.read.format("pbft_chain").option("spans", json.dumps([[url, first, last, range], ...]))

`kind` = `blocks` (default): one bundle row per block (`schemas.BUNDLE`); every span is split
into partitions of at most `partition_blocks` blocks, each fetched by one task with batched
calls (`batch_blocks` blocks, 4 calls each, per request). `kind` = `export`: the same tasks,
each writing its blocks' rows of every block-range table to Parquet files itself (under the
option `staging`, a directory every task reaches: `tables.RangeWriter`), one row each of what
it wrote (`tables.WRITTEN`). `kind` = `view_changes` or
`evidence` (option `nodes`: [[url, last_view], ...]): one task per node. A node error is
retried with backoff; what still fails is left out with a warning (the audit judges the hole).
"""

from __future__ import annotations

import json
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark_etl import schemas
from spark_etl.errors import EtlError, ExtractError, UsageError
from spark_etl.hexcodec import long
from spark_etl.rows import (
    BlockBundle,
    BlockPayload,
    Row,
    block_bundle_row,
    bundle_row,
    evidence_row,
    view_change_rows,
)
from spark_etl.rpc import JsonRpcClient, MethodNotFound, RetryPolicy
from spark_etl.tables import ARROW_BUNDLE, WRITTEN, RangeWriter, to_record_batch

DEFAULT_PARTITION_BLOCKS = 100
DEFAULT_BATCH_BLOCKS = 25
MAX_SPAN = 10_000  # pbft_getCheckpoints answers at most this many seqNos at once
VIEWS_PER_CALL = 1_000
MAX_VIEWS = 1_000_000  # views asked of one node at most: a thousand calls
# The node's range method (chain/rpc/bundles.py): per block, the bytes every column derives
# from, in one answer; a node without it is asked the Ethereum calls of `block_calls`
BUNDLE_METHOD = "pbft_getBlockBundles"
IN_FLIGHT = 2  # requests at once per task: the node encodes one answer while the task reads one
Payload = BlockPayload | BlockBundle


@dataclass(frozen=True)
class Span:
    """Blocks first..last (inclusive) of one node, inside the range starting at range_start."""

    node: str
    first: int
    last: int
    range_start: int

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def split(self, blocks: int) -> list[Span]:
        return [
            Span(self.node, start, min(self.last, start + blocks - 1), self.range_start)
            for start in range(self.first, self.last + 1, blocks)
        ]

    def describe(self) -> str:
        return f"blocks {self.first}-{self.last} from {self.node}"


@dataclass(frozen=True)
class ReadOptions:
    """The data source's options, parsed (Spark hands them over as strings)."""

    kind: str
    spans: tuple[Span, ...]
    nodes: tuple[tuple[str, int], ...]
    partition_blocks: int
    batch_blocks: int
    policy: RetryPolicy
    staging: str = ""  # kind `export`: where the tasks write their files

    @classmethod
    def parse(cls, options: dict[str, str]) -> ReadOptions:
        partition_blocks = int(options.get("partition_blocks", DEFAULT_PARTITION_BLOCKS))
        if not 1 <= partition_blocks <= MAX_SPAN:
            raise UsageError(f"partition_blocks must be in 1..{MAX_SPAN}")
        return cls(
            kind=options.get("kind", "blocks"),
            spans=tuple(Span(*s) for s in json.loads(options.get("spans", "[]"))),
            nodes=tuple((url, int(view)) for url, view in json.loads(options.get("nodes", "[]"))),
            partition_blocks=partition_blocks,
            batch_blocks=int(options.get("batch_blocks", DEFAULT_BATCH_BLOCKS)),
            policy=RetryPolicy(
                attempts=int(options.get("attempts", RetryPolicy.attempts)),
                backoff=float(options.get("backoff", RetryPolicy.backoff)),
                timeout=float(options.get("timeout", RetryPolicy.timeout)),
            ),
            staging=options.get("staging", ""),
        )

    def as_strings(self) -> dict[str, str]:
        """The options to hand to `spark.read.format("pbft_chain").options(...)`."""
        return {
            "kind": self.kind,
            "spans": json.dumps([[s.node, s.first, s.last, s.range_start] for s in self.spans]),
            "nodes": json.dumps([list(n) for n in self.nodes]),
            "partition_blocks": str(self.partition_blocks),
            "batch_blocks": str(self.batch_blocks),
            "attempts": str(self.policy.attempts),
            "backoff": str(self.policy.backoff),
            "timeout": str(self.policy.timeout),
            "staging": self.staging,
        }


ChunkFetch = Callable[[JsonRpcClient, Span], list[Payload]]


def block_calls(number: int) -> list[tuple[str, list[Any]]]:
    quantity = hex(number)
    return [
        ("eth_getBlockByNumber", [quantity, True]),
        ("eth_getBlockReceipts", [quantity]),
        ("debug_getRawBlock", [quantity]),
        ("pbft_getCommitCertificate", [quantity]),
    ]


CALLS_PER_BLOCK = len(block_calls(0))


def _json_chunk(client: JsonRpcClient, chunk: Span) -> list[Payload]:
    """The chunk's blocks by the Ethereum calls (CALLS_PER_BLOCK a block) and
    pbft_getCheckpoints, in one batched request: what a node without BUNDLE_METHOD serves."""
    numbers = range(chunk.first, chunk.last + 1)
    calls = [("pbft_getCheckpoints", [hex(chunk.first), hex(chunk.last)])]
    results = client.batch(calls + [c for n in numbers for c in block_calls(n)])
    checkpoints: dict[int, list[dict[str, Any]]] = {}
    for entry in results[0] or []:
        checkpoints.setdefault(long(entry["seqNo"], "seqNo"), []).append(entry)
    payloads: list[Payload] = []
    for offset, number in enumerate(numbers):
        at = 1 + offset * CALLS_PER_BLOCK
        block, receipts, raw, certificate = results[at : at + CALLS_PER_BLOCK]
        if block is None or receipts is None or raw is None:
            break
        payloads.append(BlockPayload(block, receipts, raw, certificate,
                                     checkpoints.get(number, [])))
    return payloads


def _bundle_chunk(client: JsonRpcClient, chunk: Span) -> list[Payload]:
    """The chunk's blocks by BUNDLE_METHOD, asked again from the block after the last one
    answered (the node answers a prefix within its response byte limit)."""
    bundles: list[Payload] = []
    first = chunk.first
    while first <= chunk.last:
        answer = client.call(BUNDLE_METHOD, hex(first), hex(chunk.last))
        if not isinstance(answer, list) or len(answer) > chunk.last - first + 1:
            raise ExtractError(f"{BUNDLE_METHOD}: not a list of at most the blocks asked")
        if not answer:
            break
        bundles.extend(BlockBundle(first + i, entry) for i, entry in enumerate(answer))
        first += len(answer)
    return bundles


def _first_chunk(client: JsonRpcClient, chunk: Span) -> tuple[ChunkFetch, list[Payload]]:
    """The first chunk, and how to fetch the others: by BUNDLE_METHOD, or by the Ethereum
    calls from a node that does not serve it (a geth-like node: -32601)."""
    try:
        return _bundle_chunk, _bundle_chunk(client, chunk)
    except MethodNotFound:
        return _json_chunk, _json_chunk(client, chunk)


def fetch_span(client: JsonRpcClient, span: Span, batch_blocks: int) -> Iterator[Payload]:
    """The span's blocks in order, `batch_blocks` blocks per request, up to the first one
    the node does not serve."""
    chunks = span.split(batch_blocks)
    fetch, payloads = _first_chunk(client, chunks[0])
    for index, chunk in enumerate(chunks):
        if index:
            payloads = fetch(client, chunk)
        yield from payloads
        if len(payloads) < chunk.size:
            return


class _Clients(threading.local):
    client: JsonRpcClient | None = None


def fetch_chunks(span: Span, options: ReadOptions) -> Iterator[tuple[Span, list[Payload]]]:
    """`fetch_span`'s blocks, chunk by chunk, with up to IN_FLIGHT requests at once (each
    thread its own connection): the first chunk alone (it tells which methods the node
    serves), then the rest in order, up to the first block the node does not serve."""
    chunks = span.split(options.batch_blocks)
    local = _Clients()
    opened: list[JsonRpcClient] = []

    def client() -> JsonRpcClient:
        if local.client is None:
            local.client = JsonRpcClient(span.node, options.policy)
            opened.append(local.client)
        return local.client

    pending: deque[tuple[Span, Future[list[Payload]]]] = deque()
    with ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="fetch") as pool:
        try:
            fetch, payloads = pool.submit(lambda: _first_chunk(client(), chunks[0])).result()
            yield chunks[0], payloads
            if len(payloads) < chunks[0].size:
                return
            rest = iter(chunks[1:])
            for chunk in rest:
                pending.append((chunk, pool.submit(lambda c=chunk: fetch(client(), c))))
                if len(pending) < IN_FLIGHT:
                    continue
                chunk, future = pending.popleft()
                payloads = future.result()
                yield chunk, payloads
                if len(payloads) < chunk.size:
                    return
            while pending:
                chunk, future = pending.popleft()
                payloads = future.result()
                yield chunk, payloads
                if len(payloads) < chunk.size:
                    return
        finally:
            for _, future in pending:
                future.cancel()
            pool.shutdown(wait=True)
            for opened_client in opened:
                opened_client.close()


def payload_row(span: Span, payload: Payload) -> Row:
    if isinstance(payload, BlockBundle):
        return block_bundle_row(span.node, span.range_start, payload)
    return bundle_row(span.node, span.range_start, payload)


def record_batch(rows: list[Row], what: str) -> pa.RecordBatch:
    """Rows as one Arrow batch of `schemas.BUNDLE` (Spark takes it as it is, without
    converting each value in Python); a row Arrow refuses (a value out of its column's
    range, from a lying node) is left out alone."""
    try:
        return to_record_batch(rows, ARROW_BUNDLE)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        kept = [row for row in rows
                if _readable(lambda r=row: to_record_batch([r], ARROW_BUNDLE),
                             f"{what}: block {row[2][0]}") is not None]
        return to_record_batch(kept, ARROW_BUNDLE)


class _Reader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def _client(self, node: str) -> JsonRpcClient:
        return JsonRpcClient(node, self.options.policy)


class BlockReader(_Reader):
    def partitions(self) -> Sequence[InputPartition]:
        size = self.options.partition_blocks
        return [InputPartition(part) for span in self.options.spans for part in span.split(size)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from self._batches(partition.value)

    def _batches(self, span: Span) -> Iterator[pa.RecordBatch]:
        """The span's bundles, a batch per answer, up to the first block not served."""
        try:
            for chunk, payloads in fetch_chunks(span, self.options):
                rows = [
                    _readable(lambda p=payload: payload_row(span, p), f"{span.node}: block {n}")
                    for n, payload in enumerate(payloads, chunk.first)
                ]
                kept = [row for row in rows if row is not None]
                if kept:
                    yield record_batch(kept, span.node)
        except EtlError as exc:
            _left_out(f"{span.describe()} (from the first not yet exported)", exc)


class ExportReader(BlockReader):
    """Each task writes its own rows (no Spark job reads the bundles again per table) and
    yields what it wrote, if any block; a node's error keeps what came before it."""

    def read(self, partition: InputPartition) -> Iterator[Row]:
        span: Span = partition.value
        with RangeWriter(self.options.staging, span.node, span.range_start, span.first) as out:
            for batch in self._batches(span):
                out.write(batch)
        if out.counts["blocks"]:
            yield tuple(out.counts[name] for name in WRITTEN.names)


class NodeReader(_Reader):
    """One task per node for the consensus records that are not indexed by block."""

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(node) for node in self.options.nodes]

    def read(self, partition: InputPartition) -> Iterator[Row]:
        node, last_view = partition.value
        try:
            with self._client(node) as client:
                yield from self._rows(client, node, last_view)
        except EtlError as exc:
            _left_out(f"{self.options.kind} from {node} (from the first not yet exported)", exc)

    def _rows(self, client: JsonRpcClient, node: str, last_view: int) -> Iterator[Row]:
        if self.options.kind == "evidence":
            for entry in client.call("pbft_getEvidence") or []:
                row = _readable(lambda e=entry: evidence_row(node, e), f"{node}: evidence")
                if row is not None:
                    yield row
            return
        for start in range(0, min(last_view + 1, MAX_VIEWS), VIEWS_PER_CALL):
            end = min(last_view, start + VIEWS_PER_CALL - 1)
            page = client.call("pbft_getViewChanges", hex(start), hex(end)) or []
            if not page and start > 0:
                # A view is reached by view changes, each one installed: a thousand views
                # without one are no honest node's (its timers double each time), and a
                # view claimed at 2**63 must not cost 2**53 calls.
                return
            for installed in page:
                rows = _readable(lambda i=installed: view_change_rows(node, i),
                                 f"{node}: view change")
                yield from rows or []
        if last_view >= MAX_VIEWS:
            _left_out(f"{node}: view changes above view {MAX_VIEWS - 1}",
                      ValueError(f"the node claims view {last_view}"))


T = TypeVar("T")
# What a node's answer of the wrong shape raises while it becomes rows.
UNREADABLE = (EtlError, KeyError, TypeError, ValueError, AttributeError, IndexError)


def _readable(convert: Callable[[], T], what: str) -> T | None:
    """`convert()`, or None (and a warning on stderr) when the node's answer cannot become
    rows: a lying node must not stop the export, so its unreadable block or record is left
    out, and the audit reports it missing (block-gap, block-range, checkpoint-missing,
    view-change-missing) instead of giving no verdict."""
    try:
        return convert()
    except UNREADABLE as exc:
        _left_out(what, ValueError(f"the node's answer cannot be read ({type(exc).__name__}: "
                                   f"{exc})"))
        return None


def _left_out(what: str, reason: Exception) -> None:
    """A warning on stderr for what a node did not give. A node that answers errors (after
    the retries) or nonsense must not stop the export of the others: what it did not serve
    is left out, and the audit reports the hole against it (block-gap, block-range,
    node-behind, checkpoint-missing, view-change-missing). An honest node's outage is
    reported the same way; exporting again into the same --out fetches the hole."""
    print(f"pbft-etl: warning: {what} left out: {reason}", file=sys.stderr, flush=True)


SCHEMAS: dict[str, StructType] = {
    "blocks": schemas.BUNDLE,
    "export": WRITTEN,
    "view_changes": schemas.VIEW_CHANGES.schema,
    "evidence": schemas.EVIDENCE.schema,
}


class ChainDataSource(DataSource):
    """`spark.read.format("pbft_chain")`: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return "pbft_chain"

    def schema(self) -> StructType:
        return SCHEMAS[self._options().kind]

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._options()
        readers = {"blocks": BlockReader, "export": ExportReader}
        return readers.get(options.kind, NodeReader)(options)

    def _options(self) -> ReadOptions:
        options = ReadOptions.parse(dict(self.options))
        if options.kind not in SCHEMAS:
            raise UsageError(f"pbft_chain: unknown kind {options.kind!r}")
        if options.kind == "export" and not options.staging:
            raise UsageError("pbft_chain: kind 'export' needs the option staging")
        return options
