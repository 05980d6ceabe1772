"""`pbft-etl export`: nodes' chains and consensus records to Parquet, by block range.

The requested blocks are cut into aligned ranges of `range_size` blocks (the partitions on
disk). Ranges the manifest already holds are skipped (an interrupted export resumes); the
others are fetched in waves through the `pbft_chain` data source and each table's partitions
for those ranges are replaced (a re-run never duplicates rows); the manifest records a range
only after all its tables are written."""

from __future__ import annotations

import shutil
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_etl import schemas
from spark_etl.audit.context import ValidatorSet
from spark_etl.audit.validators import ADDRESS
from spark_etl.epochs import claimed_epochs, epoch_row
from spark_etl.errors import EtlError, ExtractError, UsageError
from spark_etl.head_anchor import check_head
from spark_etl.hexcodec import long
from spark_etl.rpc import JsonRpcClient, RetryPolicy
from spark_etl.source import (
    DEFAULT_BATCH_BLOCKS,
    DEFAULT_PARTITION_BLOCKS,
    MAX_VIEWS,
    ReadOptions,
    Span,
    fetch_span,
)
from spark_etl.tables import (
    is_local_path,
    local_frame,
    local_root,
    publish,
    split_bundle,
    table_path,
    write_table,
)

DEFAULT_RANGE_SIZE = 1_000
DEFAULT_LAG_WAIT = 5.0  # seconds a node behind --to is given to catch up
RETRIES_PER_RANGE = 3  # times a node's range is fetched again after a failure
LAG_POLL = 0.25  # seconds between eth_blockNumber polls of a node behind
STAGING = "_staging"  # under --out: a wave's files before they are put in place
Progress = Callable[[str], None]


@dataclass(frozen=True)
class ExportOptions:
    nodes: tuple[str, ...]
    out: str
    first: int | None = None
    last: int | None = None
    range_size: int = DEFAULT_RANGE_SIZE
    partition_blocks: int = DEFAULT_PARTITION_BLOCKS
    batch_blocks: int = DEFAULT_BATCH_BLOCKS
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    lag_wait: float = DEFAULT_LAG_WAIT
    # --genesis: each node's claimed head must be certified by this set (`head_anchor`);
    # None (--trust-node): the heads the nodes claim bound the export unchecked
    genesis: ValidatorSet | None = None

    def read_options(self, kind: str, spans: tuple[Span, ...] = (),
                     nodes: tuple[tuple[str, int], ...] = ()) -> dict[str, str]:
        return ReadOptions(
            kind, spans, nodes, self.partition_blocks, self.batch_blocks, self.policy
        ).as_strings()


@dataclass(frozen=True)
class NodeInfo:
    """What a node says about itself before the export starts."""

    url: str
    chain_id: int
    genesis_hash: str
    validators: tuple[str, ...]
    head: int
    # pbft_status's view; None for an observer, which names none (a validator voted out
    # that now observes still serves the view changes of its time: `export_consensus_records`)
    view: int | None
    # pbft_status's `validator`: the node's own address while it is a validator; None for an
    # observer (checkpoint-missing asks a validator voted in only for its own epochs' proofs)
    address: str | None = None


def _number(value: Any, what: str) -> int:
    """A quantity (or a JSON integer: pbft_status's view) that fits a 64-bit column."""
    return long(hex(value) if type(value) is int else value, what)


PROBE_CALLS = [
    ("eth_chainId", []),
    ("eth_getBlockByNumber", ["0x0", False]),
    ("pbft_getValidators", []),
    ("pbft_status", []),
    ("eth_blockNumber", []),
]


def probe(url: str, policy: RetryPolicy, genesis: ValidatorSet | None = None) -> NodeInfo:
    """What the node says about itself; with `genesis`, only if its claimed head is
    certified by that validator set (else ExtractError, as for an answer of the wrong
    shape)."""
    try:
        with JsonRpcClient(url, policy) as client:
            info = _node_info(url, client.batch(PROBE_CALLS))
            if genesis is not None:
                check_head(client, info.head, genesis)
    except ExtractError as exc:  # an answer of the wrong shape, or a head not certified
        raise ExtractError(f"{url}: {exc}") from None
    except EtlError as exc:
        raise ExtractError(f"{url}: {exc} (is it a running PBFT node?)") from None
    return info


