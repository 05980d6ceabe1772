"""Attack review s12 (attacksync): block sync judging the answers it does not import (the
certified horizon block's body, a dropped prefetch) and the catch-up's forgetting of a
claimed head only once it excused a request timeout. Each finding was a strict xfail; both
are fixed (the proof holds `_proving` until its body check ends; `certified_block_hash`
decodes only the header's bytes, and the body's lists are bounded before pyrlp,
`check_block_bounds`). The rules that held are plain tests."""

from __future__ import annotations

import asyncio
import threading

import pytest
import rlp

from chain.blockchain import MAX_BLOCK_LIST_ITEMS, check_body_matches_header
from chain.errors import FalseBodyError
from pbft_engine import sync as sync_module
from pbft_engine.core import (
    FetchCompleted,
    FetchFailed,
    Mode,
    PeerCommitted,
    ReplicaStatus,
    TimerFired,
    TimerKind,
)
from pbft_engine.messages import ViewChange
from pbft_engine.sync import BlockSync, PeerLied, certified_block_hash
from pbft_engine.sync_messages import (
    MAX_BLOCKS_PER_REQUEST,
    Blocks,
    GetBlocks,
    Status,
    encode_sync,
)
from tests.unit.pbft.helpers import fixed_feed
from tests.unit.pbft.test_pbft_adapter_boundaries import CommittingMeanwhile, catch_up
from tests.unit.pbft.test_pbft_catch_up import (
    CHAIN_ID,
    VALIDATORS,
    SyncPeers,
    _block_with_roots,
)
from tests.unit.test_attack_review_core7 import LIE, backup_with_a_waiting_request
from tests.unit.test_replica_handover import PASSED_AT

BEHIND = ReplicaStatus(view=0, active=True, seq_no=2, low_watermark=0, high_watermark=40,
                       primary=0, stable_checkpoint=0, last_executed=2, fetching=None,
                       mode=Mode.NORMAL)


def test_a_head_proved_at_the_horizon_is_proved_one_at_a_time_body_check_included(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 1, fixed. A liar claims a head above the horizon; block sync asks it for the
    horizon block and
    checks that block's body off the loop. `_horizon_from` clears `_proving` when the answer
    arrives, before the body check: the liar's next claim (its next STATUS: every poll for a
    validator, any time to an observer) starts another proof while the first check still
    runs, and so on, each answer (up to MAX_RESPONSE_BYTES, its body as costly to check as
    the liar likes) queued in the loop's default executor, the one validations use. One
    proof at a time must cover its check."""
    release = threading.Event()
    checking = threading.Event()

    def slow_check(block: bytes) -> None:  # a body that takes the liar's time to check
        checking.set()
        release.wait(5)

    monkeypatch.setattr(sync_module, "check_body_matches_header", slow_check)
    liar = b"a" * 20
    peers = SyncPeers()
    requests: list[GetBlocks] = []

    async def claim_and_answer(sync: BlockSync) -> None:
        peers.tick()  # no progress since the last tick: ask every peer where it is
        sync.on_message(liar, encode_sync(Status(10_000, b"\x0f" * 32, b"", b"")))
        await asyncio.sleep(0)  # the proof's task sends its request at its first step
        asked = [m for p, m in peers.sent if isinstance(m, GetBlocks) and m not in requests]
        requests.extend(asked)
        for request in asked:
            answer = _block_with_roots(request.first, false_body=False)
            sync.on_message(liar, encode_sync(Blocks(request.request_id, (answer,))))

    async def attack() -> None:
        sync = BlockSync(peers, None, fixed_feed(VALIDATORS),  # type: ignore[arg-type]
                         deliver=lambda event: None, replica_status=lambda: BEHIND,
                         held_block=lambda n, d: None,  # type: ignore[arg-type,return-value]
                         chain_lock=asyncio.Lock(), poll_interval=1.0)
        sync.start()
        peers.tick()  # progress seen
        try:
            await claim_and_answer(sync)
            assert await asyncio.to_thread(checking.wait, 5), "the first body check started"
            await claim_and_answer(sync)  # the first proof's body is still being checked
            assert len(requests) == 1, "a second proof started during the first one's check"
        finally:
            release.set()
            await sync.stop()

    asyncio.run(attack())


class Decoded(Exception):
    """pyrlp was handed the liar's block whole."""


