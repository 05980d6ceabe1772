"""Issue 31: what membership costs (the opt-in stage `membership`).

    python -m benchmarks --only membership [--quick]

Two default testnets (`pbft-node testnet init`, the benchmark accounts added to its genesis as
every stage does), nothing tuned:

- **A set change** (4 validators and 1 observer): under a steady load at STEADY_RATE, once
  WARM_UP_BLOCKS have committed, validators 0, 1 and 2 vote the observer in
  (`pbft_proposeValidatorVote`); the change takes effect after the handover checkpoint c.
  Reported: the commit gap at c (block c's commit to block c+1's, as node 0's newHeads showed
  them to the load generator) against the median gap of the same load, and against one
  pipeline drain, which DESIGN.md section 10 (rule R2) puts at one commit latency plus one
  checkpoint round and this stage bounds by twice the validators' mean commit latency under
  the load (`pbft_commit_latency_seconds`: a checkpoint round is one exchange of messages, a
  commit three and an execution); and the views before and after, and the view changes.
- **Observers under a burst** (4 validators and 2 observers): the 3,000-transfer burst of the
  n4 stage, sent to the validators only, with the observers stopped and running in turn
  (BURST_ROUNDS). Stopped observers are 0 observers to the validators: a validator never dials
  one and holds nothing for one that is not connected (docs/observers.md), and the rounds
  share one chain, so they differ by the observers alone. Reported: each side's mean tx/s
  and their ratio; the validators' CPU per committed transfer, which on machines of their own
  would be the cost (here the observers' own execution shares the two cores); and, read
  throughout every burst (validators' heads first, then the observers', so a lag is never an
  artefact of the reading order), the largest number of blocks an observer was behind.
"""

from __future__ import annotations

import os
import statistics
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import stages
from benchmarks.load import BenchError, start_load
from benchmarks.report import Row
from benchmarks.testnet import BenchNet, Sampler
from testkit.cluster import rpc
from testkit.nodes import wait_for

VALIDATORS = [0, 1, 2, 3]
STEADY_RATE = 50.0  # tx/s: several transfers a block, well below what 4 validators commit
STEADY_SECONDS = 40.0  # the load's length: the vote comes and passes well within it
WARM_UP_BLOCKS = 20  # committed under the load before the vote
AFTER_BLOCKS = 20  # committed after the handover before the load may end
HANDOVER_DEADLINE = 120.0  # seconds for the vote to pass and the observer to join
BURST_ROUNDS = (0, 2, 2, 0)  # observers running in each burst: alternated, the order
# reversed in the second half, so the chain's growth from burst to burst weighs on both sides
HEAD_POLL = 0.1  # seconds between readings of the heads during a burst
CATCH_UP_DEADLINE = 120.0  # seconds for restarted observers to reach the validators' head
LATENCY_METRIC = "pbft_commit_latency_seconds"


def membership(ctx: stages.Context) -> None:
    set_change(ctx)
    observer_bursts(ctx)


# A set change under a steady load.


def commit_gaps(blocks: Sequence[Sequence[Any]], start: float, end: float) -> dict[int, float]:
    """Block number n -> seconds from n's commit to n+1's, for consecutive blocks both seen
    between `start` and `end`; `blocks` as the load generator reports them (number, seen, ...),
    in order."""
    return {n: later[1] - seen for (n, seen, *_), later in zip(blocks, blocks[1:], strict=False)
            if later[0] == n + 1 and start <= seen and later[1] <= end}


@dataclass(frozen=True)
class Handover:
    passed: int  # b: the block the change passed in
    checkpoint: int  # c: the last block of the old set


def set_change(ctx: stages.Context) -> None:
    count = int(STEADY_RATE * STEADY_SECONDS)
    net = BenchNet.create(ctx.workdir / "set-change", len(VALIDATORS), ctx.sizes.accounts,
                          observers=1)
    observer = len(VALIDATORS)
    try:
        net.cluster.start()
        views, changes = _views(net), stages.view_changes(net)
        latency = _latency_totals(net)
        load = start_load(net, ctx.workdir, "set-change-load", workload="transfer",
                          targets=VALIDATORS, rate=STEADY_RATE, deadline=STEADY_SECONDS + 60,
                          **stages._paced(ctx, count))
        try:
            handover = _vote_in(net, observer)
            outcome = load.wait()
        finally:
            load.stop()
        commit_latency = _mean_latency(latency, _latency_totals(net))
        _add_set_change(ctx, outcome, handover, commit_latency)
        after = _views(net)
        ctx.results.details["set-change"].update(views_before=views, views_after=after)
        ctx.results.add(Row(
            "31", "set change 4 -> 5: view changes", stages.view_changes(net) - changes, "",
            target=0, at_most=True, absolute=True,
            note=f"views before {sorted(set(views.values()))}, after "
            f"{sorted(set(after.values()))} (pbft_status of every validator)"))
    finally:
        net.close()


