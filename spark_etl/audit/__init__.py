"""The chain audit: every rule over an exported data set, in Spark.

`run_audit(data, validators)` evaluates all RULES (each returns a DataFrame of violations)
and the report's counts and figures as one query, collected in one Spark job, and returns an
`AuditResult`. Signatures are recovered once each and shared by the consensus rules. The
rules read every table in one partition (`context.ONE_PARTITION`); the passes over every row
(signature recovery, the per-block column checks, the rows' digests) run inside that job for
a small export (`context.ONE_PARTITION_BYTES`), their Python on the driver for a tiny one
(`context.DRIVER_BYTES`), and for a large one first, each a parallel job of its own
(`context.PARALLEL`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.util import inheritable_thread_target

from spark_etl.audit.anchor_rules import (
    block_range,
    chain_id,
    genesis_block,
    node_behind,
    validator_set,
)
from spark_etl.audit.chain_rules import (
    block_hashes,
    continuity,
    gas_used,
    log_indexes,
    receipts_per_transaction,
    transaction_counts,
)
from spark_etl.audit.column_rules import COLUMN_RULES
from spark_etl.audit.consensus_rules import (
    certificates,
    checkpoints,
    conflicting_certificates,
    equivocation,
    view_changes,
)
from spark_etl.audit.context import Audit, ValidatorSet, tagged_union, union_all
from spark_etl.audit.epoch_rules import extra_data
from spark_etl.audit.export_rules import export_manifest, node_agreement
from spark_etl.audit.records_rules import (
    checkpoint_missing,
    evidence_false,
    figure_rows,
    figures_of,
    malformed_records,
    record_fields,
    signer_columns,
    view_change_missing,
)
from spark_etl.audit.report import AuditResult, Violation
from spark_etl.audit.roots import trie_roots
from spark_etl.audit.signatures import signatures
from spark_etl.tables import Dataset

Rule = Callable[[Audit], DataFrame]

RULES: tuple[Rule, ...] = (
    continuity,
    block_hashes,
    transaction_counts,
    receipts_per_transaction,
    log_indexes,
    gas_used,
    trie_roots,
    certificates,
    conflicting_certificates,
    equivocation,
    checkpoints,
    view_changes,
    node_agreement,
    export_manifest,
    *COLUMN_RULES,
    genesis_block,
    chain_id,
    validator_set,
    block_range,
    node_behind,
    extra_data,
    signer_columns,
    record_fields,
    evidence_false,
    checkpoint_missing,
    view_change_missing,
    malformed_records,
)


# Threads that build the rules' frames: building one is mostly py4j round trips, each
# waiting on the JVM's analysis of the frame so far (some 20,000 for the rules of any
# export, 4-5 s of a 5-block audit), so two keep the driver and the JVM busy at once
BUILDERS = 2


def find_violations(audit: Audit, rules: tuple[Rule, ...] = RULES) -> list[Violation]:
    return _violations(audit.collect(union_all(*_built(audit, rules))))


def _built(audit: Audit, rules: tuple[Rule, ...]) -> list[DataFrame]:
    """Each rule's frame, in order, built on BUILDERS threads; a job one starts (a pass's)
    carries this thread's job group and properties."""
    session = audit.data.blocks.sparkSession
    build = inheritable_thread_target(session)(lambda rule: rule(audit))
    with ThreadPoolExecutor(BUILDERS, thread_name_prefix="audit-rules") as pool:
        return list(pool.map(build, rules))


def _violations(rows: list[Row]) -> list[Violation]:
    found = (Violation(**{k: row[k] for k in Violation.__dataclass_fields__}) for row in rows)
    return sorted(found, key=Violation.sort_key)


def _results(audit: Audit, rules: tuple[Rule, ...]) -> DataFrame:
    """Everything the report needs, as rows of one query (`result` says what each is): the
    violations of every rule, the counts, and the consensus figures. Collected at once, it
    is one Spark job (in one partition: of one stage) instead of one per count."""
    data = audit.data
    parts = {
        "violation": union_all(*_built(audit, rules)),
        "blocks": data.blocks.groupBy("node").agg(F.count("*").alias("count")),
        "transactions": data.transactions.agg(F.count("*").alias("count")),
        "signatures": signatures(audit).agg(F.count("*").alias("count")),
        "figure": figure_rows(audit),
    }
    return tagged_union("result", parts)


def run_audit(data: Dataset, validators: ValidatorSet, rules: tuple[Rule, ...] = RULES,
              one_partition: bool | None = None, on_driver: bool | None = None) -> AuditResult:
    """Every rule over `data`; `one_partition` and `on_driver` as `Audit` takes them (None:
    by the size)."""
    started = time.monotonic()
    audit = Audit(data, validators, one_partition, on_driver)
    try:
        if not audit.one_partition:
            signatures(audit)  # recovered first, in parallel: the step's wall time is its own
        recovery_seconds = time.monotonic() - started
        rows = audit.collect(_results(audit, rules))
    finally:
        audit.release()
    if audit.one_partition:  # recovered in the one task (or on the driver): its CPU time
        recovery_seconds = audit.recovery_cpu_seconds.value
    kinds: dict[str, list[Row]] = {}
    for row in rows:
        kinds.setdefault(row["result"], []).append(row)
    counts = {kind: sum(row["count"] for row in kinds.get(kind, []))
              for kind in ("transactions", "signatures")}
    return AuditResult(
        validators=validators,
        blocks={row["node"]: row["count"] for row in kinds.get("blocks", [])},
        transactions=counts["transactions"],
        signatures=counts["signatures"],
        recovery_seconds=recovery_seconds,
        recovery_cpu_seconds=audit.recovery_cpu_seconds.value,
        seconds=time.monotonic() - started,
        violations=_violations(kinds.get("violation", [])),
        figures=figures_of(kinds.get("figure", [])),
    )


__all__ = ["RULES", "Audit", "AuditResult", "Rule", "ValidatorSet", "Violation",
           "find_violations", "run_audit"]
