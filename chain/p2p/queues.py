"""Per-peer send queues, bounded."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class SendQueue:
    """Per-peer outbound queue bounded in frames and bytes; full means drop, never wait."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self._items: deque[tuple[int, bytes]] = deque()
        self._bytes = 0
        self._not_empty = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def put(self, channel: int, payload: bytes) -> bool:
        size = len(payload)
        if len(self._items) >= self._max_frames or self._bytes + size > self._max_bytes:
            return False
        self._items.append((channel, payload))
        self._bytes += size
        self._not_empty.set()
        return True

    async def get(self, timeout: float) -> tuple[int, bytes] | None:
        """The next frame, or None if nothing arrived within `timeout` (time for a keepalive)."""
        if not self._items:
            self._not_empty.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._not_empty.wait(), timeout)
            if not self._items:
                return None
        return self.get_nowait()

    def clear(self) -> None:
        """Drop everything queued (a peer that is gone and is never dialed: nothing waits)."""
        self._items.clear()
        self._bytes = 0

    def get_nowait(self) -> tuple[int, bytes] | None:
        """The next frame, or None if none is queued."""
        if not self._items:
            return None
        channel, payload = self._items.popleft()
        self._bytes -= len(payload)
        return channel, payload
