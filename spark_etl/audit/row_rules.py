"""transaction-count, receipt-per-transaction, log-index and gas-used: a block's own rows
agree with each other and with its header. Plain Python over one block's rows, run in the
column rules' per-block pass (`column_rules.check_block`), whose nested block rows already
hold them: no DataFrame, join or Spark job of their own.

They read the rows the way the Spark rules they replace did (SQL's null semantics: a null
index, hash or amount matches nothing and is compared with nothing; `%d` of a null prints
"null"), so their verdicts and detail lines are those rules'."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TRANSACTION_COUNT = "transaction-count"
RECEIPT_PER_TRANSACTION = "receipt-per-transaction"
LOG_INDEX = "log-index"
GAS_USED = "gas-used"

Row = dict[str, Any]
Add = Callable[[str, str], None]  # (rule, detail): a violation at the block

# what a receipt repeats of its transaction (the transaction's `hash` is the receipt's key)
RECEIPT_MATCH = ("transaction_index", "block_hash", "from_address", "to_address")
# what places a log in a receipt of its block
LOG_RECEIPT = ("transaction_hash", "transaction_index", "block_hash")


def _number(value: int | None) -> str:
    """A value as Java's `%d` formats it (Spark's format_string): null is "null"."""
    return "null" if value is None else str(value)


def _present(values: Any) -> set[Any]:
    return {value for value in values if value is not None}


def transaction_count(add: Add, block: Row | None, transactions: list[Row]) -> None:
    """transaction-count: the block's transaction_count equals its rows in transactions,
    indexed 0..n-1, all naming the block's hash (`block` None: rows of a block that is not
    in blocks)."""
    if block is None and not transactions:
        return
    count = None if block is None else block["transaction_count"]
    rows = len(transactions)
    indexes = _present(row["transaction_index"] for row in transactions)
    last = max(indexes, default=None)
    hashes = sorted(_present(row["block_hash"] for row in transactions))
    expected = None if block is None else block["hash"]
    if (count != rows or len(indexes) != rows
            or (rows > 0 and last is not None and last != rows - 1)
            or (rows > 0 and hashes != [expected])):
        add(TRANSACTION_COUNT,
            f"{rows} transactions of a block that is not in blocks" if count is None else
            f"header says {count} transactions; the transactions table has {rows} rows, "
            f"{len(indexes)} distinct indexes (last {'none' if last is None else last}), "
            f"block hashes {','.join(hashes) if transactions else 'null'}")


def _keyed(add: Add, key: str | None, problem: str) -> None:
    add(RECEIPT_PER_TRANSACTION, problem if key is None else f"{key}: {problem}")


def receipts_per_transaction(add: Add, transactions: list[Row], receipts: list[Row]) -> None:
    """receipt-per-transaction: exactly one receipt per transaction, for the same position,
    block, sender and recipient; no receipt without a transaction (a null hash matches
    none)."""
    by_hash: dict[str | None, list[Row]] = {}
    for receipt in receipts:
        by_hash.setdefault(receipt["transaction_hash"], []).append(receipt)
    for transaction in transactions:
        key = transaction["hash"]
        matched = by_hash.get(key, []) if key is not None else []
        if not matched:
            _keyed(add, key, "transaction without a receipt")
        elif len(matched) > 1:
            _keyed(add, key, f"{len(matched)} receipts for one transaction")
        elif any(matched[0][name] != transaction[name] for name in RECEIPT_MATCH):
            _keyed(add, key, "receipt's index, block hash, sender or recipient differ from "
                             "the transaction")
    hashes = {transaction["hash"] for transaction in transactions}
    for key in by_hash:
        if key is None or key not in hashes:
            _keyed(add, key, "receipt of a transaction not in the block")


def log_indexes(add: Add, logs: list[Row], receipts: list[Row]) -> None:
    """log-index: the block's log indexes are 0..n-1 without repeats, and every log belongs
    to a receipt of the block (same transaction hash, index and block hash)."""
    if not logs:
        return
    rows = len(logs)
    indexes = _present(log["log_index"] for log in logs)
    first, last = min(indexes, default=None), max(indexes, default=None)
    if (len(indexes) != rows or (first is not None and first != 0)
            or (last is not None and last != rows - 1)):
        add(LOG_INDEX, f"{rows} logs with {len(indexes)} distinct indexes from "
                       f"{_number(first)} to {_number(last)} (want 0..n-1)")
    placed = {key for key in (tuple(r[name] for name in LOG_RECEIPT) for r in receipts)
              if None not in key}
    for log in logs:
        if tuple(log[name] for name in LOG_RECEIPT) not in placed:
            add(LOG_INDEX, f"log {_number(log['log_index'])} belongs to no receipt of the "
                           "block")


def gas_steps(add: Add, receipts: list[Row]) -> None:
    """gas-used: in index order (a null index first), each receipt's cumulative gas is the
    previous one's (0 before the first) plus its gas used."""
    ordered = sorted(receipts, key=lambda r: (r["transaction_index"] is not None,
                                              r["transaction_index"] or 0))
    previous: int | None = 0
    for receipt in ordered:
        cumulative, used = receipt["cumulative_gas_used"], receipt["gas_used"]
        if None not in (cumulative, previous, used) and cumulative - previous != used:
            add(GAS_USED, f"transaction {_number(receipt['transaction_index'])}: cumulative "
                          f"gas {cumulative} - previous {previous} != its gas used {used}")
        previous = cumulative


def gas_total(add: Add, block: Row, receipts: list[Row]) -> None:
    """gas-used: the header's gas used is the receipts' sum and the last cumulative value
    (of the receipts that have them: none is 0)."""
    header = block["gas_used"]
    total = sum(r["gas_used"] for r in receipts if r["gas_used"] is not None)
    cumulative = max(_present(r["cumulative_gas_used"] for r in receipts), default=0)
    if header is not None and (total != header or cumulative != header):
        add(GAS_USED, f"header gas used {header}; receipts sum to {total}, last cumulative "
                      f"{cumulative}")


def check_rows(add: Add, block: Row | None, nested: Row, first_copy: bool) -> None:
    """Every rule of this module over one block's rows (`nested`: a row of the column
    pass, its transactions, receipts and logs nested; `block` its `blocks` row, None if it
    has none). Rules over the rows alone run once for a block exported twice
    (`first_copy`), as they did over the tables."""
    transactions = nested["transactions"] or []
    receipts = nested["receipts"] or []
    transaction_count(add, block, transactions)
    if block is not None:
        gas_total(add, block, receipts)
    if first_copy:
        receipts_per_transaction(add, transactions, receipts)
        log_indexes(add, nested["logs"] or [], receipts)
        gas_steps(add, receipts)
