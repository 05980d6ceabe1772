"""Benchmark testnets: `pbft-node testnet init` on free ports (the integration tests'
`Cluster`), with the genesis extended by the benchmark accounts and the ERC-20 token; the node
processes' CPU time and memory from /proc, their block-execution timings from /metrics, and
their database sizes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from benchmarks.accounts import genesis_alloc
from chain.genesis import parse_genesis
from chain.node import CHAINDATA, initialize_datadir
from chain.registry import available_engines
from testkit.cluster import Cluster

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_INTERVAL = 0.2  # seconds between CPU and memory samples of the nodes
EXECUTION_METRIC = re.compile(
    r'^chain_block_execution_seconds_(sum|count)\{kind="(\w+)"\} (\S+)$', re.MULTILINE
)


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def process_memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak RSS) of a process, in bytes."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) * 1024
    return values


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@dataclass
class Sample:
    time: float
    cpu: dict[int, float]  # node index -> CPU seconds so far
    rss: dict[int, int]  # node index -> bytes


class Poller:
    """A thread that calls `poll` every `interval` seconds while its `with` block runs."""

    def __init__(self, name: str, interval: float) -> None:
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def poll(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self._interval)


class Sampler(Poller):
    """A thread that samples the running nodes' CPU time and RSS every SAMPLE_INTERVAL."""

    def __init__(self, net: BenchNet) -> None:
        super().__init__("sampler", SAMPLE_INTERVAL)
        self.net = net
        self.samples: list[Sample] = []

    def poll(self) -> None:
        # a node stopped meanwhile (KeyError: a zombie's /proc status has no VmRSS)
        with contextlib.suppress(OSError, RuntimeError, KeyError):
            self.samples.append(self.net.sample())

    def at(self, moment: float) -> Sample:
        """The first sample taken at or after `moment` (the last one if none)."""
        return next((s for s in self.samples if s.time >= moment), self.samples[-1])

    def cpu_between(self, start: float, end: float) -> dict[int, float]:
        first, last = self.at(start), self.at(end)
        return {i: last.cpu[i] - first.cpu[i] for i in last.cpu if i in first.cpu}


@dataclass
class BenchNet:
    cluster: Cluster
    accounts: int
    next_nonce: list[int]
    # node index -> bytes: the largest RSS sampled once the node is running (the kernel's
    # high-water mark is not used: unlocking the validator keystore's scrypt key takes
    # 256 MiB for a moment at start-up, which would hide everything after it)
    peak_rss: dict[int, int] = field(default_factory=dict)

    @classmethod
    def create(
        cls, directory: Path, validators: int, accounts: int, pbft: dict[str, Any] | None = None,
        observers: int = 0,
    ) -> BenchNet:
        """A testnet (not started) whose genesis also funds `accounts` accounts and the token;
        `pbft` overrides genesis config.pbft parameters (such as request_timeout); `observers`
        observer nodes follow the validators (`testnet init --observers`, indices from
        `validators` on)."""
        cluster = Cluster.create(directory, validators, observers=observers)
        genesis_path = Path(cluster.description["genesis"])
        document = json.loads(genesis_path.read_text())
        document["alloc"].update(genesis_alloc(accounts))
        if pbft:
            document["config"]["pbft"].update(pbft)
        source = json.dumps(document, indent=1).encode()
        genesis_path.write_bytes(source)
        genesis = parse_genesis(document, available_engines(), source=source)
        for node in cluster.description["nodes"]:
            datadir = Path(node["datadir"])
            shutil.rmtree(datadir / CHAINDATA)  # testnet init made it from its own genesis
            initialize_datadir(datadir, genesis)
        return cls(cluster, accounts, [0] * accounts)

    @property
    def chain_id(self) -> int:
        return self.cluster.description["chain_id"]

    @property
    def size(self) -> int:
        return len(self.cluster.nodes)

    def rpc_urls(self, indices: list[int] | None = None) -> list[str]:
        nodes = self.cluster.nodes
        return [nodes[i].rpc_url for i in (range(self.size) if indices is None else indices)]

    def running(self) -> list[int]:
        return [i for i, n in enumerate(self.cluster.nodes)
                if n.process is not None and n.process.poll() is None]

    def pid(self, index: int) -> int:
        process = self.cluster.nodes[index].process
        if process is None:
            raise RuntimeError(f"node {index} is not running")
        return process.pid

    def sample(self) -> Sample:
        running = self.running()
        rss = {i: process_memory(self.pid(i))["VmRSS"] for i in running}
        for index, value in rss.items():
            self.peak_rss[index] = max(self.peak_rss.get(index, 0), value)
        return Sample(time.time(), {i: process_cpu_seconds(self.pid(i)) for i in running}, rss)

    def execution_timings(self, index: int) -> dict[str, tuple[float, int]]:
        """kind (build, validate) -> (seconds, blocks) so far, from the node's /metrics."""
        url = self.cluster.description["nodes"][index]["metrics_url"]
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        totals: dict[str, list[float]] = {}
        for part, kind, value in EXECUTION_METRIC.findall(text):
            totals.setdefault(kind, [0.0, 0.0])[part == "count"] = float(value)
        return {kind: (seconds, int(count)) for kind, (seconds, count) in totals.items()}

    def datadir_bytes(self, index: int) -> int:
        datadir = Path(self.cluster.description["nodes"][index]["datadir"])
        return directory_bytes(datadir / CHAINDATA)

    def restart(self, index: int) -> None:
        """Start a stopped node again and wait for its JSON-RPC; its start-up (the keystore's
        scrypt) does not count toward its peak RSS."""
        before = self.peak_rss.get(index, 0)
        node = self.cluster.nodes[index]
        node.launch()
        node.wait_ready()
        self.peak_rss[index] = before

    def stop(self, index: int, *sig: int) -> int:
        self.sample()  # the node's peak RSS before it goes
        return self.cluster.stop(index, *sig)

    def close(self) -> None:
        if self.running():
            self.sample()
        self.cluster.close()
