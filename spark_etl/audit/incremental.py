"""Incremental audits: an export that grew since its last audit is audited where it grew.

Every audit of an export's directory (`pbft-etl audit` and `run`; not `run_audit`) writes
an audit state into it (`audit_state`: one line of JSON, written by Spark, so on any storage
the export is on), collected in the audit's one job beside its results. It holds the
boundary B (the lowest of the nodes' highest exported blocks) and what the rules need of the
blocks up to it: per node its last block at or below B (number, hash, state root), whether
its blocks commit to a set in extraData, a digest of its manifest rows of the ranges below
the one holding B (the export never writes those again) and, for each of its blocks from
that range's start up to B (the export fetches that range again, whole), a digest of its
rows and one of its stable checkpoint's; the epoch and set that decide B+1; the
per-validator COMMIT and CHECKPOINT tallies up to B; the views the COMMITs up to B name;
every violation; the trust anchor and the audit code's version.

The next audit of the directory checks that state against what it is given and what the
directory holds (any difference: a full audit, with a note saying why), audits the blocks
above B with every rule, the boundary checked as any block is (the first block above B
follows the node's carried block; its certificate is counted with the epochs, which the
anchor check proved unchanged up to B+1), and merges: the findings at blocks up to B are the
audit's before, those above B and those of the rules that read whole tables (`WHOLE_RULES`)
are this one's, and a block up to B whose rows the re-export changed is `rewritten-block`
(but a checkpoint that became stable since, as an honest node's does once its votes came:
its proof was never judged, so the whole export is audited again)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from spark_etl import schemas
from spark_etl.audit import Audit, Rule, audit_with
from spark_etl.audit.context import Carried, ValidatorSet, union_all
from spark_etl.audit.epoch_rules import NO_COMMITMENT
from spark_etl.audit.records_rules import commit_views, per_signer
from spark_etl.audit.report import AuditResult, Continued, Violation
from spark_etl.tables import RANGE_KEYS, Dataset, is_local_path, local_frame

STATE_TABLE = "audit_state"  # under the export's directory, beside its tables
STATE_SCHEMA = StructType([StructField("value", StringType())])
FORMAT = 1
# The height column of each block-range table: a window keeps the rows above the boundary
HEIGHTS = {"blocks": "number", "transactions": "block_number", "receipts": "block_number",
           "logs": "block_number", "commit_certificates": "block_number",
           "checkpoints": "seq_no"}
# Rules that read the tables an export writes whole each time (view changes, evidence,
# epochs, the manifest), every block's number or row count, or the carried state: an
# incremental audit finds all of their violations anew, wherever they are.
WHOLE_RULES = frozenset({
    "export-manifest", "block-range", "genesis-block", "chain-id", "validator-set",
    "node-behind", "view-change", "view-change-missing", "record-fields", "evidence-false",
})
REWRITTEN = "rewritten-block"


@dataclass(frozen=True)
class NodeState:
    """One node's part of the audit state (see the module's docstring)."""

    last_block: int | None
    hash: str | None
    state_root: str | None
    committing: bool
    open_range: int  # range_start of the range holding the boundary
    manifest: str  # SHA-256 of the node's manifest rows of the ranges below open_range
    digests: dict[int, str]  # block -> digest of its rows, open_range..boundary
    # block -> digest of its stable checkpoint's rows, where it had one (a checkpoint not
    # yet stable is served anew as its votes come, and is not digested)
    stable: dict[int, str]


@dataclass(frozen=True)
class AuditState:
    format: int
    code: str  # the audit's own version: a digest of its source
    anchor: dict[str, Any]  # the trusted set, chain id, K, block 0, epochs up to boundary+1
    boundary: int
    audited_at: str
    next_epoch: int  # the epoch that decides boundary+1, and its set
    next_set: list[str]
    nodes: dict[str, NodeState]
    commits: dict[str, int]  # per validator: blocks up to the boundary with its valid COMMIT
    checkpoints: dict[str, int]
    named_views: list[tuple[str, int, int]]  # (node, view, first block) of COMMITs
    violations: list[Violation]

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: str) -> AuditState:
        value = json.loads(text)
        nodes = {node: NodeState(**{**fields, **{key: {
            int(block): digest for block, digest in fields[key].items()}
            for key in ("digests", "stable")}}) for node, fields in value["nodes"].items()}
        return cls(**{**value, "nodes": nodes,
                      "named_views": [tuple(v) for v in value["named_views"]],
                      "violations": [Violation(**v) for v in value["violations"]]})


def code_version() -> str:
    """A digest of the audit's source (this package and the table schemas): a state written
    by other code is not trusted."""
    sources = sorted(Path(__file__).parent.glob("*.py")) + [Path(schemas.__file__)]
    digest = hashlib.sha256(str(FORMAT).encode())
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def anchor_of(validators: ValidatorSet, boundary: int) -> dict[str, Any]:
    """What the audit trusted up to `boundary`, as JSON values."""
    epochs = [[first, list(s)] for first, s in validators.epochs() if first <= boundary + 1]
    anchor = {"addresses": list(validators.addresses), "chain_id": validators.chain_id,
              "checkpoint_interval": validators.checkpoint_interval,
              "genesis_hash": validators.genesis_hash, "max_in_flight": validators.max_in_flight,
              "overrides": [[first, list(s)] for first, s in validators.overrides],
              "epochs": epochs}
    normal: dict[str, Any] = json.loads(json.dumps(anchor))
    return normal


# --- the state on storage ----------------------------------------------------------------

def state_path(root: str) -> str:
    return f"{root.rstrip('/')}/{STATE_TABLE}"


def read_state(spark: SparkSession, root: str) -> AuditState | str:
    """The audit state under `root`, or why there is none to continue from."""
    path = state_path(root)
    if is_local_path(root) and not Path(path.removeprefix("file://")).exists():
        return "no audit state"
    try:
        lines = [row["value"] for row in spark.read.schema(STATE_SCHEMA).text(path).collect()]
        return AuditState.loads(lines[0])
    except (PySparkException, Py4JError, IndexError):
        return "no audit state"
    except (ValueError, KeyError, TypeError) as exc:
        return f"the audit state cannot be read ({type(exc).__name__}: {exc})"


def write_state(spark: SparkSession, root: str, state: AuditState) -> str | None:
    """Write `state` under `root`; why it could not be, if so (the audit stands)."""
    frame = local_frame(spark, [(state.dumps(),)], STATE_SCHEMA)
    try:
        frame.coalesce(1).write.mode("overwrite").text(state_path(root))
    except (PySparkException, Py4JError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"the audit state could not be written ({first}): the next audit is full"
    return None


# --- the manifest, on the driver -----------------------------------------------------------

Manifest = list[dict[str, Any]]


def node_boundaries(manifest: Manifest) -> dict[str, int]:
    """Each node's highest exported block (-1: none)."""
    highest: dict[str, int] = {}
    for row in manifest:
        last = row["last_block"] if row["last_block"] is not None else -1
        highest[row["node"]] = max(highest.get(row["node"], -1), last)
    return highest


