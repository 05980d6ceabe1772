"""JSON-RPC results to table rows (tuples in the column order of `spark_etl.schemas`).

One fetched block (`BlockPayload`) becomes one bundle row: the block and its transactions,
receipts, logs, commit-certificate signatures and checkpoints, nested."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from Crypto.Hash import keccak as pycryptodome_keccak

from pbft_engine.messages import Checkpoint, MessageError, decode_commit_certificate
from pbft_engine.messages import decode_signed_bytes as decode_message
from spark_etl import schemas
from spark_etl.audit.column_rules import (
    FIELDS,
    INTEGERS,
    DecodedTransaction,
    _header_columns,
    contract_address,
    effective_gas_price,
    transaction_columns,
)
from spark_etl.errors import ExtractError
from spark_etl.hexcodec import (
    from_hex,
    hex_data,
    long,
    optional_long,
    optional_wei,
    quantity,
    to_hex,
    wei_columns,
    word,
)
from spark_etl.schemas import Table

Row = tuple[Any, ...]
RECEIPT_DEPTH = 3  # [status, cumulative gas, bloom, [[address, [topics], data], ...]]
TRANSACTION_DEPTH = 3  # [..., [[address, [storage keys]], ...], ...]
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


# Each table's values in its column order, by its name (hashing a Table hashes every column)
_IN_ORDER: dict[str, Callable[[dict[str, Any]], Row]] = {
    t.name: itemgetter(*t.column_names) for t in schemas.TABLES
}


def ordered(table: Table, values: dict[str, Any]) -> Row:
    """The row's values in the table's column order (a missing column is a bug: KeyError).
    Every table has several columns, so itemgetter gives a tuple."""
    return _IN_ORDER[table.name](values)


def keccak(data: bytes) -> bytes:
    """keccak256 by pycryptodome, the backend eth-hash[pycryptodome] (pyproject.toml) uses
    behind `eth_hash.auto.keccak`, called directly: 5.6 us a call against 9.4 us, once per
    transaction and block."""
    return pycryptodome_keccak.new(digest_bits=256, data=data).digest()


def _wei(name: str, value: Any) -> dict[str, Any]:
    exact, lossless = optional_wei(value, name)
    return {name: exact, f"{name}_lossless": lossless}


def _span(data: bytes, at: int, end: int) -> tuple[bool, int, int]:
    """Whether the RLP item at `at` is a list, and where its payload starts and ends (inside
    `end`, else ValueError; past the data: IndexError)."""
    prefix = data[at]
    if prefix < 0x80:
        return False, at, at + 1
    if prefix < 0xB8 or 0xC0 <= prefix < 0xF8:
        start, length = at + 1, prefix - (0x80 if prefix < 0xC0 else 0xC0)
    else:
        start = at + 1 + prefix - (0xB7 if prefix < 0xC0 else 0xF7)
        length = int.from_bytes(data[at + 1 : start], "big")
    if start + length > end:
        raise ValueError("an RLP item runs past its list")
    return prefix >= 0xC0, start, start + length


def _items(data: bytes, start: int, end: int, depth: int) -> list[Any]:
    items: list[Any] = []
    while start < end:
        prefix = data[start]
        if prefix < 0xB8:  # a byte or a string under 56 bytes (most items), without a call
            first = start if prefix < 0x80 else start + 1
            last = start + 1 if prefix < 0x80 else first + prefix - 0x80
            if last > end:
                raise ValueError("an RLP item runs past its list")
            items.append(data[first:last])
            start = last
            continue
        is_list, first, last = _span(data, start, end)
        if is_list and depth == 0:
            raise ValueError("RLP lists nested deeper than they may")
        items.append(_items(data, first, last, depth - 1) if is_list else data[first:last])
        start = last
    return items


def rlp_list(data: bytes, depth: int) -> list[Any]:
    """The items of the RLP list `data`, lists in it nested at most `depth` deep (the
    recursion is bounded before it starts). No canonical-form checks: the export takes the
    values as they stand, the audit checks the bytes (spark_etl/audit/column_rules.py); this
    split, unlike pyrlp's decoder, costs a few microseconds a transaction."""
    is_list, start, end = _span(data, 0, len(data))
    if not is_list or end != len(data):
        raise ValueError("not one RLP list")
    return _items(data, start, end, depth)


