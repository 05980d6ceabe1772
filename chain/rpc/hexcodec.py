"""Hex encodings of JSON-RPC (`encoding.hexcodec`, geth's strict rules for arguments), with a
bad argument as the invalid-params error a client is sent."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from chain.rpc.errors import InvalidParams
from encoding import EncodingError, hexcodec
from encoding.hexcodec import MAX_UINT256
from encoding.hexcodec import to_data as data
from encoding.hexcodec import to_quantity as quantity

__all__ = ["MAX_UINT256", "data", "parse_address", "parse_data", "parse_hash",
           "parse_quantity", "parse_storage_slot", "quantity"]


@contextmanager
def _argument() -> Iterator[None]:
    try:
        yield
    except EncodingError as exc:
        raise InvalidParams(f"invalid argument: {exc}") from None


def parse_quantity(value: Any, what: str = "quantity", *, bits: int = 256) -> int:
    with _argument():
        return hexcodec.parse_quantity(value, what, bits=bits)


def parse_data(value: Any, what: str = "data", *, length: int | None = None) -> bytes:
    with _argument():
        return hexcodec.parse_data(value, what, length=length)


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
