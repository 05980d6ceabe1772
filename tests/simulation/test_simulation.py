"""The seeded simulator: 500 seeds across N = 1, 4, 7 in CI; `--seeds K` runs K per size."""

from __future__ import annotations

import pytest

from tests.simulation.scenario import replay_command, run_seed

# CI seeds per size: the cheap sizes get more, N = 7 (about 0.4 s a seed) fewer; 500 in total.
CI_SEEDS = {1: 150, 4: 250, 7: 100}


@pytest.mark.parametrize("n", sorted(CI_SEEDS))
def test_random_seeds(n: int, seed_count: int | None) -> None:
    failures = []
    for seed in range(seed_count or CI_SEEDS[n]):
        try:
            run_seed(seed, n)
        except AssertionError as exc:
            failures.append(f"seed {seed}: {exc}\n  replay: {replay_command(seed, n)}")
    assert not failures, "\n".join(failures)
