"""Run simulator seeds from the command line.

    .venv/bin/python -m tests.simulation.run --seeds 1000           # seeds 0..999 for N = 1..10
    .venv/bin/python -m tests.simulation.run --seed 42 --n 4        # replay one failing seed
    .venv/bin/python -m tests.simulation.run --seeds 200 --kind censor   # one class only
    .venv/bin/python -m tests.simulation.run --seeds 200 --pool-order ready   # see ledger.py
    .venv/bin/python -m tests.simulation.run --seeds 2000 --n 4 --kind chaos --amnesia
    .venv/bin/python -m tests.simulation.run --seed 31 --n 6 --calm   # without its hostile world
    .venv/bin/python -m tests.simulation.run --seeds 100 --world      # what the worlds did

Each seed belongs to one class (`scenario.kind_of`): chaos, membership, honest, gapped, slow
or censor, and draws a hostile world (`hostile.py`: failing executors, poisoned blocks,
fetches that fail part-way, crashes between writes, slow replicas), named in its failure
message (the membership class draws none: its faults are the chaos class's).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from tests.simulation import cluster, hostile, ledger, scenario
from tests.simulation.scenario import KINDS, kind_of, replay_command, run_seed

SIZES = tuple(range(1, 11))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=500, help="how many seeds per size")
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--seed", type=int, help="run only this seed")
    parser.add_argument("--n", type=int, choices=SIZES, action="append",
                        help="cluster size (repeatable; default 1 to 10)")
    parser.add_argument("--kind", choices=KINDS, action="append",
                        help="run only the seeds of this class (repeatable)")
    parser.add_argument("--pool-order", choices=("arrival", "ready"), default=ledger.POOL_ORDER,
                        help="the order in which pools hand out transactions (ledger.POOL_ORDER)")
    parser.add_argument("--amnesia", action="store_true",
                        help="every chaos seed (f >= 1) has an equivocating first primary and an "
                             "honest replica whose consensus store is wiped mid-run")
    parser.add_argument("--calm", action="store_true",
                        help="no hostile world (hostile.py) in any seed: does a failure need it?")
    parser.add_argument("--world", action="store_true",
                        help="print what the hostile worlds did (Cluster.seen), summed per size")
    parser.add_argument("--group-commit", type=int, default=0, metavar="MS",
                        help="model the adapter's group commit as a write of MS ms "
                             "(cluster.GROUP_COMMIT_MS; 0: one write per step, at once)")
    parser.add_argument("--stale-timers", action="store_true",
                        help="with --group-commit: a step's timers change only when its "
                             "actions are performed (the adapter before _note_timers)")
    parser.add_argument("--late-routing", action="store_true",
                        help="with --group-commit: a waiting step's SendTo goes to the member "
                             "its index names when performed (the adapter of s10-gc)")
    args = parser.parse_args(argv)
    ledger.POOL_ORDER = args.pool_order
    if args.amnesia:
        scenario.AMNESIA_SHARE = 1.0
    hostile.ENABLED = not args.calm
    cluster.GROUP_COMMIT_MS = args.group_commit
    cluster.TIMERS_AS_STEPS_END = not args.stale_timers
    cluster.ROUTES_AS_STEPS_END = not args.late_routing
    suffix = ("" if args.pool_order == "arrival" else f" --pool-order {args.pool_order}") + (
        " --amnesia" if args.amnesia else "") + (" --calm" if args.calm else "") + (
        f" --group-commit {args.group_commit}" if args.group_commit else "") + (
        " --stale-timers" if args.stale_timers else "") + (
        " --late-routing" if args.late_routing else "")
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    failures = 0
    for n in args.n or SIZES:
        started, ran, seen = time.monotonic(), 0, Counter[str]()
        for seed in seeds:
            kind = kind_of(seed, n)
            if args.kind and kind not in args.kind:
                continue
            ran += 1
            try:
                seen.update(run_seed(seed, n).seen)
            except Exception as exc:  # noqa: BLE001 (an unexpected error is a failure too)
                failures += 1
                what = "" if isinstance(exc, AssertionError) else f"{type(exc).__name__}: "
                print(f"FAIL seed={seed} n={n} ({kind}): {what}{exc}\n"
                      f"  replay: {replay_command(seed, n)}{suffix}", flush=True)
        print(f"n={n}: {ran} seeds run in {time.monotonic() - started:.1f} s", flush=True)
        if args.world:
            print("  " + ", ".join(f"{event}: {count}" for event, count in sorted(seen.items())),
                  flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
