"""An observer: a node outside the validator set that follows the chain (DESIGN.md section 10).

It has no replica: it casts no vote and sends no consensus message. It learns of new blocks
from the validators' announcements (each commit, `BlockSync.announce`) and, on a quiet chain
or when announcements are lost, from asking its peers' heads each poll interval; either way a
head counts only with a commit certificate of a quorum of the validator set, and every block
is fetched with its certificate, verified with the set of its own height (`EpochFeed`: as
committed state says, so a set change is followed from the blocks that made it), executed
and imported by `BlockSync.fetch`, the catch-up path validators use. One fetch at a time,
towards the highest certified head heard of: the work is bounded by the chain's own growth,
whatever peers claim. When the set that decides the next height holds this node's key, the
engine turns it into a validator (`PbftEngine._join`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from chain.engine import EngineContext
from pbft_engine.core import (
    Event,
    FetchFailed,
    Mode,
    PeerCommitted,
    ReplicaStatus,
)
from pbft_engine.epoch_feed import EpochFeed
from pbft_engine.quorum import max_faulty
from pbft_engine.record_store import LevelDBConsensusStore
from pbft_engine.sync import BlockSync
from pbft_engine.tasks import BackgroundTasks
from storage import StorageFailure

log = logging.getLogger(__name__)

OBSERVING = "observing"  # pbft_status's mode of an observer that is not fetching


def forwarding_shortfall(dialed: frozenset[bytes], validators: tuple[bytes, ...]
                         ) -> str | None:
    """Why the transactions an observer forwards may never be ordered, if they may: it sends
    them to the validators it dials, and only f+1 of them hold one honest validator, which
    proposes (or relays to the primary) what it was sent."""
    needed = max_faulty(len(validators)) + 1
    reached = len(dialed & frozenset(validators))
    if reached >= needed:
        return None
    return (f"this observer dials {reached} of the {len(validators)} validators, fewer than "
            f"f+1 = {needed}: the transactions it forwards may reach only faulty ones, which "
            f"can leave them out (list at least {needed} validators in --peers)")


class Observer:
    """Follows the certified chain through block sync; serves peers what it holds."""

    def __init__(
        self,
        context: EngineContext,
        store: LevelDBConsensusStore,
        feed: EpochFeed,
        *,
        chain_lock: asyncio.Lock,
        poll_interval: float,
        on_peer_fault: Callable[[bytes, str], None],
        on_progress: Callable[[], None] = lambda: None,
        stop_at: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.context = context
        self.on_progress = on_progress  # after each fetch: the head moved (or tried to)
        self.stop_at = stop_at  # a height not to fetch past (where this node starts voting)
        self._target: tuple[int, bytes] | None = None  # the highest certified head heard of
        self._fetching: int | None = None
        self._tasks = BackgroundTasks()
        self.sync = BlockSync(
            context, store, feed, deliver=self._on_event, replica_status=self.status,
            held_block=lambda seq_no, digest: None, chain_lock=chain_lock,
            poll_interval=poll_interval, on_peer_fault=on_peer_fault, observer=True,
        )

    def start(self) -> None:
        self.sync.start()

    async def stop(self) -> None:
        await self.sync.stop()
        await self._tasks.cancel_all()

    def status(self) -> ReplicaStatus:
        """What block sync reads of its node (an observer has no view, no watermarks)."""
        head = self.context.head().block_number
        mode = Mode.CATCHING_UP if self._fetching is not None else Mode.NORMAL
        return ReplicaStatus(0, False, head, head, head, 0, head, head, self._fetching, mode)

    def _on_event(self, event: Event) -> None:
        """Block sync's news: a certified head above ours is the next target. What else it
        passes on (NEW-VIEWs, block bodies by digest) is for replicas."""
        if isinstance(event, PeerCommitted):
            if self._target is None or event.seq_no > self._target[0]:
                self._target = (event.seq_no, event.block_hash)
            self._fetch_next()

    def _fetch_next(self) -> None:
        target = self._target
        if self._fetching is not None or target is None:
            return
        head = self.context.head().block_number
        stop = self.stop_at()
        if target[0] <= head or (stop is not None and stop <= head):
            self._target = None
            return
        self._fetching = target[0]
        self._tasks.spawn(self._fetch(*target), "observer catch-up")

    async def _fetch(self, target: int, block_hash: bytes) -> None:
        outcome: Event
        try:
            outcome = await self.sync.fetch(target, block_hash, self.stop_at)
        except StorageFailure:
            raise  # the database reported it: the node stops
        except Exception:  # logged; the next announcement or poll tries again
            log.exception("observer: fetching up to block %d failed", target)
            outcome = self.sync.failed(target)
        finally:
            self._fetching = None
        if isinstance(outcome, FetchFailed) and self._target == (target, block_hash):
            self._target = None  # asked again at the next announcement or poll
        self.on_progress()
        self._fetch_next()

    def describe(self) -> dict[str, Any]:
        """pbft_status's fields for an observer."""
        return {
            "lastExecuted": self.context.head().block_number,
            "fetching": self._fetching,
            "mode": Mode.CATCHING_UP.value if self._fetching is not None else OBSERVING,
        }