def open_range(manifest: Manifest, node: str, boundary: int) -> int:
    """The start of the node's range that holds `boundary` (or its last range below it)."""
    starts = [r["range_start"] for r in manifest if r["node"] == node
              and r["range_start"] <= boundary]
    return max(starts, default=0)


def closed_digest(manifest: Manifest, node: str, below: int) -> str:
    """SHA-256 of the node's manifest rows of the ranges that start below `below`."""
    rows = sorted(json.dumps(r, sort_keys=True, default=str) for r in manifest
                  if r["node"] == node and r["range_start"] < below)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def why_full(state: AuditState, validators: ValidatorSet, manifest: Manifest) -> str | None:
    """Why `state` cannot be continued on this export and trust anchor, if it cannot."""
    since = f"since the audit of {state.audited_at}"
    if state.format != FORMAT or state.code != code_version():
        return f"the audit's code changed {since}"
    if anchor_of(validators, state.boundary) != state.anchor:
        return (f"the trust anchor (genesis, validator set, or the epochs up to block "
                f"{state.boundary + 1}) differs from the audit of {state.audited_at}")
    if set(node_boundaries(manifest)) != set(state.nodes):
        return f"the export's nodes changed {since}"
    for node, kept in state.nodes.items():
        if closed_digest(manifest, node, kept.open_range) != kept.manifest:
            return f"{node}'s export below block {kept.open_range} was written again {since}"
    return None


# --- the audit -----------------------------------------------------------------------------

def window(whole: Dataset, boundary: int, manifest: Manifest) -> Dataset:
    """The block-range tables' rows above `boundary`; their Parquet partitions that hold
    none are not read (range_start below the first range that ends above it)."""
    starts = [r["range_start"] for r in manifest
              if r["last_block"] is not None and r["last_block"] > boundary]
    first = min(starts, default=boundary + 1)
    return replace(whole, **{
        table: getattr(whole, table).where(
            (F.col(schemas.RANGE_START.name) >= first) & (F.col(height) > boundary))
        for table, height in HEIGHTS.items()})


