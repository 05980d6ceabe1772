"""The tables on disk: how fetched bundles split into them, writing and reading them back.

Two writers lay out the same files: Spark's (`write_table`, for a bundle DataFrame), and the
export tasks' own (`RangeWriter`, pyarrow, for an --out the tasks reach as local files): one
Parquet file per table per task under `<table>/node=<url>/range_start=<n>/`, staged, then put
in place by the driver (`publish`), a range's partition replaced whole as Spark's dynamic
partition overwrite does."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import LongType, StructField, StructType

from spark_etl import schemas
from spark_etl.errors import DataError
from spark_etl.schemas import Table

RANGE_KEYS = [schemas.NODE.name, schemas.RANGE_START.name]
# The characters Spark escapes (%XX) in a partition directory's value:
# ExternalCatalogUtils.charToEscape (sql/catalyst, Spark 4.0), on a system other than Windows.
PATH_ESCAPED = frozenset([*map(chr, range(1, 0x20)), *'"#%\'*/:=?\\\x7f{[]^'])
PART_FILE = "part-{first:020d}.parquet"  # one file per table per task, named by its first block
FLUSH_BYTES = 16 << 20  # rows a task holds per table before writing them as a row group
ARROW_BUNDLE = to_arrow_schema(schemas.BUNDLE, timezone="UTC")
# What an export task that wrote its own files tells the driver (RangeWriter.counts).
WRITTEN = StructType([
    schemas.NODE.field(), schemas.RANGE_START.field(),
    *(StructField(name, LongType()) for name in ("first_block", "last_block")),
    *(StructField(t.name, LongType()) for t in schemas.BLOCK_TABLES),
])


def split_bundle(bundle: DataFrame) -> dict[str, DataFrame]:
    """The block-range tables of fetched bundles (`schemas.BUNDLE`), each in its schema."""
    tables = {schemas.BLOCKS.name: bundle.select("block.*", *RANGE_KEYS)}
    for table in schemas.NESTED_TABLES:
        exploded = bundle.select(F.explode(table.name).alias("row"), *RANGE_KEYS)
        tables[table.name] = exploded.select("row.*", *RANGE_KEYS)
    return tables


def to_record_batch(rows: list[tuple[Any, ...]], schema: pa.Schema) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def local_frame(spark: SparkSession, rows: list[tuple[Any, ...]], schema: StructType) -> DataFrame:
    """A DataFrame of rows built on the driver, through Arrow: unlike createDataFrame of
    Python rows, no Python worker has to convert them (about 1 s on a command's first job)."""
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    return spark.createDataFrame(pa.Table.from_batches([to_record_batch(rows, arrow_schema)]))


def table_path(root: str, table: Table) -> str:
    return f"{root.rstrip('/')}/{table.name}"


def write_table(frame: DataFrame, root: str, table: Table) -> None:
    """Replace the partitions (node, block range) that `frame` has rows for; keep the rest."""
    (
        frame.select(*table.schema.names)
        .write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy(*(c.name for c in table.partition))
        .parquet(table_path(root, table))
    )


def is_local_path(root: str) -> bool:
    return "://" not in root or root.startswith("file://")


def local_root(root: str) -> str:
    """A local --out as an absolute path: the tasks of a cluster do not run in the driver's
    directory."""
    return os.path.abspath(root.removeprefix("file://"))


def escape_path_name(value: str) -> str:
    """A partition value as Spark names its directory (ExternalCatalogUtils.escapePathName)."""
    return "".join(f"%{ord(c):02X}" if c in PATH_ESCAPED else c for c in value)


def partition_dir(node: str, range_start: int) -> str:
    """A block range's partition directory, relative to its table's."""
    return (f"{schemas.NODE.name}={escape_path_name(node)}/"
            f"{schemas.RANGE_START.name}={range_start}")


def split_batch(batch: pa.RecordBatch) -> dict[str, pa.RecordBatch]:
    """A batch of bundles (`ARROW_BUNDLE`): its rows of each block-range table, without the
    partition columns (what the files hold, as Spark writes them)."""
    tables = {schemas.BLOCKS.name: pa.RecordBatch.from_struct_array(batch.column("block"))}
    for table in schemas.NESTED_TABLES:
        rows = batch.column(table.name).flatten()
        tables[table.name] = pa.RecordBatch.from_struct_array(rows)
    return tables


class RangeWriter:
    """One export task's rows of every block-range table, each table's to one Parquet file
    under `staging` (named by the task's first block: a task run again overwrites it). A file
    is written under a hidden name (Spark's reader skips names starting with "."), renamed
    once whole when the writer closes; a failed task removes its own."""

    def __init__(self, staging: str, node: str, range_start: int, first: int) -> None:
        self.directory = partition_dir(node, range_start)
        self.staging = staging
        self.name = PART_FILE.format(first=first)
        self.counts: dict[str, Any] = {
            schemas.NODE.name: node, schemas.RANGE_START.name: range_start,
            "first_block": None, "last_block": None,
            **dict.fromkeys((t.name for t in schemas.BLOCK_TABLES), 0)}
        self._pending: dict[str, list[pa.RecordBatch]] = {}
        self._pending_bytes: dict[str, int] = {}
        self._writers: dict[str, pq.ParquetWriter] = {}

    def __enter__(self) -> RangeWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self._finish()
        else:
            self._remove()

    def write(self, batch: pa.RecordBatch) -> None:
        numbers = batch.column("block").field("number")
        if len(numbers):
            low, high = pc.min_max(numbers).values()
            self._extend(low.as_py(), high.as_py())
        for name, rows in split_batch(batch).items():
            self.counts[name] += rows.num_rows
            if rows.num_rows:
                self._pending.setdefault(name, []).append(rows)
                self._pending_bytes[name] = self._pending_bytes.get(name, 0) + rows.nbytes
                if self._pending_bytes[name] >= FLUSH_BYTES:
                    self._flush(name)

    def _extend(self, low: int, high: int) -> None:
        first, last = self.counts["first_block"], self.counts["last_block"]
        self.counts["first_block"] = low if first is None else min(first, low)
        self.counts["last_block"] = high if last is None else max(last, high)

    def _path(self, table: str, hidden: bool) -> str:
        name = f".{self.name}.tmp" if hidden else self.name
        return os.path.join(self.staging, table, self.directory, name)

    def _flush(self, table: str) -> None:
        rows = pa.Table.from_batches(self._pending.pop(table))
        self._pending_bytes[table] = 0
        if table not in self._writers:
            path = self._path(table, hidden=True)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._writers[table] = pq.ParquetWriter(path, rows.schema)
        self._writers[table].write_table(rows)

    def _finish(self) -> None:
        for table in list(self._pending):
            self._flush(table)
        for table, writer in self._writers.items():
            writer.close()
            os.replace(self._path(table, hidden=True), self._path(table, hidden=False))

    def _remove(self) -> None:
        for table, writer in self._writers.items():
            writer.close()
            Path(self._path(table, hidden=True)).unlink(missing_ok=True)


def publish(staging: str, root: str, ranges: Iterable[tuple[str, int]]) -> None:
    """The staged files of `ranges` moved into the block-range tables under `root`: each
    range's partition of each table replaced whole (what it held is deleted, as Spark's
    dynamic partition overwrite does), every table's directory made (a table without rows
    is read as empty)."""
    for table in schemas.BLOCK_TABLES:
        tables = Path(root, table.name)
        tables.mkdir(parents=True, exist_ok=True)
        for node, range_start in ranges:
            target = tables / partition_dir(node, range_start)
            if target.exists():
                shutil.rmtree(target)
            staged = Path(staging, table.name, partition_dir(node, range_start))
            if staged.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, target)


