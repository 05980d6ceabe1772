"""The node's budget for request bodies (chain/rpc/server.py `BodyBudget`, issue 29): two
clients posting 5 MiB bodies pushed 590 MB/s into a validator and took 60% of the event loop
that votes. Each chunk read is paid for before the next is read; what a reader owes beyond
the bucket it sleeps off (asyncio.sleep recorded here: no clock in the test)."""

from __future__ import annotations

import asyncio

import pytest

from chain.rpc import server
from chain.rpc.server import BodyBudget

MIB = 1024 * 1024


@pytest.fixture
def naps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The sleeps the budget asks for (each returns at once)."""
    asked: list[float] = []

    async def nap(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(server.asyncio, "sleep", nap)
    return asked


def test_a_full_bucket_reads_a_whole_body_at_once_then_paces_at_the_rate(
        naps: list[float]) -> None:
    budget = BodyBudget(rate=2 * MIB, burst=5 * MIB)

    async def read() -> None:
        for _ in range(5):
            await budget.spend(MIB)  # the burst: no wait
        assert naps == []
        await budget.spend(MIB)  # one more MiB at 2 MiB/s: half a second
        await budget.spend(MIB)  # and another, read alone: half a second too

    asyncio.run(read())
    assert naps == [pytest.approx(0.5, abs=0.01), pytest.approx(0.5, abs=0.01)]


def test_readers_in_debt_share_the_rate_as_a_processor_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bucket empty, twelve readers of 1 MiB chunks wait together (each sleep held
    until all have asked): the k-th waits 1 MiB x k / rate, so together they read at the
    rate; a 52-byte body arriving among them waits for its own bytes times the readers
    waiting, not for their 12 MiB."""
    rate, asked = 4 * MIB, []
    gate = asyncio.Event()

    async def held(seconds: float) -> None:
        asked.append(seconds)
        await gate.wait()

    monkeypatch.setattr(server.asyncio, "sleep", held)
    budget = BodyBudget(rate=rate, burst=1)

    async def flood() -> None:
        readers = [asyncio.create_task(budget.spend(MIB)) for _ in range(12)]
        while len(asked) < 12:
            await asyncio.wait(readers, timeout=0)  # (asyncio.sleep is `held` here)
        small = asyncio.create_task(budget.spend(52))
        while len(asked) < 13:
            await asyncio.wait([small], timeout=0)
        gate.set()
        await asyncio.gather(*readers, small)

    asyncio.run(flood())
    assert asked[:12] == [pytest.approx(MIB * k / rate) for k in range(1, 13)]
    assert asked[12] == pytest.approx(52 * 13 / rate)  # ~0.16 ms, not the 3 s of their debt
