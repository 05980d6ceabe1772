"""JSON-RPC hex values to table values: lower-case 0x hex strings, 64-bit integers, and
256-bit quantities as (DECIMAL(38,0) when it fits, lossless decimal string)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from encoding import EncodingError
from encoding.hexcodec import read_quantity
from spark_etl.errors import ExtractError

MAX_LONG = 2**63 - 1
DECIMAL_LIMIT = 10**38  # DECIMAL(38,0) holds 0 .. 10**38 - 1


def quantity(value: Any, what: str) -> int:
    """A JSON-RPC quantity ("0x1a") as an int."""
    try:
        return read_quantity(value, what)
    except EncodingError as exc:
        raise ExtractError(str(exc)) from None


def long(value: Any, what: str) -> int:
    """A quantity that must fit a signed 64-bit column (numbers, gas, nonces, indexes)."""
    number = quantity(value, what)
    if number > MAX_LONG:
        raise ExtractError(f"{what}: {number} does not fit a 64-bit column")
    return number


def optional_long(value: Any, what: str) -> int | None:
    return None if value is None else long(value, what)


def wei(value: Any, what: str) -> tuple[Decimal | None, str]:
    """A 256-bit quantity: (DECIMAL(38,0) value or None when it does not fit, decimal text)."""
    number = quantity(value, what)
    return (Decimal(number) if number < DECIMAL_LIMIT else None), str(number)


def optional_wei(value: Any, what: str) -> tuple[Decimal | None, str | None]:
    return (None, None) if value is None else wei(value, what)


def hex_data(value: Any) -> str | None:
    """Hex data (hashes, addresses, bytes) in lower case; None stays None."""
    return None if value is None else str(value).lower()


def to_hex(data: bytes) -> str:
    return "0x" + data.hex()


def from_hex(text: str) -> bytes:
    return bytes.fromhex(text[2:] if text.startswith(("0x", "0X")) else text)


def word(value: int) -> str:
    """A 256-bit number as a 32-byte hex word (signature r and s)."""
    return to_hex(value.to_bytes(32, "big"))