def block_digests(whole: Dataset, low: int, high: int) -> DataFrame:
    """(node, block_number, digest, stable): SHA-256 of a block's rows in every block-range
    table but checkpoints, and of its stable checkpoint's rows (null: none), for the blocks
    low..high (by range: partitions below `low` are not read). One aggregate over the rows
    as JSON (each row's table named in it), not a digest a table: planned in a few steps."""
    checkpoint = schemas.CHECKPOINTS.name

    def as_json(table: str, height: str) -> DataFrame:
        frame = getattr(whole, table)
        kept = (F.col(schemas.RANGE_START.name) >= low) & F.col(height).between(low, high)
        return frame.where(kept & F.col("stable") if table == checkpoint else kept).select(
            "node", F.col(height).alias("block_number"), F.lit(table).alias("table"),
            F.to_json(F.struct(F.lit(table).alias("table"),
                               *(c for c in frame.columns if c not in RANGE_KEYS))).alias("row"))

    def digest(where: Column) -> Column:
        rows = F.sort_array(F.collect_list(F.when(where, F.col("row"))))
        return F.sha2(F.array_join(rows, "\n"), 256)

    stable = F.col("table") == checkpoint
    return union_all(*(as_json(t, h) for t, h in HEIGHTS.items())).groupBy(
        "node", "block_number").agg(digest(~stable).alias("digest"),
                                    F.when(F.max(stable), digest(stable)).alias("stable"))


def state_parts(audit: Audit, boundary: int, low: int) -> dict[str, DataFrame]:
    """What the next audit carries of the blocks up to the new `boundary` that this one
    read (its window), collected with its results."""
    data = audit.data
    commits = data.commit_certificates.where(F.col("block_number") <= boundary)
    checkpoints = data.checkpoints.where(F.col("seq_no") <= boundary)
    blocks = data.blocks.where(F.col("number") <= boundary)
    committed = ~F.col("extra_data").eqNullSafe(NO_COMMITMENT)
    return {
        "state_commits": per_signer(audit, commits, "commit", "seq_no"),
        "state_checkpoints": per_signer(audit, checkpoints, "checkpoint", "seq_no"),
        "state_views": commit_views(audit).where(F.col("block_number") <= boundary)
        .groupBy("node", "view").agg(F.min("block_number").alias("block_number")),
        "state_last": blocks.groupBy("node").agg(
            F.max(F.struct("number", "hash", "state_root")).alias("last"),
            F.max(F.when(F.col("number") > 0, committed)).alias("committing")),
        "state_digest": block_digests(audit.exported, low, boundary),
    }


@dataclass(frozen=True)
class Outcome:
    """An audit of an export: its result over the whole chain, the state written for the
    next one, and what the user is told (why the audit is full; a state not written)."""

    result: AuditResult
    state: AuditState
    notes: tuple[str, ...]


def audit_export(spark: SparkSession, root: str, whole: Dataset, validators: ValidatorSet,
                 rules: tuple[Rule, ...], full: str | None = None) -> Outcome:
    """Audit the export `whole` read from `root`: incrementally when `root` holds the state
    of an audit of it before and `full` (why a full audit is asked for) is None."""
    manifest = [row.asDict() for row in whole.export_manifest.collect()]
    found = full or read_state(spark, root)
    if isinstance(found, AuditState):
        found = why_full(found, validators, manifest) or found
    before = found if isinstance(found, AuditState) else None
    notes = [] if before or found == "no audit state" else [f"a full audit: {found}"]
    boundary = before.boundary if before else -1
    heads = node_boundaries(manifest)
    new_boundary = max(min(heads.values(), default=-1), boundary)
    opens = {node: open_range(manifest, node, new_boundary) for node in heads}
    low = min([*opens.values(), *(s.open_range for s in (before.nodes if before else {})
                                  .values())], default=0)
    if before is None:
        audit = Audit(whole, validators)
    else:
        audit = Audit(window(whole, boundary, manifest), validators, whole=whole,
                      carried=carried_of(before))
    result, rows = audit_with(audit, rules, lambda a: state_parts(a, new_boundary, low))
    digests = _digests(rows.get("state_digest", []))
    if before is not None:
        rewrites, stabilized = rewritten(before, digests)
        if stabilized:  # rows up to the boundary to judge: the carried findings lack them
            return audit_export(spark, root, whole, validators, rules, stabilized)
        result = merge(before, result, rewrites)
    state = new_state(before, result, rows, validators, manifest, new_boundary, opens, digests)
    written = write_state(spark, root, state)
    return Outcome(result, state, tuple(notes + ([written] if written else [])))


def carried_of(state: AuditState) -> Carried:
    nodes = state.nodes.items()
    return Carried(
        boundary=state.boundary,
        last_blocks=tuple((node, s.last_block, s.hash) for node, s in nodes
                          if s.last_block is not None and s.hash is not None),
        named_views=tuple(state.named_views),
        committing=tuple(node for node, s in nodes if s.committing),
    )


