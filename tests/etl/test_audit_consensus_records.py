"""What a lying node says about the consensus records is checked against the signatures:
the signers it names, the evidence it keeps, the checkpoints and view changes it leaves out,
records that do not decode. Each test plants lies in node A's or B's rows of the test chain
(tests/etl/chain_factory.py: COMMITs of replicas 0..2 in view 0 for blocks 1..6, 1..3 in
view 1 after it, all four at multiples of 3; stable checkpoints at 5 and 10 signed by 0..2;
view 1 installed by replica 1's NEW-VIEW on VIEW-CHANGEs of 1..3 naming checkpoint 5)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pyspark.sql import SparkSession

from pbft_engine.messages import Commit
from spark_etl.audit import ValidatorSet, Violation, consensus_rules, find_violations
from spark_etl.audit.html import _validator_shares
from spark_etl.audit.records_rules import (
    checkpoint_missing,
    consensus_figures,
    evidence_false,
    malformed_records,
    signer_columns,
    view_change_missing,
)
from spark_etl.hexcodec import to_hex
from tests.etl.chain_factory import CHECKPOINT_INTERVAL, ServedChain
from tests.etl.conftest import NODE_A, NODE_B, Tables, make_audit
from tests.etl.test_audit import remove, rows

NEW_RULES = (signer_columns, evidence_false, checkpoint_missing, view_change_missing,
             malformed_records)


def where(found: list[Violation], rule: str) -> set[tuple[str | None, int | None]]:
    return {(v.node, v.block_number) for v in found if v.rule == rule}


def with_interval(validators: ValidatorSet) -> ValidatorSet:
    return dataclasses.replace(validators, checkpoint_interval=CHECKPOINT_INTERVAL)


def honest_commit(tables: Tables, node: str, number: int, replica: int) -> str:
    return rows(tables, "commit_certificates", node, block_number=number,
                replica=replica)[0]["message"]


def other_commit(chain: ServedChain, number: int, replica: int) -> str:
    """The validator's COMMIT for another block at `number`: an equivocation."""
    return to_hex(chain.validators.sign(Commit(0, number, bytes(32 * [0xAB]),
                                               replica)).encode())


def evidence(node: str, signer: str, first: str | None, second: str | None,
             seq_no: int = 3) -> dict[str, Any]:
    return {"node": node, "signer": signer, "type": "commit", "view": 0, "seq_no": seq_no,
            "first": first, "second": second}


