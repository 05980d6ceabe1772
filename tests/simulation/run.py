"""Run simulator seeds from the command line.

    .venv/bin/python -m tests.simulation.run --seeds 10000          # seeds 0..9999, N = 1, 4, 7
    .venv/bin/python -m tests.simulation.run --seed 42 --n 4        # replay one failing seed
"""

from __future__ import annotations

import argparse
import sys

from tests.simulation.scenario import replay_command, run_seed

SIZES = (1, 4, 7)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=500, help="how many seeds per size")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="run only this seed")
    parser.add_argument("--n", type=int, choices=SIZES, action="append",
                        help="cluster size (repeatable; default 1, 4 and 7)")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    failures = 0
    for n in args.n or SIZES:
        for seed in seeds:
            try:
                run_seed(seed, n)
            except AssertionError as exc:
                failures += 1
                print(f"FAIL seed={seed} n={n}: {exc}\n  replay: {replay_command(seed, n)}")
        print(f"n={n}: {len(seeds)} seeds run")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
