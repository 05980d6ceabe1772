"""The transport's counters, read by the node's metrics."""

from __future__ import annotations

from collections import Counter

from chain.p2p.wire import Channel


class TransportStats:
    """Counters for metrics; `snapshot()` is what `Transport.stats()` returns."""

    def __init__(self) -> None:
        self.frames_in: Counter[str] = Counter()
        self.bytes_in: Counter[str] = Counter()
        self.frames_out: Counter[str] = Counter()
        self.bytes_out: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.handshakes_refused: Counter[str] = Counter()
        self.handshakes_completed = 0
        self.duplicates_closed = 0

    def snapshot(self) -> dict[str, object]:
        return {
            "frames_in": dict(self.frames_in),
            "bytes_in": dict(self.bytes_in),
            "frames_out": dict(self.frames_out),
            "bytes_out": dict(self.bytes_out),
            "dropped": dict(self.dropped),
            "handshakes_refused": dict(self.handshakes_refused),
            "handshakes_completed": self.handshakes_completed,
            "duplicates_closed": self.duplicates_closed,
        }


def channel_name(channel: int) -> str:
    try:
        return Channel(channel).name.lower()
    except ValueError:
        return f"channel_{channel}"