def test_a_liar_s_block_is_bounded_before_pyrlp_decodes_it_on_the_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 2, fixed. A BLOCKS answer is bounded by `decode_sync` (items, depth), but each
    block in it is an
    opaque string up to MAX_RESPONSE_BYTES, and `certified_block_hash` decodes the whole of
    it with pyrlp on the event loop before it reads the header: a list's cost grows with the
    square of its length (encoding/rlp.py), measured here 0.05 s at 40,000 one-byte items,
    177 s at 2,000,000 (a 2 MB block). A liar serves such a block in answer to a dropped
    prefetch (`_drop`, this session), to a horizon proof (`_horizon_from`), to a range
    (`_import_segment`) or pushes it to an observer (`certify`): the node stops for minutes,
    before any certificate is checked (the body check off the loop decodes it again, in a
    thread that holds the GIL). It must be refused ("undecodable") by a bounded walk
    (`check_rlp_bounds`) before pyrlp sees it. The spy stands for pyrlp's minutes."""
    liar_block = rlp.encode([[b"\x01"] * 17, [b"\x01"] * 2_000_000, [], []])
    decode = rlp.decode

    def spy(data: bytes, *args: object, **kwargs: object) -> object:
        if data == liar_block:
            raise Decoded
        return decode(data, *args, **kwargs)

    monkeypatch.setattr(sync_module.rlp, "decode", spy)
    with pytest.raises(PeerLied):
        certified_block_hash(liar_block, b"", number=1, epoch=fixed_feed(VALIDATORS).epoch_at(1),
                             chain_id=CHAIN_ID)


def test_a_liar_whose_fetches_fail_fast_shields_the_primary_two_timeouts_at_most() -> None:
    """Held (change 2, c0ea254): a liar tells its head many times before the first request
    timeout, each fetch failing at once (no head is forgotten before a timeout excused it),
    then keeps a fetch under way across the second timeout and tells its head again after
    each failure. The primary is excused for two timeouts in a row, as docs/engine.md
    bounds it, and suspected at the third."""
    driven = backup_with_a_waiting_request()
    for _ in range(5):
        driven.step(PeerCommitted(*LIE, b""))
        driven.step(FetchFailed(LIE[0]))
    timeouts = 0
    while not driven.sent(ViewChange) and timeouts < 6:
        driven.step(PeerCommitted(*LIE, b""))  # a fetch under way when the timer runs out
        driven.step(TimerFired(TimerKind.REQUEST, b""))
        timeouts += 1
        driven.step(FetchFailed(LIE[0]))
    assert driven.replica.last_exec == PASSED_AT
    assert timeouts == 3


@pytest.mark.parametrize("short", [False, True])
def test_an_honest_prefetch_the_fetch_drops_is_not_charged(
        short: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held (change 1, `_drop`): the honest answer to a prefetched range is judged and
    dropped, and nobody is charged, whether the replica committed that range through
    consensus meanwhile or the range before it came short (its peer serves up to block 30
    only: the fetch goes on from 31, the answer from 33 judged against the sets head 30
    fixes, up to its horizon 40; a range above the horizon is dropped unjudged)."""
    first_range = MAX_BLOCKS_PER_REQUEST
    target = first_range + 8
    judged: list[int] = []
    check_body = BlockSync._check_body

    async def counted(number: int, block: bytes) -> None:
        judged.append(number)
        await check_body(number, block)

    monkeypatch.setattr(BlockSync, "_check_body", staticmethod(counted))
    peers = CommittingMeanwhile({b"a" * 20: 30 if short else target, b"b" * 20: target,
                                 b"c" * 20: target}, meanwhile=0 if short else target)
    outcome, faults = catch_up(peers, target)
    assert isinstance(outcome, FetchCompleted) and outcome.seq_no == target
    assert faults == [] and judged == list(range(first_range + 1, target + 1))
    if short:
        assert peers.committed == list(range(1, target + 1))


def test_a_body_of_too_many_items_is_refused_before_pyrlp_decodes_it() -> None:
    """Finding 2's other half: the body check off the loop (`check_body_matches_header`, in a
    thread that still takes the interpreter lock) walks the block's lists before pyrlp and
    refuses one list of more items than gas allows any block (`MAX_BLOCK_LIST_ITEMS`)."""
    block = rlp.encode([[b"\x01"] * 17, [b"\x01"] * (MAX_BLOCK_LIST_ITEMS + 1), [], []])
    with pytest.raises(FalseBodyError, match="more than"):
        check_body_matches_header(block)
