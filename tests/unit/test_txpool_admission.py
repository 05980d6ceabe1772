"""Issue 29: the pool's economic admission (fee floor, what a sender can afford, queued
transactions bounded, giving way and expiring), raw transactions bounded before decoding, and
a node admitting a transaction after its predecessors waiting in the gossip backlog."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chain.errors import TxPoolError
from chain.genesis import load_genesis_bytes
from chain.node import Node, NodeConfig, initialize_datadir
from chain.registry import available_engines
from chain.txpool import (
    GAP_FILLER_GAS,
    Candidate,
    GossipBacklog,
    PoolLimits,
    TxPool,
    decode_raw_transaction,
)
from tests.unit.test_txpool import (
    ALICE,
    BOB,
    BUILDER,
    CHAIN_ID,
    GWEI,
    MAX_SIZE,
    Accounts,
    add,
    address,
    tx,
)

CAROL = type(ALICE)(b"\x03" * 32)
GENESIS = Path(__file__).resolve().parents[2] / "genesis" / "dev.json"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def accounts() -> Accounts:
    return Accounts()


def flat_list(item: bytes, count: int) -> bytes:
    """The RLP list of `count` copies of the encoded `item`, built without pyrlp."""
    payload = item * count
    length = len(payload).to_bytes(3, "big")
    return b"\xfa" + length + payload


def pool_with(accounts: Accounts, clock: Clock | None = None, **limits: int) -> TxPool:
    return TxPool(CHAIN_ID, accounts, 30_000_000, PoolLimits(**limits), clock=clock or Clock())


def test_a_two_megabyte_flat_list_is_refused_before_decoding() -> None:
    """The security review's request: a million one-byte items held the loop 12.7 s."""
    flat = flat_list(b"\x81\xff", 1_000_000)  # two bytes an item
    many = flat_list(b"\x01", 100_000)  # under the size bound, over the item bound
    started = time.perf_counter()
    with pytest.raises(TxPoolError, match="oversized data: 2000005 bytes, at most 131072"):
        decode_raw_transaction(BUILDER, b"\x02" + flat, MAX_SIZE)
    with pytest.raises(TxPoolError, match="invalid raw transaction: RLP data holds more"):
        decode_raw_transaction(BUILDER, b"\x02" + many, MAX_SIZE)
    assert time.perf_counter() - started < 0.1


def test_the_fee_floor_is_the_base_fee_or_the_price_limit(accounts: Accounts) -> None:
    pool = pool_with(accounts, price_limit=2 * GWEI)
    with pytest.raises(TxPoolError, match="transaction underpriced: max fee per gas 0 is below "
                                          "the pool's floor of 2000000000 wei"):
        add(pool, tx(max_fee=0, tip=0))  # the zero-fee flood of unfunded keys
    with pytest.raises(TxPoolError, match="floor of 5000000000 wei"):
        pool.add(tx(max_fee=4 * GWEI, tip=1), 120, base_fee=5 * GWEI)
    pool.add(tx(max_fee=5 * GWEI, tip=1), 120, base_fee=5 * GWEI)
    assert len(pool) == 1


def test_an_unfunded_sender_cannot_hold_a_gap_open(accounts: Accounts) -> None:
    """A transaction behind a gap needs funds for the cheapest fillers of its gap."""
    pool = pool_with(accounts)
    cost = 21_000 * 10 * GWEI + 1
    accounts.balances[address(ALICE)] = cost + 9 * GAP_FILLER_GAS * GWEI
    with pytest.raises(TxPoolError, match="insufficient funds"):
        pool.add(tx(nonce=10), 120, base_fee=GWEI)
    pool.add(tx(nonce=9), 120, base_fee=GWEI)
    assert len(pool) == 1


def test_queued_transactions_expire_after_the_lifetime_of_inactivity(
    accounts: Accounts,
) -> None:
    clock = Clock()
    pool = pool_with(accounts, clock, lifetime=3_600)
    add(pool, tx(nonce=0))
    add(pool, tx(nonce=2))  # behind a gap
    clock.now += 1_800
    add(pool, tx(key=BOB, nonce=5))
    clock.now += 1_801
    assert pool.evict_expired() == 1  # Alice's queued one; her pending one stays
    assert [e.tx.nonce for e in pool.entries()] == [0, 5]
    assert pool.dropped["expired"] == 1 and pool.queued_count() == 1
    clock.now += 1_800
    assert pool.evict_expired() == 1 and len(pool) == 1


def test_activity_keeps_a_senders_queue_alive(accounts: Accounts) -> None:
    clock = Clock()
    pool = pool_with(accounts, clock, lifetime=3_600)
    add(pool, tx(nonce=3))
    clock.now += 3_000
    add(pool, tx(nonce=5))
    clock.now += 3_000
    assert pool.evict_expired() == 0 and len(pool) == 2


def test_what_can_execute_finds_room_queued_transactions_give_way(accounts: Accounts) -> None:
    """A full pool: queued transactions of the least recently active sender go, highest
    nonce first; an executable transaction is refused only when nothing is queued."""
    pool = pool_with(accounts, max_transactions=4)
    add(pool, tx(nonce=1))  # Alice: queued, the least recently active
    add(pool, tx(nonce=2))
    add(pool, tx(key=BOB, nonce=3))  # Bob: queued
    add(pool, tx(key=CAROL, nonce=0))
    add(pool, tx(key=CAROL, nonce=1))
    assert sorted((e.sender, e.tx.nonce) for e in pool.entries()) == sorted([
        (address(ALICE), 1), (address(BOB), 3), (address(CAROL), 0), (address(CAROL), 1)])
    assert pool.dropped["evicted"] == 1
    add(pool, tx(key=CAROL, nonce=2))
    add(pool, tx(key=CAROL, nonce=3))
    assert pool.queued_count() == 0 and pool.dropped["evicted"] == 3
    with pytest.raises(TxPoolError, match="txpool is full"):
        add(pool, tx(key=ALICE, nonce=0))


