"""Rules on the chain data of each node: continuity, parent hashes, header hashes, and the
transactions, receipts, logs and gas of every block agreeing with its header."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_etl.audit.column_rules import BLOCK_HASH, rule_of
from spark_etl.audit.context import Audit, union_all, violations

# block-hash runs in the column rules' pass over each block, beside raw-block
block_hashes = rule_of(BLOCK_HASH)


def continuity(audit: Audit) -> DataFrame:
    """block-duplicate, block-gap, parent-hash: each node's blocks numbered without gaps or
    repeats from the first exported block, each one's parent the block before it."""
    order = Window.partitionBy("node").orderBy("number", "hash")
    blocks = audit.data.blocks.select(
        "node",
        F.col("number").alias("block_number"),
        "parent_hash",
        F.lag("number").over(order).alias("previous_number"),
        F.lag("hash").over(order).alias("previous_hash"),
    )
    duplicate = violations(
        blocks.where(F.col("block_number") == F.col("previous_number")),
        "block-duplicate",
        F.lit("block exported more than once"),
    )
    gap = violations(
        blocks.where(F.col("block_number") > F.col("previous_number") + 1),
        "block-gap",
        F.format_string(
            "blocks %d..%d are missing", F.col("previous_number") + 1, F.col("block_number") - 1
        ),
    )
    parent = violations(
        blocks.where(
            (F.col("block_number") == F.col("previous_number") + 1)
            & (F.col("parent_hash") != F.col("previous_hash"))
        ),
        "parent-hash",
        F.format_string(
            "parent hash %s is not the hash %s of block %d",
            "parent_hash", "previous_hash", "previous_number",
        ),
    )
    return union_all(duplicate, gap, parent)


def _block_keys(audit: Audit) -> DataFrame:
    return audit.data.blocks.select(
        "node",
        F.col("number").alias("block_number"),
        F.col("hash").alias("expected_hash"),
        "transaction_count",
        F.col("gas_used").alias("block_gas_used"),
    )


def transaction_counts(audit: Audit) -> DataFrame:
    """transaction-count: each block's transaction_count equals its rows in transactions,
    indexed 0..n-1, all naming the block's hash."""
    rows = audit.data.transactions.groupBy("node", "block_number").agg(
        F.count("*").alias("rows"),
        F.countDistinct("transaction_index").alias("indexes"),
        F.max("transaction_index").alias("last_index"),
        F.collect_set("block_hash").alias("hashes"),
    )
    joined = _block_keys(audit).join(rows, ["node", "block_number"], "full_outer").fillna(
        0, ["rows", "indexes"]
    )
    bad = joined.where(
        ~F.coalesce(F.col("transaction_count") == F.col("rows"), F.lit(False))
        | (F.col("indexes") != F.col("rows"))
        | ((F.col("rows") > 0) & (F.col("last_index") != F.col("rows") - 1))
        | ((F.col("rows") > 0) & (F.col("hashes") != F.array("expected_hash")))
    )
    detail = F.when(
        F.col("transaction_count").isNull(),
        F.format_string("%d transactions of a block that is not in blocks", "rows"),
    ).otherwise(
        F.format_string(
            "header says %d transactions; the transactions table has %d rows, %d distinct "
            "indexes (last %s), block hashes %s",
            "transaction_count", "rows", "indexes",
            F.coalesce(F.col("last_index").cast("string"), F.lit("none")),
            F.array_join("hashes", ","),
        )
    )
    return violations(bad, "transaction-count", detail)


RECEIPT_MATCH = ("transaction_index", "block_hash", "from_address", "to_address")


def receipts_per_transaction(audit: Audit) -> DataFrame:
    """receipt-per-transaction: exactly one receipt per transaction, for the same position,
    block, sender and recipient; no receipt without a transaction."""
    keys = ["node", "block_number", "transaction_hash"]
    transactions = audit.data.transactions.select(
        "node",
        "block_number",
        F.col("hash").alias("transaction_hash"),
        F.struct(*RECEIPT_MATCH).alias("transaction"),
    )
    receipts = audit.data.receipts.groupBy(*keys).agg(
        F.count("*").alias("receipts"), F.first(F.struct(*RECEIPT_MATCH)).alias("receipt")
    )
    joined = transactions.join(receipts, keys, "full_outer")
    detail = (
        F.when(F.col("transaction").isNull(), F.lit("receipt of a transaction not in the block"))
        .when(F.col("receipts").isNull(), F.lit("transaction without a receipt"))
        .when(F.col("receipts") > 1, F.format_string("%d receipts for one transaction", "receipts"))
        .when(
            F.col("receipt") != F.col("transaction"),
            F.lit("receipt's index, block hash, sender or recipient differ from the transaction"),
        )
    )
    bad = joined.withColumn("detail", detail).where(F.col("detail").isNotNull())
    return violations(
        bad, "receipt-per-transaction", F.concat_ws(": ", "transaction_hash", "detail")
    )


def log_indexes(audit: Audit) -> DataFrame:
    """log-index: each block's log indexes are 0..n-1 without repeats, and every log belongs
    to a receipt of its block (same transaction hash, index and block hash)."""
    logs = audit.data.logs
    per_block = logs.groupBy("node", "block_number").agg(
        F.count("*").alias("rows"),
        F.countDistinct("log_index").alias("indexes"),
        F.min("log_index").alias("first"),
        F.max("log_index").alias("last"),
    )
    numbering = violations(
        per_block.where(
            (F.col("indexes") != F.col("rows"))
            | (F.col("first") != 0)
            | (F.col("last") != F.col("rows") - 1)
        ),
        "log-index",
        F.format_string(
            "%d logs with %d distinct indexes from %d to %d (want 0..n-1)",
            "rows", "indexes", "first", "last",
        ),
    )
    receipt_keys = ["node", "block_number", "transaction_hash", "transaction_index", "block_hash"]
    orphans = logs.join(audit.data.receipts.select(*receipt_keys), receipt_keys, "left_anti")
    orphaned = violations(
        orphans,
        "log-index",
        F.format_string("log %d belongs to no receipt of the block", "log_index"),
    )
    return numbering.unionByName(orphaned)


def gas_used(audit: Audit) -> DataFrame:
    """gas-used: cumulative gas steps by each receipt's gas used, and the block's gas used is
    the receipts' sum and the last cumulative value."""
    order = Window.partitionBy("node", "block_number").orderBy("transaction_index")
    receipts = audit.data.receipts.withColumn(
        "previous", F.lag("cumulative_gas_used", 1, 0).over(order)
    )
    steps = violations(
        receipts.where(F.col("cumulative_gas_used") - F.col("previous") != F.col("gas_used")),
        "gas-used",
        F.format_string(
            "transaction %d: cumulative gas %d - previous %d != its gas used %d",
            "transaction_index", "cumulative_gas_used", "previous", "gas_used",
        ),
    )
    totals = audit.data.receipts.groupBy("node", "block_number").agg(
        F.sum("gas_used").alias("sum"), F.max("cumulative_gas_used").alias("cumulative")
    )
    blocks = _block_keys(audit).join(totals, ["node", "block_number"], "left").fillna(
        0, ["sum", "cumulative"]
    )
    mismatch = violations(
        blocks.where(
            (F.col("sum") != F.col("block_gas_used"))
            | (F.col("cumulative") != F.col("block_gas_used"))
        ),
        "gas-used",
        F.format_string(
            "header gas used %d; receipts sum to %d, last cumulative %d",
            "block_gas_used", "sum", "cumulative",
        ),
    )
    return steps.unionByName(mismatch)
