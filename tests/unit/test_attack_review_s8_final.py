"""The attack review s8 (final): the per-sender bound on a client's transactions behind a nonce
gap, now counting only what this node's clients sent (gossip is exempt). Each finding is a
strict xfail naming the interleaving until its gap was fixed; both are fixed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chain.errors import TxPoolError
from chain.node import Node
from chain.p2p import Channel
from chain.txpool import PoolLimits
from tests.unit.test_txpool import GWEI, Accounts, tx
from tests.unit.test_txpool_admission import alice_node, pool_with

BOUND = 4  # the client's bound behind a gap (txpool.accountqueue, 200 by default)
OBSERVER = b"\x0b" * 20  # an observer's address: allowed to connect, not in the validator set


def test_a_fee_bump_gossiped_back_launders_a_clients_gapped_transactions() -> None:
    """Finding 1 (fixed: a replacement keeps the origin of what it replaces): a client fills
    its bound at A, then sends fee bumps of the same nonces via B, which gossips them back."""
    pool = pool_with(Accounts(), max_queued_per_sender=BOUND)
    for nonce in range(10, 10 + BOUND):
        pool.add(tx(nonce=nonce), 120)
    with pytest.raises(TxPoolError, match="nonce too high"):
        pool.add(tx(nonce=20), 120)  # the bound holds for the client sending here
    for nonce in range(10, 10 + BOUND):  # the same, bumped 10 %, sent via B: gossip here
        pool.add(tx(nonce=nonce, max_fee=11 * GWEI, tip=2 * GWEI), 120, gossiped=True)
    with pytest.raises(TxPoolError, match="nonce too high"):
        pool.add(tx(nonce=20), 120)  # still 4 this node's client sent behind the gap


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    yield from alice_node(tmp_path, PoolLimits(max_queued_per_sender=BOUND))


def test_an_observers_forwarded_transactions_are_a_clients(node: Node) -> None:
    """Finding 2 (fixed: gossip counts as a validator's only from a current validator,
    `ConsensusEngine.is_validator`): an observer (allowed to connect, not a validator)
    forwards its client's nonces 10-14 on the gossip channel. They were admitted as
    gossiped, exempt from the client's bound, though no validator accepted them first
    (nothing is outstanding elsewhere, so refusing them strands nothing): an observer's
    clients held up to 1,024 gapped transactions a sender in every pool."""
    for nonce in range(10, 10 + BOUND + 1):
        node._on_peer_message(OBSERVER, Channel.TX_GOSSIP, tx(nonce=nonce).encode())
    while node._gossip:
        node._admit_gossiped(node._gossip.pop())
    assert node.pool.queued_count() == BOUND  # the fifth refused, as from a client here
    assert node.metrics.gossip_refused._value.get() == 1
