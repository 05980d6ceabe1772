"""Attack review of issue 31, part 1 (the epoch schedule, observers, the client-work governor).

Each test is a finding: it shows the attack and fails until the fix lands (strict xfail, so
the suite stays green and the fix flips it). Pure core or fake peers, real threads where the
finding is about threads; nothing sleeps to wait (conditions with deadlines).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from eth_hash.auto import keccak

from chain import node as node_module
from chain.errors import TxPoolError
from chain.p2p import Channel
from chain.rpc import served
from pbft_engine.core import ChainHead, MessageReceived, Replica
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.core.view_change import plan_new_view, select_view_changes, verify_new_view
from pbft_engine.engine import PbftEngine
from pbft_engine.messages import KeyVerifier, NewView, PrePrepare, ViewChange, WireMessage
from pbft_engine.peer_budget import PeerBudget
from pbft_engine.sync import BlockSync
from pbft_engine.sync_messages import Blocks, GetBlocks, encode_sync
from testkit.nodes import free_port
from tests.unit.p2p.support import address_of, make_transport, run, wait_for
from tests.unit.p2p.test_observer_links import OBSERVER_KEY, VALIDATORS, _validators
from tests.unit.pbft.helpers import GENESIS, PARAMS, SIGNERS
from tests.unit.pbft.test_observers import IDLE, OBSERVER, MixedPeers
from tests.unit.pbft.test_pbft_catch_up import _block
from tests.unit.pbft.test_pbft_epochs import (
    ADDED,
    MEMBERS,
    REMOVED,
    V0,
    membership,
    scheduled,
    signed,
    view_change,
)

DEADLINE = 5.0
DEADLOCK_SECONDS = 2.0  # two readers of three records each finish in milliseconds


# Finding 1: the governor deadlocks two whole-block reads (Python 3.11's cached_property lock).


class _AnnouncingCondition(threading.Condition):
    """The turns' condition, telling the test when thread "b" waits for its turn (its ticket
    is issued by then: `_Turns.take` increments `_issued` before it waits)."""

    def __init__(self, b_waiting: threading.Event) -> None:
        super().__init__()
        self.b_waiting = b_waiting

    def wait_for(self, predicate: Callable[[], bool],  # type: ignore[override]
                 timeout: float | None = None) -> bool:
        if threading.current_thread().name == "b":
            self.b_waiting.set()
        return super().wait_for(predicate, timeout)


def _served_block(number: int, transactions: int) -> served.ServedBlock:
    records = tuple(SimpleNamespace(raw=b"\xc0", hash=bytes([i]) * 32, sender=b"s" * 20)
                    for i in range(transactions))
    header = SimpleNamespace(block_number=number)
    return served.ServedBlock(header, 100, records)  # type: ignore[arg-type]


def test_two_full_block_reads_do_not_deadlock_the_governor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two clients read two full blocks (`eth_getBlockByNumber(n, true)`) on the two read
    workers. Reader a formats block 7; at a checkpoint it hands the turn to reader b (the
    governor's rule for a unit longer than a slice); b formats block 8, which needs the
    `transactions` descriptor's lock that a holds, while a waits for the turn b holds."""
    governor = served.Governor()
    b_waiting = threading.Event()
    governor._turns._changed = _AnnouncingCondition(b_waiting)
    monkeypatch.setattr(served, "GOVERNOR", governor)
    monkeypatch.setattr(served, "SLICE_SECONDS", 0.0)  # every checkpoint ends a slice
    a_formatting = threading.Event()

    def transaction_json(raw: bytes, tx_hash: bytes, sender: bytes, header: Any,
                         index: int) -> dict[str, Any]:
        if threading.current_thread().name == "a" and index == 0:
            a_formatting.set()
            assert b_waiting.wait(DEADLINE), "reader b never asked for the turn"
        return {"hash": tx_hash.hex()}

    monkeypatch.setattr(served, "transaction_json", transaction_json)
    blocks = {"a": _served_block(7, 3), "b": _served_block(8, 3)}
    results: dict[str, int] = {}

    def read() -> None:
        name = threading.current_thread().name
        if name == "b":
            assert a_formatting.wait(DEADLINE)
        with governor.turn():
            results[name] = len(blocks[name].transactions)

    readers = [threading.Thread(target=read, name=name, daemon=True) for name in "ab"]
    for reader in readers:
        reader.start()
    ends = time.monotonic() + DEADLOCK_SECONDS
    for reader in readers:
        reader.join(max(0.0, ends - time.monotonic()))
    deadlocked = any(reader.is_alive() for reader in readers)
    if deadlocked:  # let them go: hand reader a the turn that reader b holds and cannot give
        governor._turns.give()
        for reader in readers:
            reader.join(DEADLINE)
    assert not deadlocked, "the two readers deadlocked on the governor's turn"
    assert results == {"a": 3, "b": 3}


