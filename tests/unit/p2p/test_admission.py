"""The p2p door: pending-handshake slots per source IP, silent connections evicted for
newcomers, refusals logged as a summary (issue 29)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace

import pytest

from chain.p2p.admission import PendingHandshake, PendingHandshakes
from chain.p2p.throttle import FULL_LINES, ThrottledLog
from testkit.nodes import free_port
from tests.unit.p2p.support import (
    FAST,
    HOST,
    VALIDATOR_KEYS,
    address_of,
    make_transport,
    raw_connect,
    refused,
    run,
    stop_all,
    wait_for,
)


class Aborts:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def __call__(self, name: str) -> object:
        return lambda: self.aborted.append(name)


def admitted(table: PendingHandshakes, ip: str, name: str, aborts: Aborts) -> PendingHandshake:
    slot = table.admit(ip, aborts(name))
    assert isinstance(slot, PendingHandshake), slot
    return slot


def test_one_ip_takes_its_own_silent_slots_not_anothers() -> None:
    aborts = Aborts()
    table = PendingHandshakes(max_total=4, max_per_ip=2)
    first = admitted(table, "10.0.0.1", "a1", aborts)
    admitted(table, "10.0.0.1", "a2", aborts)
    admitted(table, "10.0.0.2", "b1", aborts)
    admitted(table, "10.0.0.1", "a3", aborts)  # over its 2: its oldest silent one goes
    assert aborts.aborted == ["a1"] and first.evicted and len(table) == 3
    admitted(table, "10.0.0.3", "c1", aborts)  # the table's last slot
    admitted(table, "10.0.0.4", "d1", aborts)  # full: the IP with the most slots gives one up
    assert aborts.aborted == ["a1", "a2"] and len(table) == 4


def test_a_greeted_handshake_is_never_evicted() -> None:
    aborts = Aborts()
    table = PendingHandshakes(max_total=2, max_per_ip=2)
    for name in ("a1", "a2"):
        admitted(table, "10.0.0.1", name, aborts).greeted = True
    assert table.admit("10.0.0.1", aborts("a3")) == "per_ip_limit"
    assert table.admit("10.0.0.2", aborts("b1")) == "too_many_pending"
    assert aborts.aborted == []


def test_released_slots_are_free_again() -> None:
    aborts = Aborts()
    table = PendingHandshakes(max_total=1, max_per_ip=1)
    slot = admitted(table, "10.0.0.1", "a1", aborts)
    slot.greeted = True
    table.release(slot)
    table.release(slot)  # idempotent
    admitted(table, "10.0.0.1", "a2", aborts).greeted = True
    assert len(table) == 1 and aborts.aborted == []


def test_a_flood_is_logged_as_a_summary(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.throttle")
    caplog.set_level(logging.INFO, logger="tests.throttle")

    async def body() -> None:
        throttled = ThrottledLog(logger, "refused handshakes", interval=0.2)
        for i in range(1_000):
            throttled.log(logging.WARNING if i % 2 else logging.INFO,
                          "odd" if i % 2 else "even", "refused %d", i)
        deadline = time.monotonic() + 5
        while not any("more refused" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no summary line"
            await asyncio.sleep(0.01)

    run(body())
    messages = [r.getMessage() for r in caplog.records]
    assert messages[:FULL_LINES] == [f"refused {i}" for i in range(FULL_LINES)]
    assert len(messages) == FULL_LINES + 1, messages
    summary = messages[-1]
    assert summary.startswith(f"{1_000 - FULL_LINES} more refused handshakes in the last ")
    assert summary.endswith(" s: odd 498, even 497"), summary
    assert caplog.records[-1].levelno == logging.WARNING


def test_silent_connections_do_not_keep_a_validator_out(
    caplog_transport: pytest.LogCaptureFixture,
) -> None:
    """Idle connections from 127.0.0.1 (the validator's own address too) reopened as fast as
    they are closed: the validator's dial still gets in, and the log stays short. Before
    issue 29 every slot stayed taken and each refusal was a WARNING line."""
    config = replace(FAST, max_pending_handshakes=8, max_pending_per_ip=4, hello_timeout=1.0)

    async def body() -> None:
        a_port, unreachable = free_port(), free_port()
        endpoints = {address_of(VALIDATOR_KEYS[0]): (HOST, a_port),
                     address_of(VALIDATOR_KEYS[1]): (HOST, unreachable)}
        a, _ = make_transport(VALIDATOR_KEYS[0], endpoints, a_port, config)
        b, _ = make_transport(VALIDATOR_KEYS[1], endpoints, unreachable, config)
        await a.start()  # A's dials go nowhere: only B's dial to A can connect them
        flood = asyncio.ensure_future(_flood(a_port, 40))
        try:
            await wait_for(a, lambda: refused(a, "evicted") >= 40)
            await b.start()
            await wait_for(b, lambda: bool(b.connected_peers()))
            await wait_for(a, lambda: bool(a.connected_peers()))
        finally:
            flood.cancel()
            await asyncio.gather(flood, return_exceptions=True)
            await stop_all([a, b])

    run(body())
    refusals = [r for r in caplog_transport.records if "refused handshake" in r.getMessage()
                or "more refused handshakes" in r.getMessage()]
    assert len(refusals) <= 2 * FULL_LINES + 2, len(refusals)


async def _flood(port: int, connections: int) -> None:
    """Keep `connections` silent connections open to `port`, reopening each one closed."""

    async def hold() -> None:
        while True:
            with contextlib.suppress(OSError):
                peer = await raw_connect(port)
                try:
                    await peer.reader.read()  # until the server closes it
                finally:
                    peer.close()

    await asyncio.gather(*(hold() for _ in range(connections)))
