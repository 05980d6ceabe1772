"""Hostile JSON-RPC clients (issue 29), for the integration tests and the benchmarks: the
requests that held a validator's event loop, sent again and again from threads."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

BODY_LIMIT = 5 * 1024 * 1024  # the node's default: 413 beyond
LOOP_FOREVER = "0x5b600056"  # init code: JUMPDEST PUSH1 0 JUMP, until the gas cap runs out


def request_body(method: str, *params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
                       "params": list(params)}).encode()


def looping_call(method: str = "eth_call") -> bytes:
    """An eth_call (or eth_estimateGas) that loops until stopped: 50M gas take ~15 s."""
    return request_body(method, {"input": LOOP_FOREVER}, "latest")


def nested_arrays(size: int = BODY_LIMIT - 100) -> bytes:
    """eth_chainId with a parameter of arrays nested 30 deep filling `size` bytes: 2.6
    million values in 5 MiB."""
    unit = b"[" * 30 + b"]" * 30
    return (b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":['
            + b",".join([unit] * (size // (len(unit) + 1))) + b"]}")


HEAVY_READS = (  # each reads every block the node has, up to 1,000 (answers: up to 25 MB)
    ("pbft_getBlockBundles", "0x0", "0x3e7"),
    ("eth_getLogs", {"fromBlock": "earliest", "toBlock": "latest"}),
    ("eth_getBlockByNumber", "latest", True),
)


def heavy_reads(calls: int = 1_000) -> bytes:
    """A batch of `calls` (at most the node's 1,000) of the reads that cost the most per byte
    asked: block bundles and wide log queries over the whole chain, full blocks."""
    batch = [{"jsonrpc": "2.0", "id": i, "method": method, "params": list(params)}
             for i, (method, *params) in zip(range(calls), itertools.cycle(HEAVY_READS))]
    return json.dumps(batch).encode()


def light_reads(calls: int = 1_000) -> bytes:
    """A batch of `calls` balance lookups: each costs less than the hop to a thread, so it
    runs on the event loop (~0.24 ms a call on a validator: 238 ms a batch, for 127 kB of
    the request budget; the attack review s14-rpc, finding 7)."""
    batch = [{"jsonrpc": "2.0", "id": i, "method": "eth_getBalance",
              "params": ["0x" + "11" * 20, "latest"]} for i in range(calls)]
    return json.dumps(batch).encode()


def post(url: str, body: bytes, timeout: float = 30.0) -> Any:
    """The JSON-RPC answer to `body`, a batch's a list (AssertionError on an HTTP error
    status)."""
    reply = requests.post(url, data=body, timeout=timeout,
                          headers={"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    return reply.json()


def post_unread(url: str, body: bytes, timeout: float = 30.0) -> int:
    """The size of the answer to `body`, every byte of it read and none parsed: an attacker
    on a machine of its own, whose parsing (~0.4 of a core for 8 clients reading 25 MB
    answers) would otherwise be taken from the validators sharing this machine's cores."""
    reply = requests.post(url, data=body, timeout=timeout,
                          headers={"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text[:200]
    return len(reply.content)


@contextlib.contextmanager
def hammering(threads: int, url: str, body: bytes,
              send: Callable[[str, bytes], Any] = post) -> Iterator[list[Any]]:
    """`threads` clients posting `body` to `url` again and again (with `send`) until the
    block ends; the list of their answers (an exception too) as it grows."""
    answers: list[Any] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                answers.append(send(url, body))
            except Exception as exc:  # noqa: BLE001 - kept for the caller to report
                answers.append(exc)

    with ThreadPoolExecutor(threads) as pool:
        for _ in range(threads):
            pool.submit(client)
        try:
            yield answers
        finally:
            stop.set()
