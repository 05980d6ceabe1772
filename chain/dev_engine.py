"""The `dev` engine: one sealer, no consensus, like `geth --dev`.

It seals a block whenever the pool has executable transactions and, with `period` > 0, also
every `period` seconds (empty blocks included), as geth's `--dev.period` does. With
`period` 0, one empty block follows a block with transactions after `trailing_empty_block`
seconds (default 1, 0: none), as the PBFT engine does: web3 1.x checks for its receipt, then
waits for the next head, and on an idle chain that head must come (docs/engine.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from chain.engine import ConsensusEngine, EngineContext, TimerHandle
from chain.errors import EngineError, GenesisError
from chain.genesis import parse_address, parse_quantity
from storage import StorageFailure

log = logging.getLogger(__name__)


class DevEngine(ConsensusEngine):
    name = "dev"

    def __init__(self, context: EngineContext, params: Mapping[str, Any]) -> None:
        super().__init__(context, params)
        self.check_params(params)
        self.period = float(params.get("period", 0))
        self.trailing = float(params.get("trailing_empty_block", 1))
        self.coinbase = parse_address(params.get("coinbase", "0x" + "00" * 20), "dev.coinbase")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._period_timer: TimerHandle | None = None
        self._trailing_timer: TimerHandle | None = None
        self._seal_empty = False  # the period elapsed: seal even without transactions
        self.blocks_sealed = 0

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        unknown = set(params) - {"period", "coinbase", "trailing_empty_block"}
        if unknown:
            raise EngineError(f"config.dev: unknown keys {sorted(unknown)}; known: period, "
                              "coinbase, trailing_empty_block")
        try:
            parse_quantity(params.get("period", 0), "config.dev.period")
            parse_quantity(params.get("trailing_empty_block", 1),
                           "config.dev.trailing_empty_block")
            parse_address(params.get("coinbase", "0x" + "00" * 20), "config.dev.coinbase")
        except GenesisError as exc:
            raise EngineError(str(exc)) from None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._seal_loop(), name="dev-sealer")
        self._arm_period()
        if self.context.pending_count():
            self._wake.set()

    async def stop(self) -> None:
        for timer in (self._period_timer, self._trailing_timer):
            if timer is not None:
                timer.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def on_transactions(self, tx_hashes: list[bytes]) -> None:
        self._wake.set()

    def is_proposer(self) -> bool:
        return True

    def _arm_period(self) -> None:
        if self.period > 0:
            self._period_timer = self.context.call_later(self.period, self._on_period)

    def _on_period(self) -> None:
        self._seal_empty = True
        self._wake.set()
        self._arm_period()

    def _sealed(self, transactions: int) -> None:
        """A block is sealed: the trailing empty block is owed after one with transactions,
        and only then (so an idle chain stays still)."""
        self.blocks_sealed += 1
        if self._trailing_timer is not None:
            self._trailing_timer.cancel()
            self._trailing_timer = None
        if transactions and self.trailing > 0 and self.period <= 0:
            self._trailing_timer = self.context.call_later(self.trailing, self._on_trailing)

    def _on_trailing(self) -> None:
        self._trailing_timer = None
        self._seal_empty = True
        self._wake.set()

    async def _seal_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.context.pending_count() or self._seal_empty:
                self._seal_empty = False
                try:
                    executed = await self.context.build_block(coinbase=self.coinbase)
                    await self.context.commit_block(executed)
                except StorageFailure:
                    return  # the database reported it; the node is stopping
                except Exception:
                    log.exception("dev engine: sealing failed")
                    break
                self._sealed(len(executed.block.transactions))

    def status(self) -> dict[str, Any]:
        return {"engine": self.name, "blocksSealed": self.blocks_sealed, "period": self.period}
