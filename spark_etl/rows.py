"""JSON-RPC results to table rows (tuples in the column order of `spark_etl.schemas`).

One fetched block (`BlockPayload`) becomes one bundle row: the block and its transactions,
receipts, logs, commit-certificate signatures and checkpoints, nested."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import rlp
from rlp.codec import consume_length_prefix

from encoding import EncodingError
from encoding.rlp import check_rlp_depth
from pbft_engine.messages import Checkpoint, MessageError, decode_commit_certificate
from pbft_engine.messages import decode_signed_bytes as decode_message
from spark_etl import schemas
from spark_etl.errors import ExtractError
from spark_etl.hexcodec import (
    from_hex,
    hex_data,
    long,
    optional_long,
    optional_wei,
    quantity,
    to_hex,
    word,
)
from spark_etl.schemas import Table

Row = tuple[Any, ...]
BLOCK_DEPTH = 5  # [header, [transactions (a legacy one a list)], [], [withdrawals]]: 3, and room
NO_SEQ_NO = hex(2**64 - 1)  # pbft_getEvidence's seqNo of a message type that has none
Json = dict[str, Any]


@dataclass(frozen=True)
class BlockPayload:
    """What the node serves about one block."""

    block: Json  # eth_getBlockByNumber(n, true)
    receipts: list[Json]  # eth_getBlockReceipts(n)
    raw_block: str  # debug_getRawBlock(n)
    certificate: Json | None  # pbft_getCommitCertificate(n)
    checkpoints: list[Json]  # the entries of pbft_getCheckpoints with seqNo n


def ordered(table: Table, values: dict[str, Any]) -> Row:
    """The row's values in the table's column order (a missing column is a bug: KeyError)."""
    return tuple(values[name] for name in table.column_names)


def _wei(name: str, value: Any) -> dict[str, Any]:
    exact, lossless = optional_wei(value, name)
    return {name: exact, f"{name}_lossless": lossless}


def raw_parts(raw_block: str) -> tuple[str, list[str]]:
    """The header's bytes exactly as they stand in an RLP block [header, txs, ...], and each
    transaction's consensus encoding (a typed transaction is its bytes, a legacy one its RLP
    list)."""
    try:
        encoded = from_hex(raw_block)
        _, _, _, position = consume_length_prefix(encoded, 0)  # into the block's list
        _, _, length, start = consume_length_prefix(encoded, position)  # the header
        check_rlp_depth(encoded, BLOCK_DEPTH)  # pyrlp recurses: bound it first
        transactions = rlp.decode(encoded)[1]
    except (rlp.exceptions.RLPException, EncodingError, IndexError, ValueError) as exc:
        raise ExtractError(f"debug_getRawBlock: not an RLP block ({exc})") from None
    raw_header = to_hex(encoded[position : start + length])
    return raw_header, [
        to_hex(tx if isinstance(tx, bytes) else rlp.encode(tx)) for tx in transactions
    ]


def block_row(block: Json, raw_header: str) -> Row:
    return ordered(
        schemas.BLOCKS,
        {
            "number": long(block["number"], "number"),
            "hash": hex_data(block["hash"]),
            "parent_hash": hex_data(block["parentHash"]),
            "nonce": hex_data(block.get("nonce")),
            "sha3_uncles": hex_data(block.get("sha3Uncles")),
            "logs_bloom": hex_data(block.get("logsBloom")),
            "transactions_root": hex_data(block.get("transactionsRoot")),
            "state_root": hex_data(block.get("stateRoot")),
            "receipts_root": hex_data(block.get("receiptsRoot")),
            "miner": hex_data(block.get("miner")),
            **_wei("difficulty", block.get("difficulty")),
            "size": optional_long(block.get("size"), "size"),
            "extra_data": hex_data(block.get("extraData")),
            "gas_limit": long(block["gasLimit"], "gasLimit"),
            "gas_used": long(block["gasUsed"], "gasUsed"),
            "timestamp": long(block["timestamp"], "timestamp"),
            "transaction_count": len(block.get("transactions") or ()),
            **_wei("base_fee_per_gas", block.get("baseFeePerGas")),
            "mix_hash": hex_data(block.get("mixHash")),
            "withdrawals_root": hex_data(block.get("withdrawalsRoot")),
            "blob_gas_used": optional_long(block.get("blobGasUsed"), "blobGasUsed"),
            "excess_blob_gas": optional_long(block.get("excessBlobGas"), "excessBlobGas"),
            "parent_beacon_block_root": hex_data(block.get("parentBeaconBlockRoot")),
            "requests_hash": hex_data(block.get("requestsHash")),
            "raw_header": raw_header,
        },
    )


def _access_list(entries: Any) -> list[tuple[str, list[str]]] | None:
    if entries is None:
        return None
    return [(hex_data(e["address"]), [hex_data(k) for k in e["storageKeys"]]) for e in entries]


def transaction_row(tx: Json, raw: str, timestamp: int) -> Row:
    return ordered(
        schemas.TRANSACTIONS,
        {
            "hash": hex_data(tx["hash"]),
            "nonce": long(tx["nonce"], "nonce"),
            "transaction_index": long(tx["transactionIndex"], "transactionIndex"),
            "from_address": hex_data(tx["from"]),
            "to_address": hex_data(tx.get("to")),
            **_wei("value", tx["value"]),
            "gas": long(tx["gas"], "gas"),
            **_wei("gas_price", tx.get("gasPrice")),
            "input": hex_data(tx["input"]),
            "block_timestamp": timestamp,
            "block_number": long(tx["blockNumber"], "blockNumber"),
            "block_hash": hex_data(tx["blockHash"]),
            **_wei("max_fee_per_gas", tx.get("maxFeePerGas")),
            **_wei("max_priority_fee_per_gas", tx.get("maxPriorityFeePerGas")),
            "transaction_type": long(tx.get("type", "0x0"), "type"),
            "chain_id": optional_long(tx.get("chainId"), "chainId"),
            "access_list": _access_list(tx.get("accessList")),
            "v": long(tx["v"], "v"),
            "r": word(quantity(tx["r"], "r")),
            "s": word(quantity(tx["s"], "s")),
            "y_parity": optional_long(tx.get("yParity"), "yParity"),
            "raw": raw,
        },
    )


def receipt_row(receipt: Json) -> Row:
    return ordered(
        schemas.RECEIPTS,
        {
            "transaction_hash": hex_data(receipt["transactionHash"]),
            "transaction_index": long(receipt["transactionIndex"], "transactionIndex"),
            "block_hash": hex_data(receipt["blockHash"]),
            "block_number": long(receipt["blockNumber"], "blockNumber"),
            "from_address": hex_data(receipt.get("from")),
            "to_address": hex_data(receipt.get("to")),
            "contract_address": hex_data(receipt.get("contractAddress")),
            "cumulative_gas_used": long(receipt["cumulativeGasUsed"], "cumulativeGasUsed"),
            "gas_used": long(receipt["gasUsed"], "gasUsed"),
            **_wei("effective_gas_price", receipt.get("effectiveGasPrice")),
            "status": optional_long(receipt.get("status"), "status"),
            "type": long(receipt.get("type", "0x0"), "type"),
            "logs_bloom": hex_data(receipt["logsBloom"]),
        },
    )


def log_row(log: Json, timestamp: int) -> Row:
    return ordered(
        schemas.LOGS,
        {
            "log_index": long(log["logIndex"], "logIndex"),
            "transaction_hash": hex_data(log["transactionHash"]),
            "transaction_index": long(log["transactionIndex"], "transactionIndex"),
            "address": hex_data(log["address"]),
            "data": hex_data(log["data"]),
            "topics": [hex_data(t) for t in log["topics"]],
            "block_timestamp": timestamp,
            "block_number": long(log["blockNumber"], "blockNumber"),
            "block_hash": hex_data(log["blockHash"]),
        },
    )


def certificate_rows(certificate: Json | None) -> list[Row]:
    """One row per signed COMMIT; an undecodable certificate is kept whole as one row (the
    audit reports it) rather than failing the export."""
    if certificate is None:
        return []
    number = long(certificate["blockNumber"], "blockNumber")
    common = {"block_number": number, "block_hash": hex_data(certificate["blockHash"])}
    encoded = hex_data(certificate["certificate"])
    try:
        commits = decode_commit_certificate(from_hex(encoded))
    except (MessageError, ValueError):
        return [ordered(schemas.COMMIT_CERTIFICATES, common | _undecoded(encoded))]
    signers = certificate.get("signers") or []
    return [
        ordered(
            schemas.COMMIT_CERTIFICATES,
            common
            | {
                "view": commit.body.view,
                "seq_no": commit.body.seq_no,
                "digest": to_hex(commit.body.digest),
                "replica": commit.body.replica,
                "signer": hex_data(signers[i]) if i < len(signers) else None,
                "signature": to_hex(commit.signature),
                "message": to_hex(commit.encode()),
            },
        )
        for i, commit in enumerate(commits)
    ]


def _undecoded(message: str | None) -> dict[str, Any]:
    """The message columns of a row whose message could not be decoded (or is missing)."""
    return {
        "view": None,
        "seq_no": None,
        "digest": None,
        "replica": None,
        "signer": None,
        "signature": None,
        "message": message,
    }


def checkpoint_rows(checkpoint: Json) -> list[Row]:
    """One row per signed CHECKPOINT of the proof; one row without a message if it has none."""
    common = {
        "seq_no": long(checkpoint["seqNo"], "seqNo"),
        "block_hash": hex_data(checkpoint["blockHash"]),
        "state_root": hex_data(checkpoint["stateRoot"]),
        "stable": bool(checkpoint["stable"]),
    }
    proof = [hex_data(p) for p in checkpoint.get("proof") or []] or [None]
    return [ordered(schemas.CHECKPOINTS, common | _checkpoint_message(p)) for p in proof]


def _checkpoint_message(message: str | None) -> dict[str, Any]:
    try:
        signed = decode_message(from_hex(message), Checkpoint) if message else None
    except (MessageError, ValueError):
        signed = None
    if signed is None:
        return {"replica": None, "signature": None, "message": message}
    return {
        "replica": signed.body.replica,
        "signature": to_hex(signed.signature),
        "message": message,
    }


def bundle_row(node: str, range_start: int, payload: BlockPayload) -> Row:
    """One block with everything nested in it, in `schemas.BUNDLE` order."""
    block = payload.block
    number = long(block["number"], "number")
    timestamp = long(block["timestamp"], "timestamp")
    transactions = block.get("transactions") or []
    raw_header, raws = raw_parts(payload.raw_block)
    if len(raws) != len(transactions) or len(payload.receipts) != len(transactions):
        raise ExtractError(
            f"block {number}: {len(transactions)} transactions but {len(raws)} in the raw "
            f"block and {len(payload.receipts)} receipts"
        )
    return (
        node,
        range_start,
        block_row(block, raw_header),
        [transaction_row(tx, raw, timestamp) for tx, raw in zip(transactions, raws, strict=True)],
        [receipt_row(r) for r in payload.receipts],
        [log_row(log, timestamp) for r in payload.receipts for log in r.get("logs") or []],
        certificate_rows(payload.certificate),
        [row for c in payload.checkpoints for row in checkpoint_rows(c)],
    )


def view_change_rows(node: str, installed: Json) -> list[Row]:
    """The VIEW-CHANGE messages of one installed view (one row without them if none)."""
    common = {
        "view": long(installed["view"], "view"),
        "primary": hex_data(installed["primary"]),
        "new_view": hex_data(installed["newView"]),
    }
    entries: Sequence[Json | None] = installed.get("viewChanges") or [None]
    return [
        ordered(
            schemas.VIEW_CHANGES,
            common
            | {
                "signer": hex_data(e["signer"]) if e else None,
                "stable_seq_no": long(e["stableSeqNo"], "stableSeqNo") if e else None,
                "message": hex_data(e["message"]) if e else None,
            },
        )
        + (node,)
        for e in entries
    ]


def evidence_row(node: str, entry: Json) -> Row:
    return ordered(
        schemas.EVIDENCE,
        {
            "signer": hex_data(entry["signer"]),
            "type": str(entry["type"]),
            "view": optional_long(entry.get("view"), "view"),
            # VIEW-CHANGE and NEW-VIEW evidence has no sequence number: the node says 2^64-1
            "seq_no": None if entry.get("seqNo") in (None, NO_SEQ_NO)
            else long(entry["seqNo"], "seqNo"),
            "first": hex_data(entry["first"]),
            "second": hex_data(entry.get("second")),
        },
    ) + (node,)
