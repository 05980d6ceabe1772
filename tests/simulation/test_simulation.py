"""The seeded simulator: 700 seeds across N = 1..10 in CI; `--seeds K` runs K per size.

Seeds fall into classes by `scenario.kind_of` (half chaos, the rest honest, gapped, slow and
censor); a failure names its class and the command that replays it.
"""

from __future__ import annotations

import pytest

from tests.simulation.scenario import kind_of, replay_command, run_seed

# CI seeds per size: the quorum edge cases (N = 2, 3, 5, 6) and the cheap sizes get more, the
# large ones fewer (N = 10 takes about 1.1 s a seed here); 700 in total, about 150 s.
CI_SEEDS = {1: 150, 2: 100, 3: 100, 4: 150, 5: 40, 6: 40, 7: 60, 8: 20, 9: 20, 10: 20}


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