def block_parts(encoded: bytes) -> tuple[bytes, list[bytes]]:
    """The header's bytes exactly as they stand in an RLP block [header, txs, ...], and each
    transaction's consensus encoding (a typed transaction is its bytes, a legacy one its RLP
    list), byte for byte: split by their length prefixes, not decoded."""
    try:
        kind, position, end = _span(encoded, 0, len(encoded))
        header_kind, _, header_end = _span(encoded, position, end)
        list_kind, at, transactions_end = _span(encoded, header_end, end)
        if not (kind and header_kind and list_kind) or end != len(encoded):
            raise ValueError("not [header, [transactions], ...]")
        transactions = []
        while at < transactions_end:
            is_list, start, stop = _span(encoded, at, transactions_end)
            transactions.append(encoded[at:stop] if is_list else encoded[start:stop])
            at = stop
    except (IndexError, ValueError) as exc:
        raise ExtractError(f"not an RLP block ({exc})") from None
    return encoded[position:header_end], transactions


def raw_parts(raw_block: str) -> tuple[str, list[str]]:
    """`block_parts` of debug_getRawBlock's answer, in hex."""
    raw_header, transactions = block_parts(from_hex(raw_block))
    return to_hex(raw_header), [to_hex(tx) for tx in transactions]


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


@dataclass(frozen=True)
class BlockBundle:
    """What the node serves about block `number` in one `pbft_getBlockBundles` entry: the RLP
    block, the receipts' consensus encodings, the senders, the commit certificate and the
    checkpoints of that seqNo (as pbft_getCommitCertificate and pbft_getCheckpoints)."""

    number: int  # the block asked for
    entry: Json


@dataclass(frozen=True)
class _Placed:
    """The block columns every row of a block repeats, and its base fee."""

    keys: dict[str, Any]
    base_fee: int | None


def _raw_receipt(encoded: bytes) -> tuple[int, list[Any]]:
    """A receipt's consensus encoding: its type and [status, cumulative gas, bloom, logs]."""
    type_id = 0 if encoded[0] >= 0xC0 else encoded[0]
    items = rlp_list(encoded if type_id == 0 else encoded[1:], RECEIPT_DEPTH)
    if len(items) != 4 or not isinstance(items[3], list):
        raise ExtractError("a receipt is not [status, cumulative gas, bloom, logs]")
    return type_id, items


def _status(item: bytes) -> int | None:
    """EIP-658's status (1 success, 0 failure); None for a pre-Byzantium state root."""
    return {b"\x01": 1, b"": 0}.get(item)


def _decoded(raw: bytes) -> DecodedTransaction:
    """A transaction's fields from its consensus encoding, in the shape the audit's decoder
    gives them (`column_rules.decode_transaction`), without what only the audit needs: the
    canonical-form checks and the signing hash (the audit makes both)."""
    type_id = 0 if raw[0] >= 0xC0 else raw[0]
    names = FIELDS[type_id]
    items = rlp_list(raw if type_id == 0 else raw[1:], TRANSACTION_DEPTH)
    if len(items) != len(names):
        raise ExtractError(f"not the {len(names)} fields of a type-{type_id} transaction")
    values = dict(zip(names, items, strict=True))
    fields: dict[str, Any] = {n: int.from_bytes(values[n], "big") for n in names if n in INTEGERS}
    fields["to"] = to_hex(values["to"]) if values["to"] else None
    fields["input"] = to_hex(values["input"])
    if type_id:  # as the JSON's rows: (address, 32-byte keys) pairs
        fields["access_list"] = [(to_hex(address), [to_hex(k.rjust(32, b"\0")) for k in keys])
                                 for address, keys in values["access_list"]]
    elif fields["v"] >= 35:  # EIP-155: v = chain id * 2 + 35 + parity
        fields["chain_id"] = (fields["v"] - 35) // 2
    return DecodedTransaction(type_id, fields, b"", None)


def _bundle_transaction_row(decoded: DecodedTransaction, raw: bytes, tx_hash: str, index: int,
                            sender: str, placed: _Placed) -> Row:
    columns = {"gas_price": None, "gas_price_lossless": None}
    columns |= transaction_columns(decoded, placed.base_fee)
    return ordered(
        schemas.TRANSACTIONS,
        columns | placed.keys | {
            "hash": tx_hash,
            "transaction_index": index,
            "from_address": sender,
            "raw": to_hex(raw),
        },
    )


