"""Attacker review of de4ef1b..HEAD (issue 29: pool admission, gossip backlog, WebSocket
outboxes). Findings 1 to 4 are fixed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from chain.errors import TxPoolError
from chain.node import GOSSIP_SLICE, Node
from chain.rpc.errors import RpcError
from chain.rpc.subscriptions import Subscriptions, WebSocketLimits
from chain.txpool import PoolLimits, TxPool
from tests.unit.test_txpool import ALICE, BOB, CHAIN_ID, Accounts, add, tx
from tests.unit.test_txpool_admission import alice_node

CAROL = type(ALICE)(b"\x03" * 32)
GENESIS = Path(__file__).resolve().parents[2] / "genesis" / "dev.json"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """A dev node with the default pool limits, not started, Alice funded."""
    yield from alice_node(tmp_path, PoolLimits())


def test_one_gossip_slice_admits_at_most_gossip_slice_transactions(node: Node) -> None:
    for nonce in reversed(range(4 * GOSSIP_SLICE)):  # a byzantine peer's order
        node._queue_gossip(tx(nonce=nonce).encode(), True)
    assert len(node._gossip) == 4 * GOSSIP_SLICE

    async def one_slice() -> int:
        task = asyncio.get_running_loop().create_task(node._admit_gossip())
        await asyncio.sleep(0)  # the task runs its first slice up to its first yield
        admitted = len(node.pool)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return admitted

    admitted = asyncio.run(one_slice())
    assert admitted <= GOSSIP_SLICE, f"one slice admitted {admitted} transactions"


def test_a_refused_transaction_evicts_nothing() -> None:
    accounts = Accounts()
    big, queued = tx(nonce=0, gas=60_000, data=b"\x01" * 600), tx(key=BOB, nonce=1)
    limit = len(big.encode()) + len(queued.encode())
    pool = TxPool(CHAIN_ID, accounts, 30_000_000, PoolLimits(max_bytes=limit))
    add(pool, big)  # Alice: executable
    add(pool, queued)  # Bob: behind a gap, honest
    attacker = tx(key=CAROL, nonce=0, gas=60_000, data=b"\x02" * 700)  # larger than Bob's
    with pytest.raises(TxPoolError, match="txpool is full"):
        add(pool, attacker)
    assert queued.hash in pool, "Bob's queued transaction was evicted by a refused one"


class _Node:
    def add_head_listener(self, listener: object) -> None:
        pass


def test_one_client_cannot_take_the_whole_node_log_subscription_budget() -> None:
    async def scenario() -> None:
        subscriptions = Subscriptions(_Node(), WebSocketLimits())  # type: ignore[arg-type]
        for connection in range(10):  # one client's connections (256 allowed)
            session = subscriptions.session("203.0.113.7")
            addresses = ["0x%040x" % (connection * 1000 + i + 1) for i in range(1000)]
            if connection < 2:
                await session.eth_subscribe("logs", {"address": addresses})
                continue
            with pytest.raises(RpcError, match="of this client's connections"):
                await session.eth_subscribe("logs", {"address": addresses})
        for host in range(3):  # one IPv6 client from other addresses of its /64 each time
            ipv6 = subscriptions.session(f"2001:db8::{host + 1}")
            criteria = {"address": ["0x%040x" % (20_000 + host * 1000 + i) for i in range(1000)]}
            if host < 2:
                await ipv6.eth_subscribe("logs", criteria)
                continue
            with pytest.raises(RpcError, match="of this client's connections"):
                await ipv6.eth_subscribe("logs", criteria)
        honest = subscriptions.session("198.51.100.1")
        try:
            await honest.eth_subscribe("logs", {"address": "0x" + "ab" * 20})
        except RpcError as exc:
            pytest.fail(f"an honest client's first log subscription refused: {exc}")

    asyncio.run(scenario())


def _list_in_an_integer_field() -> bytes:
    """Alice's valid type-2 transaction with its maxPriorityFeePerGas sent as a list."""
    import rlp

    fields = rlp.decode(tx().encode()[1:])
    fields[2] = [b"\x01"]
    return b"\x02" + rlp.encode(fields)


def test_a_list_in_an_integer_field_is_a_one_line_refusal(node: Node) -> None:
    raw = _list_in_an_integer_field()
    with pytest.raises(TxPoolError, match="invalid raw transaction"):
        node.submit_raw_transaction(raw)
    node._queue_gossip(raw, True)  # refused and counted, not raised
