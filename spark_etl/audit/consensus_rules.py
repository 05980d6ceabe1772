"""Rules on the consensus evidence: commit certificates, conflicting certificates,
unreported equivocation, stable checkpoints and installed views. Every signature is checked
through `signatures` (recovered once per distinct message)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_etl.audit.context import Audit, union_all, violations
from spark_etl.audit.records_rules import (
    installed_views,
    verified_evidence,
    view_change_records,
)
from spark_etl.audit.signatures import checked, signatures


def certificates(audit: Audit) -> DataFrame:
    """certificate-signature, certificate-non-validator, certificate-block, certificate-view,
    certificate-duplicate-signer, certificate-quorum: every block after genesis has a commit
    certificate of at least Q distinct validators' valid COMMITs for its number and hash."""
    blocks = audit.data.blocks.select(
        "node", F.col("number").alias("block_number"), F.col("hash").alias("expected_hash")
    )
    certificate = audit.data.commit_certificates.select(
        "node", "block_number", "block_hash", "signer", "message"
    )
    rows = (
        checked(audit, certificate, "c", "commit")
        .join(blocks, ["node", "block_number"], "left")
        .withColumn(
            "for_block",
            (F.col("c_seq_no") == F.col("block_number"))
            & (F.col("c_digest") == F.col("expected_hash"))
            & (F.col("block_hash") == F.col("expected_hash")),
        )
    )
    who = F.format_string("replica %s's COMMIT", F.coalesce(F.col("c_replica").cast("string"),
                                                           F.lit("?")))
    bad_signature = violations(
        rows.where(F.col("problem").isNotNull()),
        "certificate-signature",
        F.concat_ws(": ", who, "problem"),
    )
    height = F.col("block_number")
    size = audit.validators.size_at(height)
    outside = F.coalesce((F.col("c_replica") < 0) | (F.col("c_replica") >= size), F.lit(False))
    named = F.col("signer").isNotNull() & ~audit.validators.contains(F.col("signer"), height)
    outsider = violations(
        rows.where(outside | named),
        "certificate-non-validator",
        F.format_string("%s names signer %s: not one of the %d validators", who,
                        F.coalesce("signer", F.lit("?")), size),
    )
    wrong_block = violations(
        rows.where(F.col("c_error").isNull() & ~F.coalesce("for_block", F.lit(False))),
        "certificate-block",
        F.format_string(
            "%s is for seqNo %d and digest %s; the block is %s (certificate names %s)",
            who, "c_seq_no", "c_digest",
            F.coalesce("expected_hash", F.lit("not exported")), "block_hash",
        ),
    )
    per_block = rows.groupBy("node", "block_number").agg(
        F.countDistinct("c_view").alias("views"),
        F.countDistinct(
            F.when(F.col("problem").isNull() & F.col("for_block"), F.col("c_signer"))
        ).alias("signers"),
    )
    views = violations(
        per_block.where(F.col("views") > 1),
        "certificate-view",
        F.format_string("COMMITs from %d different views", "views"),
    )
    duplicates = violations(
        rows.where(F.col("c_signer").isNotNull())
        .groupBy("node", "block_number", "c_signer")
        .count()
        .where(F.col("count") > 1),
        "certificate-duplicate-signer",
        F.format_string("%s signed %d COMMITs in one certificate (counted once)",
                        "c_signer", "count"),
    )
    quorum = audit.validators.quorum_at(F.col("block_number"))
    counted = blocks.where(F.col("block_number") > 0).join(
        per_block, ["node", "block_number"], "left"
    )
    short = violations(
        counted.where(F.coalesce(F.col("signers"), F.lit(0)) < quorum),
        "certificate-quorum",
        F.when(F.col("signers").isNull(), F.lit("no commit certificate")).otherwise(
            F.format_string("%d distinct valid validator signatures, quorum is %d",
                            "signers", quorum)
        ),
    )
    return union_all(bad_signature, outsider, wrong_block, views, duplicates, short)


def _valid(audit: Audit) -> DataFrame:
    return signatures(audit).where(F.col("valid"))


def conflicting_certificates(audit: Audit) -> DataFrame:
    """conflicting-certificates: no two different blocks with Q valid COMMITs at one height,
    across every exported node."""
    commits = audit.data.commit_certificates.select("message").distinct()
    valid = _valid(audit).where(F.col("type") == "commit").join(commits, "message")
    certified = (
        valid.groupBy("seq_no", "digest")
        .agg(F.countDistinct("signer").alias("signers"))
        .where(F.col("signers") >= audit.validators.quorum_at(F.col("seq_no")))
    )
    conflicts = (
        certified.groupBy("seq_no")
        .agg(F.sort_array(F.collect_set("digest")).alias("digests"))
        .where(F.size("digests") > 1)
    )
    return violations(
        conflicts,
        "conflicting-certificates",
        F.format_string("blocks %s all have a quorum of COMMITs at this height",
                        F.array_join("digests", ", ")),
        node=F.lit(None),
        block=F.col("seq_no"),
    )


