"""RLP as our messages use it: canonical integers, and a linear check of how deeply RLP data
nests, run before decoding anything a peer or client sent. pyrlp decodes recursively and
copies as it descends: a list nested 10,000 deep (30 KB) takes seconds, 50,000 deep (a 150 KB
frame) minutes, all on the event loop. Our messages nest at most a dozen levels, so anything
deeper is refused before pyrlp sees it."""

from __future__ import annotations

from encoding import EncodingError

MAX_UINT64 = 2**64 - 1


def encode_uint(value: int) -> bytes:
    """A canonical RLP integer: big-endian, no leading zero bytes, 0 is the empty string."""
    return value.to_bytes((value.bit_length() + 7) // 8, "big")


def decode_uint(item: object, bound: int = MAX_UINT64) -> int:
    """A canonical RLP integer (as `encode_uint` writes it) of at most `bound`."""
    if not isinstance(item, bytes):
        raise EncodingError("expected an integer, got a list")
    if item[:1] == b"\x00":
        raise EncodingError("integer with a leading zero byte is not canonical")
    value = int.from_bytes(item, "big")
    if value > bound:
        raise EncodingError(f"integer {value} out of range")
    return value


class RlpTooDeep(EncodingError):
    """The data nests lists deeper than allowed (or its headers overrun it)."""


def _length(data: bytes, start: int, size: int) -> int:
    if start + size > len(data):
        raise RlpTooDeep("RLP length runs past the end of the data")
    return int.from_bytes(data[start:start + size], "big")


def check_rlp_depth(data: bytes, max_depth: int) -> None:
    """Raise RlpTooDeep if lists in `data` nest more than `max_depth` levels; O(items)."""
    ends: list[int] = []  # where each open list ends
    position = 0
    while position < len(data):
        while ends and position >= ends[-1]:
            ends.pop()
        prefix = data[position]
        if prefix < 0x80:
            position += 1
        elif prefix < 0xB8:
            position += 1 + prefix - 0x80
        elif prefix < 0xC0:
            size = prefix - 0xB7
            position += 1 + size + _length(data, position + 1, size)
        else:
            if prefix < 0xF8:
                header, payload = 1, prefix - 0xC0
            else:
                size = prefix - 0xF7
                header, payload = 1 + size, _length(data, position + 1, size)
            ends.append(position + header + payload)
            if len(ends) > max_depth:
                raise RlpTooDeep(f"RLP lists nested deeper than {max_depth}")
            position += header
