"""The audit's result: the violations, as JSON and as a readable summary."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from spark_etl.audit.context import ValidatorSet


@dataclass(frozen=True)
class Violation:
    """One broken rule: where (node, block) and why."""

    rule: str
    node: str | None
    block_number: int | None
    detail: str

    def sort_key(self) -> tuple[int, str, str, str]:
        return (-1 if self.block_number is None else self.block_number, self.rule,
                self.node or "", self.detail)

    def line(self) -> str:
        where = "-" if self.block_number is None else str(self.block_number)
        node = f" [{self.node}]" if self.node else ""
        return f"  block {where:>8}  {self.rule:<30} {self.detail}{node}"


@dataclass(frozen=True)
class InstalledView:
    """A view a node served as installed: its primary and VIEW-CHANGE senders as recovered
    (`primary` None: no valid NEW-VIEW), and the highest stable checkpoint they name."""

    view: int
    primary: str | None
    senders: int
    stable_seq_no: int | None


@dataclass(frozen=True)
class ConsensusFigures:
    """Who signed what, from recovered signatures only (never a signer column a node filled
    in): per validator address, the blocks with its valid COMMIT in a certificate, the
    checkpoints with its valid CHECKPOINT, the views with its valid VIEW-CHANGE, and the
    verified equivocation evidence against it (two different messages it signed for one
    type, view and seqNo); `unproven_evidence` counts the evidence rows that prove nothing,
    `one_message_evidence` those that keep a single signed message (never an accusation)."""

    commits: dict[str, int]
    checkpoints: dict[str, int]
    view_changes: dict[str, int]
    equivocations: dict[str, int]
    unproven_evidence: int
    one_message_evidence: int
    views: tuple[InstalledView, ...]

    def to_json(self, addresses: tuple[str, ...]) -> dict[str, Any]:
        kinds = ("commits", "checkpoints", "view_changes", "equivocations")
        return {
            "per_validator": {a: {k: getattr(self, k).get(a, 0) for k in kinds}
                              for a in addresses},
            "equivocations_verified": sum(self.equivocations.values()),
            "evidence_unproven": self.unproven_evidence,
            "evidence_one_message": self.one_message_evidence,
            "installed_views": [asdict(v) for v in self.views],
        }


def epochs_note(validators: ValidatorSet) -> str:
    """What the summary adds when the set changed: how many epochs, each counted with its
    own set."""
    if not validators.changes:
        return ""
    return (f"; {len(validators.changes) + 1} validator-set epochs, each block counted with "
            "its own")


@dataclass(frozen=True)
class AuditResult:
    validators: ValidatorSet
    blocks: dict[str, int]  # node -> blocks audited
    transactions: int
    signatures: int  # distinct signed messages recovered
    recovery_seconds: float  # wall time of the recovery step (a Spark job)
    recovery_cpu_seconds: float  # CPU time of the recovery itself, summed over the workers
    # (or the driver's, where a tiny export's passes run: `context.DRIVER_BYTES`)
    seconds: float
    violations: list[Violation]
    figures: ConsensusFigures | None = None  # the consensus records, by recovered signer

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_rule(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for violation in self.violations:
            counts[violation.rule] = counts.get(violation.rule, 0) + 1
        return dict(sorted(counts.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "chain_id": self.validators.chain_id,
            "validators": list(self.validators.addresses),
            "quorum": self.validators.quorum,
            "epochs": self.validators.epoch_table(),
            "nodes": self.blocks,
            "transactions": self.transactions,
            "signatures": self.signatures,
            "signatures_per_second": round(self.signatures / max(self.recovery_seconds, 1e-9)),
            "signatures_per_cpu_second":
                round(self.signatures / max(self.recovery_cpu_seconds, 1e-9)),
            "seconds": round(self.seconds, 3),
            **({"consensus": self.figures.to_json(self.validators.members())}
               if self.figures else {}),
            "violations_by_rule": self.by_rule(),
            "violations": [asdict(x) for x in self.violations],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    def summary(self) -> str:
        v = self.validators
        lines = [
            f"audited {sum(self.blocks.values())} blocks from {len(self.blocks)} node(s), "
            f"{self.transactions} transactions, {self.signatures} signed messages "
            f"(N = {v.size}, f = {v.max_faulty}, Q = {v.quorum}, chain id {v.chain_id}"
            f"{epochs_note(v)}) in {self.seconds:.1f} s",
        ]
        if self.ok:
            lines.append("no violations: the chain and its certificates are sound")
            return "\n".join(lines) + "\n"
        counts = ", ".join(f"{rule} {n}" for rule, n in self.by_rule().items())
        lines.append(f"{len(self.violations)} violation(s): {counts}")
        lines.extend(x.line() for x in self.violations)
        return "\n".join(lines) + "\n"
