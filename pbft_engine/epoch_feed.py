"""The epoch schedule as committed state says it, for the adapter (DESIGN.md section 10).

The registry of votes lives in state (`pbft_engine.registry`); what it scheduled is read
after every commit from the head's state, so every node learns a change from the same
committed block. The core hears each new change as a `ScheduleChange`; block sync, the
observer and the header commitment (`extraData`) ask this feed which set decides a height.

What committed state can answer: a change that passes in block b takes effect after the
first checkpoint c >= b + max_in_flight, so no block above the head can change the set of
any height up to the first multiple of K at or above head + 1 + max_in_flight, nor of any
height within K of a change already scheduled (the *horizon*). Above it the set is not
known yet, and nothing there is believed until more is committed.
"""

from __future__ import annotations

from collections.abc import Callable

import rlp
from eth_utils import keccak

from pbft_engine.core.epochs import Epoch, EpochSchedule

# Reads the schedule (every epoch, none installed) from the state at one block's hash.
ScheduleReader = Callable[[bytes], EpochSchedule]


def validators_hash(validators: tuple[bytes, ...]) -> bytes:
    """What block n's extraData holds: keccak256 of the RLP list of the sorted set that
    decides n+1 (CometBFT's NextValidatorsHash): a chain of certified headers proves every
    set change."""
    return keccak(rlp.encode(sorted(validators)))


class EpochFeed:
    """The schedule at the committed head, refreshed after each commit."""

    def __init__(self, genesis: EpochSchedule, read: ScheduleReader) -> None:
        self.schedule = genesis
        self._read = read
        self._head_hash: bytes | None = None
        self.head = 0
        self._members = self._members_from_head()

    def refresh(self, head_number: int, head_hash: bytes) -> None:
        """Read the schedule at the new head (once per head)."""
        if head_hash == self._head_hash:
            return
        self.schedule = self._read(head_hash)
        self._head_hash, self.head = head_hash, head_number
        self._members = self._members_from_head()

    @property
    def horizon(self) -> int:
        """The highest height whose set the committed head fixes (see the module's doc)."""
        return self.schedule.horizon(self.head)

    def epoch_at(self, height: int) -> Epoch | None:
        """The epoch (number and set) that decides `height`; None above the horizon (not
        decided yet)."""
        if height > self.horizon:
            return None
        return self.schedule.epoch_at(height)

    def members(self) -> frozenset[bytes]:
        """Every validator of the epochs from the head's on: the peers believed and heard (the
        head's own: a validator voted out still sends its CHECKPOINT at the handover
        checkpoint c to those that committed c before it, and the handover needs it).
        Computed once per head: every peer message asks."""
        return self._members

    def _members_from_head(self) -> frozenset[bytes]:
        first = self.schedule.epoch_at(self.head).number
        return frozenset(v for e in self.schedule.epochs[first:] for v in e.validators)

    def carried_set_hash(self, height: int) -> bytes | None:
        """What block `height` may commit to besides `next_set_hash`: one the set before an
        override proposed there (T .. T - 1 + max_in_flight) before anyone knew of it, which
        the override's first view carries (`handover.stand_on_override`), committed to the
        set that decided the next height then (the carried blocks' attack review, finding 3)."""
        schedule = self.schedule
        for epoch in schedule.epochs:
            if epoch.override and epoch.first <= height < epoch.first + schedule.max_in_flight:
                return validators_hash(schedule.epochs[epoch.number - 1].validators)
        return None

    def next_set_hash(self, height: int) -> bytes | None:
        """Block `height`'s extraData: the hash of the set that decides height + 1 (None: not
        known yet from committed state)."""
        epoch = self.epoch_at(height + 1)
        return None if epoch is None else validators_hash(epoch.validators)
