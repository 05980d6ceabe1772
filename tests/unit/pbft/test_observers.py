"""Observers and block sync: a validator asks and believes only validators and announces its
commits to the observers; an observer hears the validators' announcements (only theirs, and
only above what it knows), follows the highest certified head one fetch at a time, and no
consensus message from outside the set reaches a replica."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

from eth_hash.auto import keccak

from pbft_engine.core import FetchCompleted, Mode, PeerCommitted, ReplicaStatus
from pbft_engine.engine import PbftEngine
from pbft_engine.observer import Observer, forwarding_shortfall
from pbft_engine.peer_budget import PeerBudget
from pbft_engine.sync import BlockSync
from pbft_engine.sync_messages import Block, GetStatus, Status, encode_sync
from tests.unit.pbft.helpers import fixed_feed
from tests.unit.pbft.test_pbft_catch_up import VALIDATORS, SyncPeers, _block, _certificate

OBSERVER = b"o" * 20
IDLE = ReplicaStatus(view=0, active=True, seq_no=2, low_watermark=0, high_watermark=40,
                     primary=0, stable_checkpoint=0, last_executed=2, fetching=None,
                     mode=Mode.NORMAL)


@dataclass
class MixedPeers(SyncPeers):
    """Two validators and an observer connected."""

    connected: frozenset[bytes] = field(
        default_factory=lambda: frozenset({VALIDATORS[0], VALIDATORS[1], OBSERVER}))

    def peers(self) -> frozenset[bytes]:
        return self.connected


def _validator_sync(peers: MixedPeers, delivered: list[object], store: object = None
                    ) -> BlockSync:
    return BlockSync(peers, store, fixed_feed(VALIDATORS), deliver=delivered.append,  # type: ignore[arg-type]
                     replica_status=lambda: IDLE, held_block=lambda n, d: None,
                     chain_lock=asyncio.Lock(), poll_interval=1.0,
                     sources=lambda: peers.peers() & frozenset(VALIDATORS))


def test_a_validator_asks_and_believes_only_validators() -> None:
    peers = MixedPeers()
    delivered: list[object] = []
    sync = _validator_sync(peers, delivered)
    sync.start()
    peers.tick()
    peers.tick()  # no progress: where are the peers?
    assert sorted(peers.sent) == sorted((v, GetStatus()) for v in VALIDATORS[:2])
    _, head = _block(5)
    certified = Status(5, head, _certificate(5, head, range(3)), b"")
    sync.on_message(OBSERVER, encode_sync(certified))  # true, but an observer's word
    assert delivered == []
    sync.on_message(VALIDATORS[0], encode_sync(certified))
    assert delivered == [PeerCommitted(5, head, certified.certificate)]
    block, digest = _block(3)
    peers.sent.clear()
    sync.want_block(3, digest)
    assert {p for p, _ in peers.sent} == set(VALIDATORS[:2])
    sync.on_message(OBSERVER, encode_sync(Block(3, digest, block)))
    assert len(delivered) == 1, "a body from an observer reached the replica"
    sync.on_message(VALIDATORS[1], encode_sync(Block(3, digest, block)))
    assert len(delivered) == 2


def test_a_validator_announces_each_commit_to_its_observers_only() -> None:
    peers = MixedPeers()
    head = peers.head()
    certificate = _certificate(5, head.hash, range(3))
    store = SimpleNamespace(get=lambda name, key: certificate)
    sync = _validator_sync(peers, [], store)
    sync.announce(5)
    assert peers.sent == [(OBSERVER, Status(5, head.hash, certificate, b""))]
    peers.sent.clear()
    sync.announce(4)  # the head moved on meanwhile: that one announces itself
    assert peers.sent == []


def test_an_observer_hears_validators_announcements_above_what_it_knows() -> None:
    peers = MixedPeers(connected=frozenset({VALIDATORS[0], b"p" * 20}))  # and another observer
    delivered: list[object] = []
    fetching = ReplicaStatus(0, False, 2, 2, 2, 0, 2, 2, 4, Mode.CATCHING_UP)
    sync = BlockSync(peers, None, fixed_feed(VALIDATORS), deliver=delivered.append,  # type: ignore[arg-type]
                     replica_status=lambda: fetching, held_block=lambda n, d: None,
                     chain_lock=asyncio.Lock(), poll_interval=1.0, observer=True)
    for number, sender in ((5, b"p" * 20), (4, VALIDATORS[0])):  # unasked non-validator; known
        _, head = _block(number)
        sync.on_message(sender, encode_sync(
            Status(number, head, _certificate(number, head, range(3)), b"")))
    _, head = _block(5)
    sync.on_message(VALIDATORS[0], encode_sync(Status(5, head, b"garbage", b"")))
    assert delivered == []
    certificate = _certificate(5, head, range(3))
    sync.on_message(VALIDATORS[0], encode_sync(Status(5, head, certificate, b"")))
    assert delivered == [PeerCommitted(5, head, certificate)]


def test_an_observer_follows_the_highest_certified_head_one_fetch_at_a_time() -> None:
    async def scenario() -> tuple[list[int], int]:
        peers = MixedPeers()
        chain = SimpleNamespace(block_number=0)
        peers.head = lambda: chain  # type: ignore[method-assign]
        observer = Observer(peers, None, fixed_feed(VALIDATORS),  # type: ignore[arg-type]
                            chain_lock=asyncio.Lock(), poll_interval=1.0,
                            on_peer_fault=lambda peer, kind: None)
        fetched: list[int] = []
        release = asyncio.Event()

        async def fetch(target: int, block_hash: bytes, stop_at: object) -> FetchCompleted:
            fetched.append(target)
            await release.wait()
            chain.block_number = target
            return FetchCompleted(target, block_hash, b"", ())

        observer.sync.fetch = fetch  # type: ignore[method-assign]
        for number in (3, 5, 4):  # 5 and 4 arrive while 3 is fetched
            observer.sync.deliver(PeerCommitted(number, keccak(b"%d" % number), b""))
        await asyncio.sleep(0)
        assert observer.status().fetching == 3 and fetched == [3]
        release.set()
        while observer.status().fetching is not None or chain.block_number < 5:
            await asyncio.sleep(0)
        observer.sync.deliver(PeerCommitted(5, keccak(b"5"), b""))  # nothing above: no fetch
        await asyncio.sleep(0)
        await observer.stop()
        return fetched, chain.block_number

    assert asyncio.run(asyncio.wait_for(scenario(), 10)) == ([3, 5], 5)


def test_a_consensus_message_from_outside_the_set_never_reaches_the_replica() -> None:
    stepped: list[object] = []
    engine = PbftEngine.__new__(PbftEngine)
    engine.engine_params = SimpleNamespace(validators=VALIDATORS)  # type: ignore[assignment]
    engine.feed = fixed_feed(VALIDATORS)
    engine.budget = PeerBudget(lambda: 0.0)
    engine.replica = SimpleNamespace(  # type: ignore[assignment]
        view=0, active=True, fetching=None, step=stepped.append)
    engine._perform = lambda ready: None  # type: ignore[method-assign]
    engine.on_message(OBSERVER, b"a VIEW-CHANGE signed by a validator, relayed")
    assert stepped == []
    engine.on_message(VALIDATORS[2], b"a PREPARE")
    assert len(stepped) == 1


def test_only_a_validators_gossip_is_a_validators() -> None:
    """An observer forwards its clients' transactions on the gossip channel: the pool counts
    them as a client's (its bound behind a nonce gap), since no validator holds them yet."""
    engine = PbftEngine.__new__(PbftEngine)
    engine.feed = fixed_feed(VALIDATORS)
    assert engine.is_validator(VALIDATORS[3])
    assert not engine.is_validator(OBSERVER)


