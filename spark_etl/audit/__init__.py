"""The chain audit: every rule over an exported data set, in Spark.

`run_audit(data, validators)` evaluates all RULES (each returns a DataFrame of violations)
as one union and returns an `AuditResult`. Signatures are recovered first, once each, and
shared by the consensus rules."""

from __future__ import annotations

import time
from collections.abc import Callable

from pyspark.sql import DataFrame

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
from spark_etl.audit.context import Audit, ValidatorSet, union_all
from spark_etl.audit.export_rules import export_manifest, node_agreement
from spark_etl.audit.records_rules import (
    checkpoint_missing,
    consensus_figures,
    evidence_false,
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
    signer_columns,
    record_fields,
    evidence_false,
    checkpoint_missing,
    view_change_missing,
    malformed_records,
)


def find_violations(audit: Audit, rules: tuple[Rule, ...] = RULES) -> list[Violation]:
    found = union_all(*(rule(audit) for rule in rules)).collect()
    return sorted((Violation(**row.asDict()) for row in found), key=Violation.sort_key)


def run_audit(data: Dataset, validators: ValidatorSet,
              rules: tuple[Rule, ...] = RULES) -> AuditResult:
    started = time.monotonic()
    audit = Audit(data, validators)
    recovered = signatures(audit).count()
    recovery_seconds = time.monotonic() - started
    blocks = {
        row["node"]: row["count"] for row in data.blocks.groupBy("node").count().collect()
    }
    transactions = data.transactions.count()
    found = find_violations(audit, rules)
    figures = consensus_figures(audit)
    return AuditResult(
        validators=validators,
        blocks=blocks,
        transactions=transactions,
        signatures=recovered,
        recovery_seconds=recovery_seconds,
        recovery_cpu_seconds=audit.recovery_cpu_seconds.value,
        seconds=time.monotonic() - started,
        violations=found,
        figures=figures,
    )


__all__ = ["RULES", "Audit", "AuditResult", "Rule", "ValidatorSet", "Violation",
           "find_violations", "run_audit"]
