"""Connections that send no request (a TCP connect/close flood) are the event loop's work
too: accepted within the calls' share of it (chain/rpc/server.py `CONNECTION_SECONDS`)."""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import socket
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from chain.p2p.throttle import FULL_LINES
from chain.rpc import child_process
from chain.rpc import server as server_module
from chain.rpc.dispatcher import Dispatcher
from chain.rpc.limits import RpcLimits
from chain.rpc.loop_turns import LOOP_SHARE
from chain.rpc.server import BUSY_READS, BodyBudget, RpcServer, _Busy, _Lingering

FLOOD_SECONDS = 1.0

# Connections opened and reset (no TIME_WAIT left to run out of ports) as fast as one process
# can, in batches, from a process of its own (as a thread of the test's process it took the
# interpreter from the loop it measured).
FLOODING_CLIENT = r"""
import select, socket, struct, sys
port, reset = int(sys.argv[1]), struct.pack("ii", 1, 0)
while True:
    batch = []
    for _ in range(50):
        client = socket.socket()
        client.setblocking(False)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, reset)
        client.connect_ex(("127.0.0.1", port))
        batch.append(client)
    select.select([], batch, [], 1.0)
    for client in batch:
        client.close()
"""


def _server() -> RpcServer:
    """The node's HTTP front door alone: no node behind it."""
    server = object.__new__(RpcServer)
    server.settings = SimpleNamespace(http_addr="127.0.0.1", http_port=0)  # type: ignore[assignment]
    server.limits = RpcLimits()
    server._body_budget = BodyBudget(server.limits.max_body_rate, server.limits.max_body_bytes)
    server.host_allowlist, server.cors_origins = {"*"}, set()
    server.dispatcher = Dispatcher({})
    server._websockets = {}
    server.subscriptions = SimpleNamespace(close_all=lambda: None)  # type: ignore[assignment]
    server.eth = SimpleNamespace(close=lambda: None)  # type: ignore[assignment]
    return server


def test_connections_without_requests_are_charged_to_the_calls_share(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection accepted costs the loop 160-230 us (asyncio's accept and transport,
    aiohttp's handler made and dropped; measured on session 16's loaded machine) before it
    sends anything, and one that sends nothing paid nothing: no request to charge
    (HTTP_HANDLING_SECONDS), no byte of the request budget. At that price one core's worth
    of loop is ~5,000 connections a second, which a flood from another host makes without
    trying. Now each is accepted in a turn of the loop, the share's debt waited out, and
    charged CONNECTION_SECONDS. Here the chain makes blocks and one process opens and
    resets connections for 1 s: the loop thread's CPU time over that second is within what
    the accepts were charged to the calls' share (it was charged nothing), and within the
    share (a loaded machine that does not run the thread counts as idle)."""
    server = _server()
    turns = server.dispatcher.turns
    charged = 0.0
    spent = turns.spent

    def counted(seconds: float) -> None:
        nonlocal charged
        charged += seconds
        spent(seconds)

    monkeypatch.setattr(turns, "spent", counted)

    async def flooded() -> tuple[float, float, float]:
        nonlocal charged
        await server.start()
        client = subprocess.Popen([sys.executable, "-c", FLOODING_CLIENT, str(server.port)],
                                  stderr=subprocess.DEVNULL)
        try:
            await asyncio.sleep(0.5)  # (the client started, the share's burst spent)
            started, cpu, charged = time.monotonic(), time.thread_time(), 0.0
            await asyncio.sleep(FLOOD_SECONDS)
            seconds = time.monotonic() - started
            return time.thread_time() - cpu, charged, seconds
        finally:
            client.kill()
            client.wait()
            await server.stop()

    monkeypatch.setattr(child_process, "_last_block", math.inf)  # blocks keep coming
    cpu, paid, seconds = asyncio.run(flooded())
    assert cpu > 0.01, f"the flood cost the loop nothing ({cpu * 1e3:.1f} ms): not measured"
    assert cpu <= paid * 1.1 + 0.005, (
        f"the loop spent {cpu * 1e3:.0f} ms on the flood, {paid * 1e3:.0f} ms charged")
    assert cpu / seconds <= LOOP_SHARE * 1.2, f"the loop {cpu / seconds:.0%} busy"


def test_a_connection_over_the_limit_reset_before_its_503_logs_nothing() -> None:
    """A connection over `max_connections` is answered 503 and its write side shut; one
    the client had reset already raised ENOTCONN from the shutdown, in the loop's callback:
    a traceback in the log for each connection of a flood past the limit."""
    aborted: list[bool] = []

    class Reset(asyncio.Transport):
        def write(self, data: Any) -> None:
            pass

        def can_write_eof(self) -> bool:
            return True

        def write_eof(self) -> None:
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")

        def abort(self) -> None:
            aborted.append(True)

    async def made() -> None:
        _Busy(_Lingering()).connection_made(Reset())

    asyncio.run(made())
    assert aborted == [True]


def test_the_node_raises_its_open_files_limit_to_the_hard_limit() -> None:
    """`pbft-node run` raises the soft RLIMIT_NOFILE to the hard one (the attack review
    s16, finding 6): here in a child process started with a soft limit of 256."""
    code = ("import resource, cli.node\n"
            "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
            "cli.node.raise_fd_limit()\n"
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "True", done.stderr


def test_a_connection_answered_503_that_goes_on_sending_is_cut() -> None:
    """`_Busy` ignores what the client sends, but each read is the loop's work: past
    BUSY_READS reads the connection is aborted."""
    aborted: list[bool] = []

    class Sending(asyncio.Transport):
        def write(self, data: Any) -> None:
            pass

        def can_write_eof(self) -> bool:
            return True

        def write_eof(self) -> None:
            pass

        def close(self) -> None:
            pass

        def abort(self) -> None:
            aborted.append(True)

    async def sent() -> None:
        busy = _Busy(_Lingering())
        busy.connection_made(Sending())
        for _ in range(BUSY_READS):
            busy.data_received(b"x")
        assert not aborted
        busy.data_received(b"x")

    asyncio.run(sent())
    assert aborted == [True]


def test_accepting_goes_on_after_failed_accepts_with_a_throttled_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Accepting failed (EMFILE: no file descriptor left) 20 times running: the node says so
    in at most FULL_LINES lines (one a retry, not a line each), waits, and then accepts
    and answers the next connection."""
    monkeypatch.setattr(server_module, "ACCEPT_RETRY_SECONDS", 0.001)
    server = _server()
    failures = [20]

    async def answered() -> bytes:
        loop = asyncio.get_running_loop()
        sock_accept = loop.sock_accept

        async def failing(listening: socket.socket) -> tuple[socket.socket, Any]:
            if failures[0]:
                failures[0] -= 1
                raise OSError(errno.EMFILE, "Too many open files")
            return await sock_accept(listening)

        monkeypatch.setattr(loop, "sock_accept", failing)
        await server.start()
        try:
            assert server.port is not None
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(10):
                line = await reader.readuntil(b"\r\n")
            writer.close()
            return line
        finally:
            await server.stop()

    with caplog.at_level(logging.ERROR, logger="chain.rpc.server"):
        assert asyncio.run(answered()).startswith(b"HTTP/1.1 405")
    lines = [r for r in caplog.records if "cannot accept" in r.getMessage()]
    assert failures == [0] and 0 < len(lines) <= FULL_LINES, len(lines)
