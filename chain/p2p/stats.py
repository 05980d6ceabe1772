"""The transport's counters, read by the node's metrics."""

from __future__ import annotations

from collections import Counter

from chain.p2p.wire import Channel

# Every reason the transport drops a frame for (a unit test reads them from its source): each
# is counted from zero at start, so the metric p2p_dropped_frames_total exists for every
# reason before the first drop and `increase()` sees that first one.
DROP_REASONS = (
    "unknown_peer",  # send: not a validator of this transport
    "too_large",  # send: over the frame cap
    "not_running",  # send: the transport is stopped
    "queue_full",  # send: the peer's queue is at its bound
    "not_connected",  # send: an observer that is not connected (nothing queued for it)
    "bad_frame",  # read or handshake: a malformed frame
    "auth_failure",  # a refused handshake
    "decrypt_failure",  # a frame that does not open under the session keys
    "unknown_channel",  # a frame on no channel this node serves
    "handler_error",  # a message handler raised
)


class TransportStats:
    """Counters for metrics; `snapshot()` is what `Transport.stats()` returns."""

    def __init__(self) -> None:
        self.frames_in: Counter[str] = Counter()
        self.bytes_in: Counter[str] = Counter()
        self.frames_out: Counter[str] = Counter()
        self.bytes_out: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter(dict.fromkeys(DROP_REASONS, 0))
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
