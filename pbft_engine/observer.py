"""An observer: a node outside the validator set that follows the chain (DESIGN.md section 10).

It has no replica: it casts no vote and sends no consensus message. Each validator pushes
every block it commits, with its commit certificate, to the observers connected to it
(`BlockSync.announce`): the first copy of a block above what this node holds is verified at
once (a quorum of the set of its height, `EpochFeed`: as committed state says, so a set change
is followed from the blocks that made it) and held, bounded in bytes and blocks, until the
blocks before it are in; the others are dropped unchecked. Held blocks are executed and
imported one at a time, in order, while the next ones arrive and are verified: an observer
keeping up is behind by its own execution time, not by a round trip per block. What is not
pushed (a push dropped by a full queue, a block over the bound, a node that starts behind, a
validator that no longer holds a body and announces a STATUS instead, a quiet chain whose
heads are asked each poll interval) is fetched by `BlockSync.fetch`, the catch-up path
validators use, up to just below the lowest block held or to the highest certified head heard
of. One import or fetch at a time: the work is bounded by the chain's own growth, whatever
peers claim. When the set that decides the next height holds this node's key, the engine
turns it into a validator (`PbftEngine._join`).
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
from pbft_engine.sync import MAX_RESPONSE_BYTES, BlockSync, CertifiedBlock
from pbft_engine.sync_messages import MAX_BLOCKS_PER_REQUEST, Committed
from pbft_engine.tasks import BackgroundTasks
from storage import StorageFailure

log = logging.getLogger(__name__)

OBSERVING = "observing"  # pbft_status's mode of an observer that is not fetching
# Pushed blocks held verified above the head, at most: a catch-up range's worth (what one
# BLOCKS answer may hold); a push beyond either bound is fetched later instead.
MAX_HELD_BLOCKS = MAX_BLOCKS_PER_REQUEST
MAX_HELD_BYTES = MAX_RESPONSE_BYTES


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
        self._importing: int | None = None  # the pushed block being executed and imported
        self._held: dict[int, CertifiedBlock] = {}  # pushed, verified, above the head
        self._held_bytes = 0
        self._tasks = BackgroundTasks()
        self.sync = BlockSync(
            context, store, feed, deliver=self._on_event, replica_status=self.status,
            held_block=lambda seq_no, digest: None, chain_lock=chain_lock,
            poll_interval=poll_interval, on_peer_fault=on_peer_fault, observer=True,
            on_pushed=self._on_pushed,
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
        busy = self._fetching if self._fetching is not None else self._importing
        return ReplicaStatus(0, False, head, head, head, 0, head, head, busy, mode)

    def _on_event(self, event: Event) -> None:
        """Block sync's news: a certified head above ours is the next target. What else it
        passes on (NEW-VIEWs, block bodies by digest) is for replicas."""
        if isinstance(event, PeerCommitted):
            self._raise_target(event.seq_no, event.block_hash)
            self._follow()

    def _raise_target(self, number: int, block_hash: bytes) -> None:
        if self._target is None or number > self._target[0]:
            self._target = (number, block_hash)

    def _on_pushed(self, sender: bytes, pushed: Committed) -> None:
        """A validator's push: the first copy of a block above what this node holds or is
        importing is verified now and held (a full hold makes it a fetch target instead);
        every other copy is dropped unchecked."""
        number = pushed.number
        if number <= self._reached() or number in self._held:
            return
        block_hash = self.sync.certify(sender, pushed)
        if block_hash is None:
            return
        size = len(pushed.block) + len(pushed.certificate)
        if len(self._held) >= MAX_HELD_BLOCKS or self._held_bytes + size > MAX_HELD_BYTES:
            self._raise_target(number, block_hash)
        else:
            self._held[number] = (number, pushed.block, pushed.certificate, block_hash)
            self._held_bytes += size
        self._follow()

    def _reached(self) -> int:
        """The highest block imported, or being imported or fetched now."""
        return max(self.context.head().block_number, self._fetching or 0, self._importing or 0)

    def _follow(self) -> None:
        """The next step, if none is under way: import the held block after the head, else
        fetch up to just below the lowest one held (its pushes were lost), else up to the
        highest certified head heard of; nothing past `stop_at`."""
        if self._fetching is not None or self._importing is not None:
            return
        head = self.context.head().block_number
        self._forget_held(head)
        stop = self.stop_at()
        if stop is not None and stop <= head:
            self._target = None
            self._drop_held()  # this node votes from stop + 1
        elif head + 1 in self._held:
            self._importing = head + 1
            self._tasks.spawn(self._import(self._held[head + 1]), "observer import")
        elif self._held:
            self._start_fetch(min(self._held) - 1, b"")
        elif self._target is not None and self._target[0] > head:
            self._start_fetch(*self._target)
        else:
            self._target = None

    def _forget_held(self, up_to: int) -> None:
        """Held blocks at or below `up_to` (imported, or never to be imported here)."""
        if any(number <= up_to for number in self._held):
            self._held = {n: held for n, held in self._held.items() if n > up_to}
            self._held_bytes = sum(len(b) + len(c) for _, b, c, _ in self._held.values())

    def _drop_held(self) -> None:
        self._held, self._held_bytes = {}, 0

    def _start_fetch(self, target: int, block_hash: bytes) -> None:
        self._fetching = target
        self._tasks.spawn(self._fetch(target, block_hash), "observer catch-up")

    async def _import(self, held: CertifiedBlock) -> None:
        """Execute and import one held block; one that fails is dropped (fetched instead)."""
        try:
            await self.sync.import_certified([held])
        except StorageFailure:
            raise  # the database reported it: the node stops
        except Exception:  # logged; its fetch tries again
            log.exception("observer: importing pushed block %d failed", held[0])
            self._forget_held(held[0])
            self._raise_target(held[0], held[3])
        finally:
            self._importing = None
        self.on_progress()
        self._follow()

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
        if isinstance(outcome, FetchFailed):
            # tried again at the next push, announcement or poll, not at once
            self._drop_held()
            if self._target == (target, block_hash):
                self._target = None
        self.on_progress()
        self._follow()

    def describe(self) -> dict[str, Any]:
        """pbft_status's fields for an observer."""
        return {
            "lastExecuted": self.context.head().block_number,
            "fetching": self._fetching,
            "mode": Mode.CATCHING_UP.value if self._fetching is not None else OBSERVING,
        }
