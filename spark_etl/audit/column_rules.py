"""raw-block, transaction-fields, transaction-sender, receipt-fields, log-order and
malformed-value: every decoded column of blocks, transactions, receipts and logs compared with
the bytes the certificates bind.

A certificate binds the block hash; the hash binds `raw_header` (its keccak256); the header
binds the raw transactions (transactions root) and the receipts' consensus encoding
(receipts root). Every other column a node serves is derived here from those bytes: each
header field decoded from `raw_header`, the block's size rebuilt, each transaction column
decoded from `raw`, each sender recovered from its signature (libsecp256k1, once per
transaction), and each receipt and log column compared with the verified transaction it
belongs to. A value that does not parse (not lower-case hex, a wrong length, an integer out of
its column's range, bytes that are not RLP) is a `malformed-value` violation, never an error,
and the checks that need it are skipped (a hash or root is never computed from a guess).

One Python pass per block, its transactions, receipts and logs nested in its row, yields the
violations of every rule here and of the per-block byte checks that predate them, block-hash
(`chain_rules.block_hashes`) and transaction-hash, transactions-root and receipts-root
(`roots.trie_roots`), and of the rules on a block's own rows (`row_rules`: transaction-count,
receipt-per-transaction, log-index, gas-used): each block is shuffled, decoded and hashed
once. The pass runs once per audit (cached) and each rule reads its own violations from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from typing import Any

import rlp
from coincurve import PublicKey
from eth_hash.auto import keccak
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from rlp.codec import consume_length_prefix, length_prefix

from encoding import EncodingError
from encoding.rlp import check_rlp_depth
from spark_etl import schemas
from spark_etl.audit import row_rules
from spark_etl.audit.context import Audit
from spark_etl.hexcodec import (
    MalformedValue,
    column_bytes,
    column_natural,
    column_wei,
    from_hex,
    to_hex,
    wei_columns,
    word,
)
from spark_etl.schemas import Table
from spark_etl.tables import Dataset

RAW_BLOCK = "raw-block"
TRANSACTION_FIELDS = "transaction-fields"
TRANSACTION_SENDER = "transaction-sender"
RECEIPT_FIELDS = "receipt-fields"
LOG_ORDER = "log-order"
MALFORMED_VALUE = "malformed-value"
BLOCK_HASH = "block-hash"
TRANSACTION_HASH = "transaction-hash"
TRANSACTIONS_ROOT = "transactions-root"
RECEIPTS_ROOT = "receipts-root"

Row = dict[str, Any]
Parser = Callable[[Any], Any]

# secp256k1's group order: a signature's r and s lie in 1..n-1, and s in 1..n/2 (EIP-2)
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
LIST_OFFSET = 0xC0  # an RLP list's first byte: a legacy transaction; a typed one is below 0x80
EMPTY_LIST = rlp.encode([])
EMPTY_STRING = rlp.encode(b"")
EMPTY_LIST_HASH = keccak(EMPTY_LIST)
BLANK_ROOT = keccak(rlp.encode(b""))  # the empty trie's
SHOWN_CHARACTERS = 80  # a served value longer than this is cut in a violation's detail


# What each column holds, so that anything else is reported as malformed.


def _decimal(value: Any) -> Decimal:
    if not isinstance(value, Decimal) or value < 0 or value != value.to_integral_value():
        raise MalformedValue("not a non-negative whole number")
    return value


def _words(value: Any) -> list[bytes]:
    """Topics, storage keys: a list of 32-byte words."""
    if not isinstance(value, list):
        raise MalformedValue("not a list of 32-byte words")
    return [column_bytes(item, 32) for item in value]


def _access_list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedValue("not a list of (address, storage keys)")
    for entry in value:
        column_bytes(entry["address"], 20)
        _words(entry["storage_keys"])
    return value


HASH = partial(column_bytes, size=32)
ADDRESS = partial(column_bytes, size=20)
BLOOM = partial(column_bytes, size=256)
TYPE = partial(column_natural, limit=0x80)  # EIP-2718: a transaction type is 0..0x7f


def _parsers(table: Table, by_name: dict[str, Parser]) -> dict[str, Parser]:
    """Every column's parser: `by_name`'s, else by type (an integer column holds a natural
    number, a DECIMAL one a whole number, a `_lossless` one a 256-bit decimal)."""
    parsers = {}
    for column in table.columns:
        if column.name in by_name:
            parsers[column.name] = by_name[column.name]
        elif column.type == schemas.LONG:
            parsers[column.name] = column_natural
        elif column.type == schemas.WEI:
            parsers[column.name] = _decimal
        elif column.name.endswith("_lossless"):
            parsers[column.name] = column_wei
        else:
            raise KeyError(f"{table.name}.{column.name} has no parser")
    return parsers


BLOCK_PARSERS = _parsers(schemas.BLOCKS, {
    **dict.fromkeys(("hash", "parent_hash", "sha3_uncles", "transactions_root", "state_root",
                     "receipts_root", "mix_hash", "withdrawals_root", "parent_beacon_block_root",
                     "requests_hash"), HASH),
    "nonce": partial(column_bytes, size=8), "logs_bloom": BLOOM, "miner": ADDRESS,
    "extra_data": column_bytes, "raw_header": column_bytes,
})  # fmt: skip
TRANSACTION_PARSERS = _parsers(schemas.TRANSACTIONS, {
    "hash": HASH, "from_address": ADDRESS, "to_address": ADDRESS, "input": column_bytes,
    "block_hash": HASH, "r": HASH, "s": HASH, "raw": column_bytes, "access_list": _access_list,
    "transaction_type": TYPE,
})  # fmt: skip
RECEIPT_PARSERS = _parsers(schemas.RECEIPTS, {
    "transaction_hash": HASH, "block_hash": HASH, "from_address": ADDRESS, "to_address": ADDRESS,
    "contract_address": ADDRESS, "logs_bloom": BLOOM, "type": TYPE,
})  # fmt: skip
LOG_PARSERS = _parsers(schemas.LOGS, {
    "transaction_hash": HASH, "block_hash": HASH, "address": ADDRESS, "data": column_bytes,
    "topics": _words,
})  # fmt: skip
PARSERS = {"blocks": BLOCK_PARSERS, "transactions": TRANSACTION_PARSERS,
           "receipts": RECEIPT_PARSERS, "logs": LOG_PARSERS}
# Columns a row cannot be placed or checked without: null there is malformed too
# (and the ones `roots` encodes: where it cannot, this rule reports why)
REQUIRED = {
    "blocks": ("raw_header",),
    "transactions": ("transaction_index", "raw"),
    "receipts": ("transaction_index", "cumulative_gas_used", "logs_bloom", "type"),
    "logs": ("log_index", "transaction_index", "address", "data", "topics"),
}


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, Decimal) else str(value)
    return text if len(text) <= SHOWN_CHARACTERS else text[:SHOWN_CHARACTERS] + "..."


Expected = dict[str, tuple[str, str, Any]]  # column -> (rule, what gives it, value)


def _expect(rule: str, source: str, columns: Row) -> Expected:
    return {name: (rule, source, value) for name, value in columns.items()}


def _parsed(parse: Parser, value: Any) -> Any:
    """`parse(value)`, or None if it is malformed (reported when its row is checked)."""
    try:
        return parse(value)
    except MalformedValue:
        return None


@dataclass
class _Findings:
    """The violations found in one block of one node."""

    node: str
    number: int
    rows: list[tuple[str, str, int, str]] = field(default_factory=list)

    def add(self, rule: str, detail: str) -> None:
        self.rows.append((rule, self.node, self.number, detail))

    def check_row(self, table: str, where: str, row: Row, expected: Expected) -> None:
        """Every column of a `table` row: equal to what the bytes give where `expected` says
        (else a violation of that column's rule), and, when it is not, well formed (else
        `malformed-value` instead). A value equal to the bytes' is well formed, so the
        common case costs one comparison."""
        required = REQUIRED[table]
        for name, parse in PARSERS[table].items():
            value = row[name]
            want = expected.get(name)
            if want is not None and value == want[2]:
                continue
            if value is None and name in required:
                self.add(MALFORMED_VALUE, f"{table}.{name} of {where} is null")
                continue
            if value is not None:
                try:
                    parse(value)
                except MalformedValue as exc:
                    self.add(MALFORMED_VALUE,
                             f"{table}.{name} of {where}: {_shown(value)} is {exc}")
                    continue
            if want is not None:
                rule, source, wanted = want
                self.add(rule, f"{where}: {name} is {_shown(value)}, {source} "
                               f"{_shown(wanted)}")


# The raw block.

# The header's RLP fields in order, as columns of `blocks`; trailing fields of later forks
# are absent (null) on older blocks.
HEADER_FIELDS = (
    "parent_hash", "sha3_uncles", "miner", "state_root", "transactions_root", "receipts_root",
    "logs_bloom", "difficulty_lossless", "number", "gas_limit", "gas_used", "timestamp",
    "extra_data", "mix_hash", "nonce", "base_fee_per_gas_lossless", "withdrawals_root",
    "blob_gas_used", "excess_blob_gas", "parent_beacon_block_root", "requests_hash",
)  # fmt: skip


def _header_item(name: str, value: Any) -> int | bytes:
    if name.endswith("_lossless"):
        return column_wei(value)
    return column_natural(value) if isinstance(value, int) else column_bytes(value)


def header_hash(block: Row) -> str:
    """keccak256 of the RLP header rebuilt from a `blocks` row; MalformedValue if a field
    does not parse."""
    items = []
    for name in HEADER_FIELDS:
        if block[name] is None:
            break
        items.append(_header_item(name, block[name]))
    return to_hex(keccak(rlp.encode(items)))


def _check_block_hash(found: _Findings, block: Row) -> None:
    """block-hash: the block hash is the keccak256 of the header rebuilt from its columns
    (a field that does not parse: malformed-value)."""
    try:
        computed = header_hash(block)
    except MalformedValue:
        return
    if computed != block["hash"]:
        found.add(BLOCK_HASH, f"the header fields hash to {computed}, not to the exported "
                              f"hash {block['hash']}")


def _header_value(column: schemas.Column, item: Any) -> Any:
    """A header item (RLP bytes) as the export writes its column."""
    if not isinstance(item, bytes):
        raise MalformedValue("not an RLP header (a field is a list)")
    if column.type == schemas.LONG:
        return int.from_bytes(item, "big")
    if column.name.endswith("_lossless"):
        return str(int.from_bytes(item, "big"))
    return to_hex(item)


BLOCK_COLUMNS = {column.name: column for column in schemas.BLOCKS.columns}
# How deep lists nest: a header is flat; a transaction's access list (or EIP-7702
# authorization list) holds lists of lists. Deeper data is refused before pyrlp's recursive
# decoder sees it (30,000 levels: a RecursionError, or with py-evm loaded a crashed worker).
HEADER_DEPTH = 1
TRANSACTION_DEPTH = 4


def _decode(data: bytes, max_depth: int) -> Any:
    """`data` decoded, nesting at most `max_depth` lists; MalformedValue if it cannot be."""
    try:
        check_rlp_depth(data, max_depth)
        return rlp.decode(data)
    except (EncodingError, rlp.exceptions.RLPException) as exc:
        raise MalformedValue(f"not RLP of at most {max_depth} nested lists ({exc})") from None


def _header_columns(raw_header: bytes) -> Row:
    """The `blocks` columns the header gives (a later fork's absent field: null), DECIMAL
    twins of the 256-bit ones included; MalformedValue if it is not an RLP header."""
    items = _decode(raw_header, HEADER_DEPTH)
    if not isinstance(items, list) or len(items) > len(HEADER_FIELDS):
        raise MalformedValue(f"not an RLP list of at most {len(HEADER_FIELDS)} header fields")
    columns: Row = {}
    for position, name in enumerate(HEADER_FIELDS):
        present = position < len(items)
        value = _header_value(BLOCK_COLUMNS[name], items[position]) if present else None
        columns[name] = value
        if name.endswith("_lossless"):
            columns[name.removesuffix("_lossless")] = (
                wei_columns(int(value))[0] if value is not None else None
            )
    return columns


def _list_length(payload: int) -> int:
    """Bytes of an RLP list (or a string that is not one byte below 0x80) around a payload
    of `payload` bytes."""
    if payload < 56:
        return 1 + payload
    return 1 + (payload.bit_length() + 7) // 8 + payload


def _transaction_length(raw: bytes) -> int:
    """Bytes of a transaction in the block: a legacy one is its list, a typed one an RLP
    string of its bytes."""
    if raw[:1] >= bytes([LIST_OFFSET]) or (len(raw) == 1 and raw[0] < 0x80):
        return len(raw)
    return _list_length(len(raw))


def block_size(raw_header: bytes, raws: list[bytes], has_withdrawals: bool) -> int:
    """Length of the encoded block [header, transactions, ommers(, withdrawals)], as
    debug_getRawBlock serves it: a typed transaction is an RLP string of its bytes, a legacy
    one its list; the ommers are empty under PBFT, and so are the withdrawals when the header
    has their root (both checked against the header)."""
    transactions = sum(_transaction_length(raw) for raw in raws)
    lists = 2 if has_withdrawals else 1
    return _list_length(len(raw_header) + _list_length(transactions) + lists * len(EMPTY_LIST))


@dataclass(frozen=True)
class _Header:
    """What `raw_header` gives: the header's columns, and the block columns its rows repeat
    (from the header where it decodes and hashes to the block hash, else as served)."""

    raw: bytes | None
    hash: str | None  # keccak256 of raw
    columns: Row | None
    keys: Row

    @property
    def base_fee(self) -> int | None:
        lossless = None if self.columns is None else self.columns["base_fee_per_gas_lossless"]
        return None if lossless is None else int(lossless)


def _header(found: _Findings, block: Row) -> _Header:
    raw = _parsed(column_bytes, block["raw_header"])
    served = {"block_number": block["number"], "block_hash": block["hash"],
              "block_timestamp": block["timestamp"]}
    if raw is None:
        return _Header(None, None, None, served)
    computed_hash = to_hex(keccak(raw))
    try:
        columns = _header_columns(raw)
    except MalformedValue as exc:
        found.add(MALFORMED_VALUE, f"blocks.raw_header of the block: {exc}")
        return _Header(raw, computed_hash, None, served)
    if computed_hash != block["hash"]:  # a raw header that is not the block's (reported)
        return _Header(raw, computed_hash, columns, served)
    keys = {"block_number": columns["number"], "block_hash": computed_hash,
            "block_timestamp": columns["timestamp"]}
    return _Header(raw, computed_hash, columns, keys)


def _check_block_row(found: _Findings, block: Row, header: _Header,
                     raws: list[bytes] | None) -> None:
    """raw-block: the block's columns are what its raw header gives; its size and
    transaction count are those of the block rebuilt around it."""
    expected: Expected = {}
    if header.hash is not None:
        expected["hash"] = (RAW_BLOCK, "keccak256 of raw_header is", header.hash)
    columns = header.columns
    if header.raw is not None and columns is not None:
        expected |= _expect(RAW_BLOCK, "raw_header gives", columns)
        if columns["sha3_uncles"] != to_hex(EMPTY_LIST_HASH):
            found.add(RAW_BLOCK, f"the header's ommers hash {columns['sha3_uncles']} is not "
                                 "the empty list's: a PBFT block has no ommers")
        withdrawals = columns["withdrawals_root"]
        if withdrawals is not None and withdrawals != to_hex(BLANK_ROOT):
            found.add(RAW_BLOCK, f"the header's withdrawals root {withdrawals} is not the "
                                 "empty trie's: a PBFT block has no withdrawals")
        if raws is not None:  # else a raw transaction or its index is malformed (reported)
            size = block_size(header.raw, raws, withdrawals is not None)
            expected |= _expect(RAW_BLOCK, "the block rebuilt from the raw bytes has",
                                {"size": size, "transaction_count": len(raws)})
    found.check_row("blocks", "the block", block, expected)


# Transactions.

_FEE_MARKET = ("chain_id", "nonce", "max_priority_fee_per_gas", "max_fee_per_gas", "gas", "to",
               "value", "input", "access_list")
# The RLP fields of each transaction type (EIP-155 legacy, 2930, 1559, 4844, 7702)
FIELDS: dict[int, tuple[str, ...]] = {
    0: ("nonce", "gas_price", "gas", "to", "value", "input", "v", "r", "s"),
    1: ("chain_id", "nonce", "gas_price", "gas", "to", "value", "input", "access_list",
        "y_parity", "r", "s"),
    2: (*_FEE_MARKET, "y_parity", "r", "s"),
    3: (*_FEE_MARKET, "max_fee_per_blob_gas", "blob_versioned_hashes", "y_parity", "r", "s"),
    4: (*_FEE_MARKET, "authorization_list", "y_parity", "r", "s"),
}
INTEGERS = frozenset({"nonce", "gas_price", "gas", "value", "v", "r", "s", "y_parity",
                      "chain_id", "max_priority_fee_per_gas", "max_fee_per_gas"})


def _integer(item: Any) -> int:
    if not isinstance(item, bytes) or item[:1] == b"\x00":
        raise MalformedValue("an integer field is not a canonical RLP integer")
    return int.from_bytes(item, "big")


def _recipient(item: Any) -> str | None:
    if not isinstance(item, bytes) or len(item) not in (0, 20):
        raise MalformedValue("the recipient is neither empty nor 20 bytes")
    return to_hex(item) if item else None


def _decoded_access_list(item: Any) -> list[Row]:
    """As the node's JSON writes it (and the export keeps): each storage key as 32 bytes."""
    malformed = MalformedValue("the access list is not [[20-byte address, [keys]], ...]")
    if not isinstance(item, list):
        raise malformed
    entries = []
    for entry in item:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], bytes)
                and len(entry[0]) == 20 and isinstance(entry[1], list)
                and all(isinstance(k, bytes) and len(k) <= 32 for k in entry[1])):
            raise malformed
        address, keys = entry
        entries.append({"address": to_hex(address),
                        "storage_keys": [to_hex(key.rjust(32, b"\0")) for key in keys]})
    return entries


