"""What every audit rule works with: the data set, the validator set, and helpers to run
Python over partitions (Arrow batches) and to shape violations."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from threading import RLock
from typing import Any

import pyarrow as pa
import rlp
from eth_hash.auto import keccak
from pyspark.accumulators import Accumulator
from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from pbft_engine.quorum import max_faulty, quorum, view_change_quorum
from spark_etl.hexcodec import from_hex, to_hex
from spark_etl.tables import Dataset, to_record_batch


def validators_hash(addresses: Iterable[str]) -> str:
    """keccak256(rlp(sorted 20-byte addresses)), 0x hex: what block n's extraData holds for
    the set that decides n+1 (the chain's definition: `pbft_engine.epoch_feed.validators_hash`)."""
    return to_hex(keccak(rlp.encode(sorted(from_hex(a) for a in addresses))))


Change = tuple[int, tuple[str, ...]]  # a set change: the first block it decides, the set


@dataclass(frozen=True)
class ValidatorSet:
    """The validators in replica order (lower-case 0x addresses) and the chain they sign for;
    from a genesis file also its checkpoint interval K and the hash its block 0 must have.
    `changes`: the sets voted in after genesis, by first block (the epochs table's), each
    counted only for the heights it decides: the `*_at` columns take a height column."""

    addresses: tuple[str, ...]
    chain_id: int
    checkpoint_interval: int | None = None  # K: None when the set was not read from genesis
    genesis_hash: str | None = None  # lower-case 0x hash of block 0 built from the genesis
    changes: tuple[Change, ...] = ()
    # The genesis file's overrides (config.pbft.transitions): sets that take over without a
    # vote, so the block before each commits to the set the old schedule named, not theirs
    overrides: tuple[Change, ...] = ()
    max_in_flight: int = 2  # config.pbft.max_in_flight: how far an override may carry blocks

    @property
    def size(self) -> int:
        return len(self.addresses)

    @property
    def quorum(self) -> int:
        return quorum(self.size)

    @property
    def max_faulty(self) -> int:
        return max_faulty(self.size)

    @property
    def view_change_quorum(self) -> int:
        return view_change_quorum(self.size)

    def epochs(self) -> list[Change]:
        """(first block, set) of every epoch, the genesis set's first."""
        return [(1, self.addresses), *self.changes]

    def epoch_table(self) -> list[dict[str, Any]]:
        """Every epoch as the report shows it (the columns of the epochs table)."""
        epochs = self.epochs()
        return [{"epoch": number, "first_block": first,
                 "last_block": epochs[number + 1][0] - 1 if number + 1 < len(epochs) else None,
                 "validators": list(addresses), "validators_hash": validators_hash(addresses),
                 "n": len(addresses), "f": max_faulty(len(addresses)),
                 "quorum": quorum(len(addresses))}
                for number, (first, addresses) in enumerate(epochs)]

    def members(self) -> tuple[str, ...]:
        """Every address of any epoch, in order of first appearance."""
        return tuple(dict.fromkeys(a for _, s in self.epochs() for a in s))

    def set_at(self, height: int) -> tuple[str, ...]:
        return [s for first, s in self.epochs() if first <= max(height, 1)][-1]

    def _at(self, height: Column | None, value: Callable[[tuple[str, ...]], Column]) -> Column:
        """`value` of the set that decides `height` (None: the genesis set)."""
        return self._epoch_at(height, lambda _, addresses: value(addresses))

    def _epoch_at(self, height: Column | None,
                  value: Callable[[int, tuple[str, ...]], Column]) -> Column:
        """`value` of the number and set of the epoch that decides `height` (None: genesis)."""
        column = value(0, self.addresses)
        if height is None:
            return column
        for number, (first, addresses) in enumerate(self.changes, 1):  # the latest tested first
            column = F.when(height >= first, value(number, addresses)).otherwise(column)
        return column

    def epoch_at(self, height: Column) -> Column:
        """The number of the epoch that decides `height`: what its messages must name."""
        return self._epoch_at(height, lambda number, _: F.lit(number))

    def size_at(self, height: Column) -> Column:
        return self._at(height, lambda s: F.lit(len(s)))

    def quorum_at(self, height: Column) -> Column:
        return self._at(height, lambda s: F.lit(quorum(len(s))))

    def view_change_quorum_at(self, height: Column) -> Column:
        return self._at(height, lambda s: F.lit(view_change_quorum(len(s))))

    def hash_at(self, height: Column) -> Column:
        """The validators_hash of the set that decides `height`."""
        return self._at(height, lambda s: F.lit(validators_hash(s)))

    def address_of(self, replica: Column, height: Column | None = None) -> Column:
        """validators[replica] of `height`'s set, or null for an index outside it."""

        def of(addresses: tuple[str, ...]) -> Column:
            array = F.array(*(F.lit(a) for a in addresses))
            inside = (replica >= 0) & (replica < len(addresses))
            return F.when(inside, F.element_at(array, (replica + 1).cast("int")))

        return self._at(height, of)

    def array_at(self, height: Column) -> Column:
        """The set that decides `height`, as an array column in replica order."""
        return self._at(height, lambda s: F.array(*(F.lit(a) for a in s)))

    def contains(self, address: Column, height: Column | None = None) -> Column:
        return self._at(height, lambda s: address.isin(list(s)))

    def first_member_height(self, address: Column) -> Column:
        """The first block of the first epoch whose set counts `address`; null for an
        address no epoch counts."""
        column = F.lit(None).cast("long")
        for first, addresses in reversed(self.epochs()):  # the earliest epoch is tested first
            column = F.when(address.isin(list(addresses)), F.lit(first)).otherwise(column)
        return column


# Up to this many bytes of exported tables (Parquet, as Spark's planner estimates them: the
# files' sizes), the audit's passes over every row (signature recovery, the per-block column
# checks, the rows' digests) run in one partition too, inside the rules' one job: their
# ~145 us a transaction take a few seconds on one core. An estimate: 10,000-20,000
# transactions (a hex hash does not compress: about 1 KB each with its receipt and
# certificate share).
ONE_PARTITION_BYTES = 16 * 1024 * 1024
# Up to this many bytes (some hundreds of transactions) the passes' Python runs on the
# driver, over their inputs' rows collected as Arrow: the same functions, and no Python
# worker. On a 5-block chain the passes take milliseconds, but the rules' job waited
# seconds on them: for a worker forked and fed, and each stage that reads a pass for the
# one task that caches it. What the driver collects is bounded by this (times the tables'
# compression).
DRIVER_BYTES = 1024 * 1024
# How Spark plans and runs the rules' query, which reads every table in one partition (the
# passes' results and the consensus tables are a few rows a block): no shuffle, and nothing
# that only pays off on many rows. So it is one Spark job of a few dozen one-task stages
# (independent stages run side by side) instead of some 150 jobs (each broadcast and each
# adaptive query stage was a job of 1-2 tasks, each paying its scheduling however few rows
# it held; the rules' joins are keyed by message, node, view and block alike, so no one
# partitioning of the tables would have spared their shuffles).
ONE_PARTITION = {
    # a join of two inputs in one partition needs no shuffle (EnsureRequirements) when
    # their estimated size is below this: Spark's estimate of a join multiplies its inputs'
    "spark.sql.maxSinglePartitionBytes": str(2**62),
    # what still needs a shuffle (an input that is not known to be in one partition, like
    # a full outer join's output) shuffles into one partition, not 200
    "spark.sql.shuffle.partitions": "1",
    # no broadcast join: each would be a job of its own, to send rows that are already there
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    # not adaptive: there is no shuffle to adapt, and an adaptive plan does not say it is in
    # one partition (every join with a cached frame would shuffle)
    "spark.sql.adaptive.enabled": "false",
    # no semi or anti join pushed below a table's coalesce: it would read the table's
    # partitions, and shuffle them
    "spark.sql.optimizer.excludedRules":
        "org.apache.spark.sql.catalyst.optimizer.PushDownLeftSemiAntiJoin",
    # interpreted, not compiled: compiling each of the hundreds of operators' Java code
    # (Janino) cost more than running them over a few thousand rows (on the test chain:
    # the query's CPU time 22 s -> 15 s)
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# How a large export's cached passes are planned: each is one Spark job whose shuffles are
# stages of it (adaptive execution ran every exchange as a job of its own, as was every
# broadcast), into PARALLEL_SHUFFLES partitions a core: room for uneven blocks, and a task
# costs little beside its blocks' Python work
PARALLEL = {
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.sql.adaptive.enabled": "false",
}
PARALLEL_SHUFFLES = 2


ArrowFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
RowFunction = Callable[[dict[str, Any]], Iterable[tuple[Any, ...]]]


@dataclass(frozen=True)
class Tables:
    """The tables as a cached pass reads them: in one partition (a small export's), or in
    the partitions they were read in (a large one's, the work spread over the cores).
    `on_driver`: the passes' Python runs on the driver (a tiny export's, in one partition)."""

    data: Dataset
    one_partition: bool
    on_driver: bool = False

    def map_in_arrow(self, frame: DataFrame, function: ArrowFunction,
                     schema: StructType) -> DataFrame:
        """`frame.mapInArrow(function, schema)`: in Python workers, or on the driver over
        `frame` collected (one job), the result a frame of its rows in one partition."""
        if not self.on_driver:
            return frame.mapInArrow(function, schema)
        batches = list(function(iter(frame.toArrow().to_batches())))
        table = pa.Table.from_batches(batches, schema=to_arrow_schema(schema))
        return frame.sparkSession.createDataFrame(table, schema).coalesce(1)

    def flat_map_rows(self, frame: DataFrame, function: RowFunction,
                      schema: StructType) -> DataFrame:
        """Python `function(row dict) -> output rows` over every row of `frame`, through
        Arrow batches (bounded by spark.sql.execution.arrow.maxRecordsPerBatch)."""
        arrow_schema = to_arrow_schema(schema)

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                rows = [out for row in batch.to_pylist() for out in function(row)]
                yield to_record_batch(rows, arrow_schema)

        return self.map_in_arrow(frame, run, schema)

    def union(self, first: DataFrame, *others: DataFrame) -> DataFrame:
        """`union_all`, kept in one partition when the tables are in one (a union has a
        partition per part: grouping or joining it would shuffle)."""
        frame = union_all(first, *others)
        return frame.coalesce(1) if self.one_partition else frame


@dataclass
class Audit:
    """One audit run: rules read `data` (every table in one partition) and share what
    `cached` keeps (the recovered `signatures`, the column checks, the row digests).
    `one_partition` (None: decided from the data's size) runs the cached passes in one
    partition as well; else each is a parallel job of its own before the rules'.
    `on_driver` (None: by the size; only in one partition) runs their Python on the driver."""

    data: Dataset
    validators: ValidatorSet
    one_partition: bool | None = None
    on_driver: bool | None = None
    _cache: dict[str, DataFrame] = field(default_factory=dict)
    _building: RLock = field(default_factory=RLock)  # rules are built on several threads
    # CPU time the Python workers (or the driver) spent recovering signatures (the per-core
    # rate's divisor)
    recovery_cpu_seconds: Accumulator[float] = field(init=False)
    tables: Tables = field(init=False)  # what the cached passes read

    def __post_init__(self) -> None:
        spark = self.data.blocks.sparkSession
        self.recovery_cpu_seconds = spark.sparkContext.accumulator(0.0)
        if self.one_partition is None or self.on_driver is None:
            size = self.data.estimated_bytes()
            if self.one_partition is None:
                self.one_partition = size <= ONE_PARTITION_BYTES
            if self.on_driver is None:
                self.on_driver = self.one_partition and size <= DRIVER_BYTES
        if self.on_driver and not self.one_partition:
            raise ValueError("the passes run on the driver only in one partition")
        parallel = self.data
        self.data = self.data.in_one_partition()
        self.tables = Tables(self.data if self.one_partition else parallel, self.one_partition,
                             self.on_driver)

    def cached(self, name: str, build: Callable[[Tables], DataFrame]) -> DataFrame:
        """`build(self.tables)` computed once per audit and kept for every rule: in one
        partition, cached by the first task that reads it (no job of its own, but on the
        driver one to collect the pass's input); else a local checkpoint of the parallel
        pass (one job: `PARALLEL`), read by the rules as one partition."""
        with self._building:
            if name not in self._cache:
                self._cache[name] = self._build(build)
            return self._cache[name]

    def _build(self, build: Callable[[Tables], DataFrame]) -> DataFrame:
        if self.one_partition:
            with self.planning():  # cache() plans its query now
                return build(self.tables).cache()
        with self._configured(self._parallel()):
            frame = build(self.tables).localCheckpoint(eager=True)
        return frame.coalesce(1)

    def planning(self) -> AbstractContextManager[None]:
        """Spark plans and runs queries in here as the rules want (`ONE_PARTITION`)."""
        return self._configured(ONE_PARTITION)

    def _parallel(self) -> dict[str, str]:
        cores = self.data.blocks.sparkSession.sparkContext.defaultParallelism
        return {**PARALLEL, "spark.sql.shuffle.partitions": str(PARALLEL_SHUFFLES * cores)}

    @contextmanager
    def _configured(self, settings: dict[str, str]) -> Iterator[None]:
        """Spark plans and runs queries in here with `settings` (the session's, after)."""
        conf = self.data.blocks.sparkSession.conf
        before: dict[str, str | None] = {key: conf.get(key, None) for key in settings}
        for key, value in settings.items():
            conf.set(key, value)
        try:
            yield
        finally:
            for key, previous in before.items():
                if previous is None:
                    conf.unset(key)
                else:
                    conf.set(key, previous)

    def union(self, first: DataFrame, *others: DataFrame) -> DataFrame:
        """`union_all` of the rules' frames, kept in one partition."""
        return union_all(first, *others).coalesce(1)

    def collect(self, frame: DataFrame) -> list[Row]:
        """`frame`'s rows, read by one task (a union's parts would be a task each: the
        audit's results were 61 tasks of a few rows, each paying a task's fixed cost)."""
        with self.planning():
            return frame.coalesce(1).collect()

    def release(self) -> None:
        """Drop what `cached` kept (a cache outlives the audit otherwise)."""
        for frame in self._cache.values():
            if self.one_partition:
                frame.unpersist()
        self._cache.clear()


def violations(
    frame: DataFrame,
    rule: str,
    detail: Column,
    *,
    node: Column | None = None,
    block: Column | None = None,
) -> DataFrame:
    """Rows of `frame` as violations of `rule` (node and block_number columns by default)."""
    return frame.select(
        F.lit(rule).alias("rule"),
        (node if node is not None else F.col("node")).cast("string").alias("node"),
        (block if block is not None else F.col("block_number")).cast("long").alias("block_number"),
        detail.alias("detail"),
    )


def union_all(first: DataFrame, *others: DataFrame) -> DataFrame:
    return _paired_union([first, *others], allow_missing=False)


def tagged_union(tag: str, parts: dict[str, DataFrame]) -> DataFrame:
    """The rows of every part, with column `tag` naming their part (a column a part lacks:
    null), to collect as one query."""
    tagged = [frame.select(F.lit(name).alias(tag), "*") for name, frame in parts.items()]
    return _paired_union(tagged, allow_missing=True)


def _paired_union(frames: list[DataFrame], *, allow_missing: bool) -> DataFrame:
    """The frames' union by name, as one n-ary Union of their plans analysed once. Spark
    analyses the whole plan at each `unionByName`: the audit's ~100 parts folded one frame
    at a time were analysed ~100 times over a growing plan (about 4 s of its driver on a
    5-block chain), and pairwise (a balanced tree) still seven times (1.4-2.9 s)."""
    if len(frames) == 1:
        return frames[0]
    spark = frames[0].sparkSession
    jvm = spark._jvm
    assert jvm is not None
    plans = jvm.PythonUtils.toSeq([frame._jdf.logicalPlan() for frame in frames])
    union = jvm.org.apache.spark.sql.catalyst.plans.logical.Union(
        plans, True, allow_missing
    )
    return DataFrame(jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession,
                                                                     union), spark)
