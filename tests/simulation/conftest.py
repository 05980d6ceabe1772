"""`--seeds K`: how many simulator seeds the simulation tests run (default: the CI set)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--seeds", type=int, default=None,
                     help="simulator seeds per cluster size (default: the CI split, 400 in total)")


@pytest.fixture
def seed_count(request: pytest.FixtureRequest) -> int | None:
    return request.config.getoption("--seeds")