def _node_info(url: str, answers: list[Any]) -> NodeInfo:
    chain_id, genesis, validators, status, head = answers
    try:
        return NodeInfo(
            url=url,
            chain_id=_number(chain_id, "eth_chainId"),
            genesis_hash=str(genesis["hash"]).lower(),
            validators=tuple(str(v).lower() for v in validators),
            head=_number(head, "eth_blockNumber"),
            view=_optional(status.get("view"), "pbft_status view"),
            # an observer names its node key (`node`): a validator voted out keeps its
            # address, so what it decided before it left is still asked of it
            address=_address(status.get("validator") or status.get("node")),
        )
    except (TypeError, KeyError, AttributeError) as exc:  # the wrong shape (null, no field)
        raise ExtractError(f"a malformed answer about the node ({exc!r})") from None


def _optional(value: Any, what: str) -> int | None:
    return None if value is None else _number(value, what)


def _address(value: Any) -> str | None:
    """pbft_status's `validator` (an observer's `node`), lower-case."""
    if value is None:
        return None
    if not isinstance(value, str) or not ADDRESS.match(value):
        raise TypeError(f"pbft_status validator {value!r} is not an address")
    return value.lower()


def check_same_chain(infos: list[NodeInfo], progress: Progress) -> None:
    """Nodes that report another chain id or block 0 than the first are exported all the
    same (refusing would let one lying node stop the export of the honest ones): the audit
    judges each against the genesis (chain-id, genesis-block). Say so now."""
    reference = infos[0]
    for info in infos[1:]:
        if (info.chain_id, info.genesis_hash) != (reference.chain_id, reference.genesis_hash):
            progress(f"warning: {info.url} and {reference.url} report different chain ids or "
                     "block 0 hashes: both are exported, the audit judges them")


def block_bounds(options: ExportOptions, infos: list[NodeInfo]) -> tuple[int, int]:
    """--from (default 0) .. --to (default: the highest head: a node that claims a lower
    head must not cut the others' export short; it is exported up to its own head). With
    --genesis every head in `infos` is certified (`probe`), so nothing above the highest
    certified head is planned, whatever a node claims later (`catch_up` raises a node's
    head only up to the bound found here)."""
    highest = max(infos, key=lambda i: i.head)
    first = 0 if options.first is None else options.first
    last = highest.head if options.last is None else options.last
    if last > highest.head:
        raise UsageError(f"--to {last} is above the head {highest.head} of {highest.url}")
    if first > last:
        raise UsageError(f"--from {first} is after --to {last}")
    return first, last


def _head(info: NodeInfo, policy: RetryPolicy) -> int:
    """The node's head now; the one it claimed before when it fails to answer one (a node
    behind that answers errors must not stop the others' export)."""
    try:
        with JsonRpcClient(info.url, policy) as client:
            return max(info.head, _number(client.call("eth_blockNumber"), "eth_blockNumber"))
    except EtlError:
        return info.head


def probe_all(options: ExportOptions, progress: Progress) -> list[NodeInfo]:
    """The nodes that answer what they are (`probe`), with --genesis only those whose
    claimed head the genesis validators certified; one that does not is left out with a
    warning (a lying node must not stop the others' export), unless none answers."""
    infos, failures = [], []
    for url in options.nodes:
        try:
            infos.append(probe(url, options.policy, options.genesis))
        except ExtractError as exc:
            failures.append(exc)
    if not infos:
        raise failures[0]
    for failure in failures:
        progress(f"warning: {failure}: the node is left out of the export and the audit")
    return infos


