"""Where a node's time goes under a saturating load: py-spy on every node of a benchmark
testnet, its samples sorted into the node's stages.

    python -m benchmarks.profile --validators 4 [--workload transfer] [--rounds 2]

py-spy samples the thread holding the GIL (`--gil`), 100 times a second, so a stage's share
is its share of the node's Python time. Collapsed stacks are kept in --out (flamegraph.pl or
speedscope read them). py-spy is a development tool, not a dependency: `make profile`
installs it into the virtualenv.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks.load import BenchError, run_load
from benchmarks.stages import window
from benchmarks.testnet import BenchNet

ACCOUNTS = 2_000
# (stage, pattern over the whole stack): the first match wins.
STAGES = [
    ("receipts read by the benchmark", r"eth_getBlockReceipts"),
    ("validate: execute_block", r"Blockchain\.execute_block"),
    ("build: apply_all_transactions", r"Blockchain\.build_block.*apply_all_transactions"),
    ("build: roots, state, persist", r"Blockchain\.build_block"),
    ("tx gossip in: decode, recover, admit", r"_on_gossiped_transaction"),
    ("RPC eth_sendRawTransaction", r"eth_sendRawTransaction"),
    ("RPC other", r"Dispatcher|RpcServer"),
    ("commit: write, refresh, prune", r"commit_block|on_committed"),
    ("pool: next batch", r"TxPool\.executable"),
    ("PBFT engine: steps, synced persists", r"pbft_engine"),
    ("transport", r"chain/p2p/"),
]


def stage_shares(path: Path) -> tuple[int, Counter[str]]:
    """Samples in a py-spy raw (collapsed) file, and how many fell in each stage."""
    shares: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        stage = next((name for name, pattern in STAGES if re.search(pattern, stack)), "other")
        shares[stage] += int(count)
    return total, shares


def _spy(py_spy: str, pid: int, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [py_spy, "record", "--pid", str(pid), "--gil", "--rate", "100", "--format", "raw",
         "--output", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def profile(validators: int, workload: str, rounds: int, out: Path, py_spy: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="pbft-profile-"))
    net = BenchNet.create(workdir / "net", validators, ACCOUNTS)  # the testnet's defaults
    spies: list[subprocess.Popen[bytes]] = []
    try:
        net.cluster.start()
        for index in range(validators):
            spies.append(_spy(py_spy, net.pid(index), out / f"node{index}.txt"))
        load = {"workload": workload, "senders": ACCOUNTS, "per_sender": rounds}
        run_load(net, workdir, "profile", window=window(net, load), **load)
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for spy in spies:
            spy.wait(timeout=60)
        net.close()
        shutil.rmtree(workdir, ignore_errors=True)


def report(out: Path, validators: int) -> None:
    for index in range(validators):
        total, shares = stage_shares(out / f"node{index}.txt")
        print(f"node {index}: {total} samples")
        for stage, count in shares.most_common():
            print(f"  {count / total:6.1%}  {stage}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("--validators", type=int, default=1)
    parser.add_argument("--workload", choices=["transfer", "erc20"], default="transfer")
    parser.add_argument("--rounds", type=int, default=2, help="transactions per account")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/profile"))
    args = parser.parse_args(argv)
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which(
        "py-spy")
    if py_spy is None:
        print("py-spy is not installed: run `make profile` (it installs it)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        profile(args.validators, args.workload, args.rounds, args.out, py_spy)
    except BenchError as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return 1
    report(args.out, args.validators)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
