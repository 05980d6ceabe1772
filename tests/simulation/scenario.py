"""One random simulation run per seed: faults, then healing, then the safety/liveness checks."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import rlp
from eth_hash.auto import keccak

from pbft_engine.messages import (
    Authenticator,
    Checkpoint,
    Commit,
    PhaseMessage,
    Prepare,
    PrePrepare,
    WireMessage,
)
from tests.simulation.cluster import Cluster, NetworkFaults, make_block

CHAOS_MS = 3_000
LIVENESS_LIMIT_MS = 60_000
BEHAVIOURS = ("crash", "silent", "equivocate", "garbage", "replay", "out_of_window")


class LivenessFailure(AssertionError):
    pass


def replay_command(seed: int, n: int) -> str:
    return f".venv/bin/python -m tests.simulation.run --seed {seed} --n {n}"


@dataclass
class Byzantine:
    """Rewrites what a faulty replica sends: (dst, message) -> what actually goes out."""

    cluster: Cluster
    index: int
    behaviour: str
    rng: random.Random

    def __call__(self, dst: int, data: bytes) -> list[tuple[int, bytes]]:
        return getattr(self, f"_{self.behaviour}")(dst, data)

    def _silent(self, dst: int, data: bytes) -> list[tuple[int, bytes]]:
        return []

    def _garbage(self, dst: int, data: bytes) -> list[tuple[int, bytes]]:
        flipped = bytearray(data)
        flipped[self.rng.randrange(len(flipped))] ^= 1 << self.rng.randrange(8)
        noise = self.rng.randbytes(self.rng.randrange(1, 200))
        return [(dst, data), (dst, bytes(flipped)), (dst, noise)]

    def _replay(self, dst: int, data: bytes) -> list[tuple[int, bytes]]:
        old = self.cluster.delivered
        return [(dst, data)] + ([(dst, old[self.rng.randrange(len(old))])] if old else [])

    def _sign(self, body: object, blocks: tuple[bytes, ...] = ()) -> bytes:
        node = self.cluster.nodes[self.index]
        auth = Authenticator(self.cluster.params.chain_id, self.cluster.params.validators,
                             self.cluster.verifier)
        return WireMessage(auth.sign(body, node.signer), blocks).encode()  # type: ignore[arg-type]

    def _out_of_window(self, dst: int, data: bytes) -> list[tuple[int, bytes]]:
        body = WireMessage.decode(data).signed.body
        if not isinstance(body, PhaseMessage | Checkpoint):
            return [(dst, data)]
        far = body.seq_no + self.rng.choice((100, 10_000, 2**40))
        forged: object
        if isinstance(body, Checkpoint):
            forged = Checkpoint(far, keccak(b"fake"), keccak(b"fake root"), self.index)
        else:
            forged = self.rng.choice((Prepare, Commit))(body.view, far, body.digest, self.index)
        return [(dst, data), (dst, self._sign(forged))]

    def _equivocate(self, dst: int, data: bytes) -> list[tuple[int, bytes]]:
        wire = WireMessage.decode(data)
        body = wire.signed.body
        if not isinstance(body, PrePrepare) or dst % 2 == 0:
            return [(dst, data)]
        parent = rlp.decode(wire.blocks[0])[1]
        block = make_block(body.seq_no, parent, (), b"equivocation")
        twin = PrePrepare(body.view, body.seq_no, keccak(block), self.index)
        return [(dst, self._sign(twin, (block,)))]


def run_seed(seed: int, n: int) -> Cluster:
    """Run one seeded scenario; raises SafetyViolation / LivenessFailure with a replay hint."""
    rng = random.Random(seed * 7919 + n)
    faults = NetworkFaults(min_delay_ms=1, max_delay_ms=rng.randint(5, 60),
                           drop=rng.choice((0.0, 0.02, 0.1)), duplicate=rng.choice((0.0, 0.05)))
    cluster = Cluster(n, seed, faults=faults)
    f = cluster.params.f
    timeline: list[tuple[int, Callable[[], None]]] = []
    faulty = rng.sample(range(n), rng.randint(0, f))
    crashed_for_good: list[int] = []
    for index in faulty:
        behaviour = rng.choice(BEHAVIOURS)
        if behaviour == "crash":
            crashed_for_good.append(index)
            timeline.append((rng.randrange(CHAOS_MS), lambda i=index: cluster.crash(i)))
        else:
            cluster.byzantine.add(index)
            cluster.outgoing[index] = Byzantine(cluster, index, behaviour, rng)
    survivors = [i for i in range(n) if i not in faulty]
    for index in rng.sample(survivors, min(len(survivors), rng.randint(0, 2))):
        down = rng.randrange(CHAOS_MS - 500)
        timeline.append((down, lambda i=index: cluster.crash(i)))
        timeline.append((down + rng.randint(50, 1500), lambda i=index: cluster.restart(i)))
    if n > 1 and rng.random() < 0.5:
        side = set(rng.sample(range(n), rng.randint(1, n - 1)))
        start = rng.randrange(CHAOS_MS - 500)

        def split(side: set[int] = side) -> None:
            cluster.partition = [side, set(range(n)) - side]

        timeline.append((start, split))
    for k in range(rng.randint(3, 15)):
        tx = keccak(b"chaos %d %d" % (seed, k))
        timeline.append((rng.randrange(CHAOS_MS), lambda tx=tx: cluster.submit(tx)))

    def heal() -> None:
        cluster.partition = None
        cluster.faults = NetworkFaults(1, faults.max_delay_ms)
        for node in cluster.nodes:
            if not node.up and node.index not in crashed_for_good:
                cluster.restart(node.index)

    timeline.append((CHAOS_MS, heal))
    for when, action in sorted(timeline, key=lambda item: item[0]):
        cluster.run_for(max(0, when - cluster.now))
        action()
    cluster.check_safety()
    fresh = [keccak(b"after heal %d %d" % (seed, k)) for k in range(3)]
    for tx in fresh:
        cluster.submit(tx)
    need = f + 1
    live = cluster.run_until(lambda: all(cluster.committed(tx) >= need for tx in fresh),
                             LIVENESS_LIMIT_MS)
    cluster.check_safety()
    if not live:
        views = [node.replica.view if node.replica else None for node in cluster.nodes]
        raise LivenessFailure(f"no commit within {LIVENESS_LIMIT_MS} ms after healing: "
                              f"heights {cluster.heights()}, views {views}")
    return cluster
