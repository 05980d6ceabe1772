"""Issue 30: the audit ETL beside ethereum-etl on a chain of at least 300,000 transactions.

    python -m benchmarks --only etl-large [--chain-dir DIR]

The chain is a default 4-validator testnet (`pbft-node testnet init`, the benchmark accounts
and token added to its genesis as every stage does) loaded by the load generator with plain
transfers and, one load in ERC20_EVERY, ERC-20 transfers (one log each). Building it takes
from 15 minutes to over an hour (the nodes' commit rate on a busy machine), so it lives in
a directory of its own that later runs restart (`--chain-dir`, else $PBFT_BENCH_CHAIN_DIR,
else DEFAULT_CHAIN_DIR): it is built, or topped up, only when it holds fewer than
CHAIN_TRANSACTIONS transactions. Every transaction is from a benchmark account, so the
chain's transaction count is the sum of their nonces. A testnet whose node 0 already answers
(started by another process) is used as it is.

Side by side, from node 0, over the same blocks, each a new process: ethereum-etl's export,
`pbft-etl export`, `audit --genesis` and `run --genesis` (the n4 stage's
`_etl_beside_ethereum_etl`); then the chain grows by GROWTH of its transactions and `run`
goes again into the same --out (the incremental run); `run` on `local[1]` and `local[2]`;
the state audit's replay rate on the chain's first STATE_TRANSACTIONS transfers; and the
first 5 blocks' commands (what a command costs whatever the chain). The chain keeps what
the growth added: the next run measures a chain GROWTH larger. With $PBFT_BENCH_MEASURE_ONLY
set, the chain is measured as it is: neither topped up (a builder may be running already)
nor grown (no incremental run).

    python -m benchmarks.etl_large [DIR]                    build or top up the chain only
    python -m benchmarks.etl_large --side-by-side [--before CHECKOUT] [DIR]

`--side-by-side` measures the export alone, as the chain is: ethereum-etl's export, then
`pbft-etl export` of the --before checkout (another commit's tree, e.g. `git archive`) and
of --after (default: this checkout), each a new process over blocks 0..head (or --to),
--rounds times; then `run --genesis` on each `--masters` (local[1] and local[2] by default);
the load average beside each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import stages
from benchmarks.accounts import bench_account
from benchmarks.load import BenchError, run_load
from benchmarks.raw import block_size
from benchmarks.reads import RpcClient
from benchmarks.report import Row
from benchmarks.testnet import BenchNet
from testkit.cluster import Cluster

CHAIN_TRANSACTIONS = 300_000
ACCOUNTS = 2_000
VALIDATORS = 4
ROUNDS_PER_LOAD = 10  # transactions per account in one load: 20,000 a load
ERC20_EVERY = 10  # one load in ten is ERC-20 transfers (a log each)
WINDOW_BLOCKS = 2  # full blocks' worth submitted but not committed per target, as the stages
LOAD_DEADLINE = 1_800.0  # seconds for one load to commit (a busy machine commits slowly)
RPC_BATCH = 500  # calls per JSON-RPC batch (the node answers at most 1,000)
GROWTH = 0.01  # the incremental run's growth, of the chain's transactions
STATE_TRANSACTIONS = 20_000  # the state audit's prefix (the first loads: transfers only)
CHAIN_DIR_VARIABLE = "PBFT_BENCH_CHAIN_DIR"
MEASURE_ONLY_VARIABLE = "PBFT_BENCH_MEASURE_ONLY"
CHECKOUT = Path(__file__).resolve().parent.parent
DEFAULT_CHAIN_DIR = Path.home() / ".cache" / "pbft-chain" / "bench-chain300k"
ISSUE = "30"


def chain_dir(given: Path | None) -> Path:
    """Where the large chain lives: `given`, else $PBFT_BENCH_CHAIN_DIR, else the cache."""
    if given is not None:
        return given
    return Path(os.environ.get(CHAIN_DIR_VARIABLE) or DEFAULT_CHAIN_DIR)


def open_chain(directory: Path) -> BenchNet:
    """The testnet in `directory` (created if absent), started unless it already runs, its
    senders' nonces read."""
    if (directory / "testnet.json").exists():
        description = json.loads((directory / "testnet.json").read_text())
        net = BenchNet(Cluster.describe(directory, description), ACCOUNTS, [0] * ACCOUNTS)
    else:
        directory.parent.mkdir(parents=True, exist_ok=True)
        net = BenchNet.create(directory, VALIDATORS, ACCOUNTS)
    try:
        if not _answers(net):
            net.cluster.start()
        net.next_nonce = sender_nonces(net)
    except BaseException:
        net.close()
        raise
    return net


