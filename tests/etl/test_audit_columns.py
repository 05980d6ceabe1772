"""The column rules (spark_etl/audit/column_rules.py) on the test chain: every decoded column
of blocks, transactions, receipts and logs is checked against the bytes the certificates
bind. Each test plants the lies of one hole in the exported rows (as a lying node would serve
them) and asserts that exactly the expected rule fires, at the blocks lied about and nowhere
else; a malformed value is a `malformed-value` violation, never an error."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
import rlp
from eth_hash.auto import keccak
from pyspark.sql import DataFrame, SparkSession
from trie.hexary import HexaryTrie

from spark_etl.audit import (
    Audit,
    ValidatorSet,
    Violation,
    chain_rules,
    find_violations,
    roots,
    row_rules,
)
from spark_etl.audit.column_rules import COLUMN_RULES, trie_root
from spark_etl.hexcodec import from_hex, to_hex, word
from tests.etl.conftest import NODE_A, NODE_B, Tables, make_audit
from tests.etl.test_audit import flip, rows

Row = dict[str, Any]
Where = tuple[str, str | None, int | None]  # rule, node, block
RULE_NAMES = {"raw-block", "transaction-fields", "transaction-sender", "receipt-fields",
              "log-order", "malformed-value"}
OTHER_ADDRESS = "0x" + "33" * 20
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
# 2**255 + 2: no point of secp256k1 has this x, so a signature with this r recovers no key
R_OFF_THE_CURVE = (2**255 + 2).to_bytes(32, "big")


def run(spark: SparkSession, tables: Tables, validators: ValidatorSet,
        extra: tuple[Callable[[Audit], DataFrame], ...] = ()) -> list[Violation]:
    return find_violations(make_audit(spark, tables, validators), (*COLUMN_RULES, *extra))


def where(found: list[Violation]) -> set[Where]:
    """Where the column rules fired (other rules given to `run` left out)."""
    return {(v.rule, v.node, v.block_number) for v in found if v.rule in RULE_NAMES}


def columns(found: list[Violation]) -> set[tuple[str | None, int | None, str]]:
    """(node, block, column) of each violation whose detail names a column: "...: COLUMN is"."""
    return {(v.node, v.block_number, v.detail.split(": ")[1].split(" is ")[0]) for v in found}


def one(tables: Tables, table: str, node: str = NODE_A, **match: Any) -> Row:
    return rows(tables, table, node, **match)[0]


def test_a_clean_export_breaks_no_column_rule(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    assert run(spark, tables, validator_set) == []


def _other_raw_header(raw_header: str) -> str:
    """A well-formed header that is not the block's: its timestamp one second later."""
    items = rlp.decode(from_hex(raw_header))
    items[11] = (int.from_bytes(items[11], "big") + 1).to_bytes(8, "big").lstrip(b"\0")
    return to_hex(rlp.encode(items))