# Finding 2: serving an observer's block-sync request is not charged to its budget.


class _ServingPeers(MixedPeers):
    """A validator's node as block sync sees it; reading a range costs it `cost` seconds of
    the loop's clock (`clock`, which the test's `time.perf_counter` reads)."""

    def __init__(self, clock: list[float], cost: float) -> None:
        super().__init__()
        self.clock = clock
        self.cost = cost
        self.ranges_read: list[int] = []

    async def peer_blocks(self, first: int, count: int) -> list[bytes]:
        self.clock[0] += self.cost
        self.ranges_read.append(first)
        return [_block(number)[0] for number in range(first, first + count)]


def _validator_engine(peers: MixedPeers, validators: tuple[bytes, ...], budget: PeerBudget
                      ) -> PbftEngine:
    """A validator's engine with block sync and a budget, nothing else (no replica)."""
    engine = PbftEngine.__new__(PbftEngine)
    engine.budget = budget
    engine.metrics = SimpleNamespace(  # type: ignore[assignment]
        peer_fault=lambda peer, kind: None, peer_dropped=lambda peer: None)
    engine.log = SimpleNamespace(warning=lambda *args: None)  # type: ignore[assignment]
    store = SimpleNamespace(get=lambda name, key: b"a certificate")
    engine.sync = BlockSync(
        peers, store, validators, deliver=lambda event: None,  # type: ignore[arg-type]
        replica_status=lambda: IDLE, held_block=lambda n, d: None,
        chain_lock=asyncio.Lock(), poll_interval=1.0,
        sources=lambda: peers.peers() - {OBSERVER})
    return engine


def test_serving_an_observers_block_ranges_is_charged_to_its_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each range costs the validator a second (fake clock); the observer's budget holds half
    a second and does not refill (frozen clock): one range is served, the others dropped."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    peers = _ServingPeers(clock, cost=1.0)
    validators = tuple(sorted(peers.peers() - {OBSERVER}))
    engine = _validator_engine(peers, validators, PeerBudget(lambda: 0.0, burst=0.5))

    async def scenario() -> None:
        for request_id in range(1, 4):  # each asked once the previous one was answered
            engine.on_sync_message(OBSERVER, encode_sync(GetBlocks(request_id, 1, 32)))
            while engine.sync._serving:  # type: ignore[union-attr]
                await asyncio.sleep(0)

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE))
    answers = [m for peer, m in peers.sent if peer == OBSERVER and isinstance(m, Blocks)]
    assert len(answers) == len(peers.ranges_read)
    assert peers.ranges_read == [1], "three seconds of serving charged nothing to the observer"


# Finding 3: block-sync reads for peers bypass the governor of client work.


