"""What a replica reports of itself (status, metrics, logs) and the chain head it is given,
and the limits of its request timer's fairness rule: plain values, beside `core.replica`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

# The hash a block's bytes claim (its digest), or None for bytes that are no block. Blocks
# travel unsigned: every copy taken from a message is checked against the digest it is for.
BlockDigest = Callable[[bytes], bytes | None]


@dataclass(frozen=True)
class ChainHead:
    """The last block imported into the chain (the last executed seqNo), and its state root
    (b"": not given). `Replica.restore` needs the root: a head at a checkpoint multiple may
    still owe its CHECKPOINT (`handover.checkpoint_restored_head`)."""

    seq_no: int
    block_hash: bytes
    state_root: bytes = b""


# Commits that may pass over the oldest waiting request before they stop restarting the
# request timer. Pools see transactions in different orders: in a burst, everything the
# primary received before the oldest request reached it goes first, and that may be many
# blocks' worth (an honest 600-transaction burst at N = 4 passed one over 15 times). So at
# the fairness mark (a quarter of the request timeout after the oldest became the oldest:
# it has reached the primary by then, by gossip or relayed by this backup) the backlog that
# arrived here before it earns a grace of one commit per FAIR_BLOCK_TRANSACTIONS of it:
# commits holding only that backlog count against the grace, every other commit (one with a
# newer request, an empty one, or one of transactions this backup never held) against
# MAX_PASSED_OVER. A primary that keeps leaving one out while it commits others, or serves
# the backlog a transaction at a time, is censoring it, and the timer then runs out.
MAX_PASSED_OVER = 8
FAIR_BLOCK_TRANSACTIONS = 8
# Waiting requests a backup relays to the primary when it starts timing it, and again halfway
# (the oldest): enough for one account's run of nonces that gossip did not deliver there.
RELAYED_REQUESTS = 4
MAX_RELAY_SEND = 128  # a VIEW-CHANGE send after which its requests are relayed no more


class Mode(Enum):
    """What a replica is doing, as one value for status, metrics and logs. The state behind it
    is not one value: a replica can catch up while it changes view (it fetches what a
    NEW-VIEW's checkpoint proves, or what f+1 peers vouch for), so the view status (`active`)
    and the catch-up target (`fetching`) stay apart, and the mode reports the first that
    holds of halted, following, catching-up and view-change."""

    NORMAL = "normal"
    VIEW_CHANGE = "view-change"  # asked for view `view`, waiting for its NEW-VIEW
    CATCHING_UP = "catching-up"  # fetching certified blocks up to `fetching`
    FOLLOWING = "following"  # lost its records: votes only where it cannot contradict itself
    HALTED = "halted"  # an alarm stopped it: it takes no step until an operator acts
    LEFT = "left"  # removed from the set: it voted up to the handover and takes no step


@dataclass(frozen=True)
class ReplicaStatus:
    view: int
    active: bool
    seq_no: int
    low_watermark: int
    high_watermark: int
    primary: int
    stable_checkpoint: int
    last_executed: int
    fetching: int | None
    mode: Mode
