"""Real node processes on loopback: free ports, `pbft-node testnet init`, a running node and
waiting on a condition with a deadline (for the integration tests and the benchmarks)."""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from web3 import Web3

from cli.node import main as pbft_node_main

T = TypeVar("T")
STARTUP_DEADLINE = 60.0
REPO_ROOT = Path(__file__).resolve().parent.parent  # testkit is not installed: run from here


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port_range(count: int, avoid: Collection[int] = ()) -> int:
    """The first of `count` consecutive free ports, outside `avoid` (testnet nodes use
    base + index) and below the kernel's ephemeral range, where connections take ports."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 32_000 - count)
        ports = range(base, base + count)
        if any(p in avoid for p in ports):
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in ports:
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError(f"no {count} consecutive free ports")


def wait_for(condition: Callable[[], T], deadline: float, what: str) -> T:
    """Poll `condition` until it returns a truthy value, or fail after `deadline` seconds."""
    end = time.monotonic() + deadline
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}")
        time.sleep(0.05)


def pbft_node(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "cli.node", *args], capture_output=True, text=True, timeout=120
    )
    if check and result.returncode != 0:
        raise AssertionError(f"pbft-node {' '.join(args)} failed: {result.stderr}")
    return result


def _in_process(*args: str) -> None:
    """`pbft-node` run in this process: what a subprocess would do without its interpreter's
    start (~1 s of a core: tests make a testnet dozens of times)."""
    errors = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        code = pbft_node_main(list(args))
    if code != 0:
        raise AssertionError(f"pbft-node {' '.join(args)} failed: {errors.getvalue()}")


@dataclass
class RunningNode:
    description: dict[str, Any]
    node: dict[str, Any]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    argv: list[str] | None = None  # run instead of node["command"] (testkit.byzantine's)

    @property
    def rpc_url(self) -> str:
        return self.node["rpc_url"]

    @property
    def ws_url(self) -> str:
        return self.node["ws_url"]

    def web3(self) -> Web3:
        return Web3(Web3.HTTPProvider(self.rpc_url, request_kwargs={"timeout": 30}))

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        with open(self.log_path, "ab") as log:
            if self.argv is None:
                self.process = subprocess.Popen(self.node["command"], stdout=log, stderr=log)
            else:
                self.process = subprocess.Popen(self.argv, stdout=log, stderr=log, cwd=REPO_ROOT)

    def wait_ready(self) -> None:
        w3 = self.web3()

        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"node exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                return w3.is_connected()
            except Exception:
                return False

        wait_for(ready, STARTUP_DEADLINE, "the node's JSON-RPC")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.process = None
        return code


def make_testnet(directory: Path, validators: int = 1, *pbft_flags: str, observers: int = 0
                 ) -> dict[str, Any]:
    """`pbft-node testnet init` on free ports; pbft_flags such as "--checkpoint-interval", "4"."""
    count = validators + observers
    http = free_port_range(count)
    p2p = free_port_range(count, avoid=range(http, http + count))
    metrics = free_port_range(
        count, avoid={*range(http, http + count), *range(p2p, p2p + count)})
    _in_process(
        "testnet",
        "init",
        "--validators",
        str(validators),
        "--observers",
        str(observers),
        "--dir",
        str(directory),
        "--base-http-port",
        str(http),
        "--base-p2p-port",
        str(p2p),
        "--base-metrics-port",
        str(metrics),
        *pbft_flags,
    )
    return json.loads((directory / "testnet.json").read_text())


def copy_testnet(template: Path, directory: Path) -> dict[str, Any]:
    """A testnet made by `make_testnet` in `template` (never started) copied to `directory`
    on free ports: a fresh chain in a fraction of `testnet init`'s time (the keys and the
    genesis are the template's); its description."""
    shutil.copytree(template, directory, dirs_exist_ok=True)
    description = json.loads((directory / "testnet.json").read_text())
    count = len(description["nodes"])
    http = free_port_range(count)
    p2p = free_port_range(count, avoid=range(http, http + count))
    metrics = free_port_range(count, avoid={*range(http, http + count), *range(p2p, p2p + count)})
    moved: dict[str, str] = {}
    for node in description["nodes"]:
        i = node["index"]
        for old, base in ((node["rpc_url"], http), (node["p2p"], p2p),
                          (node["metrics_url"], metrics)):
            moved[re.search(r":(\d+)", old.removeprefix("http://")).group(1)] = str(base + i)

    def rewrite(text: str) -> str:  # ports as in URLs ("host:port") and TOML ("port = n")
        return re.sub(r"(:|port = )(\d+)\b", lambda m: m[1] + moved.get(m[2], m[2]),
                      text.replace(json.dumps(str(template))[1:-1],
                                   json.dumps(str(directory))[1:-1]))

    for path in [directory / "testnet.json",
                 *(directory / f"node{n['index']}" / "config.toml"
                   for n in description["nodes"])]:
        path.write_text(rewrite(path.read_text()))
    return json.loads((directory / "testnet.json").read_text())


def run_dev_node(directory: Path, http_settings: str = "") -> Iterator[RunningNode]:
    """A one-validator dev testnet in `directory`, its node running until the generator is
    resumed, then stopped cleanly. `http_settings` (TOML lines) go into its config's [http]."""
    description = make_testnet(directory)
    entry = description["nodes"][0]
    config = Path(entry["command"][-1])
    config.write_text(config.read_text().replace("[http]\n", f"[http]\n{http_settings}\n"))
    node = RunningNode(description, entry, directory / "node0.log")
    node.start()
    yield node
    code = node.stop()
    assert code == 0, f"node did not shut down cleanly:\n{node.log_path.read_text()[-3000:]}"
