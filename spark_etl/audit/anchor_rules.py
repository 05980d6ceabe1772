"""Rules that tie the export to the trust anchor and to what was asked, which a lying node
cannot choose: genesis-block, chain-id, validator-set, block-range, node-behind."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_etl.audit.context import Audit, union_all, violations
from spark_etl.audit.signatures import signatures


def genesis_block(audit: Audit) -> DataFrame:
    """genesis-block: with a genesis file, every node's exported block 0 is the block the
    genesis makes, and every node reported that block 0 to the export (the manifest)."""
    trusted = audit.validators.genesis_hash
    if trusted is None:  # --trust-node: block 0 is whatever the node says
        return _none(audit)
    block_zero = audit.data.blocks.where(F.col("number") == 0).where(F.col("hash") != trusted)
    exported = violations(
        block_zero,
        "genesis-block",
        F.format_string("block 0 has hash %s; the genesis file makes %s", "hash", F.lit(trusted)),
        block=F.lit(0),
    )
    reported = audit.data.export_manifest.select("node", "genesis_hash").distinct()
    manifest = violations(
        reported.where(~F.col("genesis_hash").eqNullSafe(trusted)),
        "genesis-block",
        F.format_string("the node reported block 0 hash %s to the export; the genesis file "
                        "makes %s", F.coalesce("genesis_hash", F.lit("none")), F.lit(trusted)),
        block=F.lit(0),
    )
    return exported.unionByName(manifest)


def chain_id(audit: Audit) -> DataFrame:
    """chain-id: every node reported the trusted chain id (eth_chainId) to the export."""
    trusted = audit.validators.chain_id
    reported = audit.data.export_manifest.select("node", "chain_id").distinct()
    return violations(
        reported.where(~F.col("chain_id").eqNullSafe(trusted)),
        "chain-id",
        F.format_string("the node reported chain id %s; the trusted chain id is %d",
                        F.coalesce(F.col("chain_id").cast("string"), F.lit("none")),
                        F.lit(trusted)),
        block=F.lit(None),
    )


def validator_set(audit: Audit) -> DataFrame:
    """validator-set: every node reported the trusted validator set, in replica order
    (pbft_getValidators: the set of the block after its head), to the export."""
    reported = (audit.data.export_manifest.select("node", "validators", "node_head").distinct()
                .withColumn("trusted", audit.validators.array_at(
                    F.coalesce(F.col("node_head"), F.lit(0)) + 1)))
    trusted = F.col("trusted")
    return violations(
        reported.where(~F.col("validators").eqNullSafe(trusted)),
        "validator-set",
        F.format_string("the node reported the validator set [%s]; the trusted set is [%s]",
                        F.coalesce(F.array_join("validators", ", "), F.lit("none")),
                        F.array_join(trusted, ", ")),
        block=F.lit(None),
    )


def _asked(audit: Audit) -> DataFrame:
    """Per node: the blocks its exports asked of it, want_first..want_last (asked_last, or
    its reported head when lower: then node-behind judges it), and its highest reported
    head. Manifests of exports that did not record the ask are left out."""
    return (
        audit.data.export_manifest.where(F.col("asked_first").isNotNull())
        .groupBy("node")
        .agg(
            F.min("asked_first").alias("want_first"),
            F.max(F.least("asked_last", "node_head")).alias("want_last"),
            F.max("node_head").alias("head"),
        )
    )


def block_range(audit: Audit) -> DataFrame:
    """block-range: each node's blocks are exactly the blocks the export asked of it: none
    missing at the start or the end (a lost first or last range leaves no gap), none
    outside, as many as asked."""
    held = audit.data.blocks.groupBy("node").agg(
        F.min("number").alias("low"),
        F.max("number").alias("high"),
        F.countDistinct("number").alias("held"),
    )
    nodes = _asked(audit).join(held, "node", "left")
    asked = F.format_string("the export asked for blocks %d..%d", "want_first", "want_last")
    expected = F.col("want_first") <= F.col("want_last")  # else its head is below --from
    start = violations(
        nodes.where(expected & F.coalesce(F.col("low") > F.col("want_first"), F.lit(True))),
        "block-range",
        F.when(F.col("low").isNull(), F.concat(F.lit("no block exported; "), asked)).otherwise(
            F.concat(F.format_string("blocks %d..%d are missing at the start; ", "want_first",
                                     F.col("low") - 1), asked)
        ),
        block=F.col("want_first"),
    )
    end = violations(
        nodes.where(F.col("high") < F.col("want_last")),
        "block-range",
        F.concat(F.format_string("blocks %d..%d are missing at the end; ", F.col("high") + 1,
                                 "want_last"), asked),
        block=F.col("high") + 1,
    )
    outside = (F.col("low") < F.col("want_first")) | (F.col("high") > F.col("want_last"))
    beyond = violations(
        nodes.where(outside),
        "block-range",
        F.concat(F.format_string("blocks %d..%d are exported; ", "low", "high"), asked),
        block=F.lit(None),
    )
    span = F.col("want_last") - F.col("want_first") + 1
    inside = (F.col("low") == F.col("want_first")) & (F.col("high") == F.col("want_last"))
    short = violations(
        nodes.where(inside & (F.col("held") != span)),
        "block-range",
        F.concat(F.format_string("%d of the %d blocks asked are exported; ", "held", span),
                 asked),
        block=F.lit(None),
    )
    return union_all(start, end, beyond, short)


def quorum_commits(audit: Audit) -> DataFrame:
    """(seq_no, digest) that a quorum of valid COMMITs in any node's certificates certify."""
    commits = audit.data.commit_certificates.select("message").distinct()
    return (
        signatures(audit)
        .where(F.col("valid") & (F.col("type") == "commit"))
        .join(commits, "message")
        .groupBy("seq_no", "digest")
        .agg(F.countDistinct("signer").alias("signers"))
        .where(F.col("signers") >= audit.validators.quorum_at(F.col("seq_no")))
    )


def certified_blocks(audit: Audit) -> DataFrame:
    """(node, number) of every exported block that has a quorum of valid COMMITs for its
    number and hash, from whichever node's certificates they were exported."""
    certified = quorum_commits(audit)
    blocks = audit.data.blocks.select("node", "number", "hash")
    on = (blocks["number"] == certified["seq_no"]) & (blocks["hash"] == certified["digest"])
    return blocks.join(certified, on).select("node", "number")


def node_behind(audit: Audit) -> DataFrame:
    """node-behind: a node whose reported head (eth_blockNumber) is below a block another
    node served with a quorum certificate withheld the blocks above its head."""
    heads = _asked(audit).select(F.col("node").alias("behind"), "head")
    served = certified_blocks(audit)
    above = heads.join(
        served, (served["node"] != heads["behind"]) & (served["number"] > heads["head"])
    )
    highest = above.groupBy("behind", "head").agg(
        F.max(F.struct("number", "node")).alias("certified")
    )
    return violations(
        highest,
        "node-behind",
        F.format_string(
            "the node claims head %d (eth_blockNumber), but %s served block %d with a quorum "
            "certificate",
            "head", "certified.node", "certified.number",
        ),
        node=F.col("behind"),
        block=F.col("certified.number"),
    )


def _none(audit: Audit) -> DataFrame:
    """No violations, in the violations' shape."""
    return violations(audit.data.export_manifest.limit(0), "genesis-block", F.lit(""),
                      block=F.lit(None))
