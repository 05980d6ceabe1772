"""py-evm objects as JSON-RPC results, in geth's shapes (validated against the execution-apis
schemas in tests)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import rlp
from eth._utils.address import generate_contract_address
from eth.abc import BlockAPI, BlockHeaderAPI, LogAPI, ReceiptAPI, SignedTransactionAPI

from chain.rpc.hexcodec import data, quantity


def _bloom(value: int) -> str:
    return data(value.to_bytes(256, "big"))


def _word(value: int) -> str:
    return data(value.to_bytes(32, "big"))


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


def effective_gas_price(tx: SignedTransactionAPI, base_fee: int) -> int:
    return min(tx.max_fee_per_gas, base_fee + tx.max_priority_fee_per_gas)


def transaction_json(
    tx: SignedTransactionAPI,
    header: BlockHeaderAPI | None = None,
    index: int | None = None,
) -> dict[str, Any]:
    """A transaction object; `header` and `index` place it in a block (None: pending)."""
    type_id = getattr(tx, "type_id", None) or 0
    result: dict[str, Any] = {
        "blockHash": data(header.hash) if header else None,
        "blockNumber": quantity(header.block_number) if header else None,
        "from": data(tx.sender),
        "gas": quantity(tx.gas),
        "hash": data(tx.hash),
        "input": data(tx.data),
        "nonce": quantity(tx.nonce),
        "to": data(tx.to) if tx.to else None,
        "transactionIndex": quantity(index) if index is not None else None,
        "value": quantity(tx.value),
        "type": quantity(type_id),
        "r": quantity(tx.r),
        "s": quantity(tx.s),
    }
    if header is not None:
        result["blockTimestamp"] = quantity(header.timestamp)
    if type_id == 0:
        result["gasPrice"] = quantity(tx.gas_price)
        result["v"] = quantity(tx.v)
        if tx.chain_id is not None:
            result["chainId"] = quantity(tx.chain_id)
        return result
    base_fee = header.base_fee_per_gas if header else tx.max_fee_per_gas
    result.update(
        {
            "chainId": quantity(tx.chain_id),
            "gasPrice": quantity(
                effective_gas_price(tx, base_fee) if header else tx.max_fee_per_gas
            ),
            "v": quantity(tx.y_parity),
            "yParity": quantity(tx.y_parity),
            "accessList": [
                {"address": data(address), "storageKeys": [_word(k) for k in keys]}
                for address, keys in tx.access_list
            ],
        }
    )
    if type_id >= 2:
        result["maxFeePerGas"] = quantity(tx.max_fee_per_gas)
        result["maxPriorityFeePerGas"] = quantity(tx.max_priority_fee_per_gas)
    return result


def block_json(block: BlockAPI, full_transactions: bool) -> dict[str, Any]:
    header = block.header
    result = header_json(header)
    result["size"] = quantity(len(rlp.encode(block)))
    result["uncles"] = []
    result["withdrawals"] = []
    result["transactions"] = [
        transaction_json(tx, header, i) if full_transactions else data(tx.hash)
        for i, tx in enumerate(block.transactions)
    ]
    return result


@dataclass(frozen=True)
class LogPosition:
    """Where a receipt's logs sit: block, transaction and the block-wide index of its first."""

    header: BlockHeaderAPI
    tx_hash: bytes
    tx_index: int
    first_log_index: int


def log_json(log: LogAPI, position: LogPosition, offset: int) -> dict[str, Any]:
    header = position.header
    return {
        "address": data(log.address),
        "topics": [_word(topic) for topic in log.topics],
        "data": data(log.data),
        "blockNumber": quantity(header.block_number),
        "blockHash": data(header.hash),
        "blockTimestamp": quantity(header.timestamp),
        "transactionHash": data(position.tx_hash),
        "transactionIndex": quantity(position.tx_index),
        "logIndex": quantity(position.first_log_index + offset),
        "removed": False,
    }


def receipt_json(
    tx: SignedTransactionAPI,
    receipt: ReceiptAPI,
    position: LogPosition,
    previous_cumulative_gas: int,
) -> dict[str, Any]:
    header = position.header
    type_id = getattr(tx, "type_id", None) or 0
    contract = generate_contract_address(tx.sender, tx.nonce) if not tx.to else None
    return {
        "transactionHash": data(tx.hash),
        "transactionIndex": quantity(position.tx_index),
        "blockHash": data(header.hash),
        "blockNumber": quantity(header.block_number),
        "from": data(tx.sender),
        "to": data(tx.to) if tx.to else None,
        "cumulativeGasUsed": quantity(receipt.gas_used),
        "gasUsed": quantity(receipt.gas_used - previous_cumulative_gas),
        "contractAddress": data(contract) if contract else None,
        "logs": [log_json(log, position, i) for i, log in enumerate(receipt.logs)],
        "logsBloom": _bloom(receipt.bloom),
        "type": quantity(type_id),
        "status": quantity(1 if receipt.state_root == b"\x01" else 0),
        "effectiveGasPrice": quantity(effective_gas_price(tx, header.base_fee_per_gas)),
    }


def block_receipts_json(block: BlockAPI, receipts: Sequence[ReceiptAPI]) -> list[dict[str, Any]]:
    results = []
    previous_gas = 0
    log_index = 0
    for index, (tx, receipt) in enumerate(zip(block.transactions, receipts, strict=True)):
        position = LogPosition(block.header, tx.hash, index, log_index)
        results.append(receipt_json(tx, receipt, position, previous_gas))
        previous_gas = receipt.gas_used
        log_index += len(receipt.logs)
    return results
