"""Attack review of session 10's protocol changes (ddf0df2 claimed lag, feff802/d6537c1 the
heaviest sender's highest dropped, 10944ef a built block owed to the handover, b752be7
group commit): an attacker's inputs and interleavings, one test per finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pbft_engine.core import FetchCompleted
from pbft_engine.sync_messages import MAX_BLOCKS_PER_REQUEST, GetBlocks, decode_sync, encode_sync
from tests.unit.pbft.test_pbft_adapter_boundaries import ServingPeers, catch_up

# --- finding 1: a peer that serves its ranges one block at a time holds a fetch for good -------


@dataclass
class Dribbling(ServingPeers):
    """`dribbler` answers every GET_BLOCKS with the range's first block alone: valid, and
    (on a real link) just inside block sync's REQUEST_TIMEOUT_S each time."""

    dribbler: bytes = b""
    asked: list[int] = field(default_factory=list)  # the first block of each range it got

    def send_sync(self, peer: bytes, payload: bytes) -> None:
        request = decode_sync(payload)
        if peer == self.dribbler and isinstance(request, GetBlocks):
            self.asked.append(request.first)
            payload = encode_sync(GetBlocks(request.request_id, request.first, 1))
        super().send_sync(peer, payload)


@pytest.mark.xfail(strict=True, reason="attack review s10, finding 1: a peer answering each "
                   "range with one block is asked again for the next block, its whole turn")
def test_a_peer_serving_one_block_per_request_cannot_hold_a_fetch() -> None:
    """A replica three ranges behind fetches 96 blocks from three peers; the first in turn
    (faulty, or the censoring primary itself) serves each range request with its first
    block alone, valid, just inside REQUEST_TIMEOUT_S (10 s). The next range starts in the
    same turn (`_peers_for`: by first // MAX_BLOCKS_PER_REQUEST), so it is asked for each
    block of its turns (32 requests here: 1..31, and 96): 320 s, while the core, which hears
    of the fetch only when it ends, has `fetching` set and `missed_fetches` at 0, so
    `claimed_lag` excuses every request timeout (2 s: 160 of them), and the replica neither
    votes nor times the primary.
    A replica 1000 blocks behind at N = 4: about 55 minutes. Bounded, a short answer moves
    the turn on (as a failed one does), so the dribbler holds each fetch one request at a
    time per turn."""
    dribbler = b"a" * 20
    target = 3 * MAX_BLOCKS_PER_REQUEST
    peers = Dribbling({dribbler: target, b"b" * 20: target, b"c" * 20: target},
                      dribbler=dribbler)
    outcome, faults = catch_up(peers, target)
    assert isinstance(outcome, FetchCompleted) and outcome.seq_no == target
    assert faults == []
    assert len(peers.asked) <= 2, f"the dribbler was asked {len(peers.asked)} times"
