"""The RLP walk that bounds nesting and items before pyrlp sees peer or client data."""

from __future__ import annotations

import time

import pytest
import rlp

from encoding.rlp import RlpTooDeep, RlpTooManyItems, check_rlp_bounds, check_rlp_depth

FRAME = 16 * 2**20  # the transport's frame cap


def nested(depth: int) -> bytes:
    data = b"\x80"
    for _ in range(depth):
        size = len(data)
        if size < 56:
            data = bytes([0xC0 + size]) + data
        else:
            length = size.to_bytes((size.bit_length() + 7) // 8, "big")
            data = bytes([0xF7 + len(length)]) + length + data
    return data


@pytest.mark.parametrize("depth", [0, 1, 5, 24])
def test_data_within_the_depth_passes(depth: int) -> None:
    check_rlp_depth(nested(depth), 24)
    check_rlp_depth(rlp.encode([b"x" * 100_000, [[b"y"], 1], []]), 3)


def test_deeper_data_is_refused_in_linear_time() -> None:
    with pytest.raises(RlpTooDeep):
        check_rlp_depth(nested(25), 24)
    deep = nested(90_000)  # pyrlp would take minutes on this
    started = time.perf_counter()
    with pytest.raises(RlpTooDeep):
        check_rlp_depth(deep, 24)
    assert time.perf_counter() - started < 1.0


def test_siblings_do_not_add_up() -> None:
    check_rlp_depth(rlp.encode([[[b"a"]], [[b"b"]], [[b"c"]]]), 3)
    with pytest.raises(RlpTooDeep):
        check_rlp_depth(rlp.encode([[[b"a"]], [[[b"b"]]]]), 3)


def test_a_length_past_the_end_is_refused() -> None:
    with pytest.raises(RlpTooDeep):
        check_rlp_depth(b"\xb9\xff", 4)


def tiny_items(size: int) -> bytes:
    """One list of `size` bytes of one-byte items (pyrlp needs hours for 16 MiB of them)."""
    return rlp.codec.length_prefix(size, 0xC0) + b"\x01" * size


def test_a_frame_of_tiny_items_is_refused_after_the_items_allowed() -> None:
    frame = tiny_items(FRAME - 8)
    started = time.perf_counter()
    with pytest.raises(RlpTooManyItems):
        check_rlp_bounds(frame, max_depth=24, max_items=100_000, max_list_items=FRAME)
    with pytest.raises(RlpTooManyItems):
        check_rlp_bounds(frame, max_depth=24, max_items=FRAME, max_list_items=40)
    assert time.perf_counter() - started < 0.2  # the walk of all 16 M items: about 2 s


def test_items_are_counted_in_all_and_per_list() -> None:
    data = rlp.encode([[b"a", b"b"], [b"c", b"d"], b"e"])  # 8 items, lists of 3, 2 and 2
    check_rlp_bounds(data, max_depth=2, max_items=8, max_list_items=3)
    with pytest.raises(RlpTooManyItems):
        check_rlp_bounds(data, max_depth=2, max_items=7, max_list_items=3)
    with pytest.raises(RlpTooManyItems):
        check_rlp_bounds(data, max_depth=2, max_items=8, max_list_items=2)
    with pytest.raises(RlpTooDeep):
        check_rlp_bounds(data, max_depth=1, max_items=8, max_list_items=3)
    # each list counts its own items, not those nested in them
    check_rlp_bounds(rlp.encode([[b"a", b"b"], [b"c", b"d"]]), max_depth=2, max_items=7,
                     max_list_items=2)