def _vote_in(net: BenchNet, observer: int) -> Handover:
    """Once the load has committed WARM_UP_BLOCKS: a majority of the validators vote the
    observer in; returns once it votes and AFTER_BLOCKS more blocks have committed."""
    first = net.cluster.head(0)
    wait_for(lambda: net.cluster.head(0) >= first + WARM_UP_BLOCKS, 60, "blocks under the load")
    address = net.cluster.description["nodes"][observer]["address"]
    for voter in VALIDATORS[:3]:
        rpc(net.cluster.nodes[voter], "pbft_proposeValidatorVote", address, True)

    def scheduled() -> dict[str, Any] | None:
        epoch: dict[str, Any] = rpc(net.cluster.nodes[0], "pbft_getEpoch", "0x1")
        return epoch if epoch["scheduled"] else None

    epoch = wait_for(scheduled, HANDOVER_DEADLINE, "the change to be scheduled")
    handover = Handover(int(epoch["scheduled"]["passedAt"], 16), int(epoch["lastBlock"], 16))
    wait_for(lambda: net.cluster.status(observer)["role"] == "validator", HANDOVER_DEADLINE,
             "the observer to join the validator set")
    wait_for(lambda: net.cluster.head(0) >= handover.checkpoint + AFTER_BLOCKS, 60,
             "blocks after the handover")
    return handover


def _views(net: BenchNet) -> dict[int, int]:
    return {i: net.cluster.status(i)["view"] for i in VALIDATORS}


def _latency_totals(net: BenchNet) -> tuple[float, float]:
    """The validators' commit latency histograms so far: (seconds, blocks) summed."""
    metrics = [net.cluster.metrics(i) for i in VALIDATORS]
    return (sum(m.get(f"{LATENCY_METRIC}_sum|", 0.0) for m in metrics),
            sum(m.get(f"{LATENCY_METRIC}_count|", 0.0) for m in metrics))


def _mean_latency(before: tuple[float, float], after: tuple[float, float]) -> float:
    blocks = after[1] - before[1]
    if not blocks:
        raise BenchError("no block committed under the steady load")
    return (after[0] - before[0]) / blocks


def _add_set_change(ctx: stages.Context, outcome: dict[str, Any], handover: Handover,
                    commit_latency: float) -> None:
    c = handover.checkpoint
    gaps = commit_gaps(outcome["blocks"], outcome["t_start"], outcome["t_submitted"])
    if c not in gaps:
        raise BenchError(f"blocks {c} and {c + 1} did not both commit under the steady load")
    others = sorted(gap for n, gap in gaps.items() if n != c)
    median, drain = statistics.median(others), 2 * commit_latency
    ctx.results.details["set-change"] = {
        "rate": STEADY_RATE, "passed_at": handover.passed, "checkpoint": c,
        "gap_at_checkpoint": gaps[c], "median_gap": median, "largest_other_gap": others[-1],
        "mean_commit_latency": commit_latency, "gaps": gaps}
    load = f"{STEADY_RATE:g} tx/s"
    ctx.results.add(Row(
        "31", "set change 4 -> 5: commit gap at handover c", gaps[c] * 1000, "ms",
        reference=median * 1000, reference_name=f"median gap at {load}",
        note=f"passed in block {handover.passed}, c = {c}; the largest other gap of "
        f"{len(others)} {others[-1] * 1000:.0f} ms"))
    ctx.results.add(Row(
        "31", "set change 4 -> 5: gap at c / one pipeline drain", gaps[c] * 1000, "ms",
        reference=drain * 1000, reference_name="2 x mean commit latency", target=1.0,
        at_most=True, note=f"mean commit latency {commit_latency * 1000:.0f} ms at {load}: "
        "one for c+1 and at most one for the checkpoint round at c"))


# Observers under a burst.


def lag_counts(samples: Sequence[tuple[int, Sequence[int]]]) -> Counter[int]:
    """Blocks behind -> how often an observer was that far behind, from readings of the
    validators' highest head and then each observer's (negative: the observer's head was
    read after a block that the validators' reading missed)."""
    return Counter(head - behind for head, observers in samples for behind in observers)


