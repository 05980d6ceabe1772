"""What every audit rule works with: the data set, the validator set, and helpers to run
Python over partitions (Arrow batches) and to shape violations."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.accumulators import Accumulator
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from pbft_engine.quorum import max_faulty, quorum, view_change_quorum
from spark_etl.tables import Dataset, to_record_batch


@dataclass(frozen=True)
class ValidatorSet:
    """The validators in replica order (lower-case 0x addresses) and the chain they sign for;
    from a genesis file also its checkpoint interval K and the hash its block 0 must have."""

    addresses: tuple[str, ...]
    chain_id: int
    checkpoint_interval: int | None = None  # K: None when the set was not read from genesis
    genesis_hash: str | None = None  # lower-case 0x hash of block 0 built from the genesis

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

    def address_of(self, replica: Column) -> Column:
        """validators[replica], or null for an index outside the set."""
        addresses = F.array(*(F.lit(a) for a in self.addresses))
        inside = (replica >= 0) & (replica < self.size)
        return F.when(inside, F.element_at(addresses, (replica + 1).cast("int")))

    def contains(self, address: Column) -> Column:
        return address.isin(list(self.addresses))


@dataclass
class Audit:
    """One audit run: rules read `data`, and share `signatures` (recovered once, cached)."""

    data: Dataset
    validators: ValidatorSet
    _cache: dict[str, DataFrame] = field(default_factory=dict)
    # CPU time the Python workers spent recovering signatures (the per-core rate's divisor)
    recovery_cpu_seconds: Accumulator[float] = field(init=False)

    def __post_init__(self) -> None:
        spark = self.data.blocks.sparkSession
        self.recovery_cpu_seconds = spark.sparkContext.accumulator(0.0)

    def cached(self, name: str, build: Callable[[], DataFrame]) -> DataFrame:
        """`build()` computed once per audit and kept (local checkpoint) for every rule."""
        if name not in self._cache:
            self._cache[name] = build().localCheckpoint(eager=True)
        return self._cache[name]


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
    for other in others:
        first = first.unionByName(other)
    return first


RowFunction = Callable[[dict[str, Any]], Iterable[tuple[Any, ...]]]


def flat_map_rows(frame: DataFrame, function: RowFunction, schema: StructType) -> DataFrame:
    """Python `function(row dict) -> output rows` over every row, in parallel partitions,
    through Arrow batches (bounded by spark.sql.execution.arrow.maxRecordsPerBatch)."""
    arrow_schema = to_arrow_schema(schema)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = [out for row in batch.to_pylist() for out in function(row)]
            yield to_record_batch(rows, arrow_schema)

    return frame.mapInArrow(run, schema)
