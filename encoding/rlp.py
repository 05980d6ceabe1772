"""RLP as our messages use it: canonical integers, and a linear walk of RLP data that bounds
how deeply it nests and how many items it holds, run before decoding anything a peer or
client sent. pyrlp decodes recursively and copies as it descends: a list nested 10,000 deep
(30 KB) takes seconds, 50,000 deep (a 150 KB frame) minutes; and it rebuilds each list's
bytes item by item, so a list's cost grows with the square of its length (40,000 entries:
1.7 s, 430,000: minutes), all on the event loop. What is deeper, longer or holds more items
than its type allows is refused before pyrlp sees it, and the walk stops at the first item
past a bound, so a 16 MiB frame of one-byte items costs no more than the items allowed."""

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


class RlpTooManyItems(EncodingError):
    """The data holds more items than allowed, in all or in one list."""


def _length(data: bytes, start: int, size: int) -> int:
    if start + size > len(data):
        raise RlpTooDeep("RLP length runs past the end of the data")
    return int.from_bytes(data[start:start + size], "big")


def check_rlp_depth(data: bytes, max_depth: int) -> None:
    """Raise RlpTooDeep if lists in `data` nest more than `max_depth` levels; O(items)."""
    check_rlp_bounds(data, max_depth=max_depth, max_items=len(data), max_list_items=len(data))


def check_rlp_bounds(data: bytes, *, max_depth: int, max_items: int,
                     max_list_items: int) -> None:
    """Walk `data` once, item by item, and stop at the first one past a bound: lists nested
    more than `max_depth` levels (RlpTooDeep), more than `max_items` strings and lists in all,
    the outermost included, or more than `max_list_items` in one list (RlpTooManyItems).

    Canonical form and whether items fit their lists are left to the decoder, which then
    runs on bounded input.
    """
    size = len(data)
    enclosing: list[tuple[int, int]] = []  # (end, items so far) of each enclosing list
    end, listed = size, 0  # the list being walked (at first the data itself) and its items
    position = items = 0
    while True:
        if position >= end:
            if not enclosing:
                return
            end, listed = enclosing.pop()
            continue
        items += 1
        listed += 1
        if items > max_items or listed > max_list_items:
            raise RlpTooManyItems(f"RLP data holds more than {max_items} items, or a list "
                                  f"more than {max_list_items}")
        prefix = data[position]
        if prefix < 0x80:
            position += 1
        elif prefix < 0xB8:
            position += prefix - 0x7F
        elif prefix < 0xC0:
            length_size = prefix - 0xB7
            position += 1 + length_size + _length(data, position + 1, length_size)
        else:
            if prefix < 0xF8:
                header, payload = 1, prefix - 0xC0
            else:
                length_size = prefix - 0xF7
                header, payload = 1 + length_size, _length(data, position + 1, length_size)
            enclosing.append((end, listed))
            if len(enclosing) > max_depth:
                raise RlpTooDeep(f"RLP lists nested deeper than {max_depth}")
            position += header
            end, listed = min(position + payload, size), 0
