"""Incremental audits (`spark_etl.audit.incremental`): the epoch chain exported up to block
10 and audited, then grown to block 22 (the validator set changes at 11: across the
boundary) and audited again, reading only the blocks above 10. One grown export, lies
planted below, at and above the boundary: each is found; a block up to the boundary that
the export wrote again otherwise is `rewritten-block`; a fork across the boundary shows at
its first block; the state of an audit with another trust anchor gives a full audit, with a
note; a state that does not match what the audit is given is not continued. Two audits (an
audit costs seconds of the suite): the first with one cheap rule, the grown export's with
every rule."""

from __future__ import annotations

import copy
import dataclasses
import shutil
from collections import Counter
from itertools import groupby
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from spark_etl import schemas
from spark_etl.audit import RULES, Rule
from spark_etl.audit.chain_rules import continuity
from spark_etl.audit.context import ValidatorSet
from spark_etl.audit.incremental import (
    FORMAT,
    AuditState,
    Outcome,
    anchor_of,
    audit_export,
    code_version,
    read_state,
    rewritten,
    why_full,
    write_state,
)
from spark_etl.audit.validators import resolve_validators
from spark_etl.tables import Dataset, escape_path_name, to_record_batch
from tests.etl.chain_factory import ServedChain
from tests.etl.conftest import NODE_A, NODE_B, RANGE_SIZE, Tables, export_rows
from tests.etl.test_audit import _certify_another_block, _change, flip, rows
from tests.etl.test_audit_epochs import GENESIS_SET

BOUNDARY = 10  # the first export's head; the set that decides 11 is the second epoch's
OPEN = BOUNDARY - BOUNDARY % RANGE_SIZE  # the range the second export fetches again


def exports(chain: ServedChain) -> tuple[Tables, Tables]:
    """The first export (up to BOUNDARY: the epochs a node knows then) and what the second
    export writes: the ranges from OPEN on, and the tables written whole."""
    first = export_rows(chain, (NODE_A, NODE_B), BOUNDARY)
    first["epochs"] = [e for e in first["epochs"] if e["first_block"] <= BOUNDARY + 1]
    second = export_rows(chain, (NODE_A, NODE_B))
    for table in schemas.BLOCK_TABLES + (schemas.EXPORT_MANIFEST,):
        second[table.name] = [r for r in second[table.name] if r["range_start"] >= OPEN]
    return first, second


def write(tables: Tables, root: Path) -> None:
    """`tables` written into the export directory `root` as the export writes them: each
    partition they have rows for replaced whole, the others kept (no Spark job)."""
    for table in schemas.TABLES:
        keys = [c.name for c in table.partition]
        arrow_schema = to_arrow_schema(table.row_schema, timezone="UTC")

        def partition(row: dict[str, Any], keys: list[str] = keys) -> tuple[Any, ...]:
            return tuple(row[k] for k in keys)

        (root / table.name).mkdir(parents=True, exist_ok=True)
        for values, group in groupby(sorted(tables[table.name], key=partition), partition):
            directory = root.joinpath(table.name, *(
                f"{k}={escape_path_name(str(v))}" for k, v in zip(keys, values, strict=True)))
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            batch = to_record_batch([tuple(r[c] for c in table.column_names) for r in group],
                                    arrow_schema)
            pq.write_table(pa.Table.from_batches([batch]), directory / "part-0.parquet")


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


BELOW = _change("blocks", "parent_hash", flip, number=3)  # continuity: the first audit's rule
ABOVE = (_change("blocks", "timestamp", lambda t: t + 1, number=17),
         _change("checkpoints", "state_root", flip, seq_no=20))
FIRST_RULES = (continuity,)  # the first audit's: its findings are what the next one carries
# What the incremental audit finds: the first audit's finding below the boundary; view 1's
# record missing (a view named below, in a table exported whole: found anew); the rewrite;
# the parent-hash lie and the fork across the boundary at 11; lies in 17 and checkpoint 20
FOUND = {
    ("parent-hash", NODE_A, 3), ("view-change-missing", NODE_A, 7),
    ("rewritten-block", NODE_B, 9),
    ("block-hash", NODE_A, 11), ("raw-block", NODE_A, 11), ("parent-hash", NODE_A, 11),
    ("block-hash", NODE_B, 11), ("raw-block", NODE_B, 11), ("node-agreement", None, 11),
    ("conflicting-certificates", None, 11), ("parent-hash", NODE_B, 12),
    ("block-hash", NODE_A, 17), ("raw-block", NODE_A, 17), ("node-agreement", None, 17),
    ("checkpoint-chain", NODE_A, 20), ("checkpoint-proof", NODE_A, 20),
}


@dataclasses.dataclass(frozen=True)
class Grown:
    """The first export audited (`first`: over the state of an audit with another trust
    anchor), grown and audited again (`incremental`); what they were given."""

    first: Outcome
    incremental: Outcome
    root: Path
    exports: tuple[Tables, Tables]


