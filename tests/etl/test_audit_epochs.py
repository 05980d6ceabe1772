"""The audit across validator-set changes: a real chain whose validators vote a fifth member
in (it decides from block 11) and then a genesis member out (from block 16), every block
certified by its own height's set and committing in extraData to the next height's. Honest:
sound, the epochs reported, exported with --genesis from a validator, an observer and the
validator voted in (which holds no stable checkpoint from before it joined). Lies: a node's
epochs that the headers do not commit to, a certificate of the old set above the handover,
a change hidden from the epochs table, a checkpoint missing from the added validator's own
epochs."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from cli.etl import main
from pbft_engine.messages import Commit, KeySigner
from spark_etl.audit import Audit, ValidatorSet, find_violations
from spark_etl.audit.consensus_rules import certificates
from spark_etl.audit.epoch_rules import extra_data
from spark_etl.audit.records_rules import checkpoint_missing
from spark_etl.audit.validators import resolve_validators
from spark_etl.tables import Dataset
from tests.etl.chain_factory import (
    CHAIN_ID,
    CHECKPOINT_INTERVAL,
    ServedChain,
    Validators,
    build_chain,
    certificate_json,
    commits_for,
)
from tests.etl.conftest import NODE_A, NODE_B, Tables, dataset, export_rows
from tests.etl.fake_node import serving
from tests.etl.test_audit_anchor import write_genesis

GENESIS = Validators()
ADDED = KeySigner(b"\x05" * 32)
SECOND = Validators([*GENESIS.signers, ADDED], epoch=1)  # N = 5: f = 1, Q = 4
THIRD = Validators([*GENESIS.signers[1:], ADDED], epoch=2)  # validator 0 voted out
SCHEDULE = [(1, GENESIS), (11, SECOND), (16, THIRD)]
OUTSIDERS = Validators([KeySigner(bytes([0x70 + i]) * 32) for i in range(5)])
GENESIS_SET = ValidatorSet(tuple(GENESIS.addresses), CHAIN_ID, CHECKPOINT_INTERVAL)
ADDED_ADDRESS = "0x" + ADDED.address.hex()
# pbft_status of an observer (pbft_engine.engine: no view, no validator address)
OBSERVER_STATUS = {"engine": "pbft", "role": "observer", "epoch": 2, "lastExecuted": 22,
                   "mode": "following", "checkpointInterval": CHECKPOINT_INTERVAL}


@pytest.fixture(scope="module")
def epoch_chain(tmp_path_factory: pytest.TempPathFactory) -> ServedChain:
    """Blocks 1..22: stable checkpoints at 5 and 10 (the genesis set's), 15 (the second
    set's: the added validator's first) and 20."""
    return build_chain(tmp_path_factory.mktemp("epochs"), SCHEDULE, empty_blocks=12)


def without_checkpoints(chain: ServedChain, *numbers: int) -> ServedChain:
    """`chain` served without the stable checkpoints at `numbers`."""
    payloads = [dataclasses.replace(p, checkpoints=[]) if n in numbers else p
                for n, p in enumerate(chain.payloads)]
    return dataclasses.replace(chain, payloads=payloads)


def trusted(data: Dataset) -> ValidatorSet:
    """The genesis set with the changes the export's epochs table reports."""
    return resolve_validators(data.export_manifest, None, GENESIS_SET, data.epochs)


def found(spark: SparkSession, tables: Tables) -> set[tuple[str, int | None]]:
    """(rule, block) of the violations of the rules a set change touches (a whole audit is
    the honest chain's)."""
    data = dataset(spark, tables)
    violations = find_violations(Audit(data, trusted(data)), (certificates, extra_data))
    return {(v.rule, v.block_number) for v in violations}


@dataclasses.dataclass(frozen=True)
class Run:
    """`pbft-etl run` of nodes serving the chain: status, report, page, the nodes by role
    and the export's directory."""

    code: int
    report: dict[str, Any]
    page: str
    nodes: dict[str, str]  # role -> URL
    out: Path