def test_queued_transactions_are_bounded_in_all(accounts: Accounts) -> None:
    pool = pool_with(accounts, max_queued=2)
    add(pool, tx(nonce=1))
    add(pool, tx(key=BOB, nonce=1))
    add(pool, tx(key=CAROL, nonce=1))  # Alice's, the oldest, gives way
    assert {e.sender for e in pool.entries()} == {address(BOB), address(CAROL)}
    add(pool, tx(key=CAROL, nonce=0))  # executable: no queued bound
    single = pool_with(accounts, max_queued=1)
    add(single, tx(nonce=1))
    with pytest.raises(TxPoolError, match="txpool is full: 1 transactions behind nonce gaps"):
        add(single, tx(nonce=2))  # only its own sender's queued ones to give way


def candidate(key: object = ALICE, nonce: int = 0) -> Candidate:
    """As another validator gossiped it."""
    signed = tx(key=key, nonce=nonce)
    return Candidate(signed, signed.sender, len(signed.encode()), gossiped=True)


def test_the_gossip_backlog_hands_over_a_senders_predecessors_in_nonce_order() -> None:
    backlog = GossipBacklog(PoolLimits(max_per_sender=3))
    items = [candidate(nonce=n) for n in (2, 0, 5)] + [candidate(key=BOB)]
    assert all(backlog.push(item) for item in items)
    assert not backlog.push(candidate(nonce=7))  # Alice's three: her bound
    assert [i.tx.nonce for i in backlog.take_before(address(ALICE), 5, limit=1)] == [0]
    assert [i.tx.nonce for i in backlog.take_before(address(ALICE), 5, limit=32)] == [2]
    assert backlog.pop().tx.nonce == 5 and backlog.pop().sender == address(BOB)
    assert len(backlog) == 0 and backlog.size_bytes == 0


def test_a_pop_is_the_oldest_senders_lowest_nonce() -> None:
    """Gossiped highest nonce first, a sender's run comes out lowest first: each pop is one
    admission, never a run of predecessors taken along (a slice stays GOSSIP_SLICE)."""
    backlog = GossipBacklog(PoolLimits())
    for n in (3, 2, 1, 0):
        backlog.push(candidate(nonce=n))
    backlog.push(candidate(key=BOB))
    assert [backlog.pop().tx.nonce for _ in range(4)] == [0, 1, 2, 3]
    assert backlog.pop().sender == address(BOB)


def alice_node(datadir: Path, limits: PoolLimits) -> Iterator[Node]:
    """A dev node with Alice funded, not started: its pool, backlog and admission, without
    the network (a fixture's body)."""
    document = json.loads(GENESIS.read_text())
    document["alloc"] = {"0x" + address(ALICE).hex(): {"balance": hex(10**24)}}
    genesis = load_genesis_bytes(json.dumps(document).encode(), available_engines())
    initialize_datadir(datadir, genesis)
    node = Node(NodeConfig(datadir=datadir, http_enabled=False, pool_limits=limits))
    try:
        yield node
    finally:
        node.db.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    yield from alice_node(tmp_path, PoolLimits(max_queued_per_sender=4))


def test_a_gap_waiting_in_the_gossip_backlog_is_filled_before_judging(node: Node) -> None:
    """Nonces 0-9 came by gossip and wait for admission; nonces 10-19 sent to this node
    are all accepted (the account allows 4 behind a gap), and all are executable."""
    for nonce in range(10):
        node._queue_gossip(tx(nonce=nonce).encode(), True)
    for nonce in range(10, 20):
        node.submit_raw_transaction(tx(nonce=nonce).encode())
    assert len(node._gossip) == 0
    assert node.pool.queued_count() == 0 and node.executable_count(100) == 20
    with pytest.raises(TxPoolError, match="nonce too high: 4 transactions"):
        for nonce in range(30, 35):  # a gap that nothing here fills is still a gap
            node.submit_raw_transaction(tx(nonce=nonce).encode())


def test_gossip_behind_a_gap_never_gets_a_client_refused(node: Node) -> None:
    """A load balancer's spray: nonces 10-29 came by gossip (other validators accepted them)
    while 0-9 are still on the wire. A client's nonce 30 sent here is accepted (its account
    allows 4 behind a gap, but those 20 are outstanding at their origins: refusing 30 would
    strand 31 onwards wherever they went), and so is gossip beyond the bound; the client's
    own gapped transactions are still bounded."""
    for nonce in range(10, 30):
        node._admit_gossiped(candidate(nonce=nonce))
    assert node.pool.queued_count() == 20
    for nonce in range(30, 34):
        node.submit_raw_transaction(tx(nonce=nonce).encode())
    with pytest.raises(TxPoolError, match="nonce too high: 4 transactions"):
        node.submit_raw_transaction(tx(nonce=40).encode())
    for nonce in range(10):
        node._queue_gossip(tx(nonce=nonce).encode(), True)
    node.submit_raw_transaction(tx(nonce=34).encode())  # the backlog fills the gap first
    assert node.pool.queued_count() == 0 and node.executable_count(100) == 35
