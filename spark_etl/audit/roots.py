"""transaction-hash, transactions-root, receipts-root: each block's tries rebuilt with py-trie
from the exported rows (key rlp(index), value the consensus encoding) and compared with the
header. Receipts are re-encoded from the receipts and logs tables (EIP-658 status,
cumulative gas, bloom, logs; EIP-2718 type prefix), so a changed receipt or log shows."""

from __future__ import annotations

from typing import Any

import rlp
from eth_hash.auto import keccak
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from trie import HexaryTrie

from spark_etl import schemas
from spark_etl.audit.context import Audit, flat_map_rows
from spark_etl.hexcodec import from_hex, to_hex

BLANK_ROOT = keccak(rlp.encode(b""))


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


def receipt_encoding(receipt: dict[str, Any]) -> bytes:
    logs = sorted(receipt["logs"] or [], key=lambda log: log["log_index"])
    payload = rlp.encode(
        [
            b"\x01" if receipt["status"] == 1 else b"",
            receipt["cumulative_gas_used"],
            from_hex(receipt["logs_bloom"]),
            [
                [from_hex(log["address"]), [from_hex(t) for t in log["topics"]],
                 from_hex(log["data"])]
                for log in logs
            ],
        ]
    )
    return typed(receipt["type"], payload)


def _by_index(items: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return sorted(items or [], key=lambda item: item["transaction_index"])


def _root_violations(block: dict[str, Any]) -> list[tuple[Any, ...]]:
    node, number = block["node"], block["number"]
    found = []
    transactions = _by_index(block["transactions"])
    raws = [from_hex(tx["raw"]) for tx in transactions]
    for tx, raw in zip(transactions, raws, strict=True):
        if to_hex(keccak(raw)) != tx["hash"]:
            detail = f"transaction {tx['transaction_index']}: raw bytes hash to " \
                     f"{to_hex(keccak(raw))}, not {tx['hash']}"
            found.append(("transaction-hash", node, number, detail))
    checks = (
        ("transactions-root", "transactions_root", raws),
        ("receipts-root", "receipts_root",
         [receipt_encoding(r) for r in _by_index(block["receipts"])]),
    )  # fmt: skip
    for rule, column, values in checks:
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
