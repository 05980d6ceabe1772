"""Committed blocks (py-evm headers and the read store's records) as JSON-RPC results, in
geth's shapes (validated against the execution-apis schemas in tests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from eth.abc import BlockHeaderAPI
from eth_bloom import BloomFilter

from chain.read_store import StoredLog, TxRecord, decode_stored
from chain.rpc.hexcodec import data, quantity


def _bloom(value: int) -> str:
    return data(value.to_bytes(256, "big"))


EMPTY_BLOOM = _bloom(0)


def header_json(header: BlockHeaderAPI) -> dict[str, Any]:
    """The header part of a block object (also the eth_subscribe newHeads payload)."""
    result: dict[str, Any] = {
        "number": quantity(header.block_number),
        "hash": data(header.hash),
        "parentHash": data(header.parent_hash),
        "nonce": data(header.nonce),
        "sha3Uncles": data(header.uncles_hash),
        "logsBloom": _bloom(header.bloom),
        "transactionsRoot": data(header.transaction_root),
        "stateRoot": data(header.state_root),
        "receiptsRoot": data(header.receipt_root),
        "miner": data(header.coinbase),
        "difficulty": quantity(header.difficulty),
        "extraData": data(header.extra_data),
        "gasLimit": quantity(header.gas_limit),
        "gasUsed": quantity(header.gas_used),
        "timestamp": quantity(header.timestamp),
        "mixHash": data(header.mix_hash),
        "baseFeePerGas": quantity(header.base_fee_per_gas),
        "withdrawalsRoot": data(header.withdrawals_root),
        "blobGasUsed": quantity(header.blob_gas_used),
        "excessBlobGas": quantity(header.excess_blob_gas),
        "parentBeaconBlockRoot": data(header.parent_beacon_block_root),
        "requestsHash": data(header.requests_hash),
    }
    return result


# The fields of each transaction type's RLP payload, in order (EIP-155, 2930, 1559, 4844, 7702).
_LEGACY_FIELDS = ("nonce", "gasPrice", "gas", "to", "value", "input", "v", "r", "s")
_FEE_MARKET = ("chainId", "nonce", "maxPriorityFeePerGas", "maxFeePerGas", "gas", "to", "value",
               "input", "accessList")
_TYPED_FIELDS: dict[int, tuple[str, ...]] = {
    1: ("chainId", "nonce", "gasPrice", "gas", "to", "value", "input", "accessList",
        "yParity", "r", "s"),
    2: (*_FEE_MARKET, "yParity", "r", "s"),
    3: (*_FEE_MARKET, "maxFeePerBlobGas", "blobVersionedHashes", "yParity", "r", "s"),
    4: (*_FEE_MARKET, "authorizationList", "yParity", "r", "s"),
}
_AUTHORIZATION_FIELDS = ("chainId", "address", "nonce", "yParity", "r", "s")


def _int(value: bytes) -> int:
    return int.from_bytes(value, "big")


def _quantity(value: bytes) -> str:
    return hex(int.from_bytes(value, "big"))


def _access_list(value: list[Any]) -> list[dict[str, Any]]:
    return [
        {"address": data(address), "storageKeys": [data(k.rjust(32, b"\0")) for k in keys]}
        for address, keys in value
    ]


def _authorization_list(value: list[Any]) -> list[dict[str, Any]]:
    return [
        {field: data(item) if field == "address" else quantity(_int(item))
         for field, item in zip(_AUTHORIZATION_FIELDS, entry, strict=True)}
        for entry in value
    ]


# How each field is written; every other field is a quantity.
_FIELD_JSON: dict[str, Callable[[Any], Any]] = {
    "input": data,
    "to": lambda value: data(value) if value else None,
    "accessList": _access_list,
    "blobVersionedHashes": lambda value: [data(h) for h in value],
    "authorizationList": _authorization_list,
}


def transaction_fields(raw: bytes) -> tuple[int, dict[str, Any]]:
    """A signed transaction's type and its fields as JSON, decoded from its canonical
    encoding (plain RLP: no py-evm objects, no sender recovery)."""
    if raw[0] >= 0xC0:
        type_id, names, values = 0, _LEGACY_FIELDS, decode_stored(raw)
    else:
        type_id, values = raw[0], decode_stored(raw[1:])
        names = _TYPED_FIELDS[type_id]
    return type_id, {
        name: _FIELD_JSON.get(name, _quantity)(value)
        for name, value in zip(names, values, strict=True)
    }


def transaction_json(
    raw: bytes,
    tx_hash: bytes,
    sender: bytes,
    header: BlockHeaderAPI | None = None,
    index: int | None = None,
) -> dict[str, Any]:
    """A transaction object; `header` and `index` place it in a block (None: pending)."""
    type_id, fields = transaction_fields(raw)
    result: dict[str, Any] = {
        "blockHash": data(header.hash) if header else None,
        "blockNumber": quantity(header.block_number) if header else None,
        "from": data(sender),
        "hash": data(tx_hash),
        "transactionIndex": quantity(index) if index is not None else None,
        "type": quantity(type_id),
        **fields,
    }
    if header is not None:
        result["blockTimestamp"] = quantity(header.timestamp)
    if type_id == 0:
        v = int(fields["v"], 16)
        if v >= 35:  # EIP-155: v = chain id * 2 + 35 + parity
            result["chainId"] = quantity((v - 35) // 2)
        return result
    result["v"] = fields["yParity"]
    if "maxFeePerGas" in fields:
        max_fee = int(fields["maxFeePerGas"], 16)
        result["gasPrice"] = quantity(
            min(max_fee, header.base_fee_per_gas + int(fields["maxPriorityFeePerGas"], 16))
            if header else max_fee
        )
    return result


def block_json(
    header: dict[str, Any], size: int, transactions: list[Any]
) -> dict[str, Any]:
    """A block object from its header's JSON, encoded size and transactions (hashes or
    transaction objects)."""
    return {**header, "size": quantity(size), "uncles": [], "withdrawals": [],
            "transactions": transactions}


def log_json(
    log: StoredLog, header: BlockHeaderAPI, record: TxRecord, tx_index: int, offset: int
) -> dict[str, Any]:
    return {
        "address": data(log.address),
        "topics": [data(topic) for topic in log.topics],
        "data": data(log.data),
        "blockNumber": quantity(header.block_number),
        "blockHash": data(header.hash),
        "blockTimestamp": quantity(header.timestamp),
        "transactionHash": data(record.hash),
        "transactionIndex": quantity(tx_index),
        "logIndex": quantity(record.first_log_index + offset),
        "removed": False,
    }


def _receipt_bloom(logs: Sequence[StoredLog]) -> str:
    if not logs:
        return EMPTY_BLOOM
    bloom = BloomFilter()
    for log in logs:
        bloom.add(log.address)
        for topic in log.topics:
            bloom.add(topic)
    return _bloom(int(bloom))


def receipt_json(record: TxRecord, header: BlockHeaderAPI, index: int) -> dict[str, Any]:
    type_id = 0 if record.raw[0] >= 0xC0 else record.raw[0]
    to = None if record.contract_address else transaction_to(record.raw)
    return {
        "transactionHash": data(record.hash),
        "transactionIndex": quantity(index),
        "blockHash": data(header.hash),
        "blockNumber": quantity(header.block_number),
        "from": data(record.sender),
        "to": data(to) if to else None,
        "cumulativeGasUsed": quantity(record.cumulative_gas_used),
        "gasUsed": quantity(record.gas_used),
        "contractAddress": data(record.contract_address) if record.contract_address else None,
        "logs": [log_json(log, header, record, index, i) for i, log in enumerate(record.logs)],
        "logsBloom": _receipt_bloom(record.logs),
        "type": quantity(type_id),
        "status": quantity(record.status),
        "effectiveGasPrice": quantity(record.effective_gas_price),
    }


def transaction_to(raw: bytes) -> bytes:
    """The recipient of an encoded transaction (empty for a contract creation)."""
    if raw[0] >= 0xC0:
        return decode_stored(raw)[3]
    position = _TYPED_FIELDS[raw[0]].index("to")
    return decode_stored(raw[1:])[position]
