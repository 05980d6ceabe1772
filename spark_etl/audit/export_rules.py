"""Rules across nodes and on the export itself: node-agreement, export-manifest."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_etl import schemas
from spark_etl.audit.context import Audit, violations
from spark_etl.tables import RANGE_KEYS


def node_agreement(audit: Audit) -> DataFrame:
    """node-agreement: every node exported holds the same block at every height."""
    heights = (
        audit.data.blocks.groupBy(F.col("number").alias("block_number"))
        .agg(
            F.countDistinct("hash").alias("hashes"),
            F.sort_array(F.collect_set(F.concat_ws(" has ", "node", "hash"))).alias("holders"),
        )
        .where(F.col("hashes") > 1)
    )
    return violations(
        heights,
        "node-agreement",
        F.concat(F.lit("nodes disagree: "), F.array_join("holders", "; ")),
        node=F.lit(None),
    )


def export_manifest(audit: Audit) -> DataFrame:
    """export-manifest: every (node, block range) with rows is in the manifest, holds
    first_block..last_block, and has the row counts the manifest recorded (a range an
    interrupted export left behind, or a lost file, shows here)."""
    data = audit.data
    counted = [
        getattr(data, t.name).groupBy(*RANGE_KEYS).agg(F.count("*").alias(f"{t.name}_rows"))
        for t in schemas.BLOCK_TABLES
    ]
    actual = reduce(lambda a, b: a.join(b, RANGE_KEYS, "full_outer"), counted)
    joined = data.export_manifest.join(actual, RANGE_KEYS, "full_outer").fillna(
        0, [f"{t.name}_rows" for t in schemas.BLOCK_TABLES]
    )
    mismatches = [
        F.when(
            F.col(t.name) != F.col(f"{t.name}_rows"),
            F.format_string(f"{t.name}: %d rows, manifest says %d", f"{t.name}_rows", t.name),
        )
        for t in schemas.BLOCK_TABLES
    ]
    span = F.col("last_block") - F.col("first_block") + 1
    detail = F.when(
        F.col("first_block").isNull(),
        F.lit("rows of a block range the manifest does not list (an interrupted export?)"),
    ).otherwise(
        F.concat_ws(
            "; ",
            F.when(span != F.col("blocks"), F.lit("blocks do not cover first..last_block")),
            *mismatches,
        )
    )
    bad = joined.withColumn("detail", detail).where(F.col("detail") != "")
    return violations(bad, "export-manifest", F.col("detail"), block=F.col("range_start"))
