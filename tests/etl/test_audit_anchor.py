"""The trust anchor and the exported range, which a lying node must not choose: the audit
needs a genesis file (or an explicit --trust-node), block 0 and the chain id are the
genesis's, each node's blocks are exactly the range asked, a node claiming a lower head is
reported and cuts no other node's export, and nodes agree on every row, not only on hashes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from cli.etl import genesis_validators, main
from spark_etl.audit import Audit, ValidatorSet, Violation, find_violations
from spark_etl.audit.anchor_rules import block_range, chain_id, genesis_block, node_behind
from spark_etl.audit.chain_rules import continuity
from spark_etl.audit.export_rules import export_manifest, node_agreement
from spark_etl.tables import Dataset
from tests.etl.chain_factory import CHAIN_ID, CHECKPOINT_INTERVAL, SENDER, ServedChain
from tests.etl.conftest import NODE_A, NODE_B, RANGE_SIZE, Tables, etl, make_audit
from tests.etl.fake_node import serving

Rule = Callable[[Audit], DataFrame]
FAST = ("--retries", "1", "--range-size", "4")
EXPORT_RULES = (node_behind, block_range, genesis_block, chain_id, node_agreement,
                export_manifest)


def found(spark: SparkSession, tables: Tables, validators: ValidatorSet,
          *rules: Rule) -> list[tuple[str, str | None, int | None]]:
    violations = find_violations(make_audit(spark, tables, validators), rules)
    return [(v.rule, v.node, v.block_number) for v in violations]


def details(violations: list[Violation]) -> str:
    return "\n".join(v.detail for v in violations)


def write_genesis(chain: ServedChain, path: Path, **changes: Any) -> Path:
    """A genesis file of the test chain (chain_factory builds block 0 from these values; the
    engine section does not enter block 0), with top-level `changes`."""
    document = {
        "config": {"chainId": CHAIN_ID, "pbft": {"validators": chain.validators.addresses,
                                                 "checkpoint_interval": CHECKPOINT_INTERVAL}},
        "alloc": {SENDER.public_key.to_checksum_address(): {"balance": hex(10**24)}},
        "timestamp": chain.payloads[0].block["timestamp"],
        **changes,
    }
    path.write_text(json.dumps(document))
    return path


@pytest.fixture(scope="module")
def genesis_file(test_chain: ServedChain, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_genesis(test_chain, tmp_path_factory.mktemp("genesis") / "genesis.json")


# --- the trust anchor -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["audit", "--data", "."], "give --genesis FILE"),
        (["audit", "--data", ".", "--validators", "v.txt"], "--validators: add --trust-node"),
        (["audit", "--data", ".", "--genesis", "g.json", "--validators", "v.txt"],
         "--validators: add --trust-node"),
        (["run", "--rpc", "http://127.0.0.1:1", "--out", "never"], "give --genesis FILE"),
    ],
)
def test_the_audit_needs_a_genesis_or_an_explicit_trust_node(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, stderr = etl(capsys, *args)
    assert (code, stderr.count("\n")) == (2, 1), stderr
    assert message in stderr and stderr.startswith("pbft-etl: error")


def test_a_genesis_file_the_chain_refuses_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, test_chain: ServedChain
) -> None:
    genesis = write_genesis(test_chain, tmp_path / "genesis.json",
                            alloc={"0x" + "22" * 20: {"balance": hex(2**256)}})
    code, _, stderr = etl(capsys, "audit", "--data", str(tmp_path), "--genesis", str(genesis))
    assert (code, stderr.count("\n")) == (2, 1), stderr
    assert f"--genesis {genesis}: Account Balance exceeds" in stderr


def test_the_genesis_file_gives_the_hash_of_block_0(
    genesis_file: Path, test_chain: ServedChain, tmp_path: Path
) -> None:
    trusted = genesis_validators(genesis_file)
    assert trusted.genesis_hash == test_chain.genesis_hash
    assert trusted.checkpoint_interval == CHECKPOINT_INTERVAL
    other = genesis_validators(write_genesis(test_chain, tmp_path / "other.json", timestamp=1))
    assert other.genesis_hash != test_chain.genesis_hash


def test_the_genesis_file_s_overrides_are_read_and_a_malformed_one_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], test_chain: ServedChain, tmp_path: Path,
) -> None:
    """config.pbft.transitions: the sets the audit takes from the file at those blocks."""
    later = test_chain.validators.addresses[:2]
    config = {"chainId": CHAIN_ID, "pbft": {"validators": test_chain.validators.addresses,
                                            "transitions": [{"block": 9, "validators": later}]}}
    trusted = genesis_validators(write_genesis(test_chain, tmp_path / "g.json", config=config))
    assert trusted.overrides == ((9, tuple(later)),)
    config["pbft"]["transitions"] = [{"block": 1, "validators": later}]
    bad = write_genesis(test_chain, tmp_path / "bad.json", config=config)
    code, _, stderr = etl(capsys, "audit", "--data", str(tmp_path), "--genesis", str(bad))
    assert (code, stderr.count("\n")) == (2, 1), stderr
    assert "config.pbft.transitions must be a list" in stderr


def test_a_block_0_that_is_not_the_genesis_s_is_genesis_block(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet, test_chain: ServedChain
) -> None:
    anchored = replace(validator_set, genesis_hash=test_chain.genesis_hash)
    assert found(spark, tables, anchored, genesis_block) == []
    forged = "0x" + "ab" * 32
    next(r for r in tables["blocks"] if r["node"] == NODE_B and r["number"] == 0)["hash"] = forged
    for row in tables["export_manifest"]:
        if row["node"] == NODE_B:
            row["genesis_hash"] = forged
    violations = find_violations(make_audit(spark, tables, anchored), (genesis_block,))
    assert [(v.rule, v.node, v.block_number) for v in violations] == [
        ("genesis-block", NODE_B, 0), ("genesis-block", NODE_B, 0)]
    assert forged in details(violations) and test_chain.genesis_hash in details(violations)


def test_another_chain_id_is_chain_id(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    assert found(spark, tables, validator_set, chain_id) == []
    for row in tables["export_manifest"]:
        if row["node"] == NODE_B:
            row["chain_id"] = CHAIN_ID + 1
    assert found(spark, tables, validator_set, chain_id) == [("chain-id", NODE_B, None)]


# --- the range --------------------------------------------------------------------------


def drop_range(tables: Tables, node: str, start: int) -> None:
    """Every row of one node's block range, its manifest row with them (no file is left
    that the manifest misses, no row count disagrees)."""
    for name, rows in tables.items():
        tables[name] = [r for r in rows if (r["node"], r.get("range_start")) != (node, start)]


@pytest.mark.parametrize(("start", "where", "block"), [(0, "at the start", 0),
                                                       (8, "at the end", 8)])
def test_deleting_a_node_s_first_or_last_blocks_is_block_range(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet, start: int, where: str,
    block: int,
) -> None:
    assert found(spark, tables, validator_set, block_range) == []
    drop_range(tables, NODE_A, start)
    # what caught nothing before: continuity counts from the first block, the manifest
    # agrees with what is left
    assert found(spark, tables, validator_set, continuity, export_manifest) == []
    violations = find_violations(make_audit(spark, tables, validator_set), (block_range,))
    assert [(v.rule, v.node, v.block_number) for v in violations] == [
        ("block-range", NODE_A, block)]
    last = start + RANGE_SIZE - 1 if start == 0 else 10
    assert violations[0].detail == (f"blocks {start}..{last} are missing {where}; the export "
                                    "asked for blocks 0..10")


def test_a_node_that_claims_a_lower_head_is_node_behind(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    assert found(spark, tables, validator_set, node_behind) == []
    for row in tables["export_manifest"]:
        if row["node"] == NODE_B:
            row["node_head"] = 4
    for name in ("blocks", "transactions", "receipts", "logs"):
        column = "number" if name == "blocks" else "block_number"
        tables[name] = [r for r in tables[name] if r["node"] == NODE_A or r[column] <= 4]
    violations = find_violations(make_audit(spark, tables, validator_set),
                                 (node_behind, block_range))
    assert [(v.rule, v.node, v.block_number) for v in violations] == [
        ("node-behind", NODE_B, 10)]
    assert violations[0].detail == (f"the node claims head 4 (eth_blockNumber), but {NODE_A} "
                                    "served block 10 with a quorum certificate")


def test_nodes_that_differ_only_in_a_receipt_column_are_node_agreement(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    receipt = next(r for r in tables["receipts"] if r["node"] == NODE_B and r["block_number"] == 1)
    receipt["contract_address"] = "0x" + "ee" * 20
    violations = find_violations(make_audit(spark, tables, validator_set), (node_agreement,))
    assert [(v.rule, v.block_number) for v in violations] == [("node-agreement", 1)]
    assert violations[0].detail.startswith("nodes disagree on receipts: ")
    assert NODE_A in violations[0].detail and NODE_B in violations[0].detail


# --- the export, from nodes on loopback -------------------------------------------------


@pytest.fixture(scope="module")
def lagging_export(test_chain: ServedChain,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """The test chain exported from an honest node and one that claims head 4 throughout:
    (out, the honest node's URL, the lagging node's URL)."""
    out = tmp_path_factory.mktemp("lagging") / "out"
    with serving(test_chain) as honest, serving(test_chain) as lagging:
        lagging.heads = [4]
        code = main(["export", "--rpc", f"{honest.url},{lagging.url}", "--out", str(out),
                     "--lag-wait", "0.3", *FAST])
        assert code == 0
        yield out, honest.url, lagging.url


def blocks_per_node(spark: SparkSession, out: Path) -> dict[str, int]:
    blocks = Dataset.read(spark, str(out)).blocks.groupBy("node").agg(F.count("*").alias("n"))
    return {row["node"]: row["n"] for row in blocks.collect()}


def test_a_node_claiming_a_lower_head_cuts_no_other_node_s_export_and_is_reported(
    spark: SparkSession, lagging_export: tuple[Path, str, str], genesis_file: Path
) -> None:
    out, honest, lagging = lagging_export
    assert blocks_per_node(spark, out) == {honest: 11, lagging: 5}
    audit = Audit(Dataset.read(spark, str(out)), genesis_validators(genesis_file))
    assert [(v.rule, v.node, v.block_number) for v in find_violations(audit, EXPORT_RULES)] == [
        ("node-behind", lagging, 10)]


def test_a_node_claiming_a_head_below_from_is_recorded_and_node_behind(
    spark: SparkSession, tmp_path: Path, test_chain: ServedChain, genesis_file: Path
) -> None:
    """It has no block to export, yet the manifest records its claim."""
    out = tmp_path / "out"
    with serving(test_chain) as honest, serving(test_chain) as lagging:
        lagging.heads = [4]
        assert main(["export", "--rpc", f"{honest.url},{lagging.url}", "--out", str(out),
                     "--from", "8", "--lag-wait", "0.3", *FAST]) == 0
    assert blocks_per_node(spark, out) == {honest.url: 3}
    audit = Audit(Dataset.read(spark, str(out)), genesis_validators(genesis_file))
    assert [(v.rule, v.node, v.block_number) for v in find_violations(audit, EXPORT_RULES)] == [
        ("node-behind", lagging.url, 10)]


def test_a_node_claiming_a_head_it_does_not_serve_is_block_range(
    spark: SparkSession, tmp_path: Path, test_chain: ServedChain, genesis_file: Path
) -> None:
    """It fails no export: the honest node is exported whole, the boaster up to its last
    block, and the audit names what it claimed and did not serve."""
    out = tmp_path / "out"
    with serving(test_chain) as honest, serving(test_chain) as boasting:
        boasting.heads = [15]
        assert main(["export", "--rpc", f"{honest.url},{boasting.url}", "--out", str(out),
                     "--lag-wait", "0.3", *FAST]) == 0
    assert blocks_per_node(spark, out) == {honest.url: 11, boasting.url: 11}
    audit = Audit(Dataset.read(spark, str(out)), genesis_validators(genesis_file))
    violations = find_violations(audit, EXPORT_RULES)
    assert [(v.rule, v.node, v.block_number) for v in violations] == [
        ("block-range", boasting.url, 11)]
    assert violations[0].detail == ("blocks 11..15 are missing at the end; the export asked "
                                    "for blocks 0..15")


def test_a_genesis_that_did_not_make_block_0_is_genesis_block(
    spark: SparkSession, lagging_export: tuple[Path, str, str], test_chain: ServedChain,
    tmp_path: Path,
) -> None:
    out, honest, lagging = lagging_export
    other = genesis_validators(write_genesis(test_chain, tmp_path / "other.json", timestamp=1))
    audit = Audit(Dataset.read(spark, str(out)), other)
    violations = find_violations(audit, (genesis_block,))
    assert sorted((v.rule, v.node) for v in violations) == sorted(
        [("genesis-block", node) for node in (honest, honest, lagging, lagging)])


def test_an_honest_node_behind_is_waited_for_and_trust_node_warns(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain,
) -> None:
    out = tmp_path / "out"
    with serving(test_chain) as ahead, serving(test_chain) as behind:
        behind.heads = [4, 4, 7, 10]  # catches up while the export waits
        code, _, stderr = etl(capsys, "run", "--rpc", f"{ahead.url},{behind.url}", "--out",
                              str(out), "--lag-wait", "30", "--trust-node", *FAST)
    assert code == 0, stderr
    assert blocks_per_node(spark, out) == {ahead.url: 11, behind.url: 11}
    warnings = [line for line in stderr.splitlines() if "warning" in line]
    assert warnings == ["pbft-etl: warning: --trust-node: the validator set and chain id are "
                        "the exported nodes' own answers, so the verdict trusts the node"]