@dataclass(frozen=True)
class DecodedTransaction:
    """A raw transaction's fields (columns' names and values) and what it was signed as."""

    type: int
    fields: Row
    signing_hash: bytes
    parity: int | None  # None: a legacy v that is neither 27/28 nor EIP-155's


def _string_length(item: bytes) -> int:
    """Bytes of an RLP string."""
    return 1 if len(item) == 1 and item[0] < 0x80 else _list_length(len(item))


def _unsigned_fields(encoded: bytes, items: list[Any]) -> bytes:
    """The payload of a transaction's RLP field list without its last three items (v or y
    parity, r, s: validated byte strings), sliced from its encoding: encoding the fields
    again cost more than the signature's recovery."""
    _, _, length, start = consume_length_prefix(encoded, 0)
    signature = sum(_string_length(item) for item in items[-3:])
    return encoded[start : start + length - signature]


def decode_transaction(raw: bytes) -> DecodedTransaction:
    """The consensus encoding of a signed transaction; MalformedValue if it is not one."""
    if not raw:
        raise MalformedValue("empty")
    type_id = 0 if raw[0] >= LIST_OFFSET else raw[0]
    if type_id not in FIELDS:
        raise MalformedValue(f"of transaction type {type_id}, not one of 0..4")
    names = FIELDS[type_id]
    items = _decode(raw if type_id == 0 else raw[1:], TRANSACTION_DEPTH)
    if not isinstance(items, list) or len(items) != len(names):
        raise MalformedValue(f"not the {len(names)} fields of a type-{type_id} transaction")
    values = dict(zip(names, items, strict=True))
    fields: Row = {name: _integer(values[name]) for name in names if name in INTEGERS}
    if max(fields["r"], fields["s"]).bit_length() > 256:
        raise MalformedValue("its signature's r or s is longer than 32 bytes")
    fields["to"] = _recipient(values["to"])
    if not isinstance(values["input"], bytes):
        raise MalformedValue("the input is a list, not bytes")
    fields["input"] = to_hex(values["input"])
    unsigned = _unsigned_fields(raw if type_id == 0 else raw[1:], items)
    if type_id:
        fields["access_list"] = _decoded_access_list(values["access_list"])
        parity = fields["y_parity"] if fields["y_parity"] in (0, 1) else None
        signed = bytes([type_id]) + length_prefix(len(unsigned), LIST_OFFSET) + unsigned
        return DecodedTransaction(type_id, fields, keccak(signed), parity)
    v = fields["v"]
    if v >= 35:  # EIP-155: v = chain id * 2 + 35 + parity, and the chain id signed
        fields["chain_id"] = (v - 35) // 2
        unsigned += rlp.encode(fields["chain_id"]) + EMPTY_STRING + EMPTY_STRING
        parity = (v - 35) % 2
    else:
        parity = v - 27 if v in (27, 28) else None
    signed = length_prefix(len(unsigned), LIST_OFFSET) + unsigned
    return DecodedTransaction(0, fields, keccak(signed), parity)


