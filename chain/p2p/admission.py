"""Which inbound connections may hold a pending-handshake slot.

Anyone who reaches the p2p port can open connections and say nothing; before this, 64 such
connections held every slot for the whole handshake deadline and a restarted validator stayed
at 0 peers. Now:
- at most `max_pending_per_ip` pending handshakes per source IP, `max_pending_handshakes` in all;
- a connection that arrives when its IP (or the whole table) is full takes the slot of the
  oldest *silent* pending connection (one that has not sent its HELLO yet) of its IP (or of
  the IP holding the most slots), which is closed as `evicted`. A validator sends its HELLO as
  soon as it connects, so once its HELLO is in it is only ever refused for its own deadline;
  silent connections cannot keep it out, however many one address opens.
- outbound dials (to the configured validators' endpoints) never take an inbound slot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

_ids = count()


@dataclass(eq=False)
class PendingHandshake:
    """One inbound connection between accept and the end of its handshake."""

    ip: str
    abort: Callable[[], None]  # closes the connection (its handshake then fails)
    greeted: bool = False  # its HELLO arrived: no longer evictable
    evicted: bool = False
    key: int = field(default_factory=lambda: next(_ids))


class PendingHandshakes:
    """The pending inbound handshakes, bounded in total and per source IP."""

    def __init__(self, max_total: int, max_per_ip: int) -> None:
        self._max_total = max_total
        self._max_per_ip = max_per_ip
        self._pending: dict[int, PendingHandshake] = {}  # oldest first
        self._per_ip: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._pending)

    def admit(self, ip: str, abort: Callable[[], None]) -> PendingHandshake | str:
        """A slot for a connection from `ip` (evicting a silent one if need be), or the reason
        it is refused: `per_ip_limit` or `too_many_pending` (every slot past its HELLO)."""
        if self._per_ip[ip] >= self._max_per_ip:
            if not self._evict_from(ip):
                return "per_ip_limit"
        elif len(self._pending) >= self._max_total and not self._evict_any():
            return "too_many_pending"
        pending = PendingHandshake(ip, abort)
        self._pending[pending.key] = pending
        self._per_ip[ip] += 1
        return pending

    def release(self, pending: PendingHandshake) -> None:
        """The handshake ended (done, refused or evicted); idempotent."""
        if self._pending.pop(pending.key, None) is not None:
            self._per_ip[pending.ip] -= 1
            if not self._per_ip[pending.ip]:
                del self._per_ip[pending.ip]

    def _evict_any(self) -> bool:
        """Evict a silent connection of the IP holding the most slots (then of the next)."""
        return any(self._evict_from(ip) for ip, _ in self._per_ip.most_common())

    def _evict_from(self, ip: str) -> bool:
        victim = next((p for p in self._pending.values() if p.ip == ip and not p.greeted), None)
        if victim is None:
            return False
        victim.evicted = True
        self.release(victim)
        victim.abort()
        return True
