"""The handshake over real TCP on 127.0.0.1: who may connect, replays, timeouts, roles."""


from __future__ import annotations

import asyncio
import logging
import time

import pytest

from chain.p2p import Channel, TransportConfig
from chain.p2p.errors import HandshakeRefused, TransportError
from chain.p2p.framing import encode_frame, read_frame
from chain.p2p.handshake import (
    KEYS,
    HandshakeState,
    Hello,
    auth_signing_hash,
    sign_auth,
    verify_auth,
)
from chain.p2p.wire import HANDSHAKE_FRAME_CAP, HELLO_SIZE, Role
from tests.unit.p2p.support import (
    CHAIN_ID,
    HOST,
    STRANGER_KEY,
    VALIDATOR_KEYS,
    Proxy,
    Signal,
    address_of,
    dropped,
    free_port,
    make_transport,
    raw_connect,
    raw_handshake,
    read_until_closed,
    refused,
    run,
    stop_all,
    two_validator_endpoints,
    validator_a,
    wait_for,
)


def test_unknown_key_is_refused(caplog_transport: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        a, a_inbox, a_port = validator_a()
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
        a, a_inbox, a_port = validator_a()
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
