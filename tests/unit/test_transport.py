"""chain.transport over real TCP on 127.0.0.1: exchange, authentication, framing, bounds.

pytest-asyncio is not installed, so every test is a sync function that runs one coroutine
under a hard deadline with `run()`. Nothing sleeps to wait: tests wait on events (an Inbox or
a proxy's Signal) or on `Transport.wait_until`, always bounded by `asyncio.wait_for`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from eth_keys import keys

from chain.transport import (
    HANDSHAKE_FRAME_CAP,
    HELLO_SIZE,
    KEYS,
    Channel,
    HandshakeRefused,
    HandshakeState,
    Hello,
    PeerConnection,
    PeerTransport,
    Role,
    Session,
    SessionCipher,
    Transport,
    TransportConfig,
    TransportConfigError,
    TransportError,
    auth_signing_hash,
    encode_frame,
    prefer_connection,
    read_frame,
    sign_auth,
    verify_auth,
)

CHAIN_ID = 1337
HOST = "127.0.0.1"
DEADLINE = 5.0
VALIDATOR_KEYS = [keys.PrivateKey(bytes([i]) * 32) for i in range(1, 5)]
STRANGER_KEY = keys.PrivateKey(b"\x77" * 32)
FAST = TransportConfig(
    handshake_timeout=1.0,
    backoff_initial=0.02,
    backoff_max=0.2,
    higher_address_dial_delay=0.05,
    keepalive_interval=1.0,
    idle_timeout=5.0,
)


def address_of(key: keys.PrivateKey) -> bytes:
    return key.public_key.to_canonical_address()


def run(coroutine: Awaitable[Any], timeout: float = 15.0) -> Any:
    """Run one test body under a hard deadline so a hang fails instead of stalling the suite."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coroutine, timeout)

    return asyncio.run(bounded())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class Signal:
    """A state-change pulse: `wait_until` re-checks its predicate on every `pulse()`."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def pulse(self) -> None:
        self._event.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = DEADLINE) -> None:
        async def wait() -> None:
            while not predicate():
                self._event.clear()
                await self._event.wait()

        await asyncio.wait_for(wait(), timeout)


@dataclass
class Inbox:
    """The message callback of one transport: records (sender, channel, payload)."""

    messages: list[tuple[bytes, int, bytes]] = field(default_factory=list)
    signal: Signal = field(default_factory=Signal)

    def __call__(self, sender: bytes, channel: int, payload: bytes) -> None:
        self.messages.append((sender, int(channel), payload))
        self.signal.pulse()

    async def wait_for_count(self, count: int) -> None:
        await self.signal.wait_until(lambda: len(self.messages) >= count)


async def wait_for(transport: Transport, predicate: Callable[[], bool]) -> None:
    await asyncio.wait_for(transport.wait_until(predicate), DEADLINE)


def make_transport(
    key: keys.PrivateKey,
    endpoints: dict[bytes, tuple[str, int]],
    port: int,
    config: TransportConfig = FAST,
    inbox: Inbox | None = None,
    chain_id: int = CHAIN_ID,
) -> tuple[Transport, Inbox]:
    inbox = inbox or Inbox()
    transport = Transport(key, chain_id, endpoints, HOST, port, inbox, config)
    return transport, inbox


def peer_view(transport: Transport, address: bytes) -> dict[str, Any]:
    peers: dict[str, dict[str, Any]] = transport.stats()["peers"]  # type: ignore[assignment]
    return peers["0x" + address.hex()]


def refused(transport: Transport, reason: str) -> int:
    counts: dict[str, int] = transport.stats()["handshakes_refused"]  # type: ignore[assignment]
    return counts.get(reason, 0)


def dropped(transport: Transport, reason: str) -> int:
    counts: dict[str, int] = transport.stats()["dropped"]  # type: ignore[assignment]
    return counts.get(reason, 0)


def settled_on_lower_initiator(transport: Transport, others: Iterable[Transport]) -> bool:
    """`transport` holds exactly the connection the lower address dialed to each of `others`."""
    for other in others:
        if other is transport:
            continue
        lower = min(transport.address, other.address)
        if peer_view(transport, other.address)["initiator"] != "0x" + lower.hex():
            return False
    return True


async def wait_all_settled(transports: list[Transport]) -> None:
    """Each transport waits on its own state changes for its own view of every pair."""
    await asyncio.gather(
        *(wait_for(t, lambda t=t: settled_on_lower_initiator(t, transports)) for t in transports)
    )


async def stop_all(transports: Iterable[Transport]) -> None:
    await asyncio.gather(*(t.stop() for t in transports))


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything the victim sends until it closes (EOF or reset); bounded by DEADLINE."""
    received = bytearray()
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(65536), DEADLINE):
            received += chunk
    return bytes(received)