def catch_up(infos: list[NodeInfo], last: int, options: ExportOptions,
             progress: Progress) -> list[NodeInfo]:
    """`infos` with the heads of the nodes behind `last` polled again until they reach it or
    --lag-wait runs out (an honest node a block or two behind catches up in that time); a
    node still behind is exported up to its head and the audit reports it (node-behind)."""
    deadline = time.monotonic() + options.lag_wait
    infos = list(infos)
    behind = [i for i, info in enumerate(infos) if info.head < last]
    while behind and time.monotonic() < deadline:
        time.sleep(min(LAG_POLL, max(0.0, deadline - time.monotonic())))
        for index in behind:
            infos[index] = replace(infos[index], head=_head(infos[index], options.policy))
        behind = [i for i in behind if infos[i].head < last]
    for index in behind:
        info = infos[index]
        progress(f"{info.url} reports head {info.head}, behind --to {last} after "
                 f"{options.lag_wait:g} s: exporting it up to its head (the audit reports it)")
    return infos


Done = dict[tuple[str, int], tuple[int, int]]


@dataclass
class Plan:
    """The spans still to fetch, made lazily, ordered by range then node, each node's up to
    its head in `heads` if lower than `last`. A range the manifest covers is skipped; one it
    holds partly is fetched whole again (what it held and what is asked), so that replacing
    its partitions loses nothing. A node in `stopped` gets no more spans: a node that did
    not serve a block it was asked for is not asked for the blocks above it, so a head
    claimed at 2**63 costs one range, not 2**53 (the audit reports what it did not serve).
    A node `paused` (it answered errors) is planned again once the others are done, and a
    span is fetched again at most RETRIES_PER_RANGE times in all."""

    nodes: tuple[str, ...]
    first: int
    last: int
    range_size: int
    done: Done = field(default_factory=dict)
    heads: Mapping[str, int] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    again: deque[Span] = field(default_factory=deque)  # spans to fetch once more, first
    retried: Counter[tuple[str, int]] = field(default_factory=Counter)  # (node, range_start)
    paused: dict[str, int] = field(default_factory=dict)  # node -> range to resume from
    _next: dict[str, int] = field(init=False)  # each node's next range to plan

    def __post_init__(self) -> None:
        if len(set(self.nodes)) != len(self.nodes):
            raise UsageError("a node is listed twice: give each --rpc URL once")
        self._next = dict.fromkeys(self.nodes, self.first - self.first % self.range_size)

    def node_last(self, node: str) -> int:
        return min(self.last, self.heads.get(node, self.last))

    def next_wave(self, spans: int) -> list[Span]:
        """About `spans` spans (a range's spans are not split), the ones to fetch again
        first, then the lowest range any node still has to fetch; [] when the plan is done.
        Made when asked for: a node stopped by then gets no more spans."""
        wave: list[Span] = []
        while len(wave) < spans:
            if self.again:
                wave.append(self.again.popleft())
                continue
            active = [n for n in self.nodes
                      if n not in self.stopped and self._next[n] <= self.node_last(n)]
            if not active and not self._resume_paused():
                break
            if not active:
                continue
            start = min(self._next[n] for n in active)
            for node in active:
                if self._next[node] == start:
                    self._next[node] += self.range_size
                    if (span := self._span(node, start)) is not None:
                        wave.append(span)
        return wave

    def fetch_again(self, span: Span) -> bool:
        """Queue `span` once more (whole: its range's partitions are replaced), unless its
        range was fetched again RETRIES_PER_RANGE times already."""
        if not self._retry(span.node, span.range_start):
            return False
        self.again.append(span)
        return True

    def pause(self, node: str, range_start: int) -> None:
        """Stop `node` (it answered an error) until the other nodes are done; then it is
        planned once more from its range at `range_start` (a restart outlasted the retries),
        while that range has retries left."""
        self.stopped.add(node)
        self.paused[node] = min(range_start, self.paused.get(node, range_start))

    def _resume_paused(self) -> bool:
        resumed = False
        for node, start in list(self.paused.items()):
            del self.paused[node]
            if self._retry(node, start):
                self.stopped.discard(node)
                self._next[node] = start
                resumed = True
        return resumed

    def _retry(self, node: str, range_start: int) -> bool:
        if self.retried[(node, range_start)] >= RETRIES_PER_RANGE:
            return False
        self.retried[(node, range_start)] += 1
        return True

    def _span(self, node: str, start: int) -> Span | None:
        want = (max(start, self.first), min(start + self.range_size - 1, self.node_last(node)))
        if want[0] > want[1]:
            return None  # the node is behind this range
        have = self.done.get((node, start))
        if have is not None and have[0] <= want[0] and have[1] >= want[1]:
            return None
        if have is not None:
            want = (min(want[0], have[0]), max(want[1], have[1]))
        return Span(node, want[0], want[1], start)

    def held(self) -> list[tuple[str, int]]:
        """The (node, range) pairs of the plan that the manifest already covers."""
        low = self.first - self.first % self.range_size
        return [(node, start) for node, start in self.done
                if node in self.nodes and low <= start <= self.last
                and self._within(node, start) > 0 and self._span(node, start) is None]

    def blocks(self) -> int:
        """Blocks to fetch at most: the asked ones of every node, less those held."""
        asked = sum(max(0, self.node_last(node) - self.first + 1) for node in self.nodes)
        return asked - sum(self._within(node, start) for node, start in self.held())

    def _within(self, node: str, start: int) -> int:
        return max(0, min(start + self.range_size - 1, self.node_last(node))
                   - max(start, self.first) + 1)