Digests = dict[str, dict[int, tuple[str, str | None]]]  # node -> block -> (rows, stable)


def _digests(rows: Iterable[Row]) -> Digests:
    digests: Digests = {}
    for row in rows:
        digests.setdefault(row["node"], {})[row["block_number"]] = (row["digest"], row["stable"])
    return digests


def rewritten(before: AuditState, digests: Digests) -> tuple[list[Violation], str | None]:
    """A block up to the boundary whose rows the export changed (or lost) since the audit
    before: what that audit passed is not what the directory holds now. And why the audit
    must be full, if a checkpoint up to the boundary became stable since (its node served
    it anew, as an honest one does once its votes came: its proof was not judged)."""
    found = []
    for node, kept in before.nodes.items():
        for block, digest in kept.digests.items():
            now, stable = digests.get(node, {}).get(block, (None, None))
            was_stable = kept.stable.get(block)
            if was_stable is None and stable is not None and now == digest:
                return [], (f"{node}'s checkpoint {block} became stable since the audit of "
                            f"{before.audited_at}")
            if now != digest or was_stable not in (None, stable):
                what = "are gone" if now is None else "changed"
                found.append(Violation(REWRITTEN, node, block, (
                    f"the node's rows of block {block} {what} since the audit of "
                    f"{before.audited_at} (exported again); audit with --full to judge the "
                    "export as it is now")))
    return found, None


def merge(before: AuditState, now: AuditResult, rewrites: list[Violation]) -> AuditResult:
    """The whole chain's result: the audit before's findings up to its boundary, this one's
    above it and of the rules that read whole tables, the rewrites; tallies added up."""
    boundary = before.boundary

    def carried(v: Violation) -> bool:
        return (v.rule not in WHOLE_RULES and v.block_number is not None
                and v.block_number <= boundary)

    kept = [v for v in before.violations if carried(v)]
    fresh = [v for v in now.violations if not carried(v)]
    violations = sorted(set(kept + fresh + rewrites), key=Violation.sort_key)
    figures = now.figures and replace(
        now.figures, commits=_add(before.commits, now.figures.commits),
        checkpoints=_add(before.checkpoints, now.figures.checkpoints))
    return replace(now, violations=violations, figures=figures,
                   continued=Continued(boundary, before.audited_at))


def _add(first: dict[str, int], second: dict[str, int]) -> dict[str, int]:
    return {k: first.get(k, 0) + second.get(k, 0) for k in dict.fromkeys([*first, *second])}


def _tallies(rows: Iterable[Row]) -> dict[str, int]:
    return {row["key"]: row["count"] for row in rows if row["key"] is not None}


def new_state(before: AuditState | None, result: AuditResult, rows: dict[str, list[Row]],
              validators: ValidatorSet, manifest: Manifest, boundary: int,
              opens: dict[str, int], digests: Digests) -> AuditState:
    """The state after this audit: the one before's, with what this one read up to the new
    boundary added."""
    last = {row["node"]: row for row in rows.get("state_last", [])}
    nodes = {}
    for node, start in opens.items():
        old = before.nodes.get(node) if before else None
        kept = old or NodeState(None, None, None, False, start, "", {}, {})
        kept_digests = {b: d for b, d in digests.get(node, {}).items() if start <= b <= boundary}
        mine = last.get(node)
        top = mine["last"] if mine else None
        nodes[node] = NodeState(
            last_block=top["number"] if top else kept.last_block,
            hash=top["hash"] if top else kept.hash,
            state_root=top["state_root"] if top else kept.state_root,
            committing=bool(mine and mine["committing"]) or kept.committing,
            open_range=start,
            manifest=closed_digest(manifest, node, start),
            digests={b: d for b, (d, _) in kept_digests.items()},
            stable={b: d for b, (_, d) in kept_digests.items() if d is not None},
        )
    epochs = validators.epochs()
    next_epoch = max(i for i, (first, _) in enumerate(epochs) if first <= max(boundary + 1, 1))
    return AuditState(
        format=FORMAT, code=code_version(), anchor=anchor_of(validators, boundary),
        boundary=boundary, audited_at=datetime.now(UTC).isoformat(timespec="seconds"),
        next_epoch=next_epoch, next_set=list(epochs[next_epoch][1]), nodes=nodes,
        commits=_add(before.commits if before else {}, _tallies(rows.get("state_commits", []))),
        checkpoints=_add(before.checkpoints if before else {},
                         _tallies(rows.get("state_checkpoints", []))),
        named_views=sorted((r["node"], r["view"], r["block_number"])
                           for r in rows.get("state_views", [])),
        violations=result.violations,
    )
