"""Hex numbers and bytes in the three dialects the project reads: a JSON-RPC argument (geth's
strict rules), a node's JSON-RPC reply (any 0x-prefixed hex), and a genesis file (a JSON
number, a decimal string or 0x-hex, as geth's genesis accepts)."""

from __future__ import annotations

import binascii
import re
from typing import Any

from encoding import EncodingError

_QUANTITY = re.compile(r"0x(0|[1-9a-fA-F][0-9a-fA-F]*)")
_LEADING_ZERO = re.compile(r"0x0[0-9a-fA-F]+")
MAX_UINT256 = 2**256 - 1


def to_quantity(value: int) -> str:
    return hex(value)


def to_data(value: bytes) -> str:
    return "0x" + value.hex()


def parse_quantity(value: Any, what: str = "quantity", *, bits: int = 256) -> int:
    """A JSON-RPC argument quantity: 0x, then digits without leading zeros, below 2**bits."""
    if not isinstance(value, str):
        raise EncodingError(f"{what} must be a hex string, got {value!r}")
    if value in ("0x", "0X"):
        raise EncodingError(f'{what}: hex string "0x" has no digits')
    if not _QUANTITY.fullmatch(value):  # (fullmatch: `$` would let "0x1\n" through)
        if _LEADING_ZERO.fullmatch(value):
            raise EncodingError(f"{what}: hex number with leading zero digits")
        raise EncodingError(f"{what}: {value!r} is not a hex quantity")
    number = int(value, 16)
    if number >= 2**bits:
        raise EncodingError(f"{what}: hex number > {bits} bits")
    return number


def read_quantity(value: Any, what: str) -> int:
    """A quantity in a node's reply: any 0x-prefixed hex (a reader is lenient)."""
    if not isinstance(value, str) or not value.startswith("0x"):
        raise EncodingError(f"{what}: expected a hex quantity, got {value!r}")
    try:
        return int(value, 16)
    except ValueError:
        raise EncodingError(f"{what}: {value!r} is not a hex quantity") from None


def parse_number(value: Any, what: str) -> int:
    """A genesis file's number: a JSON number, a decimal string or a 0x-hex string."""
    if isinstance(value, bool):
        raise EncodingError(f"{what}: expected a number, got {value!r}")
    if isinstance(value, int):
        result = value
    elif isinstance(value, str):
        try:
            result = int(value, 16) if value.lower().startswith("0x") else int(value, 10)
        except ValueError:
            raise EncodingError(f"{what}: {value!r} is not a decimal or 0x-hex number") from None
    else:
        raise EncodingError(f"{what}: expected a number, got {type(value).__name__}")
    if result < 0:
        raise EncodingError(f"{what}: must not be negative")
    return result


def parse_data(value: Any, what: str = "data", *, length: int | None = None) -> bytes:
    """JSON-RPC argument bytes: 0x and whole bytes of hex, `length` of them if given."""
    try:  # unhexlify: C speed, and only hex digits in pairs (bytes.fromhex skips spaces)
        if not isinstance(value, str) or not value.startswith("0x"):
            raise ValueError
        raw = binascii.unhexlify(value[2:])
    except (ValueError, binascii.Error):
        raise EncodingError(f"{what}: {value!r} is not 0x-prefixed hex bytes") from None
    if length is not None and len(raw) != length:
        raise EncodingError(f"{what}: expected {length} bytes, got {len(raw)}")
    return raw
