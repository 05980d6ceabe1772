"""The short version of the soak (`python -m tests.soak --minutes 30` is the long one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak import KINDS, soak

pytestmark = pytest.mark.integration


def test_short_soak_loses_nothing_and_never_forks(tmp_path: Path) -> None:
    report = soak(tmp_path, seconds=20, seed=11, min_faults=4)
    assert set(report.faults) == set(KINDS)  # kill, term, stop and isolate, each at least once
    assert report.acknowledged > 50
    assert (report.lost, report.forks) == (0, 0)
    assert report.committed == report.acknowledged
