"""The rule that ties the validator-set epochs the audit counts signatures with to the
certified headers: extra-data (DESIGN.md section 10)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_etl.audit.context import Audit, validators_hash, violations

NO_COMMITMENT = "0x"  # extraData of a chain built before the commitment to the next set


def extra_data(audit: Audit) -> DataFrame:
    """extra-data: every block after genesis commits in its extraData to the set that
    decides the next block, as the audit's epochs say. Each block's certificate is checked
    with its own epoch's set, so the certified headers prove every set change from the
    genesis set: the epochs table (a node's word) is believed only through this rule. A
    chain built before the commitment has 0x at every block: accepted only while no set
    change is counted and that node's every block has 0x (never mixed). The block before an
    override of the genesis file committed to what the old schedule said: not checked (the
    genesis file, which the auditor holds, is the anchor there)."""
    blocks = audit.data.blocks.where(F.col("number") > 0)
    if audit.validators.overrides:
        blocks = blocks.where(~F.col("number").isin(
            [first - 1 for first, _ in audit.validators.overrides]))
    blocks = blocks.select("node", F.col("number").alias("block_number"), "extra_data")
    validators = audit.validators
    expected = validators.hash_at(F.col("block_number") + 1)
    wrong = ~F.col("extra_data").eqNullSafe(expected)
    for first, _ in validators.overrides:  # blocks the set before it proposed, carried over
        carried = F.col("block_number").between(first, first - 1 + validators.max_in_flight)
        old = F.lit(validators_hash(validators.set_at(first - 1)))
        wrong = wrong & ~(carried & F.col("extra_data").eqNullSafe(old))
    if not audit.validators.changes:
        committing = blocks.groupBy("node").agg(
            F.max(~F.col("extra_data").eqNullSafe(NO_COMMITMENT)).alias("committing"))
        blocks = blocks.join(committing, "node")
        wrong = wrong & (F.col("committing") | ~F.col("extra_data").eqNullSafe(NO_COMMITMENT))
    return violations(
        blocks.where(wrong),
        "extra-data",
        F.format_string("extraData %s does not commit to the set that decides block %d "
                        "(its hash is %s)", F.coalesce("extra_data", F.lit("null")),
                        F.col("block_number") + 1, expected),
    )