class HeadReader:
    """A thread reading the validators' heads, then the observers', every HEAD_POLL seconds
    until stopped: the same reads in every burst, with observers or without."""

    def __init__(self, net: BenchNet, observers: list[int]) -> None:
        self.nodes = [n.web3() for n in net.cluster.nodes]
        self.observers = observers
        self.samples: list[tuple[int, list[int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heads", daemon=True)

    def __enter__(self) -> HeadReader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            highest = max(self.nodes[i].eth.block_number for i in VALIDATORS)
            self.samples.append(
                (highest, [self.nodes[i].eth.block_number for i in self.observers]))
            self._stop.wait(HEAD_POLL)


@dataclass
class Round:
    observers: int
    tps: float
    validator_cpu_ms_per_tx: float
    observer_cpu_ms_per_tx: float
    lag: Counter[int]  # blocks behind -> readings (each observer in each reading)
    load_average: float  # the machine's, over the last minute, after the burst

    def to_json(self) -> dict[str, Any]:
        return {**vars(self), "lag": dict(self.lag)}


def observer_bursts(ctx: stages.Context) -> None:
    net = BenchNet.create(ctx.workdir / "observer-bursts", len(VALIDATORS), ctx.sizes.accounts,
                          observers=2)
    observers = list(range(len(VALIDATORS), net.size))
    try:
        net.cluster.start(*VALIDATORS)
        rounds = []
        with Sampler(net) as sampler:
            for index, running in enumerate(BURST_ROUNDS):
                _set_observers(net, observers[:running], observers[running:])
                rounds.append(_burst_round(ctx, net, sampler, index, observers[:running]))
        _add_observer_bursts(ctx, rounds)
    finally:
        net.close()


def _set_observers(net: BenchNet, up: list[int], down: list[int]) -> None:
    """Observers `up` running and caught up with the settled validators, `down` stopped."""
    for index in down:
        if index in net.running():
            net.stop(index)
    head = net.cluster.wait_idle(indices=VALIDATORS)
    for index in up:
        if index not in net.running():
            net.restart(index)
    net.cluster.wait_heads(up, head, CATCH_UP_DEADLINE)


def _burst_round(ctx: stages.Context, net: BenchNet, sampler: Sampler, index: int,
                 observers: list[int]) -> Round:
    with HeadReader(net, observers) as heads:
        burst = stages._burst_load(ctx, net, f"observers-{len(observers)}-burst-{index}",
                                   targets=VALIDATORS)
    cpu = sampler.cpu_between(burst.start, burst.last_commit)
    per_tx = 1000 / burst.transactions
    return Round(len(observers), burst.end_to_end_tps,
                 sum(cpu.get(i, 0.0) for i in VALIDATORS) * per_tx,
                 sum(cpu.get(i, 0.0) for i in observers) * per_tx, lag_counts(heads.samples),
                 os.getloadavg()[0])


def _add_observer_bursts(ctx: stages.Context, rounds: list[Round]) -> None:
    ctx.results.details["observer-bursts"] = [r.to_json() for r in rounds]
    without = [r for r in rounds if not r.observers]
    with_two = [r for r in rounds if r.observers]
    tps = {side[0].observers: statistics.fmean(r.tps for r in side)
           for side in (without, with_two)}
    cpu = {side[0].observers: statistics.fmean(r.validator_cpu_ms_per_tx for r in side)
           for side in (without, with_two)}
    each = "; each: " + ", ".join(f"{r.observers}: {r.tps:.0f}" for r in rounds)
    ctx.results.add(Row("31", "N=4 burst, observers stopped", tps[0], "tx/s",
                        note=f"mean of {len(without)} alternated rounds{each}"))
    ctx.results.add(Row(
        "31", "N=4 burst, 2 observers following", tps[2], "tx/s", reference=tps[0],
        reference_name="observers stopped", target=0.95,
        note=f"mean of {len(with_two)}; the observers execute every block on the same cores"))
    ctx.results.add(Row(
        "31", "N=4 burst, validators' CPU per tx, 2 observers", cpu[2], "ms", reference=cpu[0],
        reference_name="observers stopped",
        note="the 4 validators' CPU time over the burst; the observers' own: "
        + ", ".join(f"{r.observer_cpu_ms_per_tx:.2f}" for r in with_two) + " ms per tx"))
    lag = sum((r.lag for r in with_two), Counter[int]())
    ctx.results.add(Row(
        "31", "observer head lag under the burst, largest", max(lag, default=0), "blocks",
        target=1, at_most=True, absolute=True,
        note=f"{lag.total()} readings every {HEAD_POLL:g} s: " + ", ".join(
            f"{n} behind {count}" for n, count in sorted(lag.items()))))
