"""The node's cycle collector (chain/collector.py): full collections walk only what arrived
since the last one, and a sweep still finds the garbage cycles among frozen objects."""

from __future__ import annotations

import asyncio
import gc
import weakref

from chain.collector import CycleCollector


class Cyclic:
    def __init__(self) -> None:
        self.me = self


def test_survivors_are_frozen_and_a_sweep_still_frees_frozen_cycles() -> None:
    async def scenario() -> None:
        collector = CycleCollector(interval=3600)
        kept = Cyclic()
        collector.start()
        try:
            frozen = gc.get_freeze_count()
            assert frozen > 0  # start-up's objects are frozen
            leaked = weakref.ref(kept)
            del kept  # a garbage cycle, frozen: automatic collections skip it
            gc.collect(2)
            assert leaked() is not None
            young = [Cyclic() for _ in range(100)]
            gc.collect(2)  # a full collection: its survivors are frozen on the loop
            await asyncio.sleep(0)
            assert gc.get_freeze_count() >= frozen + len(young)
            collector.sweep()
            assert leaked() is None  # the sweep thaws, collects and freezes again
            assert gc.get_freeze_count() > 0
        finally:
            await collector.stop()
        assert gc.get_freeze_count() == 0 and collector._on_collection not in gc.callbacks

    asyncio.run(scenario())
