"""The audit rules on the test chain (a clean export of it passes: tests/etl/test_export.py):
each planted fault is caught by its rule, at its block."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from pbft_engine.messages import Commit, KeySigner, NewView, Signed, decode_signed_bytes
from spark_etl.audit import (
    Audit,
    ValidatorSet,
    Violation,
    chain_rules,
    consensus_rules,
    export_rules,
    find_violations,
    roots,
)
from spark_etl.hexcodec import from_hex, to_hex
from tests.etl.chain_factory import OUTSIDER_KEY, ServedChain
from tests.etl.conftest import NODE_A, NODE_B, Tables, make_audit

Row = dict[str, Any]


def rows(tables: Tables, table: str, node: str = NODE_A, **match: Any) -> list[Row]:
    found = [
        r for r in tables[table]
        if r["node"] == node and all(r[k] == v for k, v in match.items())
    ]
    assert found, f"no {table} row with {match}"
    return found


def remove(tables: Tables, table: str, row: Row) -> None:
    tables[table] = [r for r in tables[table] if r is not row]


def run(spark: SparkSession, tables: Tables, validators: ValidatorSet,
        rule: Callable[[Audit], DataFrame]) -> list[Violation]:
    return find_violations(make_audit(spark, tables, validators), (rule,))


def flip(hex_text: str) -> str:
    """The same bytes with the last byte changed."""
    data = bytearray(from_hex(hex_text))
    data[-1] ^= 0x01
    return to_hex(bytes(data))


def set_message(row: Row, signed: Signed[Any]) -> None:
    row.update(
        message=to_hex(signed.encode()),
        signature=to_hex(signed.signature),
        replica=signed.body.replica,
    )


def _certificate(tables: Tables, number: int) -> list[Row]:
    return rows(tables, "commit_certificates", block_number=number)


def _tamper_signature(tables: Tables, chain: ServedChain, number: int) -> None:
    row = _certificate(tables, number)[1]
    signed = decode_signed_bytes(from_hex(row["message"]))
    s = int.from_bytes(signed.signature[32:64], "big") ^ 0x5A5A
    forged = signed.signature[:32] + s.to_bytes(32, "big") + signed.signature[64:]
    set_message(row, Signed(signed.body, forged))


def _drop_signer(tables: Tables, chain: ServedChain, number: int) -> None:
    remove(tables, "commit_certificates", _certificate(tables, number)[2])


def _outsider_signs(tables: Tables, chain: ServedChain, number: int) -> None:
    row = _certificate(tables, number)[2]
    outsider = KeySigner(OUTSIDER_KEY)
    body = decode_signed_bytes(from_hex(row["message"])).body
    set_message(row, chain.validators.sign(body, outsider))
    row["signer"] = to_hex(outsider.address)


def _duplicate_signer(tables: Tables, chain: ServedChain, number: int) -> None:
    first, _, third = _certificate(tables, number)
    third.update({k: first[k] for k in ("replica", "signer", "signature", "message")})


def _commit_for_another_block(tables: Tables, chain: ServedChain, number: int) -> None:
    row = _certificate(tables, number)[0]
    next_hash = from_hex(rows(tables, "blocks", number=number + 1)[0]["hash"])
    other = Commit(row["view"], number + 1, next_hash, row["replica"])
    set_message(row, chain.validators.sign(other))


# Certificate faults, each in its own block's certificate (of exactly Q = 3 COMMITs, so each
# also leaves the block short of a quorum): the violations each one must cause, and no other.
CERTIFICATE_FAULTS = {
    1: (_tamper_signature, {"certificate-signature"}),
    2: (_drop_signer, set()),
    4: (_outsider_signs, {"certificate-non-validator", "certificate-signature"}),
    5: (_duplicate_signer, {"certificate-duplicate-signer"}),
    7: (_commit_for_another_block, {"certificate-block"}),
}


def test_certificate_faults_are_caught_at_their_blocks_and_nowhere_else(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet, test_chain: ServedChain
) -> None:
    for number, (plant, _) in CERTIFICATE_FAULTS.items():
        plant(tables, test_chain, number)
    found = run(spark, tables, validator_set, consensus_rules.certificates)
    expected = {
        (rule, number)
        for number, (_, rules) in CERTIFICATE_FAULTS.items()
        for rule in rules | {"certificate-quorum"}
    }
    assert {(v.rule, v.block_number) for v in found} == expected
    assert {v.node for v in found} == {NODE_A}
    quorum = {v.block_number: v.detail for v in found if v.rule == "certificate-quorum"}
    assert quorum[2] == "2 distinct valid validator signatures, quorum is 3"


def _drop_block(tables: Tables, chain: ServedChain) -> None:
    remove(tables, "blocks", rows(tables, "blocks", number=5)[0])


def _change(table: str, column: str, value: Callable[[Any], Any], node: str = NODE_A,
            **match: Any) -> Callable[[Tables, ServedChain], None]:
    def plant(tables: Tables, chain: ServedChain) -> None:
        row = rows(tables, table, node, **match)[0]
        row[column] = value(row[column])
    return plant


def _drop(table: str, **match: Any) -> Callable[[Tables, ServedChain], None]:
    def plant(tables: Tables, chain: ServedChain) -> None:
        remove(tables, table, rows(tables, table, **match)[0])
    return plant


def _new_view_from_wrong_replica(tables: Tables, chain: ServedChain) -> None:
    for row in rows(tables, "view_changes", view=1):
        new_view = decode_signed_bytes(from_hex(row["new_view"])).body
        forged = NewView(new_view.view, new_view.view_changes, new_view.pre_prepares, 2)
        row["new_view"] = to_hex(chain.validators.sign(forged).encode())


FAULTS = {
    "gap": (_drop_block, chain_rules.continuity, "block-gap", 6),
    "wrong parent hash": (_change("blocks", "parent_hash", flip, number=7),
                          chain_rules.continuity, "parent-hash", 7),
    "header field changed": (_change("blocks", "extra_data", lambda _: "0x01", number=3),
                             chain_rules.block_hashes, "block-hash", 3),
    "wrong transaction root": (_change("blocks", "transactions_root", flip, number=4),
                               roots.trie_roots, "transactions-root", 4),
    "raw transaction changed": (_change("transactions", "raw", flip, block_number=8),
                                roots.trie_roots, "transaction-hash", 8),
    "log data changed": (_change("logs", "data", flip, block_number=4), roots.trie_roots,
                         "receipts-root", 4),
    "transaction missing": (_drop("transactions", block_number=8),
                            chain_rules.transaction_counts, "transaction-count", 8),
    "rows of a block not in blocks": (_drop_block, chain_rules.transaction_counts,
                                      "transaction-count", 5),
    "receipt missing": (_drop("receipts", block_number=2),
                        chain_rules.receipts_per_transaction, "receipt-per-transaction", 2),
    "log index repeated": (_change("logs", "log_index", lambda i: i + 1, block_number=4),
                           chain_rules.log_indexes, "log-index", 4),
    "gas used changed": (_change("receipts", "gas_used", lambda g: g + 1, block_number=1),
                         chain_rules.gas_used, "gas-used", 1),
    "checkpoint proof short": (_drop("checkpoints", seq_no=5), consensus_rules.checkpoints,
                               "checkpoint-proof", 5),
    "checkpoint state root differs": (_change("checkpoints", "state_root", flip, seq_no=10),
                                      consensus_rules.checkpoints, "checkpoint-chain", 10),
    "new view from a replica that is not the primary": (
        _new_view_from_wrong_replica, consensus_rules.view_changes, "view-change", None),
    "row lost after export": (_drop("logs", block_number=2), export_rules.export_manifest,
                              "export-manifest", 0),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_planted_fault_is_caught_by_its_rule(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet, test_chain: ServedChain,
    fault: str,
) -> None:
    plant, rule, name, block = FAULTS[fault]
    plant(tables, test_chain)
    found = run(spark, tables, validator_set, rule)
    assert (name, NODE_A, block) in {(v.rule, v.node, v.block_number) for v in found}, found


def _certify_another_block(tables: Tables, chain: ServedChain, node: str, number: int) -> bytes:
    """`node` holds another block at `number`, with a valid certificate of the replicas of
    its own (signed by the set of that height)."""
    other = bytes(32 * [0xAB])
    rows(tables, "blocks", node, number=number)[0]["hash"] = to_hex(other)
    certificate = rows(tables, "commit_certificates", node, block_number=number)
    signers = chain.set_at(number)
    for row in certificate:
        set_message(row, signers.sign(Commit(0, number, other, row["replica"])))
        row.update(block_hash=to_hex(other), digest=to_hex(other))
    return other


def test_two_certified_blocks_at_one_height_and_equivocation_without_evidence(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet, test_chain: ServedChain
) -> None:
    _certify_another_block(tables, test_chain, NODE_B, 3)
    rules = (consensus_rules.conflicting_certificates, consensus_rules.equivocation,
             export_rules.node_agreement)
    found = find_violations(make_audit(spark, tables, validator_set), rules)
    where = {(v.rule, v.node, v.block_number) for v in found}
    assert ("conflicting-certificates", None, 3) in where
    assert ("node-agreement", None, 3) in where
    equivocators = {v.detail.split()[0] for v in found if v.rule == "equivocation-unreported"}
    # block 3's certificates on both nodes hold all four validators' COMMITs
    assert equivocators == set(test_chain.validators.addresses)
    for signer in equivocators:
        honest, forged = (
            rows(tables, "commit_certificates", node, block_number=3, signer=signer)[0]["message"]
            for node in (NODE_A, NODE_B)
        )
        tables["evidence"].append({"node": NODE_B, "signer": signer, "type": "commit", "view": 0,
                                   "seq_no": 3, "first": honest, "second": forged})
    found = run(spark, tables, validator_set, consensus_rules.equivocation)
    assert found == []


def test_nodes_that_disagree_are_reported_at_the_height(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    rows(tables, "blocks", NODE_B, number=9)[0]["hash"] = "0x" + "cd" * 32
    found = run(spark, tables, validator_set, export_rules.node_agreement)
    assert [(v.rule, v.block_number) for v in found] == [("node-agreement", 9)]
    assert NODE_A in found[0].detail and NODE_B in found[0].detail
