"""The `pbft_chain` Spark data source: nodes' JSON-RPC as DataFrames.

    spark.read.format("pbft_chain").option("spans", json.dumps([[url, first, last, range], ...]))

`kind` = `blocks` (default): one bundle row per block (`schemas.BUNDLE`); every span is split
into partitions of at most `partition_blocks` blocks, each fetched by one task with batched
calls (`batch_blocks` blocks, 4 calls each, per request). `kind` = `view_changes` or
`evidence` (option `nodes`: [[url, last_view], ...]): one task per node. A node error is
retried with backoff; what still fails is left out with a warning (the audit judges the hole).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark_etl import schemas
from spark_etl.errors import EtlError, UsageError
from spark_etl.hexcodec import long
from spark_etl.rows import BlockPayload, Row, bundle_row, evidence_row, view_change_rows
from spark_etl.rpc import JsonRpcClient, RetryPolicy

DEFAULT_PARTITION_BLOCKS = 250
DEFAULT_BATCH_BLOCKS = 25
MAX_SPAN = 10_000  # pbft_getCheckpoints answers at most this many seqNos at once
VIEWS_PER_CALL = 1_000
MAX_VIEWS = 1_000_000  # views asked of one node at most: a thousand calls


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
        }


def block_calls(number: int) -> list[tuple[str, list[Any]]]:
    quantity = hex(number)
    return [
        ("eth_getBlockByNumber", [quantity, True]),
        ("eth_getBlockReceipts", [quantity]),
        ("debug_getRawBlock", [quantity]),
        ("pbft_getCommitCertificate", [quantity]),
    ]


CALLS_PER_BLOCK = len(block_calls(0))


def fetch_span(client: JsonRpcClient, span: Span, batch_blocks: int) -> Iterator[BlockPayload]:
    """The span's blocks in order, `batch_blocks` blocks per batched request, up to the
    first one the node does not serve."""
    checkpoints: dict[int, list[dict[str, Any]]] = {}
    for entry in client.call("pbft_getCheckpoints", hex(span.first), hex(span.last)) or []:
        checkpoints.setdefault(long(entry["seqNo"], "seqNo"), []).append(entry)
    for batch in span.split(batch_blocks):
        calls = [c for n in range(batch.first, batch.last + 1) for c in block_calls(n)]
        results = client.batch(calls)
        for offset, number in enumerate(range(batch.first, batch.last + 1)):
            block, receipts, raw, certificate = results[
                offset * CALLS_PER_BLOCK : (offset + 1) * CALLS_PER_BLOCK
            ]
            if block is None or receipts is None or raw is None:
                # The node serves no more of the span (a head it claimed but does not have):
                # the export keeps what it served and the audit reports what is missing
                # (block-range, block-gap); failing would let one node stop every export.
                return
            yield BlockPayload(block, receipts, raw, certificate, checkpoints.get(number, []))


class _Reader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def _client(self, node: str) -> JsonRpcClient:
        return JsonRpcClient(node, self.options.policy)


class BlockReader(_Reader):
    def partitions(self) -> Sequence[InputPartition]:
        size = self.options.partition_blocks
        return [InputPartition(part) for span in self.options.spans for part in span.split(size)]

    def read(self, partition: InputPartition) -> Iterator[Row]:
        span: Span = partition.value
        try:
            with self._client(span.node) as client:
                payloads = fetch_span(client, span, self.options.batch_blocks)
                for number, payload in enumerate(payloads, span.first):
                    row = _readable(lambda p=payload: bundle_row(span.node, span.range_start, p),
                                    f"{span.node}: block {number}")
                    if row is not None:
                        yield row
        except EtlError as exc:
            _left_out(f"{span.describe()} (from the first not yet exported)", exc)


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
        return BlockReader(options) if options.kind == "blocks" else NodeReader(options)

    def _options(self) -> ReadOptions:
        options = ReadOptions.parse(dict(self.options))
        if options.kind not in SCHEMAS:
            raise UsageError(f"pbft_chain: unknown kind {options.kind!r}")
        return options