def _bundle_receipt_rows(decoded: DecodedTransaction, tx_hash: str, index: int, sender: str,
                         receipt: tuple[int, list[Any]], previous_gas: int, first_log: int,
                         placed: _Placed) -> tuple[Row, list[Row]]:
    """The receipt's row and its logs' (the block's logs counted from `first_log`)."""
    type_id, (status, cumulative, bloom, logs) = receipt
    to = decoded.fields["to"]
    price = effective_gas_price(decoded, placed.base_fee)
    exact, lossless = wei_columns(price) if price is not None else (None, None)
    keys = {"block_hash": placed.keys["block_hash"], "block_number": placed.keys["block_number"]}
    cumulative_gas = int.from_bytes(cumulative, "big")
    row = ordered(schemas.RECEIPTS, keys | {
        "transaction_hash": tx_hash,
        "transaction_index": index,
        "from_address": sender,
        "to_address": to,
        "contract_address": None if to else contract_address(sender, decoded.fields["nonce"]),
        "cumulative_gas_used": cumulative_gas,
        "gas_used": cumulative_gas - previous_gas,
        "effective_gas_price": exact,
        "effective_gas_price_lossless": lossless,
        "status": _status(status),
        "type": type_id,
        "logs_bloom": to_hex(bloom),
    })
    log_rows = [
        ordered(schemas.LOGS, placed.keys | {
            "log_index": first_log + offset,
            "transaction_hash": tx_hash,
            "transaction_index": index,
            "address": to_hex(address),
            "data": to_hex(payload),
            "topics": [to_hex(topic) for topic in topics],
        })
        for offset, (address, topics, payload) in enumerate(logs)
    ]
    return row, log_rows


def _bundle_block_row(encoded: bytes, raw_header: bytes, transactions: int) -> Row:
    columns = _header_columns(raw_header)
    return ordered(schemas.BLOCKS, columns | {
        "hash": to_hex(keccak(raw_header)),
        "size": len(encoded),
        "transaction_count": transactions,
        "raw_header": to_hex(raw_header),
    })


def block_bundle_row(node: str, range_start: int, bundle: BlockBundle) -> Row:
    """One block of a `pbft_getBlockBundles` answer, in `schemas.BUNDLE` order: every column
    of blocks, transactions, receipts and logs decoded from the bytes the certificates bind
    (the audit derives them the same way: spark_etl/audit/column_rules.py), the senders as
    the node names them (the audit recovers them)."""
    entry = bundle.entry
    if long(entry["number"], "number") != bundle.number:
        raise ExtractError(f"asked for block {bundle.number}, answered {entry['number']}")
    encoded = from_hex(entry["block"])
    raw_header, raws = block_parts(encoded)
    block = _bundle_block_row(encoded, raw_header, len(raws))
    receipts = [_raw_receipt(from_hex(r)) for r in entry["receipts"]]
    senders = [str(hex_data(s)) for s in entry["senders"]]
    if not len(raws) == len(receipts) == len(senders):
        raise ExtractError(f"block {bundle.number}: {len(raws)} transactions but "
                           f"{len(receipts)} receipts and {len(senders)} senders")
    values = dict(zip(schemas.BLOCKS.column_names, block, strict=True))
    if values["number"] != bundle.number:
        raise ExtractError(f"asked for block {bundle.number}, its header says {values['number']}")
    base_fee = values["base_fee_per_gas_lossless"]
    placed = _Placed({"block_number": bundle.number, "block_hash": values["hash"],
                      "block_timestamp": values["timestamp"]},
                     None if base_fee is None else int(base_fee))
    transactions, receipt_rows, log_rows = [], [], []
    previous_gas = 0
    for index, (raw, receipt, sender) in enumerate(zip(raws, receipts, senders, strict=True)):
        decoded, tx_hash = _decoded(raw), to_hex(keccak(raw))
        transactions.append(_bundle_transaction_row(decoded, raw, tx_hash, index, sender, placed))
        row, logs = _bundle_receipt_rows(decoded, tx_hash, index, sender, receipt, previous_gas,
                                         len(log_rows), placed)
        receipt_rows.append(row)
        log_rows.extend(logs)
        previous_gas = int.from_bytes(receipt[1][1], "big")
    return (
        node,
        range_start,
        block,
        transactions,
        receipt_rows,
        log_rows,
        certificate_rows(entry["certificate"]),
        [row for c in entry["checkpoints"] for row in checkpoint_rows(c)],
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