def test_a_clean_export_breaks_none_of_the_record_rules(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    audit = make_audit(spark, tables, with_interval(validator_set))
    assert find_violations(audit, NEW_RULES) == []


def test_signers_are_recovered_never_taken_from_the_node(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet, test_chain: ServedChain
) -> None:
    addresses = test_chain.validators.addresses
    for row in rows(tables, "commit_certificates", NODE_A):
        row["signer"] = addresses[0]  # the node credits validator 0 with every COMMIT
    rows(tables, "checkpoints", NODE_A, seq_no=10, replica=0)[0]["replica"] = 3
    rows(tables, "view_changes", NODE_A, signer=addresses[2])[0]["signer"] = addresses[0]
    for row in rows(tables, "view_changes", NODE_B):
        row["primary"] = addresses[3]
    tables["evidence"].append(evidence(NODE_B, addresses[0], honest_commit(tables, NODE_B, 3, 2),
                                       other_commit(test_chain, 3, 2)))
    audit = make_audit(spark, tables, validator_set)
    found = find_violations(audit, (signer_columns,))
    assert where(found, "signer-column") == {
        *((NODE_A, n) for n in range(1, 11)), (NODE_A, 10), (NODE_A, None), (NODE_B, None),
        (NODE_B, 3),
    }
    assert len([v for v in found if (v.node, v.block_number) == (NODE_B, None)]) == 1
    checkpoint = next(v for v in found if v.detail.startswith("checkpoints.replica"))
    assert checkpoint.detail == (f"checkpoints.replica is 3 ({addresses[3]}); the signed "
                                 f"message recovers to {addresses[0]}")
    # the report credits each validator with the blocks its own signature is on
    figures = consensus_figures(audit)
    assert figures.commits == dict(zip(addresses, (7, 10, 10, 6), strict=True))
    assert figures.checkpoints == dict(zip(addresses[:3], (2, 2, 2), strict=True))
    assert figures.view_changes == dict(zip(addresses[1:], (1, 1, 1), strict=True))
    assert [v.primary for v in figures.views] == [addresses[1]]
    shares = _validator_shares(figures, validator_set.addresses)
    assert list(shares.data[0].y) == [7, 10, 10, 6]


def test_evidence_is_reported_only_when_two_signed_messages_prove_it(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet, test_chain: ServedChain
) -> None:
    addresses = test_chain.validators.addresses
    honest = {r: honest_commit(tables, NODE_B, 3, r) for r in range(4)}
    other = {r: other_commit(test_chain, 3, r) for r in range(4)}
    signers = test_chain.validators.signers
    forged = to_hex(test_chain.validators.sign(Commit(0, 3, bytes(32), 3), signers[0]).encode())
    tables["evidence"] += [
        evidence(NODE_B, addresses[2], honest[2], other[2]),  # proven
        # one COMMIT alone proves nothing (the engine keeps a lone message only for a PREPARE
        # from the primary or an invalid block's PRE-PREPARE): a replayed honest vote
        evidence(NODE_B, addresses[1], honest[1], None),
        evidence(NODE_B, addresses[1], honest[1], honest[1]),
        evidence(NODE_B, addresses[0], honest[3], other[3]),
        evidence(NODE_B, addresses[3], honest[3], forged),
        evidence(NODE_B, addresses[3], honest[3], other_commit(test_chain, 4, 3)),
        evidence(NODE_B, addresses[0], honest[1], None),
    ]
    audit = make_audit(spark, tables, validator_set)
    found = find_violations(audit, (evidence_false,))
    assert where(found, "evidence-false") == {(NODE_B, 3)}
    problems = sorted(v.detail.split("proves nothing: ")[1] for v in found)
    assert problems == sorted([
        "first and second sign the same content",
        f"first is signed by {addresses[3]}, not by the accused",
        f"second claims replica 3 but recovers to {addresses[0]}, not that validator",
        "second is for seqNo 4",
        f"first is signed by {addresses[1]}, not by the accused",
        "one message an honest validator signs, and no second: only a PREPARE from the "
        "view's primary or a PRE-PREPARE of a block never certified proves a fault alone",
    ])
    figures = consensus_figures(audit)
    assert figures.equivocations == {addresses[2]: 1}
    assert (figures.unproven_evidence, figures.one_message_evidence) == (6, 0)


def test_evidence_that_proves_nothing_does_not_report_an_equivocation(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet, test_chain: ServedChain
) -> None:
    """Validator 0 signed two COMMITs for block 3 (node B's certificate holds the other one);
    node B's evidence names it, but with one message: the equivocation is unreported."""
    addresses = test_chain.validators.addresses
    row = rows(tables, "commit_certificates", NODE_B, block_number=3, replica=0)[0]
    row["message"] = other_commit(test_chain, 3, 0)
    tables["evidence"].append(evidence(NODE_B, addresses[0], honest_commit(tables, NODE_A, 3, 0),
                                       None))
    found = find_violations(make_audit(spark, tables, validator_set),
                            (consensus_rules.equivocation,))
    assert [(v.rule, v.block_number, v.detail.split()[0]) for v in found] == [
        ("equivocation-unreported", 3, addresses[0])]


def test_every_multiple_of_k_up_to_the_highest_stable_checkpoint_is_served(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    for row in rows(tables, "checkpoints", NODE_A, seq_no=5):
        remove(tables, "checkpoints", row)  # 10 is still served: 5 was left out
    for row in rows(tables, "checkpoints", NODE_B):
        remove(tables, "checkpoints", row)  # none at all: its view change names 5
    found = find_violations(make_audit(spark, tables, with_interval(validator_set)),
                            (checkpoint_missing,))
    assert where(found, "checkpoint-missing") == {(NODE_A, 5), (NODE_B, 5)}
    assert "up to 10" in next(v.detail for v in found if v.node == NODE_A)
    # a checkpoint that nothing in the export proves stable (no Q matching CHECKPOINTs, here
    # once the view change that carried 5's proof is gone too) may never have become stable
    tables["view_changes"] = []
    assert find_violations(make_audit(spark, tables, with_interval(validator_set)),
                           (checkpoint_missing,)) == []
    # without K (no genesis) the rule cannot say which checkpoints there must be
    assert find_violations(make_audit(spark, tables, validator_set), (checkpoint_missing,)) == []


def test_a_view_in_use_has_its_installed_view_record(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    for row in rows(tables, "view_changes", NODE_A):
        remove(tables, "view_changes", row)  # left out: view 1's COMMITs still name it
    for row in rows(tables, "view_changes", NODE_B):
        row["new_view"] = None  # partly served: the VIEW-CHANGEs without the NEW-VIEW
    found = find_violations(make_audit(spark, tables, validator_set), (view_change_missing,))
    assert where(found, "view-change-missing") == {(NODE_A, 7), (NODE_B, 7)}
    details = {v.node: v.detail for v in found}
    assert details[NODE_A] == ("view 1 is named by its commit certificates, but the node "
                               "serves no record of it being installed")
    assert details[NODE_B] == (
        "view 1 is named by its commit certificates and its view changes, but only part of "
        "it is served: no valid NEW-VIEW from its primary, 3 of the 3 valid VIEW-CHANGEs needed"
    )


def test_consensus_records_that_do_not_decode_are_malformed_values(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet, test_chain: ServedChain
) -> None:
    rows(tables, "commit_certificates", NODE_A, block_number=2, replica=0)[0]["message"] = "0xc0"
    rows(tables, "commit_certificates", NODE_A, block_number=4)[0]["signer"] = "0xnothex"
    rows(tables, "checkpoints", NODE_A, seq_no=10)[0]["signature"] = "0x1234"
    rows(tables, "view_changes", NODE_A)[0]["message"] = "0xzz"
    tables["evidence"].append(evidence(NODE_B, test_chain.validators.addresses[0], "0x12", None))
    audit = make_audit(spark, tables, with_interval(validator_set))
    # every rule on the consensus records reaches a verdict
    consensus = (consensus_rules.certificates, consensus_rules.conflicting_certificates,
                 consensus_rules.equivocation, consensus_rules.checkpoints,
                 consensus_rules.view_changes)
    found = find_violations(audit, (*consensus, *NEW_RULES))
    assert where(found, "malformed-value") == {(NODE_A, 2), (NODE_A, 4), (NODE_A, 10),
                                               (NODE_A, None), (NODE_B, 3)}
    details = sorted(v.detail for v in found if v.rule == "malformed-value")
    assert details[0].startswith("checkpoints.signature 0x1234 is not 65 bytes of hex")
    assert details[1].startswith("commit_certificates.message 0xc0: undecodable message")
    assert details[2] == "commit_certificates.signer 0xnothex is not 20 bytes of hex"
    assert details[3].startswith("evidence.first 0x12: undecodable message")
    assert details[4] == "view_changes.message 0xzz is not hex"
