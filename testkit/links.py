"""The network between real node processes: every validator link goes through a TCP proxy.

`Links(delay).install(cluster)` gives each directed pair (i dials j) its own proxy on
loopback and rewrites node i's configured peers to dial j through it, so every connection
between two nodes crosses exactly one proxy. With a `delay` (seconds, one way) each proxy
holds every chunk that long before passing it on, in order: the link latency of validators on
separate machines, on one machine without the kernel's netem. `isolate(k)` closes every
connection of node k and refuses new ones (the node keeps running, its timers fire, its
clients can still reach it); `heal(k)` lets it connect again; `cut(a, b)` and `mend(a, b)` do
the same to one link. The proxies run on an asyncio loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from testkit.cluster import Cluster
from testkit.nodes import free_port_range

T = TypeVar("T")
CHUNK = 65536
DELAYED_CHUNKS = 1_024  # chunks held by one direction of a delayed link (the reader waits)


class LinkProxy:
    """Forwards connections from a loopback port to one node's p2p port, `delay` seconds
    later, unless cut."""

    def __init__(self, target: tuple[str, int], ends: frozenset[int], delay: float) -> None:
        self.target = target
        self.ends = ends  # the two nodes this link joins
        self.delay = delay
        self.cut = False
        self.server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, port: int) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", port)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        self.drop_connections()

    def drop_connections(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()  # a reset, as when a network path dies
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, upstream_writer}
        await asyncio.gather(self._pipe(reader, upstream_writer),
                             self._pipe(upstream_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(DELAYED_CHUNKS)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            if self.delay:
                await asyncio.gather(self._hold(reader, held), self._release(held, writer))
            else:
                while data := await reader.read(CHUNK):
                    writer.write(data)
                    await writer.drain()
        self._writers.discard(writer)
        writer.transport.abort()

    async def _hold(self, reader: asyncio.StreamReader,
                    held: asyncio.Queue[tuple[float, bytes]]) -> None:
        loop = asyncio.get_running_loop()
        while data := await reader.read(CHUNK):
            await held.put((loop.time() + self.delay, data))
        await held.put((0.0, b""))  # the end of the stream, after what came before it

    async def _release(self, held: asyncio.Queue[tuple[float, bytes]],
                       writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await held.get()
            if not data:
                return
            await asyncio.sleep(max(0.0, due - loop.time()))  # the link's latency
            writer.write(data)
            await writer.drain()


class Links:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.loop = asyncio.new_event_loop()
        self.links: list[LinkProxy] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout=30)

    def install(self, cluster: Cluster) -> None:
        """Put a proxy on every link; call before the nodes start."""
        count = len(cluster.nodes)
        base = free_port_range(count * count)
        for i, node in enumerate(cluster.nodes):
            config = Path(node.node["command"][-1])
            text = config.read_text()
            for j in range(count):
                if i == j:
                    continue
                link = LinkProxy(cluster.endpoint(j), frozenset((i, j)), self.delay)
                self._run(link.start(base + i * count + j))
                self.links.append(link)
                text = text.replace(f'@{cluster.nodes[j].node["p2p"]}"',
                                    f'@127.0.0.1:{base + i * count + j}"')
            config.write_text(text)

    def isolate(self, index: int) -> None:
        self._set_cut(lambda ends: index in ends, True)

    def heal(self, index: int) -> None:
        self._set_cut(lambda ends: index in ends, False)

    def cut(self, a: int, b: int) -> None:
        """Only the link between nodes a and b (both directions) goes down."""
        self._set_cut(lambda ends: ends == {a, b}, True)

    def mend(self, a: int, b: int) -> None:
        self._set_cut(lambda ends: ends == {a, b}, False)

    def _set_cut(self, chosen: Callable[[frozenset[int]], bool], cut: bool) -> None:
        async def apply() -> None:
            for link in self.links:
                if chosen(link.ends):
                    link.cut = cut
                    if cut:
                        link.drop_connections()

        self._run(apply())

    def close(self) -> None:
        async def stop_all() -> None:
            for link in self.links:
                await link.stop()

        self._run(stop_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
