"""The seeded simulator: 500 seeds across N = 1, 4, 7 in CI; `--seeds K` runs K per size.

Seeds fall into classes by `scenario.kind_of` (half chaos, the rest honest, gapped, slow and
censor); a failure names its class and the command that replays it.
"""

from __future__ import annotations

import pytest

from tests.simulation.scenario import kind_of, replay_command, run_seed

# CI seeds per size: the cheap sizes get more, N = 7 (about 0.5 s a seed) fewer; 500 in total.
CI_SEEDS = {1: 150, 4: 250, 7: 100}


@pytest.mark.parametrize("n", sorted(CI_SEEDS))
def test_random_seeds(n: int, seed_count: int | None) -> None:
    failures = []
    for seed in range(seed_count or CI_SEEDS[n]):
        try:
            run_seed(seed, n)
        except AssertionError as exc:
            failures.append(f"seed {seed} ({kind_of(seed, n)}): {exc}\n"
                            f"  replay: {replay_command(seed, n)}")
    assert not failures, "\n".join(failures)