def plan_spans(nodes: tuple[str, ...], first: int, last: int, range_size: int,
               done: Done, heads: Mapping[str, int] | None = None) -> list[Span]:
    """Every span of the plan, for nodes that serve every block they are asked for."""
    plan = Plan(nodes, first, last, range_size, done, heads or {})
    return [span for wave in iter(lambda: plan.next_wave(1), []) for span in wave]


def short_spans(wave: list[Span], counts: list[dict[str, Any]]) -> list[tuple[Span, int]]:
    """Every span of the wave that its node served only in part (an error after the retries,
    a null, an unreadable answer), with the first block it may not have served: after the
    last one when what it served is a prefix of the span, else the span's first (a task in
    the middle failed: where is not known)."""
    served = {(row["node"], row["range_start"]): row for row in counts}
    short = []
    for span in wave:
        row = served.get((span.node, span.range_start))
        if row is None or row["first_block"] != span.first \
                or row["blocks"] != row["last_block"] - row["first_block"] + 1:
            short.append((span, span.first))
        elif row["last_block"] != span.last:
            short.append((span, row["last_block"] + 1))
    return short


def read_done(spark: SparkSession, options: ExportOptions, infos: list[NodeInfo]) -> Done:
    """What the manifest of an earlier export into --out holds for these nodes."""
    path = table_path(options.out, schemas.EXPORT_MANIFEST)
    if is_local_path(options.out) and not Path(path.removeprefix("file://")).exists():
        return {}
    rows = spark.read.schema(schemas.EXPORT_MANIFEST.schema).parquet(path).collect()
    genesis = {info.url: info.genesis_hash for info in infos}
    for row in rows:
        if genesis.get(row["node"], row["genesis_hash"]) != row["genesis_hash"]:
            raise UsageError(f"{options.out} holds an export of another chain from "
                             f"{row['node']}: use another --out")
        if row["range_size"] != options.range_size:
            raise UsageError(
                f"{options.out} was exported with --range-size {row['range_size']}: use that"
            )
    # A row of a node that had no block to export holds nothing, nor one with a hole inside
    # (a partition task in the middle failed): its range is fetched whole again.
    return {(r["node"], r["range_start"]): (r["first_block"], r["last_block"]) for r in rows
            if r["first_block"] is not None
            and r["blocks"] == r["last_block"] - r["first_block"] + 1}


COUNTED = [t.name for t in schemas.NESTED_TABLES]  # the tables nested in a fetched block