def test_block_sync_messages_are_charged_to_their_sender() -> None:
    """An observer flooding a validator with requests (or a peer an observer with claims) is
    dropped once it has used up its budget, as for consensus messages."""
    handled: list[bytes] = []
    dropped: list[bytes] = []
    engine = PbftEngine.__new__(PbftEngine)
    engine.budget = PeerBudget(lambda: 0.0, burst=1e-9)  # any message runs it dry
    engine.sync = SimpleNamespace(  # type: ignore[assignment]
        on_message=lambda sender, payload, charge: handled.append(payload))
    engine.metrics = SimpleNamespace(  # type: ignore[assignment]
        peer_fault=lambda peer, kind: None, peer_dropped=dropped.append)
    engine.log = SimpleNamespace(warning=lambda *args: None)  # type: ignore[assignment]
    engine.on_sync_message(OBSERVER, b"GET_STATUS")
    engine.on_sync_message(OBSERVER, b"GET_STATUS again")
    assert handled == [b"GET_STATUS"] and dropped == [OBSERVER]


def test_an_observer_dialing_fewer_than_f_plus_one_validators_is_told_so() -> None:
    """Four validators (f = 1): two of them dialed reach an honest one whatever f does."""
    assert forwarding_shortfall(frozenset(VALIDATORS[:2]) | {OBSERVER}, VALIDATORS) is None
    warning = forwarding_shortfall(frozenset(VALIDATORS[:1]) | {OBSERVER}, VALIDATORS)
    assert warning is not None and "dials 1 of the 4 validators" in warning


def test_an_observer_voted_in_fetches_nothing_past_its_handover_checkpoint() -> None:
    """It votes from c + 1: a block above c imported as an observer would make it join late
    (no vote, and no checkpoint, for the heights in between)."""
    peers = MixedPeers()
    chain = SimpleNamespace(block_number=10)
    peers.head = lambda: chain  # type: ignore[method-assign]
    observer = Observer(peers, None, fixed_feed(VALIDATORS),  # type: ignore[arg-type]
                        chain_lock=asyncio.Lock(), poll_interval=1.0,
                        on_peer_fault=lambda peer, kind: None, stop_at=lambda: 10)
    fetched: list[int] = []

    async def fetch(target: int, block_hash: bytes, stop_at: object) -> FetchCompleted:
        fetched.append(target)
        return FetchCompleted(target, block_hash, b"", ())

    observer.sync.fetch = fetch  # type: ignore[method-assign]
    observer.sync.deliver(PeerCommitted(15, keccak(b"15"), b""))
    assert fetched == [] and observer.status().fetching is None

