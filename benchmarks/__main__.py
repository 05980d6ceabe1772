"""`python -m benchmarks` (`make bench`): every benchmark of issue 6 end to end, a table on
stdout and the results as JSON (benchmarks/results/latest.json unless --out says otherwise)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.load import BenchError
from benchmarks.report import Results, describe_machine, format_table
from benchmarks.stages import (
    OPT_IN_STAGES,
    QUICK,
    STAGES,
    Context,
    Reference,
    Sizes,
    raw_limit,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "latest.json"


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results JSON file")
    parser.add_argument("--quick", action="store_true", help="small loads, for development")
    parser.add_argument("--only", nargs="+", choices=sorted(STAGES),
                        default=sorted(set(STAGES) - OPT_IN_STAGES),
                        help="stages to run (the raw limit always runs; "
                             f"{', '.join(sorted(OPT_IN_STAGES))} only when named)")
    parser.add_argument("--keep", action="store_true", help="keep the testnets' directories")
    parser.add_argument("--soak", type=int, metavar="N",
                        help="N=1: committed transactions when memory is read again "
                             f"(default {Sizes.soak_total:,})")
    parser.add_argument("--chain-dir", type=Path, metavar="DIR",
                        help="etl-large: the 300,000-transaction chain, built there if absent "
                             "(default $PBFT_BENCH_CHAIN_DIR or ~/.cache/pbft-chain/"
                             "bench-chain300k)")
    return parser.parse_args(argv)


def _run_stages(ctx: Context, names: list[str]) -> None:
    raw_limit(ctx, "start")
    for name, stage in STAGES.items():
        if name not in names:
            continue
        print(f"-- {name}", flush=True)
        try:
            stage(ctx)
        except (BenchError, AssertionError, OSError, RuntimeError) as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            ctx.results.errors.append(f"{name}: {message}")
            print(f"   {name} failed: {message}", file=sys.stderr, flush=True)
    raw_limit(ctx, "end")


def main(argv: list[str]) -> int:
    args = _arguments(argv)
    started = time.monotonic()
    results = Results(describe_machine())
    sizes = QUICK if args.quick else Sizes()
    if args.soak:
        sizes = dataclasses.replace(sizes, soak_total=args.soak)
    workdir = Path(tempfile.mkdtemp(prefix="pbft-bench-"))
    try:
        _run_stages(Context(results, Reference(), sizes, workdir, args.chain_dir), args.only)
    except KeyboardInterrupt:
        print("interrupted; every node was stopped", file=sys.stderr)
        return 130
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    results.refresh_references()
    results.machine["load_average_end"] = os.getloadavg()
    results.machine["seconds"] = round(time.monotonic() - started)
    results.machine["sizes"] = "quick" if args.quick else "full"
    results.write(args.out)
    print(format_table(results))
    print(f"{results.machine['seconds']} s; results in {args.out}"
          + (f"; testnets kept in {workdir}" if args.keep else ""))
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