def _answers(net: BenchNet) -> bool:
    """Whether node 0's JSON-RPC answers (the testnet runs in another process)."""
    client = RpcClient(net.rpc_urls([0])[0])
    try:
        client.call("eth_blockNumber")
    except OSError:  # refused: nothing listens there
        return False
    finally:
        client.close()
    return True


def _batched(url: str, calls: list[tuple[str, list[Any]]]) -> list[Any]:
    client = RpcClient(url)
    try:
        return [answer for start in range(0, len(calls), RPC_BATCH)
                for answer in client.batch(calls[start : start + RPC_BATCH])]
    finally:
        client.close()


def sender_nonces(net: BenchNet) -> list[int]:
    """Every benchmark account's nonce on node 0."""
    calls = [("eth_getTransactionCount", ["0x" + bench_account(i).address.hex(), "latest"])
             for i in range(net.accounts)]
    return [int(answer, 16) for answer in _batched(net.rpc_urls([0])[0], calls)]


def chain_head(net: BenchNet) -> int:
    client = RpcClient(net.rpc_urls([0])[0])
    try:
        return int(client.call("eth_blockNumber"), 16)
    finally:
        client.close()


def grow(net: BenchNet, name: str, transactions: int, workload: str) -> None:
    """Commit about `transactions` more of `workload`: up to ROUNDS_PER_LOAD rounds over
    the accounts, in nonce order; the loads' logs are kept in the chain's `loads/`."""
    workdir = net.cluster.directory / "loads"
    workdir.mkdir(exist_ok=True)
    per_sender = max(1, min(ROUNDS_PER_LOAD, -(-transactions // net.accounts)))
    senders = min(net.accounts, -(-transactions // per_sender))
    window = WINDOW_BLOCKS * block_size(workload) // net.size
    run_load(net, workdir, name, workload=workload, senders=senders, per_sender=per_sender,
             window=window, deadline=LOAD_DEADLINE)
    if sender_nonces(net) != net.next_nonce:
        raise BenchError(f"{name}: the chain holds other nonces than the loads sent")


def fill(net: BenchNet, target: int) -> None:
    """Loads until the chain holds `target` transactions; progress on stdout."""
    while (have := sum(net.next_nonce)) < target:
        index = have // (ROUNDS_PER_LOAD * net.accounts)
        workload = "erc20" if index % ERC20_EVERY == ERC20_EVERY - 1 else "transfer"
        grow(net, f"load-{index}", min(target - have, ROUNDS_PER_LOAD * net.accounts),
             workload)
        print(f"   large chain: {sum(net.next_nonce):,} transactions, head "
              f"{chain_head(net):,}", flush=True)


def prefix_end(net: BenchNet, transactions: int) -> tuple[int, int]:
    """(the first block by which the chain holds `transactions` transactions, how many it
    holds by then)."""
    url, head, total, start = net.rpc_urls([0])[0], chain_head(net), 0, 1
    while start <= head:
        numbers = range(start, min(head, start + RPC_BATCH - 1) + 1)
        counts = _batched(url, [("eth_getBlockTransactionCountByNumber", [hex(n)])
                                for n in numbers])
        for number, count in zip(numbers, counts, strict=True):
            total += int(count, 16)
            if total >= transactions:
                return number, total
        start = numbers[-1] + 1
    raise BenchError(f"the chain holds {total:,} transactions, fewer than {transactions:,}")


def etl_large(ctx: stages.Context) -> None:
    """The stage: see the module docstring."""
    net = open_chain(chain_dir(ctx.chain_dir))
    measure_only = bool(os.environ.get(MEASURE_ONLY_VARIABLE))
    try:
        if not measure_only:
            fill(net, CHAIN_TRANSACTIONS)
        last = chain_head(net)
        details = ctx.results.details.setdefault("etl-large", {})
        details.update(chain=str(net.cluster.directory), transactions=sum(net.next_nonce),
                       blocks=last + 1, measured_at=measured_commit())
        stages._etl_beside_ethereum_etl(ctx, net, last)
        full = ctx.results.details[f"etl-vs-ethereum-etl-{last}"]
        _against_ethereum_etl(ctx, full, f"blocks 0-{last:,}")
        if not measure_only:
            _incremental(ctx, net, last, full["run_wall_seconds"], details)
        _scale_out(ctx, net, last, details)
        _state_replay(ctx, net, details)
        small = stages.SMALL_CHAIN_BLOCKS - 1
        stages._etl_beside_ethereum_etl(ctx, net, small)
        ctx.results.add(Row(
            ISSUE, "pbft-etl run, a 5-block chain",
            ctx.results.details[f"etl-vs-ethereum-etl-{small}"]["run_wall_seconds"], "s",
            target=10, at_most=True, absolute=True, note="a new process, Spark's start-up"))
    finally:
        net.close()


def measured_commit() -> str:
    """HEAD, and `+changes` when the ETL's code differs from it in the working tree (other
    sessions' work in progress is part of what was measured)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=False,
                              cwd=Path(__file__).resolve().parent.parent).stdout.strip()

    dirty = git("status", "--porcelain", "--", "spark_etl", "cli", "chain")
    return git("rev-parse", "--short", "HEAD") + (" +changes" if dirty else "")


def _against_ethereum_etl(ctx: stages.Context, times: dict[str, Any], scope: str) -> None:
    """Issue 30's two ratios to ethereum-etl's export of the same blocks."""
    theirs = times.get("ethereum_etl_seconds")
    note = "" if theirs else stages.reads.NOT_INSTALLED
    for command, key, target in (("export", "export_wall_seconds", 1.0),
                                 ("run (export + full audit)", "run_wall_seconds", 1.5)):
        ctx.results.add(Row(ISSUE, f"pbft-etl {command}, {scope}", times[key], "s",
                            reference=theirs, reference_name="ethereum-etl export",
                            target=target, at_most=True, note=note))


def _incremental(ctx: stages.Context, net: BenchNet, last: int, full_run: float,
                 details: dict[str, Any]) -> None:
    """The chain grows by GROWTH of its transactions, then `run` goes into the full run's
    --out up to the new head."""
    before = sum(net.next_nonce)
    grow(net, f"growth-{before}", int(before * GROWTH), "transfer")
    head = chain_head(net)
    url, genesis = net.rpc_urls([0])[0], net.cluster.description["genesis"]
    out = ctx.workdir / f"etl-run-0-{last}"  # where _etl_beside_ethereum_etl's run wrote
    wall, _ = stages._timed_etl("run", "--rpc", url, "--out", str(out), "--to", str(head),
                                "--genesis", genesis)
    added = sum(net.next_nonce) - before
    details["incremental"] = {"blocks_added": head - last, "transactions_added": added,
                              "run_wall_seconds": wall}
    ctx.results.add(Row(
        ISSUE, f"incremental run, +{head - last:,} blocks / +{added:,} txs", wall, "s",
        reference=full_run, reference_name="the full run", target=0.1, at_most=True,
        note=f"+{(head - last) / (last + 1):.1%} blocks, +{added / before:.1%} transactions; "
        "into the full run's --out"))


def _scale_out(ctx: stages.Context, net: BenchNet, last: int, details: dict[str, Any]) -> None:
    """`run` of the same blocks on one core and on two, each into a fresh --out."""
    url, genesis = net.rpc_urls([0])[0], net.cluster.description["genesis"]
    walls = {}
    for master in ("local[1]", "local[2]"):
        # no brackets in the path: Spark reads "[1]" in a path as a glob
        out = ctx.workdir / f"etl-run-{master.strip(']').replace('[', '-')}"
        walls[master], _ = stages._timed_etl("run", "--rpc", url, "--out", str(out), "--to",
                                             str(last), "--genesis", genesis,
                                             "--master", master)
    details["scale_out"] = walls
    ctx.results.add(Row(
        ISSUE, f"run on local[2] against local[1], blocks 0-{last:,}",
        walls["local[1]"] / walls["local[2]"], "x", target=1.6, absolute=True,
        note=f"local[1] {walls['local[1]']:.0f} s, local[2] {walls['local[2]']:.0f} s"))


def _state_replay(ctx: stages.Context, net: BenchNet, details: dict[str, Any]) -> None:
    """The state audit's replay rate: the audit of the chain's first STATE_TRANSACTIONS
    transfers with and without --state; the difference of the audits' own times (the
    report's `seconds`, Spark's start-up left out) is the replay's."""
    last, transactions = prefix_end(net, STATE_TRANSACTIONS)
    url, genesis = net.rpc_urls([0])[0], net.cluster.description["genesis"]
    out = ctx.workdir / f"etl-state-0-{last}"
    stages._timed_etl("export", "--rpc", url, "--out", str(out), "--to", str(last))
    seconds = {}
    for label, extra in (("plain", ()), ("state", ("--state",))):
        report = ctx.workdir / f"audit-{label}-{last}.json"
        stages._timed_etl("audit", "--data", str(out), "--genesis", genesis, "--report",
                          str(report), *extra)
        seconds[label] = json.loads(report.read_text())["seconds"]
    replay = seconds["state"] - seconds["plain"]
    details["state_replay"] = {"blocks": last + 1, "transactions": transactions,
                               "audit_seconds": seconds, "replay_seconds": replay}
    note = (f"{transactions:,} transfers; audit {seconds['plain']:.0f} s, with --state "
            f"{seconds['state']:.0f} s")
    ctx.results.add(stages._raw_relative(
        Row(ISSUE, f"state audit replay, blocks 0-{last:,}",
            transactions / replay if replay > 0 else None, "tx/s",
            reference_name="raw py-evm transfers, one core",
            note=note if replay > 0 else note + ": not slower, the machine's noise hides "
            "the replay (run it on a quiet machine)"),
        lambda: ctx.reference.tps("transfer")))


def transactions_upto(net: BenchNet, last: int) -> int:
    """The transactions in blocks 0..last of node 0."""
    url = net.rpc_urls([0])[0]
    counts = _batched(url, [("eth_getBlockTransactionCountByNumber", [hex(n)])
                            for n in range(last + 1)])
    return sum(int(count, 16) for count in counts)


def _timed_in(checkout: Path, *args: str) -> dict[str, Any]:
    """`pbft-etl ARGS` run from `checkout`'s tree (its modules first on the path): wall
    seconds and the load average (1 min) before and after."""
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cli.etl", *args], capture_output=True,
                          text=True, timeout=stages.ETL_DEADLINE, check=False, cwd=checkout,
                          env={**os.environ, "PYTHONPATH": str(checkout)})
    wall = time.monotonic() - started
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise BenchError(f"pbft-etl {args[0]} ({checkout}) exited {done.returncode}: {said}")
    return {"seconds": round(wall, 1), "load": [round(load_before, 1),
                                                 round(os.getloadavg()[0], 1)]}


def _timed_ethereum_etl(url: str, last: int, out: Path) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    rows, seconds = stages.reads.ethereum_etl_export(url, 0, last, out)
    return {"seconds": round(seconds, 1), "rows": rows,
            "load": [round(load_before, 1), round(os.getloadavg()[0], 1)]}


def side_by_side(net: BenchNet, checkouts: dict[str, Path], rounds: int, masters: list[str],
                 workdir: Path, last: int | None = None) -> dict[str, Any]:
    """See the module docstring: the export's times beside ethereum-etl's, the run's per
    master, of blocks 0..last (default: the head); every export into a fresh --out."""
    url, genesis = net.rpc_urls([0])[0], net.cluster.description["genesis"]
    last = chain_head(net) if last is None else last
    result: dict[str, Any] = {"blocks": last + 1, "transactions": transactions_upto(net, last),
                              "checkouts": {k: str(v) for k, v in checkouts.items()},
                              "rounds": []}
    for index in range(rounds):
        times = {"ethereum-etl": _timed_ethereum_etl(url, last, workdir / f"ee-{index}")}
        for name, checkout in checkouts.items():
            out = workdir / f"export-{name}-{index}"
            times[f"pbft-etl export {name}"] = _timed_in(
                checkout, "export", "--rpc", url, "--out", str(out), "--to", str(last))
        result["rounds"].append(times)
        print(json.dumps(times), flush=True)
    for master in masters:
        out = workdir / f"run-{master.strip(']').replace('[', '-').replace(':', '-')}"
        result[f"run {master}"] = _timed_in(
            checkouts["after"], "run", "--rpc", url, "--out", str(out), "--to", str(last),
            "--genesis", genesis, "--master", master)
        print(json.dumps({master: result[f"run {master}"]}), flush=True)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.etl_large",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("chain_dir", nargs="?", type=Path, help="the chain (its default)")
    parser.add_argument("--side-by-side", action="store_true",
                        help="measure the export as the chain is (never top it up)")
    parser.add_argument("--before", type=Path, help="another checkout's export beside")
    parser.add_argument("--after", type=Path, default=CHECKOUT,
                        help="the checkout measured (default: this one)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--to", type=int, help="the last block (default: the head)")
    parser.add_argument("--masters", nargs="*", default=["local[1]", "local[2]"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pbft-etl-side-by-side"))
    parser.add_argument("--out", type=Path, help="the results as JSON")
    args = parser.parse_args(argv)
    net = open_chain(chain_dir(args.chain_dir))
    try:
        if not args.side_by_side:
            fill(net, CHAIN_TRANSACTIONS)
            return 0
        args.workdir.mkdir(parents=True, exist_ok=True)
        checkouts = {"before": args.before} if args.before else {}
        result = side_by_side(net, checkouts | {"after": args.after}, args.rounds,
                              args.masters, args.workdir, args.to)
    finally:
        net.close()
    result["load_average"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
