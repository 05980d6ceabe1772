"""What the chain.p2p tests share: transports on 127.0.0.1, raw peers, proxies.

pytest-asyncio is not installed, so every test is a sync function that runs one coroutine
under a hard deadline with `run()`. Nothing sleeps to wait: tests wait on events (an Inbox or
a proxy's Signal) or on `Transport.wait_until`, always bounded by `asyncio.wait_for`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from eth_keys import keys

from chain.p2p import Transport, TransportConfig
from chain.p2p.framing import SessionCipher, encode_frame, read_frame
from chain.p2p.handshake import (
    KEYS,
    HandshakeState,
    Hello,
    auth_signing_hash,
    sign_auth,
    verify_auth,
)
from chain.p2p.wire import HANDSHAKE_FRAME_CAP, Role
from testkit.nodes import free_port

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




def two_validator_endpoints(b_port: int | None = None) -> tuple[dict, int, int]:
    """Endpoints for validators 0 (A) and 1 (B); B at a port nobody listens on by default."""
    a_port = free_port()
    b_port = b_port if b_port is not None else free_port()
    endpoints = {
        address_of(VALIDATOR_KEYS[0]): (HOST, a_port),
        address_of(VALIDATOR_KEYS[1]): (HOST, b_port),
    }
    return endpoints, a_port, b_port


def validator_a() -> tuple[Transport, Inbox, int]:
    """Validator 0 (A), not started yet, knowing B's address at a port nobody listens on:
    (transport, its inbox, its port)."""
    endpoints, a_port, _ = two_validator_endpoints()
    a, a_inbox = make_transport(VALIDATOR_KEYS[0], endpoints, a_port)
    return a, a_inbox, a_port