@pytest.fixture(scope="module")
def honest(spark: SparkSession, epoch_chain: ServedChain,
           tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Exported from three nodes (their epochs too) and audited against the genesis, in one
    command: a genesis validator, an observer (pbft_status without view or address) and the
    validator voted in, which was an observer until block 10 and so holds no stable
    checkpoint below 11 (the handover checkpoint 10 is the genesis set's)."""
    directory = tmp_path_factory.mktemp("run")
    report, page = directory / "report.json", directory / "audit.html"
    genesis = write_genesis(epoch_chain, directory / "genesis.json")
    with (serving(epoch_chain) as validator, serving(epoch_chain) as observer,
          serving(without_checkpoints(epoch_chain, 5, 10)) as added,
          redirect_stdout(io.StringIO())):
        observer.status = OBSERVER_STATUS
        added.status = {**added.status, "validator": ADDED_ADDRESS, "epoch": 2}
        nodes = {"validator": validator.url, "observer": observer.url, "added": added.url}
        code = main(["run", "--rpc", ",".join(nodes.values()), "--out", str(directory / "out"),
                     "--genesis", str(genesis), "--report", str(report), "--html", str(page)])
    return Run(code, json.loads(report.read_text()), page.read_text(), nodes,
               directory / "out")


def test_an_honest_chain_across_two_set_changes_is_sound(honest: Run) -> None:
    assert honest.code == 0, honest.report["violations"]
    # the observer is exported and audited, and each node's own address recorded
    assert set(honest.report["nodes"]) == set(honest.nodes.values())
    manifest = pq.read_table(honest.out / "export_manifest").to_pylist()
    named = {(row["node"], row["validator"]) for row in manifest}
    assert named == {(honest.nodes["validator"], None), (honest.nodes["observer"], None),
                     (honest.nodes["added"], ADDED_ADDRESS)}
    assert [(e["epoch"], e["first_block"], e["last_block"], e["n"], e["quorum"])
            for e in honest.report["epochs"]] == [(0, 1, 10, 4, 3), (1, 11, 15, 5, 4),
                                                  (2, 16, None, 4, 3)]
    # each epoch's members are counted: the added validator signed from block 11 on
    shares = honest.report["consensus"]["per_validator"]
    assert shares["0x" + ADDED.address.hex()]["commits"] > 0
    assert "Validator-set epochs" in honest.page
    assert "0x" + ADDED.address.hex() in honest.page


def test_epochs_the_headers_do_not_commit_to_and_an_old_set_above_the_handover_are_caught(
    spark: SparkSession, epoch_chain: ServedChain,
) -> None:
    """The node's epochs table names outsiders for epoch 1 (blocks 11-15), and block 17
    carries a certificate of the genesis set (validator 0 left at 15)."""
    payloads = list(epoch_chain.payloads)
    block = payloads[17]
    old = certificate_json(GENESIS, commits_for(GENESIS, 17, bytes.fromhex(
        block.block["hash"][2:])))
    payloads[17] = dataclasses.replace(block, certificate=old)
    tables = export_rows(dataclasses.replace(epoch_chain, payloads=payloads), (NODE_A,))
    for row in tables["epochs"]:
        if row["epoch"] == 1:
            row["validators"] = OUTSIDERS.addresses
    caught = found(spark, tables)
    # blocks 10-14 commit to the real second set, not the outsiders; no outsider signed
    assert {("extra-data", 10), ("certificate-quorum", 11), ("certificate-quorum", 15),
            ("certificate-signature", 17), ("certificate-quorum", 17)} <= caught
    assert {b for rule, b in caught if rule == "extra-data"} == set(range(10, 15))
    assert not {b for rule, b in caught if rule.startswith("certificate")} - {*range(11, 16), 17}


def test_a_certificate_naming_another_epoch_counts_for_nothing(
    spark: SparkSession, epoch_chain: ServedChain,
) -> None:
    """Block 17's COMMITs are signed by the members of its own set (the third), each at its
    index there, but name epoch 1: a signature for one epoch never counts in another."""
    payloads = list(epoch_chain.payloads)
    block = payloads[17]
    digest = bytes.fromhex(block.block["hash"][2:])
    renamed = dataclasses.replace(THIRD, epoch=1)
    payloads[17] = dataclasses.replace(
        block, certificate=certificate_json(renamed, commits_for(renamed, 17, digest)))
    data = dataset(spark, export_rows(dataclasses.replace(epoch_chain, payloads=payloads),
                                      (NODE_A,)))
    violations = find_violations(Audit(data, trusted(data)), (certificates,))
    assert {(v.rule, v.block_number) for v in violations} == {
        ("certificate-signature", 17), ("certificate-quorum", 17)}
    assert any("names epoch 1, but block 17 is decided by epoch 2" in v.detail
               for v in violations)


def test_a_change_hidden_from_the_epochs_table_is_caught_at_the_committing_block(
    spark: SparkSession, epoch_chain: ServedChain,
) -> None:
    """The node reports no removal: the second set going on after block 15."""
    tables = copy.deepcopy(export_rows(epoch_chain, (NODE_A,)))
    tables["epochs"] = [row for row in tables["epochs"] if row["epoch"] != 2]
    for row in tables["epochs"]:
        if row["epoch"] == 1:
            row["last_block"] = None
    caught = found(spark, tables)
    # block 15 commits to the third set, and so do 16 and 17; the third set's certificates
    # do not count for the second
    assert {b for rule, b in caught if rule == "extra-data"} == set(range(15, 23))
    assert {("certificate-quorum", 16), ("certificate-quorum", 17)} <= caught


def test_a_validator_voted_in_must_hold_the_stable_checkpoints_of_its_own_epochs(
    spark: SparkSession, epoch_chain: ServedChain,
) -> None:
    """Node A names the added validator's address and serves no stable checkpoint at 5, 10
    or 15, only 20: 15, in its first epoch, is missing (5 and 10 are not its to hold), as
    long as the export shows that validator live throughout 15's interval (its COMMITs for
    15 to 19). Node B names no address (an
    observer) and lacks 5: missing, as for any node."""
    tables = copy.deepcopy(export_rows(epoch_chain, (NODE_A, NODE_B)))
    dropped = {NODE_A: {5, 10, 15}, NODE_B: {5}}
    tables["checkpoints"] = [row for row in tables["checkpoints"]
                             if row["seq_no"] not in dropped[row["node"]]]
    for row in tables["export_manifest"]:
        row["validator"] = ADDED_ADDRESS if row["node"] == NODE_A else None
    data = dataset(spark, tables)
    violations = find_violations(Audit(data, trusted(data)), (checkpoint_missing,))
    assert {(v.rule, v.node, v.block_number) for v in violations} == {
        ("checkpoint-missing", NODE_A, 15), ("checkpoint-missing", NODE_B, 5)}

    # down around 15 (none of its COMMITs for 15 .. 25 in the export), it caught up by
    # fetching certified blocks, which holds no checkpoint between: 15 is not its to hold
    tables["commit_certificates"] = [
        row for row in tables["commit_certificates"]
        if not (row["signer"] == ADDED_ADDRESS and 15 <= row["block_number"] <= 25)]
    data = dataset(spark, tables)
    violations = find_violations(Audit(data, trusted(data)), (checkpoint_missing,))
    assert {(v.rule, v.node, v.block_number) for v in violations} == {
        ("checkpoint-missing", NODE_B, 5)}


def test_a_validator_killed_before_the_checkpoints_at_m_reached_it_need_not_hold_m(
    spark: SparkSession, epoch_chain: ServedChain,
) -> None:
    """Issue 31's script failed now and then on this shape: the added validator executes 15,
    commits 16 (its COMMITs at 15 and 16 are in the certificates) and is killed before the
    others' CHECKPOINTs at 15 reach it; blocks 17 to 19 are committed without it (their
    certificates hold the three others' COMMITs). Restarted, it fetches them, and never
    holds 15 stable (nobody sends those CHECKPOINTs again,
    tests/unit/pbft/test_pbft_checkpoints.py), while it holds 20. It was not live throughout
    15's interval: 15 is not its to hold. Its COMMITs for every block from 15 to 19 in the
    export (live throughout) and 15 is required
    (`test_a_validator_voted_in_must_hold_the_stable_checkpoints_of_its_own_epochs`)."""
    payloads = list(epoch_chain.payloads)
    for number in (17, 18, 19):  # committed while it was down: replicas 0 to 2 of the third set
        digest = bytes.fromhex(payloads[number].block["hash"][2:])
        commits = [THIRD.sign(Commit(1, number, digest, r)) for r in range(3)]
        payloads[number] = dataclasses.replace(
            payloads[number], certificate=certificate_json(THIRD, commits))
    tables = copy.deepcopy(export_rows(dataclasses.replace(epoch_chain, payloads=payloads),
                                       (NODE_A, NODE_B)))
    tables["checkpoints"] = [row for row in tables["checkpoints"]
                             if not (row["node"] == NODE_A and row["seq_no"] in {5, 10, 15})]
    for row in tables["export_manifest"]:
        row["validator"] = ADDED_ADDRESS if row["node"] == NODE_A else None
    data = dataset(spark, tables)
    assert find_violations(Audit(data, trusted(data)), (checkpoint_missing,)) == []


def test_q_checkpoints_without_the_node_s_own_are_not_a_stable_checkpoint_it_hides(
    spark: SparkSession, epoch_chain: ServedChain,
) -> None:
    """Node A serves the CHECKPOINTs of replicas 0, 1 and 2 at 5 (Q of the genesis set) and
    says 5 is not stable. Named as validator 0, whose own CHECKPOINT is among them, it
    executed 5 and held it stable: checkpoint-missing. Named as validator 3, it may have been
    killed before executing 5 (a replica's checkpoint is stable only with its own among Q,
    pbft_engine.core.log), so nothing is required of it there."""
    tables = copy.deepcopy(export_rows(epoch_chain, (NODE_A, NODE_B)))
    for row in tables["checkpoints"]:
        if row["node"] == NODE_A and row["seq_no"] == 5:
            row["stable"] = False

    def found(named: str) -> set[tuple[str, str | None, int | None]]:
        for row in tables["export_manifest"]:
            row["validator"] = named if row["node"] == NODE_A else None
        data = dataset(spark, tables)
        return {(v.rule, v.node, v.block_number)
                for v in find_violations(Audit(data, trusted(data)), (checkpoint_missing,))}

    assert found("0x" + GENESIS.signers[0].address.hex()) == {
        ("checkpoint-missing", NODE_A, 5)}
    assert found("0x" + GENESIS.signers[3].address.hex()) == set()
