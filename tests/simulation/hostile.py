"""The hostile world (issue 28): what a seed's machines and peers do to the adapter, beside
what its class throws at the protocol. Every seed class draws one (`draw`), from a generator
of its own (`random.Random(f"hostile {seed} {n}")`), so the class's own draws stay what they
were; each feature comes with a probability that leaves the ordinary classes making progress.

executor  `ExecutorFaults` on some nodes: a job that raises (the adapter's catch-all answers:
          a validation UNAVAILABLE, a build with no block, a commit's re-execution
          CommitRefused, a fetch FetchFailed with the head it reached), a validation whose
          answer is lost (its task died; the executor is free again: only the core's
          VALIDATION deadline ends the wait), a stall of the executor for one to four
          request timeouts (every job behind it waits; its answer comes late). A hang that
          never ends is not modelled: the real node has ONE executor thread
          (chain/node.py), so a job that never returns stops every later build, validation,
          commit and fetch of that node, which is then simply a dead node (a crash, already
          in chaos), and no deadline in the core could give it back its executor.
fetch     each fetched range fails outright with this chance (every peer timed out): the
          fetch answers FetchFailed with the head it reached (the ranges before it stay);
          peers serve 2 or 4 blocks a range instead of 32 in some seeds (large blocks: block
          sync's server stops at MAX_RESPONSE_BYTES), so a fetch takes several ranges.
          In some seeds a range no peer holds all of is served in part, as block sync's
          server answers with the blocks it has: a peer that holds its start serves that
          prefix (`short_answers`), so a fetch of a head nobody holds (a liar's claim, a
          peer gone since) imports blocks and then fails (the attack review s13-core's
          finding 2). Drawn from a generator of its own, `answers(seed, n)`, so a seed's
          other draws stay what they were before session 14.
race      block sync takes the chain lock before a CommitBlock queued ahead of it: the commit
          finds its block in the chain and is answered from it.
crashes   a node crashes at a write point (`cluster.CRASH_POINTS`: before a step's store
          batch, between it and the signing bound, between two sends, after a block's chain
          commit before the core hears of it, after a fetched range: the node is taken down
          first, so that it catches up when it restarts), at a random step, and restarts
          50-1500 ms later; a restart that comes back amnesic fails the run.
poison    (chaos, f >= 1) a byzantine replica whose blocks, as primary, carry a transaction
          that does not decode (its body matches its own header: every correct replica
          refuses it as INVALID and changes view at once), or name a parent that is not the
          one it was to build on (UNAVAILABLE: it blames no one, so the request timer
          replaces that primary).
slow      (chaos) replicas, within f with the faulty ones, whose validation of a full block
          takes one to four request timeouts (longer than the VALIDATION deadline in some).

In the classes that allow no view change (honest, gapped) and in censor, the faults fall
only on the slowest backups, at most f of them with the class's own laggards (they are left
out of the latency bound, as laggards are; everything must still settle everywhere): the
class's envelope is that the quorum of the others fits its rounds in the request timeout,
and a fault that takes a faster backup out makes the quorum wait for a slower one's backlog
(honest seed 526 at N = 4 replaced a correct primary when the world could fail any backup).

The random draws leave nothing out: the one gap they did ("stranded holder", a replica
waiting in a view it asked for alone relayed nothing, so a transaction only it held never
committed) is fixed (its VIEW-CHANGE sends relay its oldest requests to every peer).
A correct replica that sends a message its peers' decoders refuse fails the seed
(`UndecodableSent`): a restarted new primary used to resend its re-proposals whose bodies it
never had as PRE-PREPAREs without a block (chaos seed 850 at N = 6).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import partial

from tests.simulation.cluster import CRASH_POINTS, Cluster, ExecutorFaults

ENABLED = True  # False: every seed's world is calm (run.py --calm), to tell a failure's cause
RESTART_MS = (50, 1_500)
EXECUTOR_SHARE = 0.35  # seeds whose hostile nodes' executors fail
CRASH_SHARE = 0.35  # seeds with crashes at write points
FETCH_SHARE = 0.3  # seeds whose fetched ranges fail outright now and then
RACE_SHARE = 0.3  # seeds in which block sync may take the chain lock first
POISON_SHARE = 0.3  # chaos seeds (f >= 1) with a poisoning byzantine replica
SLOW_SHARE = 0.25  # chaos seeds with replicas slower than the timers
SHORT_SHARE = 0.5  # seeds whose peers serve the prefix they hold of a range
# Where the crashes fall, by weight: the rare points ("bound": once per watermark window;
# "range": only in a catch-up) are armed for their first occurrence.
POINT_WEIGHTS = {"step": 2, "bound": 3, "send": 2, "chain": 2, "range": 1}


@dataclass
class Hostility:
    executor: dict[int, ExecutorFaults] = field(default_factory=dict)
    fetch_failure: float = 0.0
    range_blocks: int = 32
    lock_race: float = 0.0
    # (when, node, point, countdown, restart after)
    crashes: list[tuple[int, int, str, int, int]] = field(default_factory=list)
    poisoners: dict[int, tuple[str, float]] = field(default_factory=dict)
    # node -> its validation of a full block, in request timeouts
    slow: dict[int, float] = field(default_factory=dict)
    # which peer serves a short answer (`Cluster.short_answers`); None: none is served
    short_answers: random.Random | None = None
    stopped: bool = False

    @property
    def nodes(self) -> set[int]:
        """Nodes whose machine misbehaves (left out of latency bounds)."""
        return (set(self.executor) | {node for _, node, *_ in self.crashes} | set(self.slow))

    def apply(self, cluster: Cluster) -> None:
        cluster.executor_faults = dict(self.executor)
        cluster.fetch_failure = self.fetch_failure
        cluster.range_blocks = self.range_blocks
        cluster.short_answers = self.short_answers
        cluster.lock_race = self.lock_race
        cluster.poisoners.update(self.poisoners)
        cluster.byzantine.update(self.poisoners)
        for when, node, point, countdown, restart in self.crashes:
            cluster.at(max(0, when - cluster.now),
                       partial(self._arm, cluster, node, point, countdown, restart))

    def _arm(self, cluster: Cluster, node: int, point: str, countdown: int, restart: int
             ) -> None:
        if self.stopped:
            return
        if point == "range" and cluster.nodes[node].up:
            # A node catches up after it was down: down for a while, then crashed again
            # after the first range its catch-up commits.
            cluster.crash_for(node, restart)
        cluster.arm_crash(node, point, countdown, restart)

    def stop(self, cluster: Cluster) -> None:
        """The machines' faults stop (a poisoner stays byzantine, a slow machine slow)."""
        self.stopped = True
        cluster.executor_faults = {}
        cluster.fetch_failure = 0.0
        cluster.crash_plans.clear()

    def describe(self) -> str:
        parts = []
        if self.executor:
            parts.append("executor " + ", ".join(
                f"{i}: raises {f.raises} lose {f.lose} stall {f.stall}"
                for i, f in sorted(self.executor.items())))
        if self.fetch_failure:
            parts.append(f"fetch failure {self.fetch_failure}")
        if self.range_blocks != 32:
            parts.append(f"ranges of {self.range_blocks}")
        if self.short_answers is not None:
            parts.append("short answers")
        if self.lock_race:
            parts.append(f"lock race {self.lock_race}")
        if self.crashes:
            parts.append("crashes " + ", ".join(f"{node}@{when}ms:{point}x{countdown}"
                                                for when, node, point, countdown, _
                                                in self.crashes))
        if self.poisoners:
            parts.append(f"poisoners {self.poisoners}")
        if self.slow:
            parts.append("slow " + ", ".join(f"{i}: {t:.1f} timeouts"
                                             for i, t in sorted(self.slow.items())))
        return "; ".join(parts) or "none"