def test_raw_block_binds_the_header_columns_size_and_count(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    one(tables, "blocks", number=2)["size"] += 1
    one(tables, "blocks", number=3)["transaction_count"] = 1
    block5 = one(tables, "blocks", number=5)
    block5["raw_header"] = _other_raw_header(block5["raw_header"])
    one(tables, "blocks", NODE_B, number=6)["timestamp"] += 1
    one(tables, "blocks", NODE_B, number=9)["base_fee_per_gas_lossless"] = "1"
    found = run(spark, tables, validator_set)
    assert where(found) == {("raw-block", NODE_A, 2), ("raw-block", NODE_A, 3),
                            ("raw-block", NODE_A, 5), ("raw-block", NODE_B, 6),
                            ("raw-block", NODE_B, 9)}
    assert columns(found) == {(NODE_A, 2, "size"), (NODE_A, 3, "transaction_count"),
                              (NODE_A, 5, "hash"), (NODE_A, 5, "timestamp"),
                              (NODE_B, 6, "timestamp"), (NODE_B, 9, "base_fee_per_gas_lossless")}


def _access_list_with_another_key(access_list: list[Any]) -> list[Any]:
    address, keys = access_list[0]
    return [(address, [*keys[:-1], "0x" + "00" * 31 + "09"])]


TRANSACTION_LIES: dict[tuple[str, int, int, str], Callable[[Any], Any]] = {
    (NODE_A, 1, 0, "nonce"): lambda nonce: nonce + 1,
    (NODE_A, 2, 1, "value_lossless"): lambda value: str(int(value) + 1),
    (NODE_A, 4, 2, "access_list"): _access_list_with_another_key,
    (NODE_A, 5, 0, "to_address"): lambda _: OTHER_ADDRESS,
    (NODE_A, 7, 0, "gas_price"): lambda price: price + 1,
    (NODE_A, 8, 0, "input"): lambda _: "0x01",
    (NODE_A, 8, 1, "block_hash"): flip,
    (NODE_A, 10, 0, "chain_id"): lambda chain_id: chain_id + 1,
    (NODE_B, 2, 0, "max_fee_per_gas"): lambda fee: fee * 2,
    (NODE_B, 4, 1, "y_parity"): lambda parity: 1 - parity,
    (NODE_B, 4, 0, "v"): lambda v: v + 1,
    (NODE_B, 5, 0, "s"): flip,
    (NODE_B, 7, 0, "transaction_type"): lambda _: 1,
    (NODE_B, 8, 1, "block_timestamp"): lambda timestamp: timestamp - 1,
}


def test_transaction_fields_are_the_raw_transactions(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    for (node, block, index, column), lie in TRANSACTION_LIES.items():
        row = one(tables, "transactions", node, block_number=block, transaction_index=index)
        row[column] = lie(row[column])
    found = run(spark, tables, validator_set)
    assert where(found) == {("transaction-fields", node, block)
                            for node, block, _, _ in TRANSACTION_LIES}
    assert columns(found) == {(node, block, column)
                              for node, block, _, column in TRANSACTION_LIES}


def _forge_raw(tables: Tables, block: int, change: Callable[[list[Any]], None]) -> None:
    """The legacy transaction of `block` (no logs) with `change` made to its RLP fields, its
    hash and signature columns and its receipt's hash following (a node serving other bytes
    would serve them consistently)."""
    transaction = one(tables, "transactions", block_number=block)
    fields = rlp.decode(from_hex(transaction["raw"]))
    change(fields)
    raw = rlp.encode(fields)
    tx_hash = to_hex(keccak(raw))
    transaction.update(raw=to_hex(raw), hash=tx_hash,
                       r=word(int.from_bytes(fields[7], "big")),
                       s=word(int.from_bytes(fields[8], "big")))
    one(tables, "receipts", block_number=block)["transaction_hash"] = tx_hash


def _malleated(fields: list[Any]) -> None:
    """The twin of a valid signature, s -> n - s, that EIP-2 forbids (same length)."""
    fields[8] = (SECP256K1_N - int.from_bytes(fields[8], "big")).to_bytes(32, "big")


def test_every_sender_is_recovered_from_its_signature(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    one(tables, "transactions", block_number=4, transaction_index=1)["from_address"] = \
        OTHER_ADDRESS
    _forge_raw(tables, 5, lambda fields: fields.__setitem__(7, R_OFF_THE_CURVE))
    _forge_raw(tables, 10, _malleated)
    found = run(spark, tables, validator_set)
    assert where(found) == {("transaction-sender", NODE_A, 4), ("transaction-sender", NODE_A, 5),
                            ("transaction-sender", NODE_A, 10)}
    details = {v.block_number: v.detail for v in found}
    assert "the signature recovers" in details[4] and OTHER_ADDRESS in details[4]
    assert "recovers no sender" in details[5] and "recovers no sender" in details[10]


RECEIPT_LIES: dict[tuple[str, int, int, str], Callable[[Any], Any]] = {
    (NODE_A, 1, 0, "contract_address"): lambda _: OTHER_ADDRESS,
    (NODE_A, 2, 0, "effective_gas_price"): lambda price: price + 1,
    (NODE_A, 2, 1, "effective_gas_price_lossless"): lambda price: str(int(price) + 1),
    (NODE_A, 4, 0, "status"): lambda _: 5,  # a failure either way in the receipts root
    (NODE_A, 5, 0, "to_address"): lambda _: OTHER_ADDRESS,
    (NODE_B, 8, 1, "from_address"): lambda _: OTHER_ADDRESS,
    (NODE_B, 10, 0, "contract_address"): lambda _: OTHER_ADDRESS,
    (NODE_B, 7, 0, "block_hash"): flip,
}


def test_receipt_fields_are_their_transactions(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    for (node, block, index, column), lie in RECEIPT_LIES.items():
        row = one(tables, "receipts", node, block_number=block, transaction_index=index)
        row[column] = lie(row[column])
    found = run(spark, tables, validator_set)
    assert where(found) == {("receipt-fields", node, block) for node, block, _, _ in RECEIPT_LIES}
    assert columns(found) == {(node, block, column) for node, block, _, column in RECEIPT_LIES}


def test_logs_name_their_transaction_and_follow_its_order(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    tx0 = one(tables, "transactions", block_number=4, transaction_index=0)
    one(tables, "logs", block_number=4)["transaction_hash"] = tx0["hash"]
    one(tables, "logs", NODE_B, block_number=7)["block_timestamp"] += 1
    # block 2: a log of transaction 1 numbered before the log of transaction 0
    first = one(tables, "logs", block_number=2)
    second = one(tables, "transactions", block_number=2, transaction_index=1)
    tables["logs"].append(first | {"transaction_index": 1, "transaction_hash": second["hash"]})
    first["log_index"] = 1
    found = run(spark, tables, validator_set)
    assert where(found) == {("log-order", NODE_A, 2), ("log-order", NODE_A, 4),
                            ("log-order", NODE_B, 7)}
    details = {(v.node, v.block_number): v.detail for v in found}
    assert details[NODE_A, 2] == "log 1 of transaction 0 comes after log 0 of transaction 1"
    assert details[NODE_A, 4].startswith("log 0: transaction_hash is")
    assert details[NODE_B, 7].startswith("log 0: block_timestamp is")


MALFORMED: dict[tuple[str, str, int, int | None, str], Any] = {
    ("receipts", NODE_A, 4, 0, "type"): 256,
    ("receipts", NODE_A, 2, 1, "logs_bloom"): "0x" + "zz" * 256,
    ("transactions", NODE_A, 8, 1, "block_hash"): "0x1234",
    ("blocks", NODE_A, 5, None, "raw_header"): "0xnothex",
    ("transactions", NODE_A, 10, 0, "raw"): "0xzz",
    ("logs", NODE_A, 7, None, "topics"): ["0x12"],
    ("receipts", NODE_B, 2, 0, "status"): -1,
    ("transactions", NODE_B, 8, 0, "value_lossless"): "12abc",
    ("receipts", NODE_B, 4, 1, "cumulative_gas_used"): None,
    ("blocks", NODE_B, 3, None, "base_fee_per_gas"): Decimal(-1),
    ("blocks", NODE_B, 9, None, "extra_data"): "0xABCD",
}


def test_malformed_values_are_violations_not_errors(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    for (table, node, block, index, column), value in MALFORMED.items():
        match: Row = {"number": block} if table == "blocks" else {"block_number": block}
        if index is not None:
            match["transaction_index"] = index
        one(tables, table, node, **match)[column] = value
    # the other rules over these tables run too and reach their verdict (a root or hash they
    # cannot compute from a malformed value is left to malformed-value)
    others = (roots.trie_roots, chain_rules.block_hashes, chain_rules.transaction_counts,
              chain_rules.receipts_per_transaction, chain_rules.log_indexes, chain_rules.gas_used)
    found = run(spark, tables, validator_set, others)
    assert where(found) == {("malformed-value", node, block) for _, node, block, _, _ in MALFORMED}
    reported = {(v.node, v.block_number, v.detail.split(" of ")[0])
                for v in found if v.rule == "malformed-value"}
    assert reported == {(node, block, f"{table}.{column}")
                        for table, node, block, _, column in MALFORMED}


def test_the_row_rules_read_a_null_as_sql_does() -> None:
    """A null log index counts as no index and prints as "null" (Spark's format_string); a
    log with a null hash belongs to no receipt, even one with a null hash too."""
    found: list[tuple[str, str]] = []
    log = {"log_index": None, "transaction_hash": None, "transaction_index": 0,
           "block_hash": None}
    row_rules.log_indexes(lambda rule, detail: found.append((rule, detail)), [log], [dict(log)])
    assert found == [("log-index", "1 logs with 0 distinct indexes from null to null "
                                   "(want 0..n-1)"),
                     ("log-index", "log null belongs to no receipt of the block")]


@pytest.mark.parametrize("count", [0, 1, 2, 16, 17, 127, 128, 129, 300])
def test_the_trie_root_is_py_trie_s(count: int) -> None:
    """Short values (nodes embedded in their parent) and long ones (hashed), keys across
    rlp(127) / rlp(128), where the key's length changes."""
    values = [keccak(i.to_bytes(4, "big"))[: 1 + i % 40] for i in range(count)]
    trie = HexaryTrie({})
    for index, value in enumerate(values):
        trie[rlp.encode(index)] = value
    assert trie_root(values) == trie.root_hash
