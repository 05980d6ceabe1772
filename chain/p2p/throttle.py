"""A log that a flood cannot fill: the first few events of an interval are logged in full at
once, the rest of it as one summary line with counts by reason.

Used for what unauthenticated parties trigger (refused p2p handshakes, WebSocket clients the
RPC server cuts): one line per event was 13.6 MB of log in 40 s of a handshake flood.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

SUMMARY_INTERVAL = 10.0  # seconds
FULL_LINES = 5  # logged in full per interval


class ThrottledLog:
    """At most `FULL_LINES` full lines and one summary line per `interval`."""

    def __init__(self, logger: logging.Logger, what: str, interval: float = SUMMARY_INTERVAL):
        self._logger = logger
        self._what = what  # "refused handshakes": the summary's subject
        self._interval = interval
        self._window_end = 0.0
        self._logged = 0  # full lines in the current window
        self._suppressed: Counter[str] = Counter()
        self._level = logging.DEBUG
        self._summary: asyncio.TimerHandle | None = None

    def log(self, level: int, reason: str, message: str, *args: object) -> None:
        """Log `message` now if the interval has room for it; else count `reason` for the
        summary at the interval's end (logged at the highest level counted)."""
        now = time.monotonic()
        if now >= self._window_end and self._summary is None:
            self._window_end, self._logged = now + self._interval, 0
        if self._logged < FULL_LINES:
            self._logged += 1
            self._logger.log(level, message, *args)
            return
        self._suppressed[reason] += 1
        self._level = max(self._level, level)
        if self._summary is None:
            delay = max(self._window_end - now, 0.0)
            self._summary = asyncio.get_running_loop().call_later(delay, self._flush)

    def _flush(self) -> None:
        self._summary = None
        if not self._suppressed:
            return
        counts = ", ".join(f"{reason} {n}" for reason, n in self._suppressed.most_common())
        total = sum(self._suppressed.values())
        elapsed = time.monotonic() - (self._window_end - self._interval)
        self._logger.log(self._level, "%d more %s in the last %.1f s: %s",
                         total, self._what, elapsed, counts)
        self._suppressed.clear()
        self._level = logging.DEBUG
        self._window_end, self._logged = time.monotonic() + self._interval, FULL_LINES

    def close(self) -> None:
        """Log what is still counted (on stop)."""
        if self._summary is not None:
            self._summary.cancel()
            self._flush()
