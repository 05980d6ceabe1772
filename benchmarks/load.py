"""Running the load generator against a benchmark testnet, and what a run measured."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.loadgen import Plan
from benchmarks.testnet import BenchNet, Sampler

PRESIGN_ALLOWANCE = 120.0  # seconds the load generator may spend signing, beyond the deadline


class BenchError(Exception):
    """A benchmark could not run to the end; the message says why, in one line."""


@dataclass
class Load:
    """A load generator process under way."""

    name: str
    plan: Plan
    process: subprocess.Popen[bytes]
    result_path: Path
    log_path: Path

    def wait(self) -> dict[str, Any]:
        try:
            code = self.process.wait(timeout=self.plan.deadline + PRESIGN_ALLOWANCE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise BenchError(f"{self.name}: the load generator did not finish") from None
        if code != 0:
            tail = self.log_path.read_text().strip().splitlines()[-1:] or ["no output"]
            raise BenchError(f"{self.name}: load generator failed: {tail[0]}")
        outcome = json.loads(self.result_path.read_text())
        if outcome["rejected"] or outcome["receipts_failed"]:
            raise BenchError(
                f"{self.name}: rejected {outcome['rejected']}, "
                f"{outcome['receipts_failed']} failed receipts"
            )
        return outcome

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_load(
    net: BenchNet,
    workdir: Path,
    name: str,
    *,
    workload: str,
    senders: int,
    per_sender: int,
    targets: list[int] | None = None,
    **options: Any,
) -> Load:
    """Start the load generator: `per_sender` transactions from each of the first `senders`
    accounts, to the nodes `targets` (all by default); options are Plan fields."""
    chosen = list(range(senders))
    plan = Plan(
        chain_id=net.chain_id,
        accounts=net.accounts,
        workload=workload,
        senders=chosen,
        first_nonces=[net.next_nonce[s] for s in chosen],
        per_sender=per_sender,
        targets=net.rpc_urls(targets),
        **options,
    )
    for sender in chosen:
        net.next_nonce[sender] += per_sender
    plan_path, result_path = workdir / f"{name}.plan.json", workdir / f"{name}.result.json"
    log_path = workdir / f"{name}.log"
    plan.save(plan_path)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.loadgen", str(plan_path), str(result_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return Load(name, plan, process, result_path, log_path)


def run_load(net: BenchNet, workdir: Path, name: str, **kwargs: Any) -> dict[str, Any]:
    load = start_load(net, workdir, name, **kwargs)
    try:
        return load.wait()
    finally:
        load.stop()


@dataclass
class Throughput:
    """Committed transactions per second of one load, from the commit times of its blocks."""

    transactions: int
    blocks: int
    steady_tps: float  # after the first block: blocks 2..n over their commit times
    end_to_end_tps: float  # from the first submission to the last commit
    timestamp_tps: float  # from block timestamps (whole seconds), a cross-check
    first_commit: float
    last_commit: float
    start: float

    @classmethod
    def of(cls, outcome: dict[str, Any]) -> Throughput:
        blocks = [b for b in outcome["blocks"] if b[3] > 0]
        if len(blocks) < 2:
            raise BenchError("a throughput load must span at least two blocks")
        committed = sum(b[3] for b in blocks)
        (_, first, first_ts, _), (_, last, last_ts, _) = blocks[0], blocks[-1]
        return cls(
            transactions=committed,
            blocks=len(blocks),
            steady_tps=(committed - blocks[0][3]) / (last - first),
            end_to_end_tps=committed / (last - outcome["t_start"]),
            timestamp_tps=committed / max(1, last_ts - first_ts),
            first_commit=first,
            last_commit=last,
            start=outcome["t_start"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "transactions": self.transactions,
            "blocks": self.blocks,
            "mean_block_size": self.transactions / self.blocks,
            "steady_tps": self.steady_tps,
            "end_to_end_tps": self.end_to_end_tps,
            "timestamp_tps": self.timestamp_tps,
        }


def cpu_per_transaction(sampler: Sampler, throughput: Throughput) -> dict[int, float]:
    """CPU seconds each node spent per committed transaction while the load ran."""
    spent = sampler.cpu_between(throughput.start, throughput.last_commit)
    return {node: seconds / throughput.transactions for node, seconds in spent.items()}


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted `values`."""
    index = max(0, min(len(values) - 1, round(fraction * len(values) + 0.5) - 1))
    return values[index]


def latency_summary(latencies: list[float]) -> dict[str, float]:
    return {
        "samples": len(latencies),
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p95_ms": percentile(latencies, 0.95) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000,
        "max_ms": latencies[-1] * 1000,
    }
