"""The read store: committed blocks in the form JSON-RPC serves them.

py-evm keeps a block's transactions and receipts in tries keyed by index, so serving one
receipt meant walking two tries, decoding the whole block and recovering every sender
(~200 ms for a 600-transfer block). Here every committed transaction gets one record,
written in its block's commit batch: its canonical encoding, hash and sender, and its
receipt with the fields a client sees (status, own and cumulative gas, effective gas price,
contract address, the block-wide index of its first log) computed once, and its location
(hash -> block number and index). A lookup by hash is those two reads; no sender is
recovered on a read. Alongside: each block's encoded size and transaction count, and the
bloom-bits index (chain/bloom_index.py) that `eth_getLogs` narrows its range with.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import rlp
from eth._utils.address import generate_contract_address
from eth.abc import BlockAPI, BlockHeaderAPI, ReceiptAPI, SignedTransactionAPI
from eth_hash.auto import keccak
from rlp.codec import length_prefix

from chain.bloom_index import BloomIndex
from storage import Database, WriteBatch

TX_PREFIX = b"read/tx/"  # block number (8 bytes) + index (4 bytes) -> a TxRecord
LOCATION_PREFIX = b"read/txloc/"  # transaction hash -> block number (8 bytes) + index (4)
BLOCK_PREFIX = b"read/block/"  # block number (8 bytes) -> [encoded size, transaction count]
BLOOM_PREFIX = b"read/bloom/"  # the bloom-bits index (chain/bloom_index.py)
META_PREFIX = b"read/meta/"  # INDEXED_KEY -> the highest block number written here
# The highest block written in this layout; the key names the layout's version, so a store
# written in another layout is indexed again from the genesis block.
INDEXED_KEY = b"indexed/2"
MAX_TRANSACTIONS = 1 << 32  # a block's, as its 4-byte index keys count them
EMPTY_LIST = b"\xc0"


def _number_key(number: int) -> bytes:
    return number.to_bytes(8, "big")


def _int(value: bytes) -> int:
    return int.from_bytes(value, "big")


def _rlp_bytes(value: bytes) -> bytes:
    if len(value) == 1 and value[0] < 0x80:
        return value
    return length_prefix(len(value), 0x80) + value


def _rlp_int(value: int) -> bytes:
    return _rlp_bytes(value.to_bytes((value.bit_length() + 7) // 8, "big"))


def _rlp_list(payload: bytes) -> bytes:
    return length_prefix(len(payload), 0xC0) + payload


def decode_stored(data: bytes) -> Any:
    """The items of an RLP list this node wrote (a record, or a transaction it validated):
    pyrlp's decoder checks canonical form on every item and took 16 us a record; data read
    back from our own store needs no such checks, and this takes a third of that."""
    first, last = _span(data, 0)
    return _items(data, first, last) if data[0] >= 0xC0 else data[first:last]


def _span(data: bytes, at: int) -> tuple[int, int]:
    """The start and end of the payload of the item at `at` (a list's items, or a string)."""
    prefix = data[at]
    if prefix < 0x80:
        return at, at + 1
    if prefix < 0xB8:
        return at + 1, at + 1 + prefix - 0x80
    if prefix < 0xC0:
        size = prefix - 0xB7
        return at + 1 + size, at + 1 + size + int.from_bytes(data[at + 1:at + 1 + size], "big")
    if prefix < 0xF8:
        return at + 1, at + 1 + prefix - 0xC0
    size = prefix - 0xF7
    return at + 1 + size, at + 1 + size + int.from_bytes(data[at + 1:at + 1 + size], "big")


def _items(data: bytes, start: int, end: int) -> list[Any]:
    items: list[Any] = []
    at = start
    while at < end:
        first, last = _span(data, at)
        items.append(_items(data, first, last) if data[at] >= 0xC0 else data[first:last])
        at = last
    return items


@dataclass(frozen=True, slots=True)
class StoredLog:
    address: bytes
    topics: tuple[bytes, ...]  # 32 bytes each
    data: bytes


@dataclass(frozen=True, slots=True)
class TxRecord:
    """A committed transaction and its receipt's derived fields, computed at commit."""

    raw: bytes  # the canonical encoding (a legacy RLP list, or type byte + payload)
    hash: bytes
    sender: bytes
    status: int
    cumulative_gas_used: int
    gas_used: int
    effective_gas_price: int
    contract_address: bytes | None
    first_log_index: int  # block-wide index of this transaction's first log
    logs: tuple[StoredLog, ...]

    def encode(self) -> bytes:
        """RLP [raw, hash, sender, status, cumulative gas, gas, price, contract or empty,
        first log index, [[address, [topics], data], ...]] (encoded by hand: pyrlp's generic
        encoder took 18 us a record, on the commit path)."""
        logs = b"".join(
            _rlp_list(_rlp_bytes(log.address) + _rlp_list(b"".join(map(_rlp_bytes, log.topics)))
                      + _rlp_bytes(log.data))
            for log in self.logs
        )
        return _rlp_list(b"".join((
            _rlp_bytes(self.raw), _rlp_bytes(self.hash), _rlp_bytes(self.sender),
            _rlp_int(self.status), _rlp_int(self.cumulative_gas_used), _rlp_int(self.gas_used),
            _rlp_int(self.effective_gas_price), _rlp_bytes(self.contract_address or b""),
            _rlp_int(self.first_log_index), _rlp_list(logs),
        )))

    @classmethod
    def decode(cls, encoded: bytes) -> TxRecord:
        (raw, tx_hash, sender, status, cumulative, gas_used, price, contract, first_log,
         logs) = decode_stored(encoded)
        return cls(
            raw, tx_hash, sender, _int(status), _int(cumulative), _int(gas_used), _int(price),
            contract or None, _int(first_log),
            tuple(StoredLog(address, tuple(topics), payload) for address, topics, payload in logs),
        )


def effective_gas_price(tx: SignedTransactionAPI, base_fee: int) -> int:
    """What the sender paid per gas (a legacy transaction's fee fields are both its price)."""
    return min(tx.max_fee_per_gas, base_fee + tx.max_priority_fee_per_gas)


def block_records(block: BlockAPI, receipts: Sequence[ReceiptAPI]) -> tuple[TxRecord, ...]:
    """The records of an executed block's transactions (senders are memoized by then)."""
    base_fee = block.header.base_fee_per_gas
    records = []
    previous_gas = 0
    log_index = 0
    for tx, receipt in zip(block.transactions, receipts, strict=True):
        raw = tx.encode()
        sender = tx.sender
        logs = tuple(
            StoredLog(log.address, tuple(t.to_bytes(32, "big") for t in log.topics), log.data)
            for log in receipt.logs
        )
        records.append(TxRecord(
            raw=raw,
            hash=keccak(raw),
            sender=sender,
            status=1 if receipt.state_root == b"\x01" else 0,
            cumulative_gas_used=receipt.gas_used,
            gas_used=receipt.gas_used - previous_gas,
            effective_gas_price=effective_gas_price(tx, base_fee),
            contract_address=None if tx.to else generate_contract_address(sender, tx.nonce),
            first_log_index=log_index,
            logs=logs,
        ))
        previous_gas = receipt.gas_used
        log_index += len(logs)
    return tuple(records)



def encode_block(header: BlockHeaderAPI, records: Sequence[TxRecord]) -> bytes:
    """The block's RLP [header, transactions, uncles, withdrawals] from its records, byte for
    byte as py-evm encodes it (a typed transaction is an RLP string, a legacy one a list).
    Blocks of this chain have no uncles and no withdrawals."""
    transactions = b"".join(
        r.raw if r.raw[0] >= 0xC0 else rlp.encode(r.raw) for r in records
    )
    return _rlp_list(rlp.encode(header) + _rlp_list(transactions) + EMPTY_LIST + EMPTY_LIST)


@dataclass(frozen=True, slots=True)
class BlockInfo:
    size: int  # bytes of the encoded block
    transaction_count: int


class ReadStore:
    """Records of committed transactions, block sizes and the bloom-bits index."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._transactions = db.keyspace(TX_PREFIX)
        self._locations = db.keyspace(LOCATION_PREFIX)
        self._blocks = db.keyspace(BLOCK_PREFIX)
        self._meta = db.keyspace(META_PREFIX)
        self.bloom_index = BloomIndex(db.keyspace(BLOOM_PREFIX))

    def indexed_height(self) -> int:
        """The highest block written here; -1 before the genesis block is."""
        value = self._meta.get(INDEXED_KEY)
        return -1 if value is None else _int(value)

    def write_block(
        self, batch: WriteBatch, header: BlockHeaderAPI, records: Sequence[TxRecord]
    ) -> None:
        number = _number_key(header.block_number)
        for index, record in enumerate(records):
            key = number + index.to_bytes(4, "big")
            batch.put(self._transactions, key, record.encode())
            batch.put(self._locations, record.hash, key)
        size = len(encode_block(header, records))
        batch.put(self._blocks, number, rlp.encode([size, len(records)]))
        self.bloom_index.add(batch, header.block_number, header.bloom)
        batch.put(self._meta, INDEXED_KEY, number)

    def location(self, tx_hash: bytes) -> tuple[int, int] | None:
        """(block number, index) of a committed transaction (py-evm keeps the same index, but
        decoding its entry took longer than the rest of a receipt lookup)."""
        key = self._locations.get(tx_hash)
        return None if key is None else (_int(key[:8]), _int(key[8:]))

    def record(self, number: int, index: int) -> TxRecord | None:
        if index >= MAX_TRANSACTIONS:
            return None
        encoded = self._transactions.get(_number_key(number) + index.to_bytes(4, "big"))
        return None if encoded is None else TxRecord.decode(encoded)

    def records(self, number: int) -> tuple[TxRecord, ...]:
        return tuple(TxRecord.decode(value) for value in self._encoded(number))

    def encoded_records(self, number: int) -> bytes:
        """The block's records as stored, one after the other (each an RLP list: the reads'
        process, chain/rpc/read_child.py, splits them)."""
        return b"".join(self._encoded(number))

    def _encoded(self, number: int) -> Iterator[bytes]:
        start = _number_key(number)
        return (value for _, value in self._transactions.items(start, _number_key(number + 1)))

    def block_info(self, number: int) -> BlockInfo | None:
        encoded = self._blocks.get(_number_key(number))
        if encoded is None:
            return None
        size, count = rlp.decode(encoded)
        return BlockInfo(_int(size), _int(count))
