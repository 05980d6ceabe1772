"""Incremental audits (`spark_etl.audit.incremental`): an export of the epoch chain up to
block 10, audited, then grown to block 22 (the validator set changes at 11: across the
boundary) and audited again, reads only the blocks above 10 and reports what a full audit
of the whole reports, for the honest chain and with lies below, at and above the boundary;
a block up to the boundary that the export wrote again is a violation; a state that does
not match what the audit is given is not continued."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from cli.etl import genesis_validators, main
from spark_etl import schemas
from spark_etl.audit import RULES
from spark_etl.audit.incremental import AuditState, audit_export, read_state, why_full
from spark_etl.audit.report import AuditResult
from spark_etl.audit.validators import resolve_validators
from spark_etl.tables import Dataset, write_table
from tests.etl.chain_factory import ServedChain
from tests.etl.conftest import NODE_A, NODE_B, RANGE_SIZE, Tables, dataset, export_rows
from tests.etl.test_audit import _certify_another_block, _change, flip, rows
from tests.etl.test_audit_anchor import write_genesis
from tests.etl.test_audit_epochs import GENESIS_SET, epoch_chain  # noqa: F401 (a fixture)

BOUNDARY = 10  # the first export's head; the set that decides 11 is the second epoch's
OPEN = BOUNDARY - BOUNDARY % RANGE_SIZE  # the range the second export fetches again
Plant = Callable[[Tables, ServedChain], None]


def exports(chain: ServedChain) -> tuple[Tables, Tables]:
    """The first export (up to BOUNDARY: the epochs a node knows then) and what the second
    export writes: the ranges from OPEN on, and the tables written whole."""
    first = export_rows(chain, (NODE_A, NODE_B), BOUNDARY)
    first["epochs"] = [e for e in first["epochs"] if e["first_block"] <= BOUNDARY + 1]
    second = export_rows(chain, (NODE_A, NODE_B))
    for table in schemas.BLOCK_TABLES + (schemas.EXPORT_MANIFEST,):
        second[table.name] = [r for r in second[table.name] if r["range_start"] >= OPEN]
    return first, second


def write(spark: SparkSession, tables: Tables, root: Path) -> None:
    """`tables` written into the export directory `root` as the export writes them (a
    block range's partitions replaced whole)."""
    frames = dataset(spark, tables)
    for table in schemas.TABLES:
        write_table(getattr(frames, table.name), str(root), table)


def etl_audit(root: Path, genesis: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    """`pbft-etl audit` of `root`: its status, JSON report and stderr."""
    report = root.parent / "report.json"
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(["audit", "--data", str(root), "--genesis", str(genesis), "--report",
                     str(report), *extra])
    return code, json.loads(report.read_text()), err.getvalue()


@dataclasses.dataclass(frozen=True)
class Grown:
    """The honest chain's first export audited, grown, audited again (incremental), then
    audited whole (--full), by the command: the reports, what the audits said on stderr."""

    reports: tuple[dict[str, Any], ...]
    said: tuple[str, ...]
    whole: Dataset
    root: Path


@pytest.fixture(scope="module")
def honest(spark: SparkSession, epoch_chain: ServedChain,  # noqa: F811 (the fixture)
           tmp_path_factory: pytest.TempPathFactory) -> Grown:
    directory = tmp_path_factory.mktemp("incremental")
    genesis, root = write_genesis(epoch_chain, directory / "genesis.json"), directory / "out"
    first, second = exports(epoch_chain)
    write(spark, first, root)
    runs = [etl_audit(root, genesis)]
    write(spark, second, root)
    runs += [etl_audit(root, genesis), etl_audit(root, genesis, "--full")]
    assert [code for code, _, _ in runs] == [0, 0, 0], runs
    return Grown(tuple(r for _, r, _ in runs), tuple(e for _, _, e in runs),
                 Dataset.read(spark, str(root)), root)


def old_messages(tables: Dataset) -> int:
    """The signed messages only the blocks up to the boundary hold: their COMMITs, and the
    CHECKPOINTs of 10 (those of 5 are also in view 1's VIEW-CHANGEs, a table read whole)."""
    commits = tables.commit_certificates.where(f"block_number <= {BOUNDARY}")
    checkpoints = tables.checkpoints.where(f"seq_no = {BOUNDARY} and message is not null")
    return commits.select("message").union(checkpoints.select("message")).distinct().count()


# What an audit's report says of the chain (not of how long it took)
VERDICT = ("ok", "violations", "violations_by_rule", "nodes", "transactions", "epochs",
           "consensus")


def test_a_grown_honest_chain_is_audited_above_the_boundary_alike(honest: Grown) -> None:
    first, incremental, full = honest.reports
    assert honest.said == ("", "", "pbft-etl: note: a full audit: --full\n")
    assert (first["incremental"], incremental["incremental"]["boundary"],
            full["incremental"]) == (None, BOUNDARY, None)
    assert full["ok"] and full["nodes"] == {NODE_A: 23, NODE_B: 23}
    assert {k: incremental[k] for k in VERDICT} == {k: full[k] for k in VERDICT}
    # it read only the blocks above the boundary: it recovered none of the blocks' below
    assert incremental["signatures"] == full["signatures"] - old_messages(honest.whole) > 0


def test_a_state_that_does_not_match_is_not_continued(spark: SparkSession,
                                                      honest: Grown) -> None:
    state, whole = read_state(spark, str(honest.root)), honest.whole
    assert isinstance(state, AuditState) and state.boundary == 22 and state.next_epoch == 2
    manifest = [row.asDict() for row in whole.export_manifest.collect()]
    validators = genesis_validators(honest.root.parent / "genesis.json")
    validators = resolve_validators(whole.export_manifest, None, validators, whole.epochs)
    assert why_full(state, validators, manifest) is None
    without_block_zero = dataclasses.replace(validators, genesis_hash=None)
    assert "trust anchor" in str(why_full(state, without_block_zero, manifest))
    assert "code changed" in str(why_full(dataclasses.replace(state, code="0" * 64),
                                          validators, manifest))
    closed = [r for r in copy.deepcopy(manifest)
              if r["range_start"] < state.nodes[r["node"]].open_range]
    closed[0]["blocks"] += 1
    assert "written again" in str(why_full(state, validators, closed + [
        r for r in manifest if r["range_start"] >= state.nodes[r["node"]].open_range]))
    assert "nodes changed" in str(why_full(state, validators, [
        r for r in manifest if r["node"] == NODE_A]))


def _parent_lie(tables: Tables, chain: ServedChain) -> None:
    """Node A's first block above the boundary names another parent."""
    _change("blocks", "parent_hash", flip, number=BOUNDARY + 1)(tables, chain)


def _fork(tables: Tables, chain: ServedChain) -> None:
    """Node B holds another certified block at BOUNDARY + 1: a fork across the boundary."""
    _certify_another_block(tables, chain, NODE_B, BOUNDARY + 1)


def _rewrite(tables: Tables, chain: ServedChain) -> None:
    """Node B's block 9 (in the range fetched again) is served otherwise the second time."""
    rows(tables, "blocks", NODE_B, number=9)[0]["timestamp"] += 1


def _no_view_change(tables: Tables, chain: ServedChain) -> None:
    tables["view_changes"] = [r for r in tables["view_changes"] if r["node"] != NODE_A]


def test_lies_below_at_and_above_the_boundary_are_reported_as_a_full_audit_does(
    spark: SparkSession, epoch_chain: ServedChain,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    first, second = exports(epoch_chain)
    below = _change("blocks", "gas_limit", lambda g: g + 1, number=3)
    above = (_change("blocks", "timestamp", lambda t: t + 1, number=17),
             _change("checkpoints", "state_root", flip, seq_no=20))
    for plants, written in (((below,), [first]), ((_no_view_change,), [first, second]),
                            ((_parent_lie, _fork, _rewrite, *above), [second])):
        for plant in plants:
            for tables in written:
                plant(tables, epoch_chain)
    root = tmp_path / "out"

    def audit(full: str | None = None) -> AuditResult:
        whole = Dataset.read(spark, str(root))
        validators = resolve_validators(whole.export_manifest, None, GENESIS_SET, whole.epochs)
        return audit_export(spark, str(root), whole, validators, RULES, full).result

    write(spark, first, root)
    assert audit().continued is None
    write(spark, second, root)
    incremental, full = audit(), audit("--full")
    assert incremental.continued is not None and full.continued is None
    where = {(v.rule, v.node, v.block_number) for v in incremental.violations}
    assert {("block-hash", NODE_A, 3), ("parent-hash", NODE_A, BOUNDARY + 1),
            ("node-agreement", None, BOUNDARY + 1), ("block-hash", NODE_A, 17),
            ("checkpoint-chain", NODE_A, 20), ("view-change-missing", NODE_A, 7),
            ("rewritten-block", NODE_B, 9)} <= where
    # the full audit judges block 9 as it is now; the incremental one, as it was, and says
    # that it changed
    rewritten = [v for v in incremental.violations if v.rule == "rewritten-block"]
    assert [(v.node, v.block_number) for v in rewritten] == [(NODE_B, 9)]
    now_at_9 = [v for v in full.violations if v.block_number == 9]
    assert now_at_9, "the rewrite is a lie the full audit sees at block 9"
    expected = sorted(set(full.violations) - set(now_at_9) | set(rewritten),
                      key=lambda v: v.sort_key())
    assert incremental.violations == expected
    assert (incremental.blocks, incremental.transactions, incremental.figures) == (
        full.blocks, full.transactions, full.figures)
