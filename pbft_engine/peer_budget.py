"""Each peer's share of the event loop that runs consensus.

Every message a validator sends is decoded and its signatures checked on the loop before
the core can tell whether it was worth it; bounds on each message type (`messages`) cap one
message's cost, and this caps a peer's rate: a token bucket of CPU time per peer (Castro &
Liskov's "a faulty replica cannot slow the others down" needs exactly this, as Clement et
al.'s Aardvark, NSDI 2009, measured). An honest validator spends a few milliseconds a second
here at full load (a PREPARE and a COMMIT a block, a signature each); a peer that spends its
whole budget is dropped until the bucket refills, and each time it runs dry it is counted as
a fault against it: evidence for the operator, not an outage for the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# CPU seconds of message handling a peer may use per second, and at once (a burst such as a
# NEW-VIEW with its VIEW-CHANGEs): twenty times an honest validator's share at full load.
RATE = 0.2
BURST = 1.0

# What a peer's time is spent on: its messages (consensus and block sync, serving included)
# and the transactions it gossips, each with a bucket of its own, so that a validator
# forwarding a burst of its clients' transactions never gets its votes dropped.
MESSAGES = "messages"
GOSSIP = "gossip"


@dataclass
class _Bucket:
    tokens: float
    updated: float
    dry: bool = False


class PeerBudget:
    """CPU-time buckets by peer and kind of work (`MESSAGES`, `GOSSIP`); `charge` after
    handling a message, `allows` before."""

    def __init__(self, clock: Callable[[], float], rate: float = RATE, burst: float = BURST
                 ) -> None:
        self.clock = clock
        self.rate = rate
        self.burst = burst
        # validators and the observers a validator lets in: bounded by the configuration
        self._buckets: dict[tuple[bytes, str], _Bucket] = {}

    def _bucket(self, peer: bytes, work: str) -> _Bucket:
        now = self.clock()
        bucket = self._buckets.setdefault((peer, work), _Bucket(self.burst, now))
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
        bucket.updated = now
        return bucket

    def allows(self, peer: bytes, work: str = MESSAGES) -> bool:
        """Whether the peer has budget left; False while its bucket refills."""
        bucket = self._bucket(peer, work)
        if bucket.tokens > 0:
            bucket.dry = False
        return bucket.tokens > 0

    def charge(self, peer: bytes, seconds: float, work: str = MESSAGES) -> bool:
        """Spend `seconds` of the peer's budget; True when this ran it dry (a new fault)."""
        bucket = self._bucket(peer, work)
        bucket.tokens -= seconds
        ran_dry = bucket.tokens <= 0 and not bucket.dry
        bucket.dry = bucket.dry or ran_dry
        return ran_dry
