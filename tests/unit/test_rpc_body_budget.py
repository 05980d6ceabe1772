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
        await budget.spend(MIB)  # one more MiB at 2 MiB/s: half a second owed
        await budget.spend(MIB)  # and another: its debt is a second

    asyncio.run(read())
    assert naps == [pytest.approx(0.5, abs=0.01), pytest.approx(1.0, abs=0.01)]


def test_readers_share_the_rate_each_owing_what_the_others_read_before_it(
        naps: list[float]) -> None:
    """A flood of chunks from many connections: every chunk waits for all those paid for
    before it, so the reading rate stays at the budget whoever reads."""
    budget = BodyBudget(rate=MIB, burst=MIB)

    async def flood() -> None:
        await asyncio.gather(*(budget.spend(MIB // 4) for _ in range(12)))

    asyncio.run(flood())
    assert len(naps) == 8  # the first four fit the bucket
    assert naps == sorted(naps) and naps[-1] == pytest.approx(2.0, abs=0.01)
