"""Incremental audits (`spark_etl.audit.incremental`): an export of the epoch chain up to
block 10, audited, then grown to block 22 (the validator set changes at 11: across the
boundary) and audited again, reads only the blocks above 10 and reports what a full audit
of the whole reports, for the honest chain and with lies below, at and above the boundary;
a block up to the boundary that the export wrote again is a violation; a state that does
not match what the audit is given is not continued."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark_etl import schemas
from spark_etl.audit import RULES
from spark_etl.audit.incremental import Outcome, audit_export, code_version, why_full
from spark_etl.audit.report import AuditResult
from spark_etl.tables import Dataset, write_table
from tests.etl.chain_factory import ServedChain
from tests.etl.conftest import NODE_A, NODE_B, RANGE_SIZE, Tables, dataset, etl, export_rows
from tests.etl.test_audit import _certify_another_block, _change, flip, rows
from tests.etl.test_audit_anchor import write_genesis
from tests.etl.test_audit_epochs import epoch_chain, trusted  # noqa: F401 (a fixture)

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


def write(spark: SparkSession, tables: Tables, root: Path) -> Dataset:
    """`tables` written into the export directory `root` as the export writes them (a
    block range's partitions replaced whole), and the export read back."""
    frames = dataset(spark, tables)
    for table in schemas.TABLES:
        write_table(getattr(frames, table.name), str(root), table)
    return Dataset.read(spark, str(root))


def audit(spark: SparkSession, root: Path, full: str | None = None) -> tuple[Outcome, Dataset]:
    whole = Dataset.read(spark, str(root))
    return audit_export(spark, str(root), whole, trusted(whole), RULES, full), whole


def report(result: AuditResult) -> tuple[Any, ...]:
    return (result.ok, result.violations, result.blocks, result.transactions, result.figures)


@dataclasses.dataclass(frozen=True)
class Grown:
    """One export audited, grown, audited again (incremental), then audited whole."""

    incremental: Outcome
    full: Outcome
    whole: Dataset
    root: Path


def grow(spark: SparkSession, chain: ServedChain, root: Path, *,
         first_only: tuple[Plant, ...] = (), both: tuple[Plant, ...] = (),
         second_only: tuple[Plant, ...] = ()) -> Grown:
    """`first_only` plants in what only the first export writes, `both` in what each writes
    (the tables written whole), `second_only` in what the second writes."""
    first, second = exports(chain)
    for plants, written in ((first_only, [first]), (both, [first, second]),
                            (second_only, [second])):
        for plant in plants:
            for tables in written:
                plant(tables, chain)
    write(spark, first, root)
    before, _ = audit(spark, root)
    assert before.result.continued is None and before.state.boundary == BOUNDARY
    write(spark, second, root)
    incremental, whole = audit(spark, root)
    full, _ = audit(spark, root, "--full")
    return Grown(incremental, full, whole, root)


@pytest.fixture(scope="module")
def honest(spark: SparkSession, epoch_chain: ServedChain,  # noqa: F811 (the fixture)
           tmp_path_factory: pytest.TempPathFactory) -> Grown:
    return grow(spark, epoch_chain, tmp_path_factory.mktemp("incremental") / "out")


def old_messages(tables: Dataset) -> int:
    """The signed messages only the blocks up to the boundary hold: their COMMITs, and the
    CHECKPOINTs of 10 (those of 5 are also in view 1's VIEW-CHANGEs, a table read whole)."""
    commits = tables.commit_certificates.where(f"block_number <= {BOUNDARY}")
    checkpoints = tables.checkpoints.where(f"seq_no = {BOUNDARY} and message is not null")
    return commits.select("message").union(checkpoints.select("message")).distinct().count()


def test_a_grown_honest_chain_is_audited_above_the_boundary_alike(honest: Grown) -> None:
    incremental, full = honest.incremental.result, honest.full.result
    assert incremental.continued is not None and incremental.continued.boundary == BOUNDARY
    assert full.continued is None and full.ok
    assert report(incremental) == report(full)
    # it read only the blocks above the boundary: it recovered none of the blocks' below
    assert incremental.signatures == full.signatures - old_messages(honest.whole) > 0
    assert honest.incremental.state.boundary == honest.full.state.boundary == 22
    assert honest.incremental.state.commits == honest.full.state.commits
    assert honest.incremental.state.next_epoch == 2


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
    below = _change("blocks", "gas_limit", lambda g: g + 1, number=3)
    above = (_change("blocks", "timestamp", lambda t: t + 1, number=17),
             _change("checkpoints", "state_root", flip, seq_no=20))
    grown = grow(spark, epoch_chain, tmp_path / "out", first_only=(below,),
                 both=(_no_view_change,), second_only=(_parent_lie, _fork, _rewrite, *above))
    incremental, full = grown.incremental.result, grown.full.result
    where = {(v.rule, v.node, v.block_number) for v in incremental.violations}
    assert {("block-hash", NODE_A, 3), ("parent-hash", NODE_A, BOUNDARY + 1),
            ("node-agreement", None, BOUNDARY + 1), ("block-hash", NODE_A, 17),
            ("checkpoint-chain", NODE_A, 20), ("view-change-missing", NODE_A, 7),
            ("rewritten-block", NODE_B, 9)} <= where
    # the full audit judges block 9 as it is now; the incremental one, as it was, and says
    # it changed
    rewritten = [v for v in incremental.violations if v.rule == "rewritten-block"]
    assert [(v.node, v.block_number) for v in rewritten] == [(NODE_B, 9)]
    now_at_9 = [v for v in full.violations if v.block_number == 9]
    assert now_at_9, "the rewrite is a lie the full audit sees at block 9"
    expected = sorted(set(full.violations) - set(now_at_9) | set(rewritten),
                      key=lambda v: v.sort_key())
    assert set(incremental.violations) ^ set(expected) == set()
    assert incremental.violations == expected
    assert report(dataclasses.replace(incremental, violations=expected)) == report(
        dataclasses.replace(full, violations=expected))


def test_a_state_that_does_not_match_is_not_continued(honest: Grown) -> None:
    state, whole = honest.incremental.state, honest.whole
    manifest = [row.asDict() for row in whole.export_manifest.collect()]
    validators = trusted(whole)
    assert why_full(state, validators, manifest) is None
    other_chain = dataclasses.replace(validators, chain_id=validators.chain_id + 1)
    assert "trust anchor" in str(why_full(state, other_chain, manifest))
    assert "code changed" in str(why_full(dataclasses.replace(state, code="0" * 64),
                                          validators, manifest))
    written_again = copy.deepcopy(manifest)
    written_again[0]["blocks"] += 1
    closed = written_again[0]["range_start"] < state.nodes[written_again[0]["node"]].open_range
    assert closed == ("written again" in str(why_full(state, validators, written_again)))
    assert code_version() == state.code


def test_the_command_continues_the_state_it_wrote_and_says_why_not(
    honest: Grown, epoch_chain: ServedChain,  # noqa: F811 (the fixture)
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the state was written trusting the genesis set without block 0: a genesis file is
    # another anchor, so the command audits the whole export, and says why
    genesis = str(write_genesis(epoch_chain, honest.root.parent / "genesis.json"))
    command = ("audit", "--data", str(honest.root), "--genesis", genesis)
    code, out, err = etl(capsys, *command)
    assert (code, "incremental:" in out) == (0, False), out
    assert "note: a full audit: the trust anchor" in err
    code, out, err = etl(capsys, *command)
    assert (code, "incremental: blocks 0..22" in out, err) == (0, True, ""), out
