"""A real-process soak: 4 validators under continuous load while up to f = 1 of them is
killed, stopped, restarted or cut off from its peers every few seconds; at the end every
acknowledged transaction must be committed on every node (lost = 0) and the nodes must agree
at every height (forks = 0). The load generator behaves like a correct client: a transaction
not committed within a few seconds is re-sent to every live node.

    .venv/bin/python -m tests.soak --minutes 30            # the long run (docs/testing.md)
    .venv/bin/python -m tests.soak --minutes 1 --seed 7    # a short one (CI runs one)

It prints a JSON report: faults injected, transactions acknowledged, committed, lost, forks,
and the longest stall (seconds from healing a fault to the next commit).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_account import Account

from testkit.cluster import GWEI, Cluster, rpc
from testkit.links import Links
from testkit.nodes import wait_for

SENDERS = 8  # dev accounts 0-7 send; account 9 receives
IN_FLIGHT = 4  # unconfirmed transactions per sender
RESEND_AFTER = 5.0  # seconds without a receipt before re-sending to every live node
FAULT_EVERY = (2.0, 5.0)  # seconds between fault actions
POLL = 0.05  # the load generator's round: send what the in-flight bound allows, poll receipts
KINDS = ("kill", "term", "stop", "isolate")  # each once, in random order, per cycle of faults
FAST = ("--checkpoint-interval", "5", "--log-multiplier", "2", "--request-timeout", "1")


@dataclass
class Pending:
    raw: bytes
    sent_at: float


@dataclass
class Report:
    seconds: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
    acknowledged: int = 0
    committed: int = 0
    lost: int = 0
    forks: int = 0
    height: int = 0
    longest_stall: float = 0.0


class Load:
    """Transfers from SENDERS accounts, IN_FLIGHT each, through random live nodes."""

    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        accounts = cluster.description["accounts"]
        self.keys = [accounts[i]["private_key"] for i in range(SENDERS)]
        self.recipient = accounts[9]["address"]
        self.nonces = [0] * SENDERS
        self.pending: list[dict[bytes, Pending]] = [{} for _ in range(SENDERS)]
        self.acknowledged: set[bytes] = set()
        self.committed: set[bytes] = set()
        self.down: set[int] = set()  # nodes the fault injector took out (updated by it)
        self.stop = threading.Event()

    def live(self) -> list[int]:
        return [i for i in range(len(self.cluster.nodes)) if i not in self.down]

    def run(self) -> None:
        while not self.stop.wait(POLL):
            for sender in range(SENDERS):
                self.settle(sender)
                if len(self.pending[sender]) < IN_FLIGHT:
                    self._send_new(sender)

    def _sign(self, sender: int) -> bytes:
        tx = {"chainId": self.cluster.description["chain_id"], "nonce": self.nonces[sender],
              "gas": 21_000, "to": self.recipient, "value": 1,
              "maxFeePerGas": 10 * GWEI, "maxPriorityFeePerGas": GWEI}
        return bytes(Account.from_key(self.keys[sender]).sign_transaction(tx).raw_transaction)

    def _submit(self, node: int, raw: bytes) -> bytes | None:
        try:
            reply = self.cluster.nodes[node].web3().provider.make_request(
                "eth_sendRawTransaction", ["0x" + raw.hex()])
        except Exception:  # the node is down or stopped: try another
            return None
        if "result" in reply:
            return bytes.fromhex(reply["result"][2:])
        return None

    def _send_new(self, sender: int) -> None:
        raw = self._sign(sender)
        for node in self.rng.sample(self.live(), len(self.live())):
            tx_hash = self._submit(node, raw)
            if tx_hash is not None:
                self.nonces[sender] += 1
                self.acknowledged.add(tx_hash)
                self.pending[sender][tx_hash] = Pending(raw, time.monotonic())
                return

    def settle(self, sender: int) -> None:
        for tx_hash, pending in list(self.pending[sender].items()):
            if self._receipt(tx_hash) is not None:
                self.committed.add(tx_hash)
                del self.pending[sender][tx_hash]
            elif time.monotonic() - pending.sent_at > RESEND_AFTER:
                for node in self.live():
                    self._submit(node, pending.raw)
                pending.sent_at = time.monotonic()

    def _receipt(self, tx_hash: bytes) -> Any:
        for node in self.rng.sample(self.live(), len(self.live())):
            try:
                return rpc(self.cluster.nodes[node], "eth_getTransactionReceipt",
                           "0x" + tx_hash.hex())
            except Exception:
                continue
        return None


class Faults:
    """At most one node faulty at a time: kill -9 or SIGTERM then restart, SIGSTOP then
    SIGCONT, or cut off from its peers (still running, still reachable by clients) then
    reconnected."""

    def __init__(self, cluster: Cluster, partitions: Links, load: Load,
                 rng: random.Random, report: Report) -> None:
        self.cluster = cluster
        self.partitions = partitions
        self.load = load
        self.rng = rng
        self.report = report
        self.faulty: tuple[int, str] | None = None
        self.kinds: list[str] = []

    def step(self) -> None:
        if self.faulty is None:
            if not self.kinds:
                self.kinds = self.rng.sample(KINDS, len(KINDS))
            node, kind = self.rng.randrange(4), self.kinds.pop()
            process = self.cluster.nodes[node].process
            assert process is not None
            if kind == "isolate":
                self.partitions.isolate(node)
            elif kind == "stop":
                self.load.down.add(node)
                process.send_signal(signal.SIGSTOP)
            else:
                self.load.down.add(node)
                self.cluster.stop(node, signal.SIGKILL if kind == "kill" else signal.SIGTERM)
            self.faulty = (node, kind)
            self.report.faults[kind] = self.report.faults.get(kind, 0) + 1
        else:
            self.heal()

    def heal(self) -> None:
        if self.faulty is None:
            return
        node, kind = self.faulty
        if kind == "isolate":
            self.partitions.heal(node)
        elif kind == "stop":
            process = self.cluster.nodes[node].process
            assert process is not None
            process.send_signal(signal.SIGCONT)
        else:
            self.cluster.start(node)
        self.load.down.discard(node)
        self.faulty = None
        self._measure_stall()

    def _measure_stall(self) -> None:
        """Seconds from the heal until the cluster commits its next block."""
        healed = time.monotonic()
        height = max(self.cluster.head(i) for i in range(4))
        wait_for(lambda: max(self.cluster.head(i) for i in range(4)) > height, 120,
                 "a commit after healing")
        self.report.longest_stall = max(self.report.longest_stall, time.monotonic() - healed)


def soak(directory: Path, seconds: float, seed: int, min_faults: int = 0) -> Report:
    """Run for `seconds`, and on until at least `min_faults` faults were injected."""
    rng = random.Random(seed)
    report = Report()
    cluster = Cluster.create(directory, 4, *FAST)
    partitions = Links()
    started = time.monotonic()
    try:
        partitions.install(cluster)
        cluster.start()
        load = Load(cluster, random.Random(seed + 1))
        generator = threading.Thread(target=load.run, daemon=True)
        generator.start()
        faults = Faults(cluster, partitions, load, rng, report)
        deadline = started + seconds
        schedule = threading.Event()  # never set: its wait() paces the fault schedule
        while time.monotonic() < deadline or sum(report.faults.values()) < min_faults:
            schedule.wait(rng.uniform(*FAULT_EVERY))
            faults.step()
        faults.heal()
        load.stop.set()
        generator.join(timeout=60)
        settle_all(cluster, load)
        report.acknowledged = len(load.acknowledged)
        report.committed = len(load.committed)
        report.lost = len(load.acknowledged - load.committed)
        report.height = min(cluster.head(i) for i in range(4))
        report.forks = _forks(cluster, report.height)
        cluster.assert_consistent()
    finally:
        cluster.close()
        partitions.close()
    report.seconds = round(time.monotonic() - started, 1)
    return report


def settle_all(cluster: Cluster, load: Load) -> None:
    """After the last fault: every acknowledged transaction committed on every node."""
    def settled() -> bool:
        for sender in range(SENDERS):
            load.settle(sender)
        return not any(load.pending)

    wait_for(settled, 120, "every acknowledged transaction committed")
    height = max(cluster.head(i) for i in range(4))
    cluster.wait_heads([0, 1, 2, 3], height, 120)


def _forks(cluster: Cluster, height: int) -> int:
    return sum(
        len({bytes(n.web3().eth.get_block(number).hash) for n in cluster.nodes}) > 1
        for number in range(1, height + 1)
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", help="keep the testnet here (default: a temporary directory)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pbft-soak-") as scratch:
        report = soak(Path(args.dir or scratch), args.minutes * 60, args.seed)
    print(json.dumps(report.__dict__, indent=2))
    return 0 if report.lost == 0 and report.forks == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
