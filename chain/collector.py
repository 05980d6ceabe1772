"""Python's cycle collector, kept off the consensus path's tail.

A node holds millions of long-lived tracked objects (py-evm's state and trie caches, the
stores' caches). CPython's full (generation 2) collection walks all of them whenever the
objects that survived younger collections reach a quarter of them: measured on the default
4-validator testnet at 20 tx/s, every 10-50 s a node stopped for 50-270 ms and found 0-250
objects to free. That pause, on the primary or on any replica the quorum waits for, was the
latency tail (p99 160-270 ms after a burst against a 40 ms median).

So what survives a full collection is frozen (`gc.freeze`: moved to a permanent generation
that automatic collections skip), and automatic full collections walk only what arrived since.
A cycle among frozen objects that becomes garbage is not found until the next sweep: every
`SWEEP_INTERVAL` the node thaws everything, collects once (one such pause per interval instead
of several a minute) and freezes again, so what leaks is bounded by what one interval makes.
Objects freed by reference counting (nearly all) are freed as before, frozen or not.
Measured the same way with this in place: full collections of 14-100 ms (most 20-50) at
the same intervals; the latency p99 after a burst did not move measurably (docs/performance.md)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

SWEEP_INTERVAL = 600.0  # seconds between full collections of everything


class CycleCollector:
    """Freezes what survives each full collection; sweeps everything every SWEEP_INTERVAL."""

    def __init__(self, interval: float = SWEEP_INTERVAL) -> None:
        self.interval = interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        gc.collect()
        gc.freeze()  # what start-up built: genesis, the stores, the caches as filled so far
        gc.callbacks.append(self._on_collection)
        self._task = self._loop.create_task(self._sweep_forever(), name="cycle collector")

    async def stop(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        gc.unfreeze()

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        # Any thread may collect (the executor's, the RPC workers'): the loop freezes.
        if phase == "stop" and info["generation"] == 2 and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nothing runs any more
                self._loop.call_soon_threadsafe(gc.freeze)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.sweep()

    @staticmethod
    def sweep() -> None:
        started = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        log.debug("full cycle collection: %d objects freed in %.0f ms", found,
                  (time.perf_counter() - started) * 1000)