def effective_gas_price(decoded: DecodedTransaction, base_fee: int | None) -> int | None:
    """What the transaction pays per gas: its gas price, or under EIP-1559 the fee cap or
    base fee + tip cap, whichever is lower (None: a fee-market transaction in a block whose
    base fee is unknown)."""
    fields = decoded.fields
    if "max_fee_per_gas" not in fields:
        return int(fields["gas_price"])
    if base_fee is None:
        return None
    tip: int = fields["max_priority_fee_per_gas"]
    return min(int(fields["max_fee_per_gas"]), base_fee + tip)


def _wei_pair(name: str, number: int | None) -> Row:
    exact, lossless = wei_columns(number) if number is not None else (None, None)
    return {name: exact, f"{name}_lossless": lossless}


def transaction_columns(decoded: DecodedTransaction, base_fee: int | None) -> Row:
    """The `transactions` columns a decoded transaction gives, as the node's JSON (and so the
    export) writes them; gas_price is left out when it cannot be known."""
    fields, is_typed = decoded.fields, decoded.type != 0
    columns: Row = {
        "nonce": fields["nonce"],
        "to_address": fields["to"],
        "gas": fields["gas"],
        "input": fields["input"],
        "transaction_type": decoded.type,
        "chain_id": fields.get("chain_id"),
        "access_list": fields.get("access_list"),
        "v": fields["y_parity"] if is_typed else fields["v"],
        "r": word(fields["r"]),
        "s": word(fields["s"]),
        "y_parity": fields["y_parity"] if is_typed else None,
    }
    for name in ("value", "max_fee_per_gas", "max_priority_fee_per_gas"):
        columns |= _wei_pair(name, fields.get(name))
    price = effective_gas_price(decoded, base_fee)
    if price is not None:
        columns |= _wei_pair("gas_price", price)
    return columns


