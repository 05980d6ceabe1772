"""Send queues over real TCP on 127.0.0.1: a down peer, a peer that stops reading."""


from __future__ import annotations

import asyncio

from chain.p2p import Channel, TransportConfig
from tests.unit.p2p.support import (
    VALIDATOR_KEYS,
    address_of,
    dropped,
    make_transport,
    peer_view,
    raw_handshake,
    run,
    two_validator_endpoints,
    wait_for,
)


def test_full_send_queue_to_a_down_peer_drops_and_counts() -> None:
    async def body() -> None:
        endpoints, a_port, _ = two_validator_endpoints()  # B is never up
        b_address = address_of(VALIDATOR_KEYS[1])
        by_count = TransportConfig(max_queue_frames=5, backoff_initial=5.0)
        a, _ = make_transport(VALIDATOR_KEYS[0], endpoints, a_port, config=by_count)
        await a.start()
        try:
            accepted = [a.send(b_address, Channel.ENGINE, b"m%d" % i) for i in range(8)]
            assert accepted == [True] * 5 + [False] * 3
            assert dropped(a, "queue_full") == 3
            assert peer_view(a, b_address)["queued_frames"] == 5
        finally:
            await a.stop()

        by_bytes = TransportConfig(max_queue_bytes=1000, backoff_initial=5.0)
        a, _ = make_transport(VALIDATOR_KEYS[0], endpoints, a_port, config=by_bytes)
        await a.start()
        try:
            accepted = [a.send(b_address, Channel.ENGINE, b"x" * 300) for _ in range(4)]
            assert accepted == [True, True, True, False]
            assert a.send(b_address, Channel.ENGINE, b"x" * 100)  # still fits by bytes
            assert dropped(a, "queue_full") == 1
            assert peer_view(a, b_address)["queued_bytes"] == 1000
        finally:
            await a.stop()

    run(body())


def test_peer_that_stops_reading_fills_queue_without_blocking() -> None:
    async def body() -> None:
        endpoints, a_port, _ = two_validator_endpoints()
        config = TransportConfig(max_queue_frames=8, max_queue_bytes=1024 * 1024)
        a, _ = make_transport(VALIDATOR_KEYS[0], endpoints, a_port, config=config)
        await a.start()
        try:
            peer = await raw_handshake(a_port, VALIDATOR_KEYS[1])  # then never reads again
            await wait_for(a, lambda: a.connected_peers() == {address_of(VALIDATOR_KEYS[1])})
            b_address = address_of(VALIDATOR_KEYS[1])
            payload = b"z" * 64 * 1024
            results = []
            for _ in range(400):  # 25 MiB offered, far more than socket buffers hold
                results.append(a.send(b_address, Channel.BLOCK_SYNC, payload))
                await asyncio.sleep(0)  # a yield, not a wait: lets the writer task run
            view = peer_view(a, b_address)
            assert view["queued_frames"] <= 8 and view["queued_bytes"] <= 1024 * 1024
            assert dropped(a, "queue_full") == results.count(False) > 0
            sent = a.stats()["frames_out"].get("block_sync", 0)  # type: ignore[attr-defined]
            # At most one frame is in flight (taken off the queue, blocked in drain()).
            accounted = sent + results.count(False) + view["queued_frames"]
            assert 399 <= accounted <= 400
            assert sent * len(payload) < 24 * 1024 * 1024
            peer.close()
        finally:
            await a.stop()

    run(body())
