"""The membership benchmark's pure helpers (benchmarks/membership.py): commit gaps from the
load generator's blocks, and observer lags from readings of the heads."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.membership import commit_gaps, lag_counts


def test_commit_gaps_pair_consecutive_blocks_seen_within_the_window() -> None:
    # (number, seen, timestamp, transactions), as the load generator reports them
    blocks = [(4, 9.0, 9, 0), (5, 10.0, 10, 3), (6, 10.25, 10, 4), (7, 11.0, 11, 2),
              (9, 11.5, 11, 1), (10, 13.0, 13, 0)]
    gaps = commit_gaps(blocks, start=10.0, end=12.0)
    # 4 was seen before the window, 7 -> 9 skips a block, 10 was seen after the window
    assert gaps == pytest.approx({5: 0.25, 6: 0.75})


def test_commit_gaps_of_too_few_blocks_are_empty() -> None:
    assert commit_gaps([], 0.0, 1.0) == {}
    assert commit_gaps([(1, 0.5, 0, 1)], 0.0, 1.0) == {}


def test_lag_counts_every_observer_in_every_reading() -> None:
    # the validators' highest head, then each observer's (read after it)
    samples = [(10, [10, 9]), (12, [10, 13]), (12, [12, 12])]
    assert lag_counts(samples) == Counter({0: 3, 1: 1, 2: 1, -1: 1})
    assert lag_counts([(5, [])]) == Counter()
