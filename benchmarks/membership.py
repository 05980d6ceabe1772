"""Issue 31: what membership costs (the opt-in stages `set-change` and `observers`).

    python -m benchmarks --only set-change observers [--quick]

Each on a default testnet (`pbft-node testnet init`, the benchmark accounts added to its genesis as
every stage does), nothing tuned:

- **Set changes** (4 validators and 1 observer): under a steady load (the latency stages'
  rate, 20 tx/s), once WARM_UP_BLOCKS have committed, validators 0, 1 and 2 vote the observer
  in (`pbft_proposeValidatorVote`), and later out again (CHANGES); each change takes effect
  after its handover checkpoint c. Reported for each: the commit gap at c (block c's commit
  to block c+1's, as node 0's newHeads showed them to the load generator) against the median
  of the gaps LOCAL_BLOCKS either side of it (a shared machine's load drifts within a load;
  the whole load's median is in the note), and against one pipeline drain, which DESIGN.md
  section 10 (rule R2) puts at one commit latency plus one checkpoint round, and this stage
  at twice the slowest validator's mean commit latency around the change
  (`pbft_commit_latency_seconds`; the primary's, which starts when it builds the block: a
  checkpoint round is one exchange of messages, a commit three and an execution); and the
  views before and after, and the view changes.
- **Observers under a burst** (4 validators and 2 observers): the 3,000-transfer burst of the
  n4 stage, sent to the validators only, with the observers stopped and running in turn
  (BURST_ROUNDS). Stopped observers are 0 observers to the validators: a validator never dials
  one and holds nothing for one that is not connected (docs/observers.md), and the rounds
  share one chain, so they differ by the observers alone. Reported: each side's mean tx/s
  and their ratio; the validators' CPU per committed transfer, which on machines of their own
  would be the cost (here the observers' own execution shares the two cores); and, read
  throughout every burst (validators' heads first, then the observers', so a lag is never an
  artefact of the reading order), the largest number of blocks an observer was behind.
  After each burst, in the same state, the latency stages' rate (20 tx/s) for PACED_SECONDS:
  the validators' CPU per transfer again, over the same seconds with observers and without
  (a burst that the observers' share of the cores slows down lasts longer, and what a
  validator spends per second whatever it commits, its timers, polls and these benchmark
  reads, then counts for more per transfer: the paced rounds leave that out of the ratio).
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import stages
from benchmarks.load import BenchError, Throughput, run_load, start_load
from benchmarks.report import Row
from benchmarks.testnet import BenchNet, Poller, Sampler
from testkit.cluster import rpc
from testkit.nodes import wait_for

VALIDATORS = [0, 1, 2, 3]
STEADY_SECONDS = 100.0  # the load's length: both changes come and pass well within it
WARM_UP_BLOCKS = 12  # committed under the load before a vote
AFTER_BLOCKS = 12  # committed after a handover before the next vote
LOCAL_BLOCKS = 10  # the gap at c against the median of the gaps this many blocks around it
HANDOVER_DEADLINE = 120.0  # seconds for a change to pass, and to join or leave the set
# observers running in each burst: pairs, each with and without, the order alternating so the
# chain's growth from burst to burst weighs on both sides alike
BURST_ROUNDS = (0, 2, 2, 0, 0, 2)
HEAD_POLL = 0.1  # seconds between readings of the heads during a burst
PACED_SECONDS = 30.0  # the paced load after each burst
CATCH_UP_DEADLINE = 120.0  # seconds for restarted observers to reach the validators' head
LATENCY_METRIC = "pbft_commit_latency_seconds"


# Set changes under a steady load.


def commit_gaps(blocks: Sequence[Sequence[Any]], start: float, end: float) -> dict[int, float]:
    """Block number n -> seconds from n's commit to n+1's, for consecutive blocks both seen
    between `start` and `end`; `blocks` as the load generator reports them (number, seen, ...),
    in order."""
    return {n: later[1] - seen for (n, seen, *_), later in zip(blocks, blocks[1:], strict=False)
            if later[0] == n + 1 and start <= seen and later[1] <= end}


def median_around(gaps: dict[int, float], block: int, reach: int) -> float:
    """The median of the gaps after blocks block-reach .. block+reach, block's own left out:
    the pace of the chain just then (a shared machine's load drifts within one load)."""
    near = [gap for n, gap in gaps.items() if abs(n - block) <= reach and n != block]
    if not near:
        raise BenchError(f"no commit gap near block {block}")
    return statistics.median(near)


@dataclass(frozen=True)
class Change:
    label: str
    add: bool  # the observer voted in, or out again
    role: str  # the observer's role once the change is in force


# the observer voted in, then out again: N from 4 to 5 (the quorum from 3 to 4) and back
CHANGES = (Change("4 -> 5", True, "validator"), Change("5 -> 4", False, "observer"))


@dataclass(frozen=True)
class Handover:
    change: Change
    passed: int  # b: the block the change passed in
    checkpoint: int  # c: the last block of the old set
    commit_latency: float  # seconds: the slowest validator's mean, warm-up to c + AFTER_BLOCKS


def set_change(ctx: stages.Context) -> None:
    rate = ctx.sizes.latency_rate
    paced = stages._paced(ctx, int(rate * STEADY_SECONDS))  # rounded up to whole rounds
    seconds = paced["senders"] * paced["per_sender"] / rate
    net = BenchNet.create(ctx.workdir / "set-change", len(VALIDATORS), ctx.sizes.accounts,
                          observers=1)
    try:
        net.cluster.start()
        views, changes = _views(net), stages.view_changes(net)
        load = start_load(net, ctx.workdir, "set-change-load", workload="transfer",
                          targets=VALIDATORS, rate=rate, deadline=seconds + 60, **paced)
        try:
            handovers = [_change(net, change) for change in CHANGES]
            outcome = load.wait()
        finally:
            load.stop()
        _add_set_changes(ctx, outcome, handovers)
        after = _views(net)
        ctx.results.details["set-change"].update(views_before=views, views_after=after)
        ctx.results.add(Row(
            "31", "set changes 4 -> 5 -> 4: view changes", stages.view_changes(net) - changes,
            "", target=0, at_most=True, absolute=True,
            note=f"pbft_status views of validators 0-3 before {list(views.values())}, after "
            f"{list(after.values())}"))
    finally:
        net.close()


def _change(net: BenchNet, change: Change) -> Handover:
    """Once the load has committed WARM_UP_BLOCKS more, validators 0, 1 and 2 (a majority of
    4 and of 5) vote `change` of the observer; done once the observer has its new role and
    AFTER_BLOCKS more blocks have committed."""
    subject = len(VALIDATORS)
    latency = _latency_totals(net)
    first = net.cluster.head(0)
    wait_for(lambda: net.cluster.head(0) >= first + WARM_UP_BLOCKS, 60, "blocks under the load")
    epoch_start = hex(first + 1)  # a block of the epoch in force: the change comes after it
    for voter in VALIDATORS[:3]:
        rpc(net.cluster.nodes[voter], "pbft_proposeValidatorVote",
            net.cluster.description["nodes"][subject]["address"], change.add)

    def scheduled() -> dict[str, Any] | None:
        epoch: dict[str, Any] = rpc(net.cluster.nodes[0], "pbft_getEpoch", epoch_start)
        return epoch if epoch["scheduled"] else None

    epoch = wait_for(scheduled, HANDOVER_DEADLINE, f"the change {change.label} scheduled")
    c = int(epoch["lastBlock"], 16)
    wait_for(lambda: net.cluster.status(subject)["role"] == change.role, HANDOVER_DEADLINE,
             f"the observer's role after {change.label}")
    wait_for(lambda: net.cluster.head(0) >= c + AFTER_BLOCKS, 60, "blocks after the handover")
    return Handover(change, int(epoch["scheduled"]["passedAt"], 16), c,
                    max(_mean_latencies(latency, _latency_totals(net))))


def _views(net: BenchNet) -> dict[int, int]:
    return {i: net.cluster.status(i)["view"] for i in VALIDATORS}


def _latency_totals(net: BenchNet) -> list[tuple[float, float]]:
    """Each of validators 0-3's commit latency histogram so far: (seconds, blocks)."""
    metrics = [net.cluster.metrics(i) for i in VALIDATORS]
    return [(m.get(f"{LATENCY_METRIC}_sum|", 0.0), m.get(f"{LATENCY_METRIC}_count|", 0.0))
            for m in metrics]


def _mean_latencies(before: list[tuple[float, float]], after: list[tuple[float, float]]
                    ) -> list[float]:
    """The mean commit latency between the two readings of each validator that committed
    through consensus meanwhile (not one that only caught up); the primary's, from building
    the block, is the longest: a backup's starts when it validates."""
    means = [(a[0] - b[0]) / (a[1] - b[1]) for a, b in zip(after, before, strict=True)
             if a[1] > b[1]]
    if not means:
        raise BenchError("no validator committed a block through consensus under the load")
    return means


def _add_set_changes(ctx: stages.Context, outcome: dict[str, Any],
                     handovers: list[Handover]) -> None:
    gaps = commit_gaps(outcome["blocks"], outcome["t_start"], outcome["t_submitted"])
    missing = [h.checkpoint for h in handovers if h.checkpoint not in gaps]
    if missing:
        raise BenchError(f"blocks {missing[0]} and {missing[0] + 1} did not both commit under "
                         "the steady load")
    whole = statistics.median(gaps.values())
    details: list[dict[str, Any]] = []
    ctx.results.details["set-change"] = {"rate": ctx.sizes.latency_rate, "median_gap": whole,
                                         "handovers": details, "gaps": gaps}
    load = f"{ctx.sizes.latency_rate:g} tx/s"
    for handover in handovers:
        c, label = handover.checkpoint, handover.change.label
        around = median_around(gaps, c, LOCAL_BLOCKS)
        details.append({"change": label, "passed_at": handover.passed, "checkpoint": c,
                        "gap": gaps[c], "median_around": around,
                        "commit_latency": handover.commit_latency})
        ctx.results.add(Row(
            "31", f"set change {label}: commit gap at handover c", gaps[c] * 1000, "ms",
            reference=around * 1000,
            reference_name=f"median gap c-{LOCAL_BLOCKS}..c+{LOCAL_BLOCKS}",
            note=f"{load}; passed in block {handover.passed}, c = {c}; the median gap of the "
            f"whole load {whole * 1000:.0f} ms"))
        ctx.results.add(Row(
            "31", f"set change {label}: gap at c / one pipeline drain", gaps[c] * 1000, "ms",
            reference=2 * handover.commit_latency * 1000,
            reference_name="2 x commit latency", target=1.0, at_most=True,
            note=f"commit latency {handover.commit_latency * 1000:.0f} ms (the slowest "
            "validator's mean around the change): one for c+1, at most one for the checkpoint "
            "round at c"))


# Observers under a burst.


@dataclass(frozen=True)
class Heads:
    """One reading of the heads: when it began, the validators' highest, then each observer's
    (read after the validators', so a lag is never an artefact of the order)."""

    time: float
    validators: int
    observers: tuple[int, ...]


def lag_counts(readings: Sequence[Heads]) -> Counter[int]:
    """Blocks behind -> how often an observer was that far behind (negative: the observer's
    head was read after a block that the validators' reading missed)."""
    return Counter(r.validators - head for r in readings for head in r.observers)


def follow_delays(readings: Sequence[Heads]) -> list[float]:
    """For each block that the validators reached during the readings and every observer
    reached by their end: seconds from the first reading with a validator holding it to the
    first with every observer holding it (to the resolution of the readings)."""
    if not readings or not readings[0].observers:
        return []

    def first(number: int, head: Callable[[Heads], int]) -> float:
        return next(r.time for r in readings if head(r) >= number)

    last = min(readings[-1].validators, *readings[-1].observers)
    return [first(n, lambda r: min(r.observers)) - first(n, lambda r: r.validators)
            for n in range(readings[0].validators + 1, last + 1)]


class HeadReader(Poller):
    """A thread reading the validators' heads, then the observers', every HEAD_POLL seconds
    until stopped: the same reads in every burst, with observers or without."""

    def __init__(self, net: BenchNet, observers: list[int]) -> None:
        super().__init__("heads", HEAD_POLL)
        self.nodes = [n.web3() for n in net.cluster.nodes]
        self.observers = observers
        self.readings: list[Heads] = []

    def poll(self) -> None:
        began = time.time()
        highest = max(self.nodes[i].eth.block_number for i in VALIDATORS)
        self.readings.append(Heads(began, highest, tuple(
            self.nodes[i].eth.block_number for i in self.observers)))


@dataclass
class Round:
    observers: int
    tps: float
    validator_cpu_ms_per_tx: float
    observer_cpu_ms_per_tx: float
    paced_validator_cpu_ms_per_tx: float  # at the latency stages' rate, after the burst
    lag: Counter[int]  # blocks behind -> readings (each observer in each reading)
    delays: list[float]  # seconds each block reached the observers after the validators
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
    paced = _paced_validator_cpu(ctx, net, sampler, f"observers-{len(observers)}-paced-{index}")
    return Round(len(observers), burst.end_to_end_tps,
                 sum(cpu.get(i, 0.0) for i in VALIDATORS) * per_tx,
                 sum(cpu.get(i, 0.0) for i in observers) * per_tx, paced,
                 lag_counts(heads.readings), follow_delays(heads.readings), os.getloadavg()[0])


def _paced_validator_cpu(ctx: stages.Context, net: BenchNet, sampler: Sampler, name: str
                         ) -> float:
    """The validators' CPU time (ms) per committed transfer over PACED_SECONDS of transfers at
    the latency stages' rate, sent to the validators."""
    rate = ctx.sizes.latency_rate
    load = Throughput.of(run_load(
        net, ctx.workdir, name, workload="transfer", targets=VALIDATORS, rate=rate,
        deadline=PACED_SECONDS + 60, **stages._paced(ctx, int(rate * PACED_SECONDS))))
    cpu = sampler.cpu_between(load.start, load.last_commit)
    return sum(cpu.get(i, 0.0) for i in VALIDATORS) * 1000 / load.transactions


def paired_ratios(rounds: Sequence[tuple[int, float]]) -> list[float]:
    """(observers, figure) of rounds run in pairs, one with observers and one without in each
    (BURST_ROUNDS): each pair's figure with observers over its figure without (a pair's two
    rounds are next to each other, so a drift of the machine's load weighs on both alike)."""
    ratios = []
    for first, second in zip(rounds[::2], rounds[1::2], strict=True):
        without, with_observers = sorted((first, second))
        if without[0] or not with_observers[0]:
            raise BenchError(f"rounds {first} and {second} are not a pair")
        ratios.append(with_observers[1] / without[1])
    return ratios


def _add_observer_bursts(ctx: stages.Context, rounds: list[Round]) -> None:
    ctx.results.details["observer-bursts"] = [r.to_json() for r in rounds]
    with_two = [r for r in rounds if r.observers]
    tps = {n: statistics.fmean(r.tps for r in rounds if r.observers == n) for n in (0, 2)}
    cpu = {n: statistics.fmean(r.validator_cpu_ms_per_tx for r in rounds if r.observers == n)
           for n in (0, 2)}
    tps_ratios = paired_ratios([(r.observers, r.tps) for r in rounds])
    cpu_ratios = paired_ratios([(r.observers, r.validator_cpu_ms_per_tx) for r in rounds])
    load = f"load average {min(r.load_average for r in rounds):.1f}-" \
        f"{max(r.load_average for r in rounds):.1f}"
    ctx.results.add(Row(
        "31", "N=4 burst, observers stopped", tps[0], "tx/s", note="mean; in turn: " + ", ".join(
            f"{r.observers} observers {r.tps:.0f}" for r in rounds) + f" ({load})"))
    ctx.results.add(Row("31", "N=4 burst, 2 observers following", tps[2], "tx/s",
                        reference=tps[0], reference_name="observers stopped (means)"))
    ctx.results.add(Row(
        "31", "N=4 burst, 2 observers / none, paired rounds", statistics.fmean(tps_ratios), "x",
        target=0.95, absolute=True, note="mean of the pairs' ratios: " + ", ".join(
            f"{r:.2f}" for r in tps_ratios) + "; the observers execute every block on the "
        "validators' cores"))
    ctx.results.add(Row(
        "31", "N=4 burst, validators' CPU per tx, 2 observers / none", statistics.fmean(
            cpu_ratios), "x", target=1.05, at_most=True, absolute=True,
        note=f"mean of the pairs' ratios: {', '.join(f'{r:.2f}' for r in cpu_ratios)}; the 4 "
        f"validators' CPU time over a burst per transfer, {cpu[0]:.2f} ms without observers, "
        f"{cpu[2]:.2f} ms with (the observers' own: " + ", ".join(
            f"{r.observer_cpu_ms_per_tx:.2f}" for r in with_two) + " ms)"))
    paced = {n: statistics.fmean(r.paced_validator_cpu_ms_per_tx for r in rounds
                                 if r.observers == n) for n in (0, 2)}
    paced_ratios = paired_ratios([(r.observers, r.paced_validator_cpu_ms_per_tx)
                                  for r in rounds])
    ctx.results.add(Row(
        "31", f"N=4 at {ctx.sizes.latency_rate:g} tx/s, validators' CPU per tx, 2 observers / "
        "none", statistics.fmean(paced_ratios), "x", target=1.05, at_most=True, absolute=True,
        note=f"mean of the pairs' ratios: {', '.join(f'{r:.2f}' for r in paced_ratios)}; "
        f"{PACED_SECONDS:g} s after each burst, {paced[0]:.2f} ms per transfer over the 4 "
        f"without observers, {paced[2]:.2f} ms with"))
    lag = sum((r.lag for r in with_two), Counter[int]())
    ctx.results.add(Row(
        "31", "observer head lag under the burst, largest", max(lag, default=0), "blocks",
        target=1, at_most=True, absolute=True,
        note=f"{lag.total()} readings every {HEAD_POLL:g} s: " + ", ".join(
            f"{n} behind {count}" for n, count in sorted(lag.items()))))
    delays = sorted(d for r in with_two for d in r.delays)
    if delays:
        ctx.results.add(Row(
            "31", "observers behind the validators under the burst, median",
            statistics.median(delays) * 1000, "ms",
            note=f"{len(delays)} blocks, the slowest {delays[-1]:.2f} s: from a validator "
            f"holding a block to every observer holding it (readings every {HEAD_POLL:g} s)"))
