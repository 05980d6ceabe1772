"""The RLP nesting check that runs before pyrlp sees peer or client data."""

from __future__ import annotations

import time

import pytest
import rlp

from encoding.rlp import RlpTooDeep, check_rlp_depth


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
