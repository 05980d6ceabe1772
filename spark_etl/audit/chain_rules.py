"""Rules on the chain data of each node: continuity, parent hashes, header hashes, and the
transactions, receipts, logs and gas of every block agreeing with its header. All but
continuity (which needs the block before) run in the column rules' per-block pass."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_etl.audit.column_rules import BLOCK_HASH, rule_of
from spark_etl.audit.context import Audit, union_all, violations
from spark_etl.audit.row_rules import (
    GAS_USED,
    LOG_INDEX,
    RECEIPT_PER_TRANSACTION,
    TRANSACTION_COUNT,
)

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


# transaction-count, receipt-per-transaction, log-index and gas-used look at one block's own
# rows: they run in the same per-block pass (`row_rules`), at no join or job of their own
transaction_counts = rule_of(TRANSACTION_COUNT)
receipts_per_transaction = rule_of(RECEIPT_PER_TRANSACTION)
log_indexes = rule_of(LOG_INDEX)
gas_used = rule_of(GAS_USED)
