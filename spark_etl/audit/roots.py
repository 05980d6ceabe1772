"""transaction-hash, transactions-root, receipts-root: each block's tries rebuilt with py-trie
from the exported rows (key rlp(index), value the consensus encoding) and compared with the
header. Receipts are re-encoded from the receipts and logs tables (EIP-658 status,
cumulative gas, bloom, logs; EIP-2718 type prefix), so a changed receipt or log shows.

A value these encodings need that does not parse leaves its trie unchecked: the
`malformed-value` rule (`column_rules`) reports it, and a root is never computed from a
guess."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import rlp
from eth_hash.auto import keccak
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from trie import HexaryTrie

from spark_etl import schemas
from spark_etl.audit.context import Audit, flat_map_rows
from spark_etl.hexcodec import MalformedValue, column_bytes, column_natural, to_hex

BLANK_ROOT = keccak(rlp.encode(b""))
Row = dict[str, Any]


def trie_root(values: list[bytes]) -> bytes:
    """Root of the trie {rlp(i): values[i]}: Ethereum's transactions and receipts tries."""
    if not values:
        return BLANK_ROOT
    trie = HexaryTrie({})
    with trie.squash_changes() as batch:
        for index, value in enumerate(values):
            batch[rlp.encode(index)] = value
    return trie.root_hash


def typed(type_id: int, payload: bytes) -> bytes:
    return payload if type_id == 0 else bytes([type_id]) + payload


def _topics(log: Row) -> list[bytes]:
    if not isinstance(log["topics"], list):
        raise MalformedValue("not a list")
    return [column_bytes(topic) for topic in log["topics"]]


def receipt_encoding(receipt: Row) -> bytes:
    """The receipt's consensus encoding; MalformedValue if a value it needs does not parse."""
    logs = sorted(receipt["logs"] or [], key=lambda log: column_natural(log["log_index"]))
    payload = rlp.encode(
        [
            b"\x01" if receipt["status"] == 1 else b"",
            column_natural(receipt["cumulative_gas_used"]),
            column_bytes(receipt["logs_bloom"]),
            [
                [column_bytes(log["address"]), _topics(log), column_bytes(log["data"])]
                for log in logs
            ],
        ]
    )
    return typed(column_natural(receipt["type"], 0x80), payload)


def _encoded(items: list[Row] | None, encode: Callable[[Row], bytes]) -> list[bytes] | None:
    """The trie values of a block's rows in index order; None if a value does not parse."""
    try:
        rows = sorted(items or [], key=lambda item: column_natural(item["transaction_index"]))
        return [encode(row) for row in rows]
    except MalformedValue:
        return None


def _raw(transaction: Row) -> bytes:
    return column_bytes(transaction["raw"])


def _root_violations(block: Row) -> list[tuple[Any, ...]]:
    node, number = block["node"], block["number"]
    found = []
    for tx in block["transactions"] or []:
        try:
            computed = to_hex(keccak(_raw(tx)))
        except MalformedValue:
            continue
        if computed != tx["hash"]:
            detail = f"transaction {tx['transaction_index']}: raw bytes hash to {computed}, " \
                     f"not {tx['hash']}"
            found.append(("transaction-hash", node, number, detail))
    checks = (
        ("transactions-root", "transactions_root", _encoded(block["transactions"], _raw)),
        ("receipts-root", "receipts_root", _encoded(block["receipts"], receipt_encoding)),
    )  # fmt: skip
    for rule, column, values in checks:
        if values is None:
            continue
        computed = to_hex(trie_root(values))
        if computed != block[column]:
            detail = f"{len(values)} rows give root {computed}, the header has {block[column]}"
            found.append((rule, node, number, detail))
    return found


def trie_roots(audit: Audit) -> DataFrame:
    """One row per block with its transactions and receipts (with their logs) nested."""
    data = audit.data
    block_keys = ["node", "block_number"]
    transactions = data.transactions.groupBy(*block_keys).agg(
        F.collect_list(F.struct("transaction_index", "hash", "raw")).alias("transactions")
    )
    logs = data.logs.groupBy(*block_keys, "transaction_index").agg(
        F.collect_list(F.struct("log_index", "address", "topics", "data")).alias("logs")
    )
    receipt_fields = ("transaction_index", "type", "status", "cumulative_gas_used", "logs_bloom")
    receipts = (
        data.receipts.join(logs, [*block_keys, "transaction_index"], "left")
        .groupBy(*block_keys)
        .agg(F.collect_list(F.struct(*receipt_fields, "logs")).alias("receipts"))
    )
    blocks = (
        data.blocks.select(
            "node", F.col("number").alias("block_number"), "transactions_root", "receipts_root"
        )
        .join(transactions, block_keys, "left")
        .join(receipts, block_keys, "left")
        .withColumnRenamed("block_number", "number")
    )
    return flat_map_rows(blocks, _root_violations, schemas.VIOLATIONS)
