"""The membership benchmark's pure helpers (benchmarks/membership.py): commit gaps from the
load generator's blocks, and observer lags from readings of the heads."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.load import BenchError
from benchmarks.membership import (
    Heads,
    commit_gaps,
    follow_delays,
    lag_counts,
    median_around,
    paired_ratios,
)


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


def test_the_median_around_a_block_leaves_it_out_and_looks_no_further() -> None:
    gaps = {1: 9.0, 2: 0.1, 3: 0.2, 4: 5.0, 5: 0.4, 6: 0.3, 7: 9.0}
    assert median_around(gaps, 4, reach=2) == pytest.approx(0.25)
    assert median_around(gaps, 7, reach=1) == pytest.approx(0.3)
    with pytest.raises(BenchError, match="no commit gap near block 20"):
        median_around(gaps, 20, reach=2)


# when, the validators' highest head, then each observer's (read after it)
READINGS = [Heads(0.0, 10, (10, 9)), Heads(0.1, 12, (10, 13)), Heads(0.2, 12, (12, 12)),
            Heads(0.3, 14, (13, 12)), Heads(0.4, 14, (14, 14))]


def test_lag_counts_every_observer_in_every_reading() -> None:
    assert lag_counts(READINGS) == Counter({0: 5, 1: 2, 2: 2, -1: 1})
    assert lag_counts([Heads(0.0, 5, ())]) == Counter()


def test_follow_delays_time_each_block_to_the_slowest_observer() -> None:
    # block 11 and 12: validators at 0.1, both observers at 0.2; 13 and 14: 0.3 and 0.4
    assert follow_delays(READINGS) == pytest.approx([0.1, 0.1, 0.1, 0.1])
    # a block the observers have not all reached by the last reading is left out
    assert follow_delays(READINGS[:4]) == pytest.approx([0.1, 0.1])
    assert follow_delays([]) == [] and follow_delays([Heads(0.0, 5, ())]) == []


def test_paired_ratios_divide_within_each_pair_whatever_its_order() -> None:
    rounds = [(0, 100.0), (2, 90.0), (2, 60.0), (0, 50.0)]
    assert paired_ratios(rounds) == pytest.approx([0.9, 1.2])
    with pytest.raises(BenchError, match="not a pair"):
        paired_ratios([(0, 100.0), (0, 90.0)])
    with pytest.raises(ValueError):
        paired_ratios([(0, 100.0), (2, 90.0), (0, 80.0)])  # a round left without its pair