def _identity(frame: DataFrame, *extra: str) -> DataFrame:
    """(signer, type, view, seq_no) of messages or evidence, with the parts that do not
    identify a message of that type nulled: CHECKPOINTs have no view, VIEW-CHANGE and
    NEW-VIEW no seqNo."""
    kind = F.col("type")
    return frame.select(
        "signer",
        "type",
        F.when(kind != "checkpoint", F.col("view")).alias("view"),
        F.when(~kind.isin("view-change", "new-view"), F.col("seq_no")).alias("seq_no"),
        *extra,
    )


def equivocation(audit: Audit) -> DataFrame:
    """equivocation-unreported: a validator that signed two different messages for one
    (type, view, seqNo) appears in some node's evidence table for it, as verified evidence
    (an evidence row that proves nothing does not count)."""
    keyed = _identity(_valid(audit), "digest")
    doubles = (
        keyed.groupBy("signer", "type", "view", "seq_no")
        .agg(F.countDistinct("digest").alias("digests"))
        .where(F.col("digests") > 1)
    )
    proven = verified_evidence(audit).where(F.col("proof") == "equivocation")
    evidence = _identity(proven).alias("e")
    condition = [
        doubles[c].eqNullSafe(F.col(f"e.{c}")) for c in ("signer", "type", "view", "seq_no")
    ]
    unreported = doubles.join(evidence, condition, "left_anti")
    return violations(
        unreported,
        "equivocation-unreported",
        F.format_string(
            "%s signed %d different %s messages for view %s, seqNo %s; no node's evidence has it",
            "signer", "digests", "type",
            F.coalesce(F.col("view").cast("string"), F.lit("-")),
            F.coalesce(F.col("seq_no").cast("string"), F.lit("-")),
        ),
        node=F.lit(None),
        block=F.col("seq_no"),
    )


def checkpoints(audit: Audit) -> DataFrame:
    """checkpoint-proof, checkpoint-chain: each stable checkpoint holds Q valid CHECKPOINTs
    of distinct validators for its seqNo, block hash and state root, and every checkpoint's
    block hash and state root are the chain's at that block."""
    claims = audit.data.checkpoints.withColumn(
        "value", F.concat(F.col("block_hash"), F.substring("state_root", 3, 64))
    )
    rows = (
        checked(audit, claims, "p", "checkpoint")
        .withColumn(
            "matching",
            F.col("problem").isNull()
            & (F.col("p_seq_no") == F.col("seq_no"))
            & (F.col("p_digest") == F.col("value")),
        )
        .withColumnRenamed("seq_no", "block_number")
    )
    bad_signature = violations(
        rows.where(F.col("problem").isNotNull()),
        "checkpoint-proof",
        F.format_string("replica %s's CHECKPOINT: %s",
                        F.coalesce(F.col("p_replica").cast("string"), F.lit("?")), "problem"),
    )
    quorum = audit.validators.quorum_at(F.col("block_number"))
    proofs = rows.groupBy("node", "block_number", "stable").agg(
        F.countDistinct(F.when(F.col("matching"), F.col("p_signer"))).alias("signers"),
        F.count("message").alias("messages"),
    )
    genesis = (F.col("block_number") == 0) & (F.col("messages") == 0)
    short = violations(
        proofs.where(F.col("stable") & ~genesis & (F.col("signers") < quorum)),
        "checkpoint-proof",
        F.format_string("stable, but %d distinct validators signed matching CHECKPOINTs; "
                        "quorum is %d", "signers", quorum),
    )
    blocks = audit.data.blocks.select(
        "node", F.col("number").alias("block_number"), F.col("hash").alias("chain_hash"),
        F.col("state_root").alias("chain_state_root"),
    )
    claimed = rows.select("node", "block_number", "block_hash", "state_root").distinct()
    chain = violations(
        claimed.join(blocks, ["node", "block_number"]).where(
            (F.col("block_hash") != F.col("chain_hash"))
            | (F.col("state_root") != F.col("chain_state_root"))
        ),
        "checkpoint-chain",
        F.format_string(
            "checkpoint has block hash %s and state root %s; the chain has %s and %s",
            "block_hash", "state_root", "chain_hash", "chain_state_root",
        ),
    )
    return union_all(bad_signature, short, chain)


def view_changes(audit: Audit) -> DataFrame:
    """view-change: every installed view has a valid NEW-VIEW from its primary and N-f valid
    VIEW-CHANGE messages for it from distinct validators."""
    new_views, votes = view_change_records(audit)
    counted = installed_views(audit)
    needed = audit.validators.view_change_quorum_at(F.col("height"))
    detail = F.format_string("view %d: %s", "view", "problem")
    return union_all(
        violations(new_views.where(F.col("problem").isNotNull()), "view-change", detail,
                   block=F.lit(None)),
        violations(votes.where(F.col("problem").isNotNull()), "view-change", detail,
                   block=F.lit(None)),
        violations(
            counted.where(F.col("senders") < needed),
            "view-change",
            F.format_string("view %d: %d valid VIEW-CHANGE messages, %d needed",
                            "view", "senders", needed),
            block=F.lit(None),
        ),
    )
