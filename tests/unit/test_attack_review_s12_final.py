"""Final attack review (session 12) of the session's change: an unauthenticated WebSocket
client against `_PaidReads` (chain/rpc/server.py).

Finding 1 (strict xfail): when a debt is paid, `_PaidReads._paid` passes the held bytes on to
aiohttp and then resumes the transport it paused, though aiohttp paused reading meanwhile (its
message queue over its limit: the client's requests are not taken, e.g. `_ws_read` waits for
room in an outbox the client does not drain, or for a slow call). The transport reads again
with aiohttp's flow control lifted; aiohttp 3.14's WebSocketReader stashes each read in its
unparsed tail (`self._tail + data`), so the tail grows at the budget's rate for as long as the
reader is stalled, each read copying all of it on the loop."""

from __future__ import annotations

import asyncio

import pytest

from chain.rpc.server import PAYMENT, BodyBudget, _PaidReads


class Transport:
    """The reading half of a transport."""

    def __init__(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class StalledReader:
    """aiohttp's protocol under a stalled reader: once its WebSocket queue passes its limit
    it pauses the transport (`BaseProtocol.pause_reading`) until the reader drains the
    queue, which a stalled reader does not."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.received = 0
        self.reading_paused = False

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if self.received > PAYMENT and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()


@pytest.mark.xfail(strict=True, reason="finding 1: _PaidReads resumes a transport aiohttp paused")
def test_a_paid_debt_does_not_lift_aiohttps_pause() -> None:
    async def scenario() -> None:
        transport = Transport()
        handler = StalledReader(transport)
        budget = BodyBudget(rate=1_000_000, burst=0)  # in debt from the first byte
        paid_reads = _PaidReads(handler, transport, budget)  # type: ignore[arg-type]
        size = 3 * PAYMENT  # one binary frame, unmasked (the budget reads only frame heads)
        frame = b"\x82\x7f" + size.to_bytes(8, "big") + b"\x00" * size
        paid_reads.data_received(frame)  # one read: its first part passed on, the rest held
        assert paid_reads._debt is not None and not transport.is_reading()
        paid_reads._debt.cancel()
        paid_reads._paid()  # the debt is paid: the rest is passed on, and aiohttp pauses
        while paid_reads._debt is not None:
            paid_reads._debt.cancel()
            paid_reads._paid()
        assert handler.reading_paused
        # aiohttp still wants its transport paused (its queue is full): it is not read.
        assert not transport.is_reading()

    asyncio.run(scenario())