def read_table(spark: SparkSession, root: str, table: Table) -> DataFrame:
    """A table as written by the export, with its declared schema."""
    path = table_path(root, table)
    missing = is_local_path(root) and not Path(path.removeprefix("file://")).exists()
    if missing and table is schemas.EPOCHS:  # an export made before it: no set change known
        return spark.createDataFrame([], table.schema)
    if missing:
        raise DataError(
            f"{path} is missing: {root} is not a finished `pbft-etl export` (run the export "
            "into it, again if it was interrupted)"
        )
    return spark.read.schema(table.schema).parquet(path)


@dataclass(frozen=True)
class Dataset:
    """Every exported table as a DataFrame."""

    blocks: DataFrame
    transactions: DataFrame
    receipts: DataFrame
    logs: DataFrame
    commit_certificates: DataFrame
    checkpoints: DataFrame
    view_changes: DataFrame
    evidence: DataFrame
    epochs: DataFrame
    export_manifest: DataFrame

    @classmethod
    def read(cls, spark: SparkSession, root: str) -> Dataset:
        return cls(**{t.name: read_table(spark, root, t) for t in schemas.TABLES})

    def frames(self) -> dict[str, DataFrame]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def estimated_bytes(self) -> int:
        """The tables' size as Spark's planner estimates it (a file's: its bytes), without
        running a job."""
        return sum(_estimated_bytes(frame) for frame in self.frames().values())

    def in_one_partition(self) -> Dataset:
        """Every table in one partition, read by one task (no shuffle)."""
        return Dataset(**{name: frame.coalesce(1) for name, frame in self.frames().items()})


def _estimated_bytes(frame: DataFrame) -> int:
    # The optimized plan's statistics (a Scala BigInt): what Spark itself weighs a
    # broadcast join by; PySpark has no public call for it.
    stats = frame._jdf.queryExecution().optimizedPlan().stats()
    return int(stats.sizeInBytes())
