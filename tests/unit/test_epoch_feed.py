"""The adapter's view of the schedule: what committed state fixes, and nothing beyond."""

from __future__ import annotations

import rlp
from eth_utils import keccak

from pbft_engine.core.epochs import Epoch, EpochSchedule
from pbft_engine.core.params import EngineParams
from pbft_engine.epoch_feed import EpochFeed, validators_hash

A, B, C, D, E = (bytes([i]) * 20 for i in range(1, 6))
GENESIS = (A, B, C, D)


def params() -> EngineParams:
    return EngineParams(chain_id=1, validators=GENESIS, checkpoint_interval=10, max_in_flight=2)


class StateSchedules:
    """Committed state by block hash: the registry's schedule at each head."""

    def __init__(self) -> None:
        self.genesis = EpochSchedule.genesis(params())
        self.by_hash: dict[bytes, EpochSchedule] = {}
        self.reads = 0

    def read(self, block_hash: bytes) -> EpochSchedule:
        self.reads += 1
        return self.by_hash.get(block_hash, self.genesis)


def test_horizon_is_the_first_checkpoint_a_change_above_the_head_cannot_reach_before() -> None:
    state = StateSchedules()
    feed = EpochFeed(state.genesis, state.read)
    for head, horizon in ((0, 10), (7, 10), (8, 20), (10, 20), (17, 20), (18, 30)):
        feed.refresh(head, bytes([head]) * 32)
        assert feed.horizon == horizon, head
        # a change passing in the next block (head + 1) takes effect after a checkpoint
        # at or above the horizon: every height up to it keeps the set known now
        later = state.genesis.schedule((A, B, C, D, E), passed_at=head + 1)
        assert later.epochs[1].first > feed.horizon
        assert feed.epoch_at(feed.horizon) == state.genesis.epochs[0]
        assert feed.epoch_at(feed.horizon + 1) is None
        assert feed.next_set_hash(feed.horizon) is None


def test_a_change_in_state_is_read_once_per_head_and_decides_its_heights() -> None:
    state = StateSchedules()
    feed = EpochFeed(state.genesis, state.read)
    feed.refresh(5, b"\x05" * 32)
    changed = state.genesis.schedule((A, B, C, D, E), passed_at=6)
    state.by_hash[b"\x06" * 32] = changed
    feed.refresh(6, b"\x06" * 32)
    feed.refresh(6, b"\x06" * 32)
    assert state.reads == 2
    assert feed.schedule == changed
    assert feed.epoch_at(10) == Epoch(0, 1, GENESIS)
    assert feed.epoch_at(11) == Epoch(1, 11, (A, B, C, D, E), passed_at=6)
    assert feed.next_set_hash(10) == validators_hash((A, B, C, D, E))
    assert feed.next_set_hash(9) == validators_hash(GENESIS)
    assert feed.members() == frozenset({A, B, C, D, E})


def test_a_removed_validator_stays_a_member_until_the_head_passes_its_last_height() -> None:
    state = StateSchedules()
    removed = state.genesis.schedule((A, B, C), passed_at=3)  # D leaves after block 10
    state.by_hash = {bytes([n]) * 32: removed for n in range(3, 12)}
    feed = EpochFeed(state.genesis, state.read)
    feed.refresh(10, b"\x0a" * 32)
    assert D in feed.members()  # its CHECKPOINT at 10 may come after block 10 committed here
    feed.refresh(11, b"\x0b" * 32)
    assert D not in feed.members()


def test_the_header_commitment_is_the_sorted_set_hashed() -> None:
    assert validators_hash((C, A, B)) == keccak(rlp.encode([A, B, C]))
    assert validators_hash((C, A, B)) == validators_hash((A, B, C))
    assert validators_hash((A, B)) != validators_hash((A, B, C))
