"""The transport over real TCP on 127.0.0.1: the interface, its configuration, exchange."""


from __future__ import annotations

import asyncio

import pytest

from chain.p2p import Channel, PeerTransport, Transport, TransportConfig
from chain.p2p.errors import TransportConfigError, TransportError
from tests.unit.p2p.support import (
    CHAIN_ID,
    FAST,
    HOST,
    STRANGER_KEY,
    VALIDATOR_KEYS,
    Inbox,
    address_of,
    dropped,
    free_port,
    make_transport,
    run,
    stop_all,
    two_validator_endpoints,
    wait_all_settled,
)


def test_transport_implements_the_interface() -> None:
    endpoints, a_port, _ = two_validator_endpoints()
    transport, _ = make_transport(VALIDATOR_KEYS[0], endpoints, a_port)
    assert isinstance(transport, PeerTransport)
    assert {Channel.ENGINE, Channel.TX_GOSSIP, Channel.BLOCK_SYNC} == {0, 1, 2}


def test_config_is_validated() -> None:
    with pytest.raises(TransportConfigError):
        TransportConfig(max_frame_size=0)
    with pytest.raises(TransportConfigError):
        TransportConfig(max_frame_size=2**32)
    with pytest.raises(TransportConfigError):
        TransportConfig(max_queue_frames=0)
    with pytest.raises(TransportConfigError):
        TransportConfig(keepalive_interval=5, idle_timeout=5)
    with pytest.raises(TransportConfigError):
        Transport(VALIDATOR_KEYS[0], CHAIN_ID, {b"short": (HOST, 1)}, HOST, 0, Inbox())


def test_four_validators_exchange_on_every_channel_and_broadcast() -> None:
    async def body() -> None:
        ports = [free_port() for _ in VALIDATOR_KEYS]
        endpoints = {address_of(k): (HOST, p) for k, p in zip(VALIDATOR_KEYS, ports, strict=True)}
        nodes = [
            make_transport(k, endpoints, p) for k, p in zip(VALIDATOR_KEYS, ports, strict=True)
        ]
        transports = [t for t, _ in nodes]
        try:
            await asyncio.gather(*(t.start() for t in transports))
            assert [t.listen_port for t in transports] == ports
            await wait_all_settled(transports)
            for transport in transports:
                assert transport.connected_peers() == set(endpoints) - {transport.address}

            big = bytes(range(256)) * 4096  # 1 MiB: several TCP segments per frame
            expected: dict[bytes, list[tuple[bytes, int, bytes]]] = {a: [] for a in endpoints}
            for sender in transports:
                for receiver in transports:
                    if receiver is sender:
                        continue
                    for channel in Channel:
                        payload = b"%s->%s:%d" % (sender.address[:2], receiver.address[:2], channel)
                        assert sender.send(receiver.address, channel, payload)
                        expected[receiver.address].append((sender.address, channel, payload))
                assert sender.broadcast(Channel.TX_GOSSIP, b"gossip" + sender.address) == 3
                for receiver in transports:
                    if receiver is not sender:
                        item = (sender.address, int(Channel.TX_GOSSIP), b"gossip" + sender.address)
                        expected[receiver.address].append(item)
            assert transports[0].send(transports[1].address, Channel.BLOCK_SYNC, big)
            expected[transports[1].address].append((transports[0].address, 2, big))

            for transport, inbox in nodes:
                await inbox.wait_for_count(len(expected[transport.address]))
                assert sorted(inbox.messages) == sorted(expected[transport.address])
                # Per-sender order is preserved on one connection.
                for sender in endpoints:
                    got = [m for m in inbox.messages if m[0] == sender]
                    assert got == [m for m in expected[transport.address] if m[0] == sender]

            stats = transports[0].stats()
            assert stats["frames_out"] == {"engine": 3, "tx_gossip": 6, "block_sync": 4}
            assert stats["frames_in"] == {"engine": 3, "tx_gossip": 6, "block_sync": 3}
            assert stats["bytes_out"]["block_sync"] > len(big)  # type: ignore[index]
            assert stats["connected_peers"] == 3
            assert not stats["handshakes_refused"]
        finally:
            await stop_all(transports)
        for transport in transports:
            assert transport.connected_peers() == set()

    run(body())


def test_send_rejects_unknown_peer_self_and_bad_channel(
    caplog_transport: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        endpoints, a_port, _ = two_validator_endpoints()
        a, _ = make_transport(VALIDATOR_KEYS[0], endpoints, a_port)
        assert not a.send(address_of(VALIDATOR_KEYS[1]), Channel.ENGINE, b"x")  # not started
        await a.start()
        try:
            assert not a.send(address_of(STRANGER_KEY), Channel.ENGINE, b"x")
            assert not a.send(a.address, Channel.ENGINE, b"x")
            with pytest.raises(TransportError):
                a.send(address_of(VALIDATOR_KEYS[1]), 255, b"x")
            too_big = b"x" * FAST.max_payload_size + b"x"
            assert not a.send(address_of(VALIDATOR_KEYS[1]), Channel.ENGINE, too_big)
            assert dropped(a, "unknown_peer") == 2
            assert dropped(a, "not_running") == 1
            assert dropped(a, "too_large") == 1  # counted, and an error in the log
            assert [r.levelname for r in caplog_transport.records
                    if "exceeds the" in r.getMessage()] == ["ERROR"]
        finally:
            await a.stop()

    run(body())
