"""The f+1 reply rule, pure: what a validator's receipt says, and when f+1 distinct validators
agree on it (no I/O; the client feeds it replies)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bft_client.errors import BftClientError
from encoding import EncodingError
from encoding.hexcodec import read_quantity


def quantity(value: Any, what: str) -> int:
    """A JSON-RPC hex quantity from a node's reply."""
    try:
        return read_quantity(value, what)
    except EncodingError as exc:
        raise BftClientError(str(exc)) from None


def fault_tolerance(validators: int) -> int:
    """f: how many of N validators may be faulty."""
    return (validators - 1) // 3


@dataclass(frozen=True)
class ReceiptKey:
    """What f+1 validators must agree on."""

    block_hash: str
    status: int
    gas_used: int
    block_number: int  # which set decided the block depends on it (bft_client.block_set)

    def __str__(self) -> str:
        return f"block {self.block_hash} status {self.status} gas {self.gas_used}"


def receipt_key(receipt: Any, tx_hash: str) -> ReceiptKey:
    """The agreement key of a receipt for `tx_hash`; BftClientError if it is not one."""
    if not isinstance(receipt, dict):
        raise BftClientError(f"malformed receipt {receipt!r}")
    if str(receipt.get("transactionHash", "")).lower() != tx_hash:
        raise BftClientError(f"a receipt for another transaction {receipt.get('transactionHash')}")
    block_hash = receipt.get("blockHash")
    if not isinstance(block_hash, str) or len(block_hash) != 66:
        raise BftClientError(f"a receipt without a block hash: {block_hash!r}")
    return ReceiptKey(
        block_hash.lower(),
        quantity(receipt.get("status"), "receipt status"),
        quantity(receipt.get("gasUsed"), "receipt gasUsed"),
        quantity(receipt.get("blockNumber"), "receipt blockNumber"),
    )


class ReplyTally:
    """Each validator's latest receipt (one vote each) and, for the others, what they said."""

    def __init__(self, validators: Sequence[str], needed: int) -> None:
        self.validators = tuple(validators)
        self.needed = needed
        self._receipts: dict[str, tuple[ReceiptKey, dict[str, Any]]] = {}
        self._notes: dict[str, str] = {}

    def count_among(self, validators: Sequence[str]) -> None:
        """Count only `validators` from now on, f+1 of them (the set that decided the block
        of the receipt agreed on, when it is not the configured one)."""
        self.validators = tuple(validators)
        self.needed = fault_tolerance(len(self.validators)) + 1

    def record_receipt(self, validator: str, key: ReceiptKey, receipt: dict[str, Any]) -> None:
        self._receipts[validator] = (key, receipt)
        self._notes.pop(validator, None)

    def record_note(self, validator: str, note: str) -> None:
        """A non-receipt answer; it does not erase a receipt the validator reported earlier."""
        if validator not in self._receipts:
            self._notes[validator] = note

    def agreement(self) -> tuple[ReceiptKey, tuple[str, ...]] | None:
        """The receipt key reported by at least `needed` distinct validators, and by whom."""
        supporters: dict[ReceiptKey, list[str]] = {}
        for validator in self.validators:
            if validator in self._receipts:
                supporters.setdefault(self._receipts[validator][0], []).append(validator)
        for key, agreeing in supporters.items():
            if len(agreeing) >= self.needed:
                return key, tuple(agreeing)
        return None

    def receipt_of(self, validator: str) -> dict[str, Any]:
        return self._receipts[validator][1]

    def disagreeing(self, key: ReceiptKey) -> dict[str, ReceiptKey]:
        return {v: k for v, (k, _) in self._receipts.items() if k != key}

    def describe(self) -> str:
        """One line: what every validator answered last."""
        answers = []
        for validator in self.validators:
            if validator in self._receipts:
                answers.append(f"{validator}: {self._receipts[validator][0]}")
            else:
                answers.append(f"{validator}: {self._notes.get(validator, 'no answer')}")
        return "; ".join(answers)