def generator(seed: int, n: int) -> random.Random:
    return random.Random(f"hostile {seed} {n}")


def answers(seed: int, n: int) -> random.Random | None:
    """The generator of the seed's short answers, if it has them (`SHORT_SHARE`): a stream
    of its own, added in session 14 without moving the seed's other draws."""
    rng = random.Random(f"short answers {seed} {n}")
    return rng if ENABLED and rng.random() < SHORT_SHARE else None


def draw(rng: random.Random, *, candidates: list[int], budget: int, horizon_ms: int,
         request_timeout_ms: int) -> Hostility:
    """Executor faults and crashes on up to `budget` of `candidates`, fetch failures and lock
    races, within the first horizon_ms of the run."""
    hostile = Hostility()
    if not ENABLED:
        return hostile
    chosen = rng.sample(candidates, min(budget, len(candidates), rng.randint(1, 3)))
    raises_in = frozenset(("build", "validate", "commit", "fetch"))
    if chosen and rng.random() < EXECUTOR_SHARE:
        for node in chosen:
            raises, lose, stall = 0.0, 0.0, 0.0
            while not (raises or lose or stall):
                raises, lose = rng.choice((0.0, 0.05, 0.2)), rng.choice((0.0, 0.1, 0.3))
                stall = rng.choice((0.0, 0.0, 0.05))
            hostile.executor[node] = ExecutorFaults(
                raises, lose, stall, stall_ms=(request_timeout_ms, 4 * request_timeout_ms),
                raises_in=raises_in, restart_ms=rng.randint(*RESTART_MS))
    if chosen and rng.random() < CRASH_SHARE:
        # (A node holds one armed crash at a time: a later one replaces it if it has not
        # fallen yet.)
        points, weights = zip(*POINT_WEIGHTS.items(), strict=True)
        for when in sorted(rng.randrange(horizon_ms) for _ in range(rng.randint(1, 3))):
            point = rng.choices(points, weights)[0]
            countdown = {"bound": 1, "range": 1, "chain": rng.randint(1, 4)}.get(
                point, rng.randint(1, 20))
            hostile.crashes.append((when, rng.choice(chosen), point, countdown,
                                    rng.randint(*RESTART_MS)))
    assert set(POINT_WEIGHTS) == set(CRASH_POINTS)
    if rng.random() < FETCH_SHARE:
        hostile.fetch_failure = rng.choice((0.2, 0.5))
        hostile.range_blocks = rng.choice((2, 4, 32))
    if rng.random() < RACE_SHARE:
        hostile.lock_race = rng.choice((0.5, 1.0))
    return hostile