def foreign_state(validators: ValidatorSet) -> AuditState:
    """The state an audit with `validators` leaves of an empty export."""
    return AuditState(FORMAT, code_version(), anchor_of(validators, -1), -1,
                      "2026-11-26T13:40:02+00:00", 0, [], {}, {}, {}, [], [])


@pytest.fixture(scope="module")
def grown(spark: SparkSession, epoch_chain: ServedChain,
          tmp_path_factory: pytest.TempPathFactory) -> Grown:
    first, second = exports(epoch_chain)
    for plants, written in (((BELOW,), [first]), ((_no_view_change,), [first, second]),
                            ((_parent_lie, _fork, _rewrite, *ABOVE), [second])):
        for plant in plants:
            for tables in written:
                plant(tables, epoch_chain)
    root = tmp_path_factory.mktemp("incremental") / "out"

    def audit(rules: tuple[Rule, ...]) -> Outcome:
        whole = Dataset.read(spark, str(root))
        validators = resolve_validators(whole.export_manifest, None, GENESIS_SET, whole.epochs)
        return audit_export(spark, str(root), whole, validators, rules)

    write(first, root)
    other_genesis = dataclasses.replace(GENESIS_SET, addresses=GENESIS_SET.addresses[1:])
    assert write_state(spark, str(root), foreign_state(other_genesis)) is None
    before = audit(FIRST_RULES)
    write(second, root)
    return Grown(before, audit(RULES), root, (first, second))


def test_a_changed_trust_anchor_audits_the_whole_export_with_a_note(grown: Grown) -> None:
    assert grown.first.notes == (
        "a full audit: the trust anchor (genesis, validator set, or the epochs up to block 0) "
        "differs from the audit of 2026-11-26T13:40:02+00:00",)
    assert grown.first.result.continued is None


def test_lies_below_at_and_above_the_boundary_are_found(grown: Grown) -> None:
    """Below: the first audit's finding, carried (its rules judged those blocks); at 11, a
    parent-hash lie and a fork across the boundary; above, lies in a block and a checkpoint;
    view-change-missing found anew; block 9 as it was audited, and said to have changed."""
    first, incremental = grown.first.result, grown.incremental.result
    assert grown.incremental.notes == ()
    assert incremental.continued is not None and incremental.continued.boundary == BOUNDARY
    found = {(v.rule, v.node, v.block_number) for v in incremental.violations}
    assert found == FOUND
    assert {(v.rule, v.node, v.block_number) for v in first.violations} == {
        ("parent-hash", NODE_A, 3)}  # view-change-missing is not among its rules


def test_the_tallies_are_the_whole_chain_s_though_the_blocks_below_were_not_read(
    grown: Grown,
) -> None:
    """Each validator's blocks with its COMMIT: those up to the boundary carried, those above
    counted now; the blocks and transactions counted over the whole export."""
    first, second = grown.exports
    commits = {(row["signer"], row["block_number"])
               for tables in (first, second) for row in tables["commit_certificates"]}
    result = grown.incremental.result
    assert result.figures is not None
    assert result.figures.commits == Counter(signer for signer, _ in commits)
    assert result.blocks == {NODE_A: 23, NODE_B: 23}
    assert result.transactions == len({(r["node"], r["hash"]) for tables in (first, second)
                                       for r in tables["transactions"]})


def test_a_state_that_does_not_match_is_not_continued(spark: SparkSession,
                                                      grown: Grown) -> None:
    state, whole = read_state(spark, str(grown.root)), Dataset.read(spark, str(grown.root))
    assert isinstance(state, AuditState) and state.boundary == 22 and state.next_epoch == 2
    manifest = [row.asDict() for row in whole.export_manifest.collect()]
    validators = resolve_validators(whole.export_manifest, None, GENESIS_SET, whole.epochs)
    assert why_full(state, validators, manifest) is None
    without_block_zero = dataclasses.replace(validators, genesis_hash="0x" + "00" * 32)
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


def test_a_checkpoint_that_became_stable_is_judged_and_one_changed_is_a_rewrite(
    grown: Grown,
) -> None:
    """An honest node serves a checkpoint up to the boundary anew once its votes came: not a
    rewrite, but rows no audit judged (a full audit); a stable checkpoint changed is one."""
    state = grown.incremental.state  # boundary 22: checkpoint 20 stable, in the range fetched again
    now = {node: {block: (digest, kept.stable.get(block))
                  for block, digest in kept.digests.items()}
           for node, kept in state.nodes.items()}
    assert rewritten(state, now) == ([], None)
    unstable = dataclasses.replace(state.nodes[NODE_B], stable={})
    before = dataclasses.replace(state, nodes={**state.nodes, NODE_B: unstable})
    assert rewritten(before, now) == ([], f"{NODE_B}'s checkpoint 20 became stable since the "
                                          f"audit of {state.audited_at}")
    now[NODE_B][20] = (now[NODE_B][20][0], "0" * 64)
    found, full = rewritten(state, now)
    assert [(v.rule, v.node, v.block_number) for v in found] == [
        ("rewritten-block", NODE_B, 20)] and full is None
