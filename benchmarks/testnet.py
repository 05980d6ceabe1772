"""Benchmark testnets: `pbft-node testnet init` on free ports (the integration tests' helpers),
with the genesis extended by the benchmark accounts and the ERC-20 token, and the node
processes' CPU time, memory and database size read from /proc and the data directories."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.accounts import genesis_alloc
from chain.genesis import parse_genesis
from chain.node import CHAINDATA, initialize_datadir
from chain.registry import available_engines
from tests.integration.cluster import Cluster

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def create_testnet(directory: Path, validators: int, accounts: int, *flags: str) -> BenchNet:
    """A testnet of `validators` nodes (not started) whose genesis funds `accounts` accounts."""
    cluster = Cluster.create(directory, validators, *flags)
    genesis_path = Path(cluster.description["genesis"])
    document = json.loads(genesis_path.read_text())
    document["alloc"].update(genesis_alloc(accounts))
    source = json.dumps(document, indent=1).encode()
    genesis_path.write_bytes(source)
    genesis = parse_genesis(document, available_engines(), source=source)
    for node in cluster.description["nodes"]:
        datadir = Path(node["datadir"])
        shutil.rmtree(datadir / CHAINDATA)  # made from the 10-account genesis by testnet init
        initialize_datadir(datadir, genesis)
    return BenchNet(cluster, accounts, [0] * accounts)


@dataclass
class BenchNet:
    cluster: Cluster
    accounts: int
    next_nonce: list[int]
    committed: int = 0  # transactions committed by the benchmarks so far
    peak_rss: dict[int, int] = field(default_factory=dict)  # node index -> bytes

    @property
    def chain_id(self) -> int:
        return self.cluster.description["chain_id"]

    def rpc_urls(self, indices: list[int] | None = None) -> list[str]:
        nodes = self.cluster.nodes
        return [nodes[i].rpc_url for i in (indices if indices is not None else range(len(nodes)))]

    def pid(self, index: int) -> int:
        process = self.cluster.nodes[index].process
        if process is None:
            raise RuntimeError(f"node {index} is not running")
        return process.pid

    def running(self) -> list[int]:
        return [i for i, n in enumerate(self.cluster.nodes) if n.process is not None]

    def cpu_seconds(self) -> dict[int, float]:
        return {i: process_cpu_seconds(self.pid(i)) for i in self.running()}

    def note_peak_rss(self) -> None:
        """Keep each node's peak RSS (the kernel's high-water mark) before it stops."""
        for index in self.running():
            peak = process_memory(self.pid(index))["VmHWM"]
            self.peak_rss[index] = max(self.peak_rss.get(index, 0), peak)

    def stop(self, index: int, sig: int | None = None) -> int:
        self.note_peak_rss()
        return self.cluster.stop(index, *(() if sig is None else (sig,)))

    def close(self) -> None:
        if self.running():
            self.note_peak_rss()
        self.cluster.close()

    def datadir_bytes(self, index: int) -> int:
        return directory_bytes(Path(self.cluster.description["nodes"][index]["datadir"]) / CHAINDATA)

    def senders(self, count: int) -> tuple[list[int], list[int]]:
        """The first `count` accounts and their next nonces."""
        senders = list(range(count))
        return senders, [self.next_nonce[s] for s in senders]

    def spend(self, senders: list[int], per_sender: int) -> None:
        for sender in senders:
            self.next_nonce[sender] += per_sender


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def process_memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) * 1024
    return values


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def describe(net: BenchNet) -> dict[str, Any]:
    return {"validators": len(net.cluster.nodes), "accounts": net.accounts}
