"""Rules across nodes and on the export itself: node-agreement, export-manifest."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_etl import schemas
from spark_etl.audit.context import Audit, violations
from spark_etl.tables import RANGE_KEYS, Dataset

# The tables whose rows every honest node serves alike for a block (certificates and
# checkpoint proofs may legitimately hold different signatures); their height column.
AGREED_TABLES = {
    schemas.BLOCKS.name: "number",
    schemas.TRANSACTIONS.name: "block_number",
    schemas.RECEIPTS.name: "block_number",
    schemas.LOGS.name: "block_number",
}


def _row_digests(data: Dataset, table: str, height: str) -> DataFrame:
    """(node, block_number, table, digest): a SHA-256 over each node's rows of `table` at
    each height it exported a block (no rows is a digest too), node and range excluded."""
    frame = getattr(data, table)
    columns = [c for c in frame.columns if c not in RANGE_KEYS]
    rows = frame.groupBy("node", F.col(height).alias("block_number")).agg(
        F.sha2(F.array_join(F.sort_array(F.collect_list(F.to_json(F.struct(*columns)))), "\n"),
               256).alias("digest")
    )
    exported = data.blocks.select("node", F.col("number").alias("block_number"))
    return exported.join(rows, ["node", "block_number"], "left").select(
        "node", "block_number", F.lit(table).alias("table"),
        F.coalesce("digest", F.sha2(F.lit(""), 256)).alias("digest"),
    )


def node_agreement(audit: Audit) -> DataFrame:
    """node-agreement: every node exported holds the same block at every height, and the
    same rows of blocks, transactions, receipts and logs for it (every column but node and
    range), one violation per height and table that differs."""
    hashes = audit.data.blocks.select("node", F.col("number").alias("block_number"), "hash")
    # every row of the four tables hashed: a pass over them (parallel on a large export)
    digests = audit.cached("row-digests", lambda tables: tables.union(
        *(_row_digests(tables.data, t, h) for t, h in AGREED_TABLES.items())))
    # a node's version of a table at a height: its block hash and its rows' digest (short)
    version = F.concat_ws(" rows ", "hash", F.substring("digest", 1, 16))
    heights = (
        digests.join(hashes, ["node", "block_number"])
        .groupBy("block_number", "table")
        .agg(
            F.countDistinct("digest").alias("versions"),
            F.sort_array(F.collect_set(F.concat_ws(" has ", "node", version))).alias("holders"),
        )
        .where(F.col("versions") > 1)
    )
    return violations(
        heights,
        "node-agreement",
        F.concat(F.lit("nodes disagree on "), F.col("table"), F.lit(": "),
                 F.array_join("holders", "; ")),
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
        F.col("range_size").isNull(),  # no manifest row (one with no block has a range size)
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
