"""Validators push each committed block with its certificate to their observers, encoded once
for all of them; an observer verifies the first copy of each block above what it holds, holds
it (bounded) while it executes the one before, imports in order, and fetches what was not
pushed to it. No round trip per block, and nothing unverified is held. And a validator's
polls decode the NEW-VIEW its peers' STATUS answers carry once, not at every answer."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
from eth_hash.auto import keccak

import pbft_engine.observer as observer_module
import pbft_engine.sync as sync_module
from pbft_engine.core import FetchCompleted
from pbft_engine.messages import Authenticator, KeyVerifier, NewView
from pbft_engine.observer import Observer
from pbft_engine.sync import MAX_PUSHED_BYTES, BlockSync, CertifiedBlock
from pbft_engine.sync_messages import Committed, Status, decode_sync, encode_sync
from tests.unit.pbft.helpers import fixed_feed
from tests.unit.pbft.test_observers import IDLE, OBSERVER, MixedPeers
from tests.unit.pbft.test_pbft_catch_up import (
    CHAIN_ID,
    SIGNERS,
    VALIDATORS,
    _block,
    _certificate,
)

OTHER_OBSERVER = b"p" * 20


def _push(number: int, signers: range = range(3)) -> Committed:
    block, block_hash = _block(number)
    return Committed(number, block, _certificate(number, block_hash, signers))


@dataclass
class RawPeers(MixedPeers):
    """Keeps the bytes sent, to see that one encoding goes to every observer."""

    raw: list[tuple[bytes, bytes]] = field(default_factory=list)

    def send_sync(self, peer: bytes, payload: bytes) -> None:
        self.raw.append((peer, payload))
        super().send_sync(peer, payload)


def test_a_validator_pushes_each_commit_to_its_observers_encoded_once() -> None:
    peers = RawPeers(connected=frozenset({VALIDATORS[0], OBSERVER, OTHER_OBSERVER}))
    head = peers.head()
    certificate = _certificate(5, head.hash, range(3))
    held = {5: b"the block"}
    sync = BlockSync(peers, SimpleNamespace(get=lambda name, key: certificate),  # type: ignore[arg-type]
                     fixed_feed(VALIDATORS), deliver=lambda event: None,
                     replica_status=lambda: IDLE,
                     held_block=lambda n, digest: held.get(n) if digest == head.hash else None,
                     chain_lock=asyncio.Lock(), poll_interval=1.0,
                     sources=lambda: peers.peers() & frozenset(VALIDATORS))
    sync.announce(5)
    assert sorted(peers.sent) == sorted(
        (o, Committed(5, b"the block", certificate)) for o in (OBSERVER, OTHER_OBSERVER))
    assert peers.raw[0][1] is peers.raw[1][1]
    peers.sent.clear()
    held[5] = b"x" * (MAX_PUSHED_BYTES + 1)  # too large to go to every observer: announced
    sync.announce(5)
    assert {message for _, message in peers.sent} == {Status(5, head.hash, certificate, b"")}


def test_a_pushed_block_travels_as_it_was_sent() -> None:
    assert decode_sync(encode_sync(_push(9))) == _push(9)


@dataclass
class Following:
    """An observer on a chain at `head`, whose imports and fetches wait for `release`."""

    head: int = 0
    stop: int | None = None
    imported: list[int] = field(default_factory=list)
    fetched: list[int] = field(default_factory=list)
    faults: list[tuple[bytes, str]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    observer: Observer = field(init=False)

    def __post_init__(self) -> None:
        peers = MixedPeers()
        peers.head = lambda: SimpleNamespace(  # type: ignore[method-assign]
            block_number=self.head, hash=keccak(b"%d" % self.head))
        self.observer = Observer(
            peers, None, fixed_feed(VALIDATORS), chain_lock=asyncio.Lock(),  # type: ignore[arg-type]
            poll_interval=1.0, on_peer_fault=lambda peer, kind: self.faults.append((peer, kind)),
            stop_at=lambda: self.stop)
        self.observer.sync.import_certified = self._import  # type: ignore[method-assign]
        self.observer.sync.fetch = self._fetch  # type: ignore[method-assign]

    async def _import(self, blocks: Sequence[CertifiedBlock]) -> list[object]:
        assert [number for number, *_ in blocks] == [self.head + 1], "out of order"
        self.imported.append(blocks[0][0])
        await self.release.wait()
        self.head = blocks[0][0]
        return []

    async def _fetch(self, target: int, block_hash: bytes, stop_at: object) -> FetchCompleted:
        self.fetched.append(target)
        await self.release.wait()
        self.head = target
        return FetchCompleted(target, block_hash, b"", ())

    def push(self, message: Committed, sender: bytes = VALIDATORS[0]) -> None:
        self.observer.sync.on_message(sender, encode_sync(message))

    async def settle(self) -> None:
        """Until nothing is imported or fetched (each step is a task of its own)."""
        self.release.set()
        for _ in range(100):
            await asyncio.sleep(0)
            if self.observer.status().fetching is None:
                return
        raise AssertionError("the observer never settled")


def _follow(scenario: Following, steps: object) -> None:
    async def run() -> None:
        try:
            await steps  # type: ignore[misc]
        finally:
            await scenario.observer.stop()

    asyncio.run(asyncio.wait_for(run(), 10))


def test_pushed_blocks_are_verified_held_and_imported_in_order_while_the_next_arrive() -> None:
    async def steps(f: Following) -> None:
        f.push(_push(1))
        await asyncio.sleep(0)
        assert f.imported == [1] and f.observer.status().fetching == 1
        for number in (2, 3):  # arrive while block 1 executes: verified and held
            for validator in VALIDATORS:  # every validator pushes every block
                f.push(_push(number), validator)
        assert sorted(f.observer._held) == [1, 2, 3]
        await f.settle()
        assert f.imported == [1, 2, 3] and f.head == 3 and f.fetched == []
        assert not f.observer._held

    scenario = Following()
    _follow(scenario, steps(scenario))


def test_a_copy_already_held_or_imported_is_not_verified_again() -> None:
    async def steps(f: Following) -> None:
        checked: list[int] = []
        certify = f.observer.sync.certify
        f.observer.sync.certify = lambda sender, pushed: (  # type: ignore[method-assign]
            checked.append(pushed.number) or certify(sender, pushed))
        for validator in VALIDATORS:
            f.push(_push(1), validator)
            f.push(_push(2), validator)
        await f.settle()
        for validator in VALIDATORS:
            f.push(_push(2), validator)
        assert checked == [1, 2] and f.imported == [1, 2]

    scenario = Following()
    _follow(scenario, steps(scenario))


def test_a_false_push_or_an_observers_is_never_held() -> None:
    async def steps(f: Following) -> None:
        f.push(_push(1, range(2)))  # two signatures: short of a quorum of 4
        f.push(Committed(1, b"\x01\x02", _push(1).certificate))  # not a block
        f.push(_push(1), OBSERVER)  # true, but not a validator's
        f.push(_push(1), OTHER_OBSERVER)
        await f.settle()
        assert f.imported == [] and not f.observer._held
        assert f.faults == [(VALIDATORS[0], "bad_certificate"), (VALIDATORS[0], "undecodable")]
        f.push(_push(1), VALIDATORS[1])  # the true copy is still taken
        await f.settle()
        assert f.imported == [1]

    scenario = Following()
    _follow(scenario, steps(scenario))


def test_what_was_not_pushed_is_fetched_then_the_held_blocks_imported() -> None:
    async def steps(f: Following) -> None:
        f.push(_push(4))  # blocks 1-3 were never pushed here (it started late)
        f.push(_push(5))
        await asyncio.sleep(0)
        assert f.fetched == [3] and f.imported == []
        await f.settle()
        assert f.imported == [4, 5] and f.head == 5

    scenario = Following()
    _follow(scenario, steps(scenario))


def test_the_held_blocks_are_bounded_and_what_overflows_is_fetched(
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = 4  # below the horizon of the fixed feed (blocks up to 10 at genesis)
    monkeypatch.setattr(observer_module, "MAX_HELD_BLOCKS", held)

    async def steps(f: Following) -> None:
        f.push(_push(1))  # executing: what follows is held
        for number in range(2, 8):
            f.push(_push(number))
        assert sorted(f.observer._held) == list(range(1, held + 1))
        await f.settle()
        assert f.imported == list(range(1, held + 1)) and f.fetched == [7] and f.head == 7

    scenario = Following()
    _follow(scenario, steps(scenario))


def test_an_observer_voted_in_imports_no_pushed_block_past_its_handover() -> None:
    async def steps(f: Following) -> None:
        for number in (1, 2, 3):
            f.push(_push(number))
        await f.settle()
        assert f.imported == [1, 2] and f.head == 2 and not f.observer._held

    scenario = Following(stop=2)
    _follow(scenario, steps(scenario))


def test_a_new_view_not_above_the_replicas_view_is_decoded_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[bytes] = []
    real = sync_module.decode_signed_bytes
    monkeypatch.setattr(sync_module, "decode_signed_bytes",
                        lambda data, kind: decoded.append(data) or real(data, kind))
    auth = Authenticator(CHAIN_ID, VALIDATORS, KeyVerifier())
    new_view = auth.sign(NewView(1, (), (), 1), SIGNERS[1]).encode()
    peers = MixedPeers()
    view = {"now": 0}
    delivered: list[object] = []
    sync = BlockSync(peers, None, fixed_feed(VALIDATORS), deliver=delivered.append,  # type: ignore[arg-type]
                     replica_status=lambda: dataclasses.replace(IDLE, view=view["now"]),
                     held_block=lambda n, d: None, chain_lock=asyncio.Lock(), poll_interval=1.0,
                     sources=lambda: peers.peers() & frozenset(VALIDATORS))
    sync.start()
    peers.tick()  # progress seen: the next ticks without any ask
    _, head = _block(2)

    def poll() -> None:
        """A tick without progress, and both validators' answers."""
        peers.tick()
        for validator in VALIDATORS[:2]:
            sync.on_message(validator, encode_sync(Status(2, head, b"", new_view)))

    poll()  # a replica left behind in view 0 is offered it at every answer
    assert len(decoded) == 2 and len(delivered) == 2
    view["now"] = 1  # it moved to view 1
    for _ in range(3):
        poll()
    assert len(decoded) == 3 and len(delivered) == 2