def recover_sender(decoded: DecodedTransaction) -> bytes:
    """The address that signed the transaction; ValueError (why) if the signature recovers
    no key or is not one a valid transaction carries."""
    fields = decoded.fields
    r, s = fields["r"], fields["s"]
    if decoded.parity is None:
        raise ValueError("its v / y parity is not a recovery id")
    if not (0 < r < SECP256K1_N and 0 < s <= SECP256K1_N // 2):
        raise ValueError("its r or s is outside the curve's range (EIP-2: s <= n/2)")
    signature = r.to_bytes(32, "big") + s.to_bytes(32, "big") + bytes([decoded.parity])
    public_key = PublicKey.from_signature_and_message(signature, decoded.signing_hash,
                                                      hasher=None)
    return keccak(public_key.format(compressed=False)[1:])[12:]


@dataclass(frozen=True)
class _Transaction:
    """A transaction as its bytes give it: hash, decoded fields and recovered sender (None:
    the signature recovers none, reported)."""

    hash: str
    decoded: DecodedTransaction
    sender: str | None


def _transaction(found: _Findings, where: str, raw: bytes, tx_hash: str) -> _Transaction | None:
    """The raw transaction decoded and its sender recovered (None, reported, if it does not
    decode)."""
    try:
        decoded = decode_transaction(raw)
    except MalformedValue as exc:
        found.add(MALFORMED_VALUE, f"transactions.raw of {where}: not a signed transaction "
                                   f"({exc})")
        return None
    try:
        sender: str | None = to_hex(recover_sender(decoded))
    except ValueError as exc:
        sender = None
        found.add(TRANSACTION_SENDER, f"{where}: the signature recovers no sender ({exc})")
    return _Transaction(tx_hash, decoded, sender)


def _check_transactions(found: _Findings, block: Row, header: _Header
                        ) -> tuple[dict[int, _Transaction], list[bytes] | None]:
    """transaction-hash, transaction-fields and transaction-sender for every row; the
    verified transactions by index, and the raw ones in index order (None if one is
    malformed)."""
    verified: dict[int, _Transaction] = {}
    raws: list[tuple[int, bytes]] = []
    whole = True
    for row in block["transactions"] or []:
        where = f"transaction {row['transaction_index']}"
        index = _parsed(column_natural, row["transaction_index"])
        raw = _parsed(column_bytes, row["raw"])
        expected = _expect(TRANSACTION_FIELDS, "the block has", header.keys)
        tx = None
        if raw is not None:
            tx_hash = to_hex(keccak(raw))
            expected["hash"] = (TRANSACTION_HASH, "its raw bytes hash to", tx_hash)
            tx = _transaction(found, where, raw, tx_hash)
        if tx is not None:
            columns = transaction_columns(tx.decoded, header.base_fee)
            expected |= _expect(TRANSACTION_FIELDS, "the raw transaction gives", columns)
            if tx.sender is not None:
                expected["from_address"] = (TRANSACTION_SENDER, "the signature recovers",
                                            tx.sender)
        found.check_row("transactions", where, row, expected)
        if index is None or raw is None:
            whole = False
            continue
        raws.append((index, raw))
        if tx is not None:
            verified.setdefault(index, tx)
    return verified, [raw for _, raw in sorted(raws)] if whole else None


# Receipts and logs.


def contract_address(sender: str, nonce: int) -> str:
    """The address a creation deploys to: keccak256(rlp([sender, nonce]))[12:]."""
    return to_hex(keccak(rlp.encode([from_hex(sender), nonce]))[12:])


def _receipt_columns(tx: _Transaction, base_fee: int | None) -> Row:
    """The receipt columns its transaction gives (the sender's only when it recovered)."""
    fields = tx.decoded.fields
    columns: Row = {"transaction_hash": tx.hash, "to_address": fields["to"],
                    "type": tx.decoded.type}
    if tx.sender is not None:
        columns["from_address"] = tx.sender
        creation = fields["to"] is None
        columns["contract_address"] = (
            contract_address(tx.sender, fields["nonce"]) if creation else None
        )
    price = effective_gas_price(tx.decoded, base_fee)
    if price is not None:
        columns |= _wei_pair("effective_gas_price", price)
    return columns


def _check_receipts(found: _Findings, block: Row, header: _Header,
                    transactions: dict[int, _Transaction]) -> None:
    """receipt-fields: each receipt's columns are its verified transaction's and block's,
    and its status is 0 or 1 (the receipts root only binds status == 1)."""
    keys = {name: header.keys[name] for name in ("block_number", "block_hash")}
    for row in block["receipts"] or []:
        where = f"receipt of transaction {row['transaction_index']}"
        expected = _expect(RECEIPT_FIELDS, "the block has", keys)
        tx = transactions.get(_parsed(column_natural, row["transaction_index"]))
        if tx is not None:
            columns = _receipt_columns(tx, header.base_fee)
            expected |= _expect(RECEIPT_FIELDS, "the transaction gives", columns)
        found.check_row("receipts", where, row, expected)
        status = row["status"]
        if status is None or _parsed(column_natural, status) not in (0, 1, None):
            found.add(RECEIPT_FIELDS, f"{where}: status is {status}, not 0 or 1")


def _check_logs(found: _Findings, block: Row, header: _Header,
                transactions: dict[int, _Transaction]) -> None:
    """log-order: each log names its transaction's hash and its block, and the log indexes
    follow the order of the transactions."""
    placed = []
    for row in block["logs"] or []:
        where = f"log {row['log_index']}"
        expected = _expect(LOG_ORDER, "the block has", header.keys)
        tx_index = _parsed(column_natural, row["transaction_index"])
        tx = transactions.get(tx_index)
        if tx is not None:
            expected["transaction_hash"] = (LOG_ORDER, "its transaction has", tx.hash)
        elif tx_index is not None:
            found.add(LOG_ORDER, f"{where}: transaction_index {tx_index} is no verified "
                                 "transaction of the block")
        found.check_row("logs", where, row, expected)
        log_index = _parsed(column_natural, row["log_index"])
        if log_index is not None and tx_index is not None:
            placed.append((log_index, tx_index))
    placed.sort()
    for (index, tx_index), (next_index, next_tx) in zip(placed, placed[1:], strict=False):
        if next_tx < tx_index:
            found.add(LOG_ORDER, f"log {next_index} of transaction {next_tx} comes after log "
                                 f"{index} of transaction {tx_index}")


# The tries: transactions-root, receipts-root.


def _nibbles(key: bytes) -> bytes:
    return bytes(nibble for byte in key for nibble in (byte >> 4, byte & 0x0F))


def _compact(nibbles: bytes, leaf: bool) -> bytes:
    """A path as a trie node holds it (hex-prefix encoding: the flag nibble says leaf or
    extension, and whether the path has an odd length)."""
    flag = 2 if leaf else 0
    padded = bytes([flag + 1]) + nibbles if len(nibbles) % 2 else bytes([flag, 0]) + nibbles
    return bytes(padded[i] << 4 | padded[i + 1] for i in range(0, len(padded), 2))


def _reference(node: list[Any]) -> Any:
    """How a parent refers to a node: the node itself if its RLP is under 32 bytes, else
    its hash."""
    encoded = rlp.encode(node)
    return node if len(encoded) < 32 else keccak(encoded)


def _trie_node(pairs: list[tuple[bytes, bytes]], depth: int) -> list[Any]:
    """The node holding `pairs` (nibble key, value; sorted, keys sharing their first `depth`
    nibbles) below depth `depth`."""
    if len(pairs) == 1:
        key, value = pairs[0]
        return [_compact(key[depth:], leaf=True), value]
    first, last = pairs[0][0], pairs[-1][0]  # sorted: what they share, every key shares
    shared = depth
    while shared < min(len(first), len(last)) and first[shared] == last[shared]:
        shared += 1
    if shared > depth:
        return [_compact(first[depth:shared], leaf=False), _reference(_trie_node(pairs, shared))]
    branch: list[Any] = [b""] * 17
    start = 0
    if len(first) == depth:  # a key that ends here: the branch's own value
        branch[16] = pairs[0][1]
        start = 1
    while start < len(pairs):
        nibble = pairs[start][0][depth]
        end = start
        while end < len(pairs) and pairs[end][0][depth] == nibble:
            end += 1
        branch[nibble] = _reference(_trie_node(pairs[start:end], depth + 1))
        start = end
    return branch


def trie_root(values: list[bytes]) -> bytes:
    """Root of the trie {rlp(i): values[i]}: Ethereum's transactions and receipts tries.
    Built bottom-up from the sorted keys in memory (no node store): seven times faster than
    py-trie's HexaryTrie, whose roots it equals (tests/etl/test_audit_columns.py)."""
    if not values:
        return BLANK_ROOT
    pairs = sorted((_nibbles(rlp.encode(index)), value) for index, value in enumerate(values))
    return keccak(rlp.encode(_trie_node(pairs, 0)))


def typed(type_id: int, payload: bytes) -> bytes:
    return payload if type_id == 0 else bytes([type_id]) + payload


def _log_topics(log: Row) -> list[bytes]:
    if not isinstance(log["topics"], list):
        raise MalformedValue("not a list")
    return [column_bytes(topic) for topic in log["topics"]]


def receipt_encoding(receipt: Row, logs: list[Row]) -> bytes:
    """The consensus encoding of a receipt and its logs; MalformedValue if a value it needs
    does not parse."""
    ordered = sorted(logs, key=lambda log: column_natural(log["log_index"]))
    payload = rlp.encode(
        [
            b"\x01" if receipt["status"] == 1 else b"",
            column_natural(receipt["cumulative_gas_used"]),
            column_bytes(receipt["logs_bloom"]),
            [
                [column_bytes(log["address"]), _log_topics(log), column_bytes(log["data"])]
                for log in ordered
            ],
        ]
    )
    return typed(column_natural(receipt["type"], 0x80), payload)


def _receipt_encodings(block: Row) -> list[bytes] | None:
    """The receipts trie's values in index order, each receipt with the logs of its
    transaction index; None if a value they need does not parse (reported)."""
    logs: dict[Any, list[Row]] = {}
    for log in block["logs"] or []:
        logs.setdefault(log["transaction_index"], []).append(log)
    try:
        receipts = sorted(block["receipts"] or [],
                          key=lambda receipt: column_natural(receipt["transaction_index"]))
        return [receipt_encoding(r, logs.get(r["transaction_index"], [])) for r in receipts]
    except MalformedValue:
        return None


def _check_roots(found: _Findings, block: Row, raws: list[bytes] | None) -> None:
    """transactions-root and receipts-root: each trie rebuilt from the rows has the header's
    root (a value they need that does not parse leaves it unchecked: malformed-value)."""
    checks = (
        (TRANSACTIONS_ROOT, "transactions_root", raws),
        (RECEIPTS_ROOT, "receipts_root", _receipt_encodings(block)),
    )
    for rule, column, values in checks:
        if values is None:
            continue
        computed = to_hex(trie_root(values))
        if computed != block[column]:
            found.add(rule, f"{len(values)} rows give root {computed}, the header has "
                            f"{block[column]}")


def check_block(block: Row) -> list[tuple[str, str, int, str]]:
    """Every violation of this module's rules and of `row_rules` in one block (a row of
    `_nested_blocks`; rows of a block that is not in blocks get `row_rules` alone)."""
    found = _Findings(block["node"], block["block_number"])
    copy = block["copy"]
    if copy is not None:
        _check_block_hash(found, block)
        header = _header(found, block)
        transactions, raws = _check_transactions(found, block, header)
        _check_block_row(found, block, header, raws)
        _check_roots(found, block, raws)
        _check_receipts(found, block, header, transactions)
        _check_logs(found, block, header, transactions)
    row_rules.check_rows(found.add, block if copy is not None else None, block,
                         first_copy=copy in (None, 1))
    return found.rows


def _nested_blocks(data: Dataset) -> DataFrame:
    """One row per block and per (node, block_number) of rows with no block: its columns,
    node, `copy` (1 for a block's first row in blocks, 2... for a repeat, null for no row),
    and its transactions, receipts and logs (all their columns) nested."""
    keys = ["node", "block_number"]

    def nested(frame: DataFrame, table: Table) -> DataFrame:
        rows = F.collect_list(F.struct(*table.column_names)).alias(table.name)
        return frame.groupBy(*keys).agg(rows)

    copies = Window.partitionBy("node", "number").orderBy("hash")
    blocks = data.blocks.select(F.col("number").alias("block_number"),
                                *schemas.BLOCKS.column_names, "node",
                                F.row_number().over(copies).alias("copy"))
    for frame, table in ((data.transactions, schemas.TRANSACTIONS),
                         (data.receipts, schemas.RECEIPTS), (data.logs, schemas.LOGS)):
        blocks = blocks.join(nested(frame, table), keys, "full_outer")
    return blocks


def column_checks(audit: Audit) -> DataFrame:
    """The violations of every rule of this module, computed once per audit."""
    return audit.cached(
        "column-checks",
        lambda tables: tables.flat_map_rows(_nested_blocks(tables.data), check_block,
                                     schemas.VIOLATIONS),
    )


def rule_of(*names: str) -> Callable[[Audit], DataFrame]:
    """The audit rule that reports the pass's violations of `names`."""

    def rule(audit: Audit) -> DataFrame:
        return column_checks(audit).where(F.col("rule").isin(list(names)))

    rule.__name__ = names[0].replace("-", "_")
    return rule


raw_block = rule_of(RAW_BLOCK)
transaction_fields = rule_of(TRANSACTION_FIELDS)
transaction_sender = rule_of(TRANSACTION_SENDER)
receipt_fields = rule_of(RECEIPT_FIELDS)
log_order = rule_of(LOG_ORDER)
malformed_values = rule_of(MALFORMED_VALUE)

COLUMN_RULES = (raw_block, transaction_fields, transaction_sender, receipt_fields, log_order,
                malformed_values)
