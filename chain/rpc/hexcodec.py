"""Hex encodings of JSON-RPC: quantities (no leading zeros) and data (lower-case)."""

from __future__ import annotations

import re
from typing import Any

from chain.rpc.errors import InvalidParams

_QUANTITY = re.compile(r"^0x(0|[1-9a-fA-F][0-9a-fA-F]*)$")
_DATA = re.compile(r"^0x([0-9a-fA-F]{2})*$")
MAX_UINT256 = 2**256 - 1


def quantity(value: int) -> str:
    return hex(value)


def data(value: bytes) -> str:
    return "0x" + value.hex()


def parse_quantity(value: Any, what: str = "quantity", *, bits: int = 256) -> int:
    if not isinstance(value, str):
        raise InvalidParams(f"invalid argument: {what} must be a hex string, got {value!r}")
    if value in ("0x", "0X"):
        raise InvalidParams(f'invalid argument: {what}: hex string "0x" has no digits')
    if not _QUANTITY.match(value):
        if re.match(r"^0x0[0-9a-fA-F]+$", value):
            raise InvalidParams(f"invalid argument: {what}: hex number with leading zero digits")
        raise InvalidParams(f"invalid argument: {what}: {value!r} is not a hex quantity")
    number = int(value, 16)
    if number >= 2**bits:
        raise InvalidParams(f"invalid argument: {what}: hex number > {bits} bits")
    return number


def parse_data(value: Any, what: str = "data", *, length: int | None = None) -> bytes:
    if not isinstance(value, str) or not _DATA.match(value):
        raise InvalidParams(f"invalid argument: {what}: {value!r} is not 0x-prefixed hex bytes")
    raw = bytes.fromhex(value[2:])
    if length is not None and len(raw) != length:
        raise InvalidParams(f"invalid argument: {what}: expected {length} bytes, got {len(raw)}")
    return raw


def parse_address(value: Any, what: str = "address") -> bytes:
    return parse_data(value, what, length=20)


def parse_hash(value: Any, what: str = "hash") -> bytes:
    return parse_data(value, what, length=32)


def parse_storage_slot(value: Any) -> int:
    """A storage slot as geth takes it: up to 32 bytes of hex, leading zeros allowed."""
    if not isinstance(value, str) or not re.match(r"^0x[0-9a-fA-F]{1,64}$", value):
        raise InvalidParams(
            f"invalid argument 1: storage slot {value!r} is not hex of at most 32 bytes"
        )
    return int(value, 16)