@dataclass
class ExportSummary:
    skipped: int  # (node, range) pairs the manifest already held
    # (node, range_start) -> rows written per table; a range fetched again replaces its own
    ranges: dict[tuple[str, int], dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def rows(self) -> dict[str, int]:
        """Rows written per table."""
        return {table: sum(r[table] for r in self.ranges.values())
                for table in ("blocks", *COUNTED)}

    @property
    def nodes(self) -> set[str]:
        """The nodes that served a block."""
        return {node for node, _ in self.ranges}

    @property
    def blocks(self) -> int:
        """Blocks fetched, summed over the nodes."""
        return self.rows["blocks"]

    def add(self, counts: list[dict[str, Any]]) -> None:
        for row in counts:
            self.ranges[(row["node"], row["range_start"])] = {
                table: row[table] or 0 for table in ("blocks", *COUNTED)}


def range_counts(bundle: DataFrame) -> list[dict[str, Any]]:
    """Per (node, range_start) of fetched bundles: first and last block and rows per table."""
    rows = (
        bundle.groupBy("node", "range_start")
        .agg(
            F.min("block.number").alias("first_block"),
            F.max("block.number").alias("last_block"),
            F.count("*").alias("blocks"),
            *(F.sum(F.size(name)).alias(name) for name in COUNTED),
        )
        .collect()
    )
    return [row.asDict() for row in rows]


def manifest_rows(counts: list[dict[str, Any]], infos: dict[str, NodeInfo], range_size: int,
                  asked: tuple[int, int] | None = None) -> list[tuple[Any, ...]]:
    """The export_manifest rows of the ranges in `counts` (as `range_counts` gives them), of
    an export that asked for blocks `asked` (default 0..the highest head, as `export` does
    without --from and --to)."""
    now = datetime.now(UTC)
    first, last = asked or (0, max(info.head for info in infos.values()))
    rows = []
    for row in counts:
        info = infos[row["node"]]
        values = {
            **row,
            **{name: row[name] or 0 for name in COUNTED},
            "asked_first": first,
            "asked_last": last,
            "node_head": info.head,
            "range_size": range_size,
            "chain_id": info.chain_id,
            "genesis_hash": info.genesis_hash,
            "validators": list(info.validators),
            "validator": info.address,
            "exported_at": now,
        }
        rows.append(tuple(values[n] for n in schemas.EXPORT_MANIFEST.schema.names))
    return rows


def written_counts(written: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`range_counts` of what the export tasks wrote (`tables.WRITTEN`, a row per task)."""
    ranges: dict[tuple[str, int], dict[str, Any]] = {}
    for row in written:
        key = (row["node"], row["range_start"])
        if key not in ranges:
            ranges[key] = dict(row)
            continue
        merged = ranges[key]
        merged["first_block"] = min(merged["first_block"], row["first_block"])
        merged["last_block"] = max(merged["last_block"], row["last_block"])
        for table in ("blocks", *COUNTED):
            merged[table] += row[table]
    return list(ranges.values())


def write_by_tasks(spark: SparkSession, options: ExportOptions,
                   wave: list[Span]) -> list[dict[str, Any]]:
    """Fetch the wave's spans, each task writing its rows of every block-range table itself
    (one pass over the blocks, no Spark job per table), into a staging directory that the
    driver then moves into --out by range (`publish`): a re-run replaces a range whole, and
    what a killed export staged is removed by the next wave. Only for an --out that the
    tasks reach as local files (`is_local_path`): on a cluster, a directory shared by the
    machines."""
    root = local_root(options.out)
    staging = str(Path(root, STAGING))
    shutil.rmtree(staging, ignore_errors=True)
    try:
        written = (
            spark.read.format("pbft_chain")
            .options(**{**options.read_options("export", tuple(wave)), "staging": staging})
            .load()
            .collect()
        )
        counts = written_counts([row.asDict() for row in written])
        publish(staging, root, [(row["node"], row["range_start"]) for row in counts])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return counts


def write_by_spark(spark: SparkSession, options: ExportOptions,
                   wave: list[Span]) -> list[dict[str, Any]]:
    """Fetch the wave's spans once and write every block-range table with Spark's writer (an
    --out the tasks cannot write as files, such as hdfs:// or s3a://).

    The fetched bundles are kept in memory, spilled to disk where they do not fit (Spark's
    columnar cache): each table's write and the counts read them again; read back from disk
    (DISK_ONLY) they made the export of 92,000 transactions 13% slower (2026-11-26)."""
    bundle = (
        spark.read.format("pbft_chain")
        .options(**options.read_options("blocks", tuple(wave)))
        .load()
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        counts = range_counts(bundle)
        for name, frame in split_bundle(bundle).items():
            write_table(frame, options.out, schemas.BY_NAME[name])
    finally:
        bundle.unpersist()
    return counts


def export_wave(spark: SparkSession, options: ExportOptions, wave: list[Span],
                infos: dict[str, NodeInfo], asked: tuple[int, int],
                summary: ExportSummary) -> list[tuple[Span, int]]:
    """Fetch the wave's spans once, write every block-range table, then the manifest; the
    first block each node that served less than asked did not serve (`short_spans`).
    Each task writes its own files when it can reach --out (`write_by_tasks`: the bundles
    are not read again by a Spark job per table, the main cost left after they became Arrow
    batches, docs/performance.md), else Spark's writer does (`write_by_spark`)."""
    write = write_by_tasks if is_local_path(options.out) else write_by_spark
    counts = write(spark, options, wave)
    manifest = manifest_rows(counts, infos, options.range_size, asked)
    write_table(local_frame(spark, manifest, schemas.EXPORT_MANIFEST.schema), options.out,
                schemas.EXPORT_MANIFEST)
    summary.add(counts)
    return short_spans(wave, counts)


def ask_again(rest: Span, options: ExportOptions) -> str | None:
    """What the node answers when asked once more, as the export asked it, for the first
    blocks of `rest`, which it did not serve: the error (after the retries), "" when it
    still serves less (a null: it has no such block), None when it serves them now."""
    batch = replace(rest, last=min(rest.last, rest.first + options.batch_blocks - 1))
    try:
        with JsonRpcClient(rest.node, options.policy) as client:
            served = sum(1 for _ in fetch_span(client, batch, options.batch_blocks))
    except EtlError as exc:
        return str(exc)
    return None if served == batch.size else ""


@dataclass
class Stops:
    """Why each node stopped early: the blocks it did not serve and its error ("" for a
    null answer: it has no such block)."""

    refused: dict[str, tuple[Span, str]] = field(default_factory=dict)

    def settle(self, plan: Plan, short: list[tuple[Span, int]], options: ExportOptions,
               progress: Progress) -> None:
        """The node of the `short` spans (all its own) is asked once more for the lowest
        block it did not serve. Serving it now, it had a passing failure: every short span
        is fetched again. A null: it is stopped, asked for nothing above. An error: it is
        paused, and planned again once the other nodes are done."""
        span, first_missing = min(short, key=lambda s: s[1])
        node = span.node
        rest = replace(span, first=first_missing)
        answer = ask_again(rest, options)
        if answer is None and all(plan.fetch_again(s) for s, _ in short):
            progress(f"{node} serves block {first_missing} now: fetching "
                     f"{', '.join(s.describe() for s, _ in short)} again")
            return
        if answer is None:  # served when asked alone, not within its span's tasks: what
            answer = ""  # cannot be read (a lie) or a flapping node, left to the audit
        if answer:
            plan.pause(node, span.range_start)
        else:
            plan.stopped.add(node)
        self.refused[node] = (replace(rest, last=plan.node_last(node)), answer)
        progress(f"{node} did not serve all of {rest.describe()} (see the warnings above): "
                 "the blocks above are not asked for now (the audit reports what is missing)")

    def settle_wave(self, plan: Plan, short: list[tuple[Span, int]], options: ExportOptions,
                    progress: Progress) -> None:
        by_node: dict[str, list[tuple[Span, int]]] = {}
        for span, first_missing in short:
            by_node.setdefault(span.node, []).append((span, first_missing))
        for node_short in by_node.values():
            self.settle(plan, node_short, options, progress)

    def fail_if_no_node_served(self, plan: Plan) -> None:
        """An error from a node is left to the audit while another node served every block
        it was asked for (a node that answers errors must not stop the export of the
        others). When none did and each answers errors, the export has nothing whole to
        judge: ExtractError naming the first, so that a re-run resumes from the manifest."""
        errors = [f"{rest.describe()}: {error}" for node, (rest, error) in self.refused.items()
                  if error and node in plan.stopped]
        if len(errors) == len(plan.nodes):
            raise ExtractError(errors[0])


def record_nodes_without_blocks(spark: SparkSession, options: ExportOptions,
                                infos: dict[str, NodeInfo], asked: tuple[int, int],
                                done: Done, served: set[str]) -> None:
    """A node that served no block (its head is below --from, or it answered nothing
    readable) gets a manifest row with none: it records that the node was asked and the head
    it claimed, so block-range and node-behind judge it (a node without a row would be
    judged by nothing), in the range of --from, unless an earlier export holds a range of
    it."""
    start = asked[0] - asked[0] % options.range_size
    empty = {"range_start": start, "first_block": None, "last_block": None, "blocks": 0,
             **dict.fromkeys(COUNTED, 0)}
    held = {node for node, _ in done} | served
    counts = [{**empty, "node": url} for url in infos if url not in held]
    if counts:
        rows = manifest_rows(counts, infos, options.range_size, asked)
        write_table(local_frame(spark, rows, schemas.EXPORT_MANIFEST.schema), options.out,
                    schemas.EXPORT_MANIFEST)


def export_epochs(spark: SparkSession, options: ExportOptions, infos: list[NodeInfo],
                  last: int, progress: Progress) -> None:
    """epochs: the sets each node says decide blocks 1..`last` (a few requests per node, on
    the driver). A node that does not answer them is left out of the table with a warning:
    the audit counts with the sets the other nodes report, checked against every block."""
    rows = []
    for info in infos:
        try:
            with JsonRpcClient(info.url, options.policy) as client:
                epochs = claimed_epochs(client, min(last, info.head))
        except EtlError as exc:
            progress(f"warning: {info.url}: its validator-set epochs are left out ({exc})")
            continue
        rows.extend(epoch_row(info.url, epoch) for epoch in epochs)
    if rows:
        write_table(local_frame(spark, rows, schemas.EPOCHS.schema), options.out,
                    schemas.EPOCHS)


def export_consensus_records(spark: SparkSession, options: ExportOptions,
                             infos: list[NodeInfo]) -> None:
    """view_changes and evidence: each node's whole record, one task per node. An observer
    names no view: its view changes (a validator voted out keeps those of its time) are
    asked for up to the first page without one (`source.NodeReader`)."""
    nodes = tuple((info.url, MAX_VIEWS - 1 if info.view is None else info.view)
                  for info in infos)
    for table in (schemas.VIEW_CHANGES, schemas.EVIDENCE):
        frame: DataFrame = (
            spark.read.format("pbft_chain")
            .options(**options.read_options(table.name, nodes=nodes))
            .load()
        )
        write_table(frame, options.out, table)


def blocks_per_second(blocks: int, seconds: float) -> str:
    """A rate as people read it: one decimal below 10 (a small chain is not "0 blocks/s")."""
    rate = blocks / max(seconds, 1e-9)
    return f"{rate:.1f}" if rate < 10 else f"{rate:.0f}"


def export(spark: SparkSession, options: ExportOptions, progress: Progress) -> ExportSummary:
    started = time.monotonic()
    infos = probe_all(options, progress)
    check_same_chain(infos, progress)
    first, last = block_bounds(options, infos)
    infos = catch_up(infos, last, options, progress)
    done = read_done(spark, options, infos)
    plan = Plan(tuple(info.url for info in infos), first, last, options.range_size, done,
                {info.url: info.head for info in infos})
    total = plan.blocks()
    summary = ExportSummary(skipped=len(plan.held()))
    progress(
        f"exporting blocks {first}..{last} from {len(infos)} node(s) to {options.out}: "
        f"{total} blocks to fetch, {summary.skipped} range(s) already exported"
    )
    by_url = {info.url: info for info in infos}
    stops = Stops()
    per_wave = 2 * max(1, spark.sparkContext.defaultParallelism)
    for wave in iter(lambda: plan.next_wave(per_wave), []):
        short = export_wave(spark, options, wave, by_url, (first, last), summary)
        stops.settle_wave(plan, short, options, progress)
        elapsed = time.monotonic() - started
        progress(f"{summary.blocks}/{total} blocks ({100 * summary.blocks // max(total, 1)}%), "
                 f"{blocks_per_second(summary.blocks, elapsed)} blocks/s")
    stops.fail_if_no_node_served(plan)
    record_nodes_without_blocks(spark, options, by_url, (first, last), done, summary.nodes)
    export_consensus_records(spark, options, infos)
    export_epochs(spark, options, infos, last, progress)
    summary.seconds = time.monotonic() - started
    return summary
