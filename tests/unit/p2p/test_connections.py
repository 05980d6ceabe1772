"""Connections over real TCP on 127.0.0.1: simultaneous dials, which one is kept, restarts."""


from __future__ import annotations

import asyncio

from chain.p2p import Channel, Transport
from chain.p2p.connections import PeerConnection, prefer_connection
from chain.p2p.framing import SessionCipher
from chain.p2p.handshake import Session
from tests.unit.p2p.support import (
    HOST,
    VALIDATOR_KEYS,
    Proxy,
    address_of,
    free_port,
    make_transport,
    run,
    stop_all,
    wait_all_settled,
    wait_for,
)


def test_simultaneous_dials_leave_exactly_one_connection() -> None:
    async def body() -> None:
        a_key, b_key = VALIDATOR_KEYS[0], VALIDATOR_KEYS[1]
        a_port, b_port = free_port(), free_port()
        gate = asyncio.Event()
        to_a, to_b = Proxy(a_port, gate), Proxy(b_port, gate)
        to_a_port, to_b_port = await to_a.start(), await to_b.start()
        a, a_inbox = make_transport(
            a_key, {address_of(a_key): (HOST, a_port), address_of(b_key): (HOST, to_b_port)}, a_port
        )
        b, b_inbox = make_transport(
            b_key, {address_of(a_key): (HOST, to_a_port), address_of(b_key): (HOST, b_port)}, b_port
        )
        await asyncio.gather(a.start(), b.start())
        try:
            # Hold both dials until both have arrived, so both handshakes really race.
            await to_a.arrived.wait_until(lambda: to_a.arrivals == 1)
            await to_b.arrived.wait_until(lambda: to_b.arrivals == 1)
            gate.set()
            await wait_all_settled([a, b])
            await to_a.live_signal.wait_until(lambda: to_a.live + to_b.live == 1)
            await to_b.live_signal.wait_until(lambda: to_a.live + to_b.live == 1)
            assert int(a.stats()["duplicates_closed"]) + int(b.stats()["duplicates_closed"]) >= 1
            lower = min(a.address, b.address)
            assert (to_b.live if lower == a.address else to_a.live) == 1
            assert a.connected_peers() == {b.address} and b.connected_peers() == {a.address}

            assert a.send(b.address, Channel.ENGINE, b"a->b")
            assert b.send(a.address, Channel.BLOCK_SYNC, b"b->a")
            await b_inbox.wait_for_count(1)
            await a_inbox.wait_for_count(1)
            assert b_inbox.messages == [(a.address, 0, b"a->b")]
            assert a_inbox.messages == [(b.address, 2, b"b->a")]
        finally:
            await stop_all([a, b])
            await to_a.stop()
            await to_b.stop()

    run(body())


def test_prefer_connection_is_the_same_on_both_ends() -> None:
    low, high = b"\x01" * 20, b"\x02" * 20

    def connection(local: bytes, peer: bytes, outbound: bool) -> PeerConnection:
        session = Session(peer, SessionCipher(b"\x00" * 32), SessionCipher(b"\x00" * 32))
        return PeerConnection(None, None, session, outbound, local)  # type: ignore[arg-type]

    # Seen from low: its own dial vs high's dial, in either arrival order.
    low_dialed, high_dialed = connection(low, high, True), connection(low, high, False)
    assert prefer_connection(low_dialed, high_dialed) is low_dialed
    assert prefer_connection(high_dialed, low_dialed) is low_dialed
    # Seen from high: the connection low dialed is high's inbound one.
    low_dialed_h, high_dialed_h = connection(high, low, False), connection(high, low, True)
    assert prefer_connection(high_dialed_h, low_dialed_h) is low_dialed_h
    # Same initiator twice (peer restarted): the newer wins.
    again = connection(low, high, True)
    assert prefer_connection(low_dialed, again) is again


def test_restarted_peer_on_same_port_is_reconnected() -> None:
    async def body() -> None:
        ports = [free_port(), free_port()]
        keys_ = VALIDATOR_KEYS[:2]
        endpoints = {address_of(k): (HOST, p) for k, p in zip(keys_, ports, strict=True)}
        a, a_inbox = make_transport(keys_[0], endpoints, ports[0])
        b, _ = make_transport(keys_[1], endpoints, ports[1])
        b_again: Transport | None = None
        await asyncio.gather(a.start(), b.start())
        try:
            await wait_all_settled([a, b])
            await b.stop()
            await wait_for(a, lambda: a.connected_peers() == set())
            # The restarted B cannot dial A (dead port in its config): only A's reconnect
            # loop can bring the link back.
            b_again_endpoints = {**endpoints, a.address: (HOST, free_port())}
            b_again, b_again_inbox = make_transport(keys_[1], b_again_endpoints, ports[1])
            await b_again.start()
            await wait_for(a, lambda: a.connected_peers() == {b_again.address})
            await wait_for(b_again, lambda: b_again.connected_peers() == {a.address})
            assert a.send(b_again.address, Channel.ENGINE, b"welcome back")
            assert b_again.send(a.address, Channel.ENGINE, b"thanks")
            await b_again_inbox.wait_for_count(1)
            await a_inbox.wait_for_count(1)
            assert b_again_inbox.messages == [(a.address, 0, b"welcome back")]
            assert a_inbox.messages[-1] == (b_again.address, 0, b"thanks")
        finally:
            await stop_all([a] + ([b_again] if b_again else []))

    run(body())
