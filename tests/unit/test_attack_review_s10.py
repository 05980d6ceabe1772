"""Attack review of session 10's protocol changes (ddf0df2 claimed lag, feff802/d6537c1 the
heaviest sender's highest dropped, 10944ef a built block owed to the handover, b752be7
group commit): an attacker's inputs and interleavings, one test per finding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from eth_hash.auto import keccak

from pbft_engine.core import FetchCompleted, FetchFailed, PeerCommitted, TimerFired, TimerKind
from pbft_engine.core.params import EngineParams
from pbft_engine.messages import Commit, MessageType, Prepare, PrePrepare, ViewChange
from pbft_engine.sync_messages import MAX_BLOCKS_PER_REQUEST, GetBlocks, decode_sync, encode_sync
from tests.unit.pbft.helpers import from_peer
from tests.unit.pbft.test_join_buffer import buffer, wire
from tests.unit.pbft.test_pbft_adapter_boundaries import ServingPeers, catch_up
from tests.unit.pbft.test_pbft_epochs import ADDED, V0
from tests.unit.pbft.test_pbft_resource_bounds import MIB, start_replica
from tests.unit.test_attack_review_core7 import LIE, backup_with_a_waiting_request
from tests.unit.test_attack_review_s8_joiner import JOINED
from tests.unit.test_replica_handover import PASSED_AT, C, block, digest

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


def test_a_peer_serving_one_block_per_request_cannot_hold_a_fetch() -> None:
    """A replica three ranges behind fetches 96 blocks from three peers; the first in turn
    (faulty, or the censoring primary itself) serves each range request with its first
    block alone, valid, just inside REQUEST_TIMEOUT_S (10 s). The next range starts in the
    same turn (`_peers_for`: by first // MAX_BLOCKS_PER_REQUEST), so it is asked for each
    block of its turns (32 requests here: 1..31, and 96): 320 s, while the core, which hears
    of the fetch only when it ends, has `fetching` set and `missed_fetches` at 0, so
    `claimed_lag` excuses every request timeout (2 s: 160 of them), and the replica neither
    votes nor times the primary.
    A replica 1000 blocks behind at N = 4: about 55 minutes; under load (over 0.3 blocks a
    second at N = 4) it never catches up. Fixed (was a strict xfail): a short answer moves
    the turn on, as a failed one does (`BlockSync._import_answer`), so the dribbler holds a
    fetch for one request per turn."""
    dribbler = b"a" * 20
    target = 3 * MAX_BLOCKS_PER_REQUEST
    peers = Dribbling({dribbler: target, b"b" * 20: target, b"c" * 20: target},
                      dribbler=dribbler)
    outcome, faults = catch_up(peers, target)
    assert isinstance(outcome, FetchCompleted) and outcome.seq_no == target
    assert faults == []
    assert len(peers.asked) <= 2, f"the dribbler was asked {len(peers.asked)} times"


# --- finding 2: a relay charges its bytes to the honest signer --------------------------------


def test_a_relay_with_junk_blocks_cannot_make_an_honest_primary_lose_its_own() -> None:
    """The core does not know who relayed a message: a faulty member (or any peer the
    transport let in) forwards view 6's primary's (replica 2, correct) signed PRE-PREPAREs
    1..4 to replica 3, still in view 0, each with a 16 MiB junk block, ahead of the
    primary's own copies (a faster link). `hold_future` keys and sums them under replica 2:
    the first copy stays (its own copies of 1..4 are refused), and its genuine PRE-PREPARE
    5, a 4 KiB block, passes the 64 MiB bound with replica 2 the heaviest sender, so it is
    the one dropped; the relayer holds nothing. Replica 2's own blocks total 20 KiB, far
    under the (bound - the other honest senders' bytes) / (f + 1) that docs/epochs.md says
    a sender keeps; entering view 6, replica 3 fetches four bodies by digest and waits a
    request timeout for 5 to be sent again. The join buffer (`JoinBuffer._sender`: the
    signer; `len(data)`: the relayed copy) charged alike. Fixed (was a strict xfail): the
    core is told which member's link delivered a message (`MessageReceived.sender`), and a
    copy relayed by another member than its signer is not held (`joining.relayed_copy`:
    correct members relay no consensus message)."""
    replica = start_replica()
    honest = [b"view 6's block %d" % n + b"\x00" * 4096 for n in range(1, 6)]
    junk = b"\x01" * (16 * MIB - 1024)
    for seq_no, own in enumerate(honest[:4], 1):
        replica.step(from_peer(PrePrepare(6, seq_no, keccak(own), 2), (junk,), relayed_by=1))
    for seq_no, own in enumerate(honest, 1):
        replica.step(from_peer(PrePrepare(6, seq_no, keccak(own), 2), (own,)))  # its own
    assert all(replica.future[(2, MessageType.PRE_PREPARE, n)].blocks == (own,)
               for n, own in enumerate(honest, 1))


def test_a_relay_with_junk_blocks_cannot_make_the_new_primary_lose_its_own_in_the_join_buffer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 2 in the join buffer (bound scaled to 100 kB, as test_join_buffer's tests do):
    a relayer forwards the new primary's signed PRE-PREPAREs of c+1 .. c+3 to the newcomer
    with 33 kB junk blocks ahead of the primary's own copies; the primary's genuine
    PRE-PREPARE of c+4 (a 1 kB block) passes the bound with the primary the heaviest sender,
    and goes, though its own blocks total 4 kB. Fixed (was a strict xfail): the relayed
    copies are not kept."""
    monkeypatch.setattr(EngineParams, "future_block_bytes", property(lambda self: 100_000))
    kept = buffer()
    own = {n: b"block %d " % n + b"." * 1_000 for n in range(C + 1, C + 5)}
    for n in range(C + 1, C + 4):  # relayed first, each with a junk block
        assert not kept.keep(wire(PrePrepare(0, n, keccak(own[n]), 0), blocks=(b"x" * 33_000,)),
                             JOINED, 9, ADDED[3])
    genuine = {n: wire(PrePrepare(0, n, keccak(block), 0), blocks=(block,))
               for n, block in own.items()}
    for data in genuine.values():
        kept.keep(data, JOINED, 9, ADDED[0])
    assert set(genuine.values()) <= set(kept.take())


# --- finding 3: a certified block held here waits for a failed fetch for good -------------------


def test_a_certified_block_held_up_by_a_failed_fetch_is_executed() -> None:
    """Simulator seed 189 at N = 5, censor class, with --group-commit 20 (passes without: one
    write per step; fails --calm too): V0[1] validated and prepared block 9 of the censoring
    primary V0[0], then the primary claimed a head it cannot serve (`unchecked_claims`;
    in a real cluster a real head whose fetch fails, the network down) and the COMMITs of 9
    arrived during that fetch: 9 is certified here with its body, but `_advance` does
    nothing while a fetch is under way. The fetch fails having imported nothing, and
    `on_fetch_failed` does not go on (`on_fetch_completed` does), so 9 waits for the next
    event that advances; the liar claims again at once each time, and the request timer
    is excused for good, not by the claims (`claimed_lag` stops after two, as here) but by
    the certified block not executed (`_certified_run_end() > last_exec`). At N = 5 every
    honest backup stayed at height 0 in view 0 for the whole run (the heights [1, 0, 0, 0,
    0]): a halt with one faulty replica. Fixed (was a strict xfail): a fetch that fails
    goes on (`replica._advance()`), as one that completes does."""
    driven = backup_with_a_waiting_request()
    n = PASSED_AT + 1
    driven.receive(PrePrepare(0, n, digest(n), 0), V0, (block(n),))
    for i in (2, 3):
        driven.receive(Prepare(0, n, digest(n), i), V0)
    driven.step(PeerCommitted(*LIE, b""))  # a fetch under way
    for i in (0, 2, 3):
        driven.receive(Commit(0, n, digest(n), i), V0)
    assert n in driven.replica.log.certified and driven.replica.last_exec == PASSED_AT
    for _ in range(6):
        driven.step(FetchFailed(LIE[0]))
        driven.step(PeerCommitted(*LIE, b""))  # the liar tells its head again at once
        driven.step(TimerFired(TimerKind.REQUEST, b""))
    assert driven.replica.last_exec == n, "a certified block held here is never executed"
    assert driven.sent(ViewChange), "the censoring primary is never suspected"