def test_block_sync_reads_for_peers_run_under_the_governor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    governor = served.Governor()
    monkeypatch.setattr(served, "GOVERNOR", governor)
    monkeypatch.setattr(node_module, "encode_block", lambda header, records: b"block")
    in_turn: list[bool] = []

    def header_by_number(number: int) -> object:
        in_turn.append(governor._holder == threading.get_ident())
        return object()

    blockchain = SimpleNamespace(header_by_number=header_by_number,
                                 read_store=SimpleNamespace(records=lambda number: ()))
    context = node_module.NodeContext.__new__(node_module.NodeContext)
    context._node = SimpleNamespace(blockchain=blockchain)  # type: ignore[assignment]
    blocks = asyncio.run(asyncio.wait_for(context.peer_blocks(1, 32), DEADLINE))
    assert len(blocks) == 32 and len(in_turn) == 32
    assert all(in_turn), "a peer's block range was read outside the governor's turn"


def test_the_engines_own_block_reads_never_wait_for_a_clients_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's own mend: the engine reads a committed block (its CommitBlock reply)
    through canonical_blocks, which must not wait for the governor's turn that a client's
    read holds, nor answer "busy" (an empty list) when peers fill the block-sync worker."""
    governor = served.Governor()
    monkeypatch.setattr(served, "GOVERNOR", governor)
    monkeypatch.setattr(node_module, "encode_block", lambda header, records: b"block")
    blockchain = SimpleNamespace(header_by_number=lambda number: object(),
                                 read_store=SimpleNamespace(records=lambda number: ()))
    context = node_module.NodeContext.__new__(node_module.NodeContext)
    context._node = SimpleNamespace(blockchain=blockchain)  # type: ignore[assignment]
    release, holding = threading.Event(), threading.Event()

    def client_unit() -> None:
        with governor.turn():
            holding.set()
            release.wait(2 * DEADLINE)  # held past the read's own deadline

    client = threading.Thread(target=client_unit, daemon=True)
    client.start()
    try:
        assert holding.wait(DEADLINE), "the client's unit never took the turn"
        blocks = asyncio.run(asyncio.wait_for(context.canonical_blocks(1, 1), DEADLINE))
        assert blocks == [b"block"]
        assert not release.is_set() and governor._holder == client.ident, (
            "the engine's read waited for the client's turn")
    finally:
        release.set()
        client.join(DEADLINE)


# Finding 4: a validator holds what it had queued for an observer that is gone.


def test_a_validator_holds_nothing_for_an_observer_that_is_gone() -> None:
    async def body() -> None:
        observer_address = address_of(OBSERVER_KEY)
        validators, _, endpoints = _validators([observer_address])
        observer, _ = make_transport(OBSERVER_KEY, endpoints, free_port())
        validator = validators[0]
        for transport in (*validators, observer):
            await transport.start()
        try:
            await wait_for(validator, lambda: observer_address in validator.connected_peers())
            # answers for it (block ranges) queued in one step of the loop, then it is gone
            for _ in range(64):
                assert validator.send(observer_address, Channel.BLOCK_SYNC, b"x" * 200_000)
            await observer.stop()
            await wait_for(validator,
                           lambda: observer_address not in validator.connected_peers())
            held = validator.stats()["peers"]["0x" + observer_address.hex()]  # type: ignore[index]
            assert held["queued_bytes"] == 0, f"{held['queued_bytes']} bytes held for it"
        finally:
            for transport in (*validators, observer):
                await transport.stop()

    run(body())


# Finding 5: an observer's (any peer's) transaction gossip is not charged to its budget.


def test_an_observers_transaction_gossip_is_charged_to_its_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each decode costs 10 ms (fake clock); a budget of a second that does not refill
    allows about a hundred, not a thousand."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    decoded: list[bytes] = []

    def decode(raw: bytes, *, gossiped: bool = False) -> object:
        clock[0] += 0.010
        decoded.append(raw)
        raise TxPoolError("invalid sender")  # refused after the work

    engine = PbftEngine.__new__(PbftEngine)
    engine.budget = PeerBudget(lambda: 0.0, burst=1.0)
    engine.engine_params = SimpleNamespace(validators=VALIDATORS)  # type: ignore[assignment]
    engine.feed = SimpleNamespace(members=lambda: frozenset(VALIDATORS))  # type: ignore[assignment]
    engine.metrics = SimpleNamespace(  # type: ignore[assignment]
        peer_fault=lambda peer, kind: None, peer_dropped=lambda peer: None)
    engine.log = SimpleNamespace(warning=lambda *args: None)  # type: ignore[assignment]
    node = node_module.Node.__new__(node_module.Node)
    node.engine = engine
    node._decode = decode  # type: ignore[method-assign,assignment]
    node.metrics = SimpleNamespace(  # type: ignore[assignment]
        gossip_refused=SimpleNamespace(inc=lambda: None))
    for index in range(1000):
        node._on_peer_message(OBSERVER, Channel.TX_GOSSIP, b"tx %d" % index)
    assert len(decoded) <= 200, f"{len(decoded)} gossiped transactions decoded (10 s of loop)"


# Finding 6: the epoch schedule cannot replay a change once another one is queued.


def test_replaying_every_scheduled_change_leaves_the_schedule_as_it_is() -> None:
    genesis = EpochSchedule.genesis(PARAMS)
    five = (*genesis.current.validators, b"\x05" * 20)
    four = five[1:]
    scheduled = genesis.schedule(five, passed_at=3).schedule(four, passed_at=5)
    assert scheduled.schedule(four, passed_at=5) is scheduled  # the last one: recognised
    assert scheduled.schedule(five, passed_at=3) is scheduled


# Finding 7 (fixed: `select_view_changes` takes only the installed epoch's): a primary's
# NEW-VIEW across the handover mixed epochs, and every replica refused it.


def test_the_new_view_a_primary_builds_across_the_handover_is_valid() -> None:
    """Five validators after the handover at 10 (epoch 1 installed). The new primary of view
    1 has the VIEW-CHANGEs of all five: four with the handover checkpoint stable (epoch 1),
    and replica 3's, which has not seen it stable yet (stable 0: epoch 0, signed by V0[3],
    a member of both sets). N - f = 4 VIEW-CHANGEs of epoch 1 are there to choose from."""
    added = membership(ADDED)
    added.schedule = added.schedule.install(10)
    epoch = added.current
    votes = [view_change(1, 10, i, V0, ADDED) for i in (0, 1, 2, 4)]
    votes.append(view_change(1, 0, 3, V0, V0))  # the lagging replica
    chosen = select_view_changes(epoch, votes)  # what Replica._send_new_view sends
    plan = plan_new_view([vc.body for vc in chosen])
    primary = added.primary(1, plan.min_s + 1)
    pre_prepares = tuple(signed(PrePrepare(1, n, d, primary), ADDED) for n, d in plan.entries)
    new_view = signed(NewView(1, chosen, pre_prepares, primary), ADDED)
    verify_new_view(added, 40, new_view)  # what every replica checks before following it


# Finding 8 (fixed: `handover.counts_toward_view`): a removed validator moved the replicas of
# the new set into view changes.


def test_a_removed_validator_cannot_move_the_new_set_to_another_view() -> None:
    """After the handover at 10 to the set without V0[0] (three validators: f = 0, so one
    VIEW-CHANGE from a member is enough to join), V0[0] is a stranger to the set deciding
    block 11 on. It sends VIEW-CHANGE(view 1, stable 0, replica 0): genesis needs no
    checkpoint proof, and under epoch 0 its signature is that of replica 0."""
    replica = Replica(PARAMS, 1, SIGNERS[2], KeyVerifier(), ChainHead(10, GENESIS),
                      block_digest=keccak, schedule=scheduled(REMOVED).install(10))
    replica.start()
    removed = SIGNERS[0]
    assert removed.address not in replica.epochs.current.validators
    forged = MEMBERS.sign(ViewChange(1, 0, (), (), (), 0), removed)
    replica.step(MessageReceived(WireMessage(forged).encode()))
    assert (replica.view, replica.active) == (0, True), \
        "a validator removed from the set moved the new set's replica to view 1"