# ----------------------------------------------------------------------------- raw peers


@dataclass
class RawPeer:
    """A hand-driven client socket, authenticated or not, for attacking a transport."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    send_cipher: SessionCipher | None = None
    recv_cipher: SessionCipher | None = None

    def close(self) -> None:
        self.writer.transport.abort()


async def raw_connect(port: int) -> RawPeer:
    reader, writer = await asyncio.open_connection(HOST, port)
    return RawPeer(reader, writer)


async def raw_handshake(
    port: int, key: keys.PrivateKey, claimed: bytes | None = None, chain_id: int = CHAIN_ID
) -> RawPeer:
    """Handshake as initiator with `key`; `claimed` makes it claim another address (impostor)."""
    peer = await raw_connect(port)
    try:
        state = HandshakeState(chain_id, Role.INITIATOR)
        peer.writer.write(encode_frame(state.hello.encode()))
        responder_hello = Hello.decode(await read_frame(peer.reader, HANDSHAKE_FRAME_CAP))
        transcript, send_cipher, recv_cipher = state.accept_peer_hello(responder_hello)
        if claimed is None:
            auth = sign_auth(key, Role.INITIATOR, transcript)
        else:
            digest = auth_signing_hash(Role.INITIATOR, transcript, claimed)
            auth = claimed + KEYS.ecdsa_sign(digest, key).to_bytes()
        peer.writer.write(encode_frame(send_cipher.seal(auth)))
        responder_auth = recv_cipher.open(await read_frame(peer.reader, HANDSHAKE_FRAME_CAP))
        verify_auth(responder_auth, Role.RESPONDER, transcript)
    except BaseException:
        peer.close()
        raise
    peer.send_cipher, peer.recv_cipher = send_cipher, recv_cipher
    return peer


def sealed_message(peer: RawPeer, channel: int, payload: bytes) -> bytes:
    assert peer.send_cipher is not None
    return encode_frame(peer.send_cipher.seal(bytes([channel]) + payload))


# ----------------------------------------------------------------------------- proxies


class Proxy:
    """A TCP relay in front of a transport: records client->server bytes, can hold
    connections at a shared gate, and counts live relayed connections."""

    def __init__(self, upstream_port: int, gate: asyncio.Event | None = None) -> None:
        self.upstream_port = upstream_port
        self.gate = gate
        self.arrived = Signal()
        self.arrivals = 0
        self.recorded = bytearray()
        self.recorded_signal = Signal()
        self.live = 0
        self.live_signal = Signal()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, HOST, 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        self.arrivals += 1
        self.arrived.pulse()
        if self.gate is not None:
            await self.gate.wait()
        up_reader, up_writer = await asyncio.open_connection(HOST, self.upstream_port)
        self._writers.append(up_writer)
        self.live += 1
        self.live_signal.pulse()
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, record=True)),
            asyncio.create_task(self._pump(up_reader, writer, record=False)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        writer.transport.abort()
        up_writer.transport.abort()
        self.live -= 1
        self.live_signal.pulse()

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, record: bool
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await source.read(65536):
                if record:
                    self.recorded += chunk
                    self.recorded_signal.pulse()
                sink.write(chunk)
                await sink.drain()

    def recorded_frames(self, count: int) -> bytes | None:
        """The first `count` complete frames the client sent, or None if not there yet."""
        offset = 0
        for _ in range(count):
            if len(self.recorded) < offset + 4:
                return None
            offset += 4 + int.from_bytes(self.recorded[offset : offset + 4], "big")
            if len(self.recorded) < offset:
                return None
        return bytes(self.recorded[:offset])


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def caplog_transport(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="chain.transport")
    return caplog


def two_validator_endpoints(b_port: int | None = None) -> tuple[dict, int, int]:
    """Endpoints for validators 0 (A) and 1 (B); B at a port nobody listens on by default."""
    a_port = free_port()
    b_port = b_port if b_port is not None else free_port()
    endpoints = {
        address_of(VALIDATOR_KEYS[0]): (HOST, a_port),
        address_of(VALIDATOR_KEYS[1]): (HOST, b_port),
    }
    return endpoints, a_port, b_port


# ----------------------------------------------------------------------------- tests


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


def test_unknown_key_is_refused(caplog_transport: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        endpoints, a_port, _ = two_validator_endpoints()
        a, a_inbox = make_transport(VALIDATOR_KEYS[0], endpoints, a_port)
        # The stranger knows A and dials it with a key A has never heard of.
        stranger_endpoints = {
            address_of(VALIDATOR_KEYS[0]): (HOST, a_port),
            address_of(STRANGER_KEY): (HOST, free_port()),
        }
        stranger, _ = make_transport(STRANGER_KEY, stranger_endpoints, 0)
        await a.start()
        await stranger.start()
        try:
            await wait_for(a, lambda: refused(a, "unknown_key") >= 1)
            assert a.connected_peers() == set()
            assert dropped(a, "auth_failure") >= 1
            assert not stranger.send(address_of(VALIDATOR_KEYS[1]), Channel.ENGINE, b"x")
        finally:
            await stop_all([a, stranger])
        assert a_inbox.messages == []

    run(body())
    assert "unknown_key" in caplog_transport.text
    assert "0x" + address_of(STRANGER_KEY).hex() in caplog_transport.text


@pytest.mark.parametrize("forgery", ["impostor", "garbage_signature"])
def test_claimed_identity_without_valid_signature_is_refused(
    forgery: str, caplog_transport: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        endpoints, a_port, _ = two_validator_endpoints()
        a, a_inbox = make_transport(VALIDATOR_KEYS[0], endpoints, a_port)
        victim_b = address_of(VALIDATOR_KEYS[1])
        await a.start()
        try:
            peer = await raw_connect(a_port)
            state = HandshakeState(CHAIN_ID, Role.INITIATOR)
            peer.writer.write(encode_frame(state.hello.encode()))
            a_hello = Hello.decode(await read_frame(peer.reader, HANDSHAKE_FRAME_CAP))
            transcript, send_cipher, _ = state.accept_peer_hello(a_hello)
            if forgery == "impostor":  # claims B, signs with its own key
                digest = auth_signing_hash(Role.INITIATOR, transcript, victim_b)
                signature = KEYS.ecdsa_sign(digest, STRANGER_KEY).to_bytes()
            else:
                signature = b"\x01" * 64 + b"\x05"
            peer.writer.write(encode_frame(send_cipher.seal(victim_b + signature)))
            await read_until_closed(peer.reader)
            await wait_for(a, lambda: refused(a, "bad_signature") == 1)
            assert a.connected_peers() == set()
            peer.close()
        finally:
            await a.stop()
        assert a_inbox.messages == []

    run(body())
    assert "bad_signature" in caplog_transport.text


def test_replayed_handshake_is_refused(caplog_transport: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        a_key, b_key = VALIDATOR_KEYS[0], VALIDATOR_KEYS[1]
        a_port = free_port()
        proxy = Proxy(a_port)
        proxy_port = await proxy.start()
        # A cannot dial B (dead port); B reaches A only through the recording proxy.
        a_endpoints = {address_of(a_key): (HOST, a_port), address_of(b_key): (HOST, free_port())}
        b_endpoints = {address_of(a_key): (HOST, proxy_port), address_of(b_key): (HOST, 0)}
        a, _ = make_transport(a_key, a_endpoints, a_port)
        b, _ = make_transport(b_key, b_endpoints, 0)
        a_again, _ = make_transport(a_key, a_endpoints, 0)  # same key, empty nonce memory
        transports = [a, b, a_again]
        await asyncio.gather(*(t.start() for t in transports))
        try:
            await wait_for(a, lambda: a.connected_peers() == {b.address})
            await proxy.recorded_signal.wait_until(lambda: proxy.recorded_frames(2) is not None)
            handshake_bytes = proxy.recorded_frames(2)
            assert handshake_bytes is not None

            # Replayed to A itself: its memory of B's nonce names the replay.
            attacker = await raw_connect(a_port)
            attacker.writer.write(handshake_bytes)
            await read_until_closed(attacker.reader)
            attacker.close()
            await wait_for(a, lambda: refused(a, "replayed_nonce") == 1)

            # Replayed to a fresh process with the same key: freshness alone defeats it, because
            # the recorded AUTH was sealed under keys from A's old ephemeral key and nonce.
            attacker = await raw_connect(a_again.listen_port)
            attacker.writer.write(handshake_bytes)
            await read_until_closed(attacker.reader)
            attacker.close()
            await wait_for(a_again, lambda: refused(a_again, "bad_auth") == 1)
            assert a_again.connected_peers() == set()
            assert a.connected_peers() == {b.address}
        finally:
            await stop_all(transports)
            await proxy.stop()

    run(body())
    assert "replayed_nonce" in caplog_transport.text
    assert "bad_auth" in caplog_transport.text


def test_silent_peer_times_out_both_directions(caplog_transport: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        config = TransportConfig(
            handshake_timeout=0.3, backoff_initial=5.0, keepalive_interval=1.0, idle_timeout=5.0
        )
        silent_connections: list[asyncio.StreamWriter] = []
        silent_connected = Signal()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            silent_connections.append(writer)
            silent_connected.pulse()

        silent_server = await asyncio.start_server(silent, HOST, 0)
        silent_port = int(silent_server.sockets[0].getsockname()[1])
        endpoints, a_port, _ = two_validator_endpoints(b_port=silent_port)
        a, _ = make_transport(VALIDATOR_KEYS[0], endpoints, a_port, config=config)
        await a.start()
        try:
            # Inbound: a client that connects and says nothing gets A's hello, then EOF.
            started = time.monotonic()
            peer = await raw_connect(a_port)
            sent_by_a = await read_until_closed(peer.reader)
            peer.close()
            assert (
                len(sent_by_a) == 4 + HELLO_SIZE
                and Hello.decode(sent_by_a[4:]).chain_id == CHAIN_ID
            )
            assert time.monotonic() - started >= 0.25
            # Outbound: A dials B's endpoint, which accepts and never answers.
            await silent_connected.wait_until(lambda: len(silent_connections) >= 1)
            await wait_for(a, lambda: refused(a, "timeout") == 2)
            assert a.connected_peers() == set()
        finally:
            await a.stop()
            silent_server.close()
            for writer in silent_connections:
                writer.transport.abort()

    run(body())
    assert caplog_transport.text.count("handshake not finished in time") == 2


BAD_FRAMES = {
    "zero_length": (0).to_bytes(4, "big"),
    "length_2_31": (2**31).to_bytes(4, "big"),
    "length_2_32_minus_1": (2**32 - 1).to_bytes(4, "big"),
    "truncated": (100).to_bytes(4, "big") + b"\x00" * 10,
}


@pytest.mark.parametrize("phase", ["before_handshake", "after_handshake"])
@pytest.mark.parametrize("frame", sorted(BAD_FRAMES))
def test_bad_frame_closes_connection_without_allocating(
    frame: str, phase: str, caplog_transport: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        endpoints, a_port, _ = two_validator_endpoints()
        a, a_inbox = make_transport(VALIDATOR_KEYS[0], endpoints, a_port)
        await a.start()
        try:
            if phase == "before_handshake":
                peer = await raw_connect(a_port)
            else:
                peer = await raw_handshake(a_port, VALIDATOR_KEYS[1])
                peer.writer.write(sealed_message(peer, Channel.ENGINE, b"fine"))
                await a_inbox.wait_for_count(1)
            tracemalloc.start()
            try:
                baseline, _ = tracemalloc.get_traced_memory()
                peer.writer.write(BAD_FRAMES[frame])
                if frame == "truncated":
                    peer.writer.write_eof()
                # Only the header was sent: the victim must close without waiting for a body.
                await read_until_closed(peer.reader)
                await wait_for(a, lambda: dropped(a, "bad_frame") == 1)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak - baseline < 1024 * 1024
            assert a.connected_peers() == set()
            if phase == "before_handshake":
                assert refused(a, "bad_frame") == 1
            peer.close()
        finally:
            await a.stop()

    run(body())
    expected_reason = {
        "zero_length": "zero-length frame",
        "length_2_31": f"frame length {2**31} exceeds cap",
        "length_2_32_minus_1": f"frame length {2**32 - 1} exceeds cap",
        "truncated": "truncated frame (10 of 100 bytes)",
    }[frame]
    assert expected_reason in caplog_transport.text


@pytest.mark.parametrize("attack", ["tampered", "replayed"])
def test_tampered_or_replayed_sealed_frame_closes_connection(
    attack: str, caplog_transport: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        endpoints, a_port, _ = two_validator_endpoints()
        a, a_inbox = make_transport(VALIDATOR_KEYS[0], endpoints, a_port)
        await a.start()
        try:
            peer = await raw_handshake(a_port, VALIDATOR_KEYS[1])
            good = sealed_message(peer, Channel.ENGINE, b"first")
            peer.writer.write(good)
            await a_inbox.wait_for_count(1)
            assert a_inbox.messages == [(address_of(VALIDATOR_KEYS[1]), 0, b"first")]
            assert a.connected_peers() == {address_of(VALIDATOR_KEYS[1])}
            if attack == "tampered":
                frame = bytearray(sealed_message(peer, Channel.ENGINE, b"second"))
                frame[6] ^= 0x01
                peer.writer.write(bytes(frame))
            else:
                peer.writer.write(good)
            await read_until_closed(peer.reader)
            await wait_for(a, lambda: dropped(a, "decrypt_failure") == 1)
            assert a.connected_peers() == set()
            assert len(a_inbox.messages) == 1
            peer.close()
        finally:
            await a.stop()

    run(body())
    assert "decrypt failure" in caplog_transport.text


def test_connection_to_oneself_is_refused(caplog_transport: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        a_port = free_port()
        # A misconfigured peer entry that points back at A's own listener.
        endpoints = {address_of(VALIDATOR_KEYS[0]): (HOST, a_port), b"\xee" * 20: (HOST, a_port)}
        a, _ = make_transport(VALIDATOR_KEYS[0], endpoints, a_port)
        await a.start()
        try:
            # Both ends of the loop refuse: the responder and the initiator half.
            await wait_for(a, lambda: refused(a, "self_connection") >= 2)
            assert a.connected_peers() == set()
        finally:
            await a.stop()

    run(body())
    assert "self_connection" in caplog_transport.text


def test_peer_leaving_mid_handshake_is_counted_but_not_warned(
    caplog_transport: pytest.LogCaptureFixture
) -> None:
    """Restarts and reset dials end handshakes early all the time: INFO, not WARNING."""
    async def body() -> None:
        endpoints, a_port, _ = two_validator_endpoints()
        a, _ = make_transport(VALIDATOR_KEYS[0], endpoints, a_port)
        await a.start()
        try:
            peer = await raw_connect(a_port)
            peer.close()
            await wait_for(a, lambda: refused(a, "connection_lost") == 1)
        finally:
            await a.stop()

    run(body())
    (record,) = [r for r in caplog_transport.records if "connection_lost" in r.getMessage()]
    assert record.levelno == logging.INFO


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


def test_signature_is_bound_to_role_transcript_and_address() -> None:
    transcript = b"\x11" * 32
    auth = sign_auth(VALIDATOR_KEYS[0], Role.RESPONDER, transcript)
    assert verify_auth(auth, Role.RESPONDER, transcript) == address_of(VALIDATOR_KEYS[0])
    tampered = [
        (auth, Role.INITIATOR, transcript),  # a responder's signature reflected as initiator's
        (auth, Role.RESPONDER, b"\x12" * 32),  # another session's transcript
        (address_of(VALIDATOR_KEYS[1]) + auth[20:], Role.RESPONDER, transcript),  # other claim
    ]
    for data, role, other_transcript in tampered:
        with pytest.raises(HandshakeRefused) as refusal:
            verify_auth(data, role, other_transcript)
        assert refusal.value.reason == "bad_signature"


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


def test_chain_id_mismatch_is_refused() -> None:
    async def body() -> None:
        endpoints, a_port, _ = two_validator_endpoints()
        a, _ = make_transport(VALIDATOR_KEYS[0], endpoints, a_port)
        await a.start()
        try:
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError, TransportError)):
                await raw_handshake(a_port, VALIDATOR_KEYS[1], chain_id=CHAIN_ID + 1)
            await wait_for(a, lambda: refused(a, "chain_id_mismatch") == 1)
        finally:
            await a.stop()

    run(body())
