"""The tables on disk: how a bundle DataFrame splits into them, and reading them back."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from spark_etl import schemas
from spark_etl.errors import DataError
from spark_etl.schemas import Table

RANGE_KEYS = [schemas.NODE.name, schemas.RANGE_START.name]


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


def read_table(spark: SparkSession, root: str, table: Table) -> DataFrame:
    """A table as written by the export, with its declared schema."""
    path = table_path(root, table)
    if is_local_path(root) and not Path(path.removeprefix("file://")).exists():
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
