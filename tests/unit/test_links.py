"""testkit.links: a delayed link passes every byte, in order, no sooner than its delay."""

from __future__ import annotations

import asyncio
import time

from testkit.links import LinkProxy
from testkit.nodes import free_port

DELAY = 0.05  # seconds, one way


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(4096):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _round_trips(delay: float) -> tuple[list[float], bytes]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    target = server.sockets[0].getsockname()[:2]
    proxy = LinkProxy(target, frozenset((0, 1)), delay)
    port = free_port()
    await proxy.start(port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times, echoed = [], b""
    for n in range(5):
        message = bytes([n]) * 1_000
        started = time.perf_counter()
        writer.write(message)
        echoed += await reader.readexactly(len(message))
        times.append(time.perf_counter() - started)
    writer.close()
    await proxy.stop()
    server.close()
    return times, echoed


def test_a_delayed_link_holds_each_direction_for_its_delay_and_keeps_the_order() -> None:
    times, echoed = asyncio.run(_round_trips(DELAY))
    assert echoed == b"".join(bytes([n]) * 1_000 for n in range(5))
    assert min(times) >= 2 * DELAY  # there and back

