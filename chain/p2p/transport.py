"""The asyncio TCP transport: listening, dialing with backoff, the handshake on each
connection, reading and writing frames."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Collection, Coroutine, Mapping
from typing import Any

from eth_keys.datatypes import PrivateKey

from chain.p2p.admission import PendingHandshake, PendingHandshakes
from chain.p2p.config import TransportConfig
from chain.p2p.connections import PeerConnection, PeerState, prefer_connection
from chain.p2p.errors import (
    ConnectionClosed,
    DecryptError,
    FrameError,
    HandshakeRefused,
    TransportConfigError,
    TransportError,
)
from chain.p2p.framing import encode_frame, read_frame
from chain.p2p.handshake import HandshakeState, Hello, NonceCache, Session, sign_auth, verify_auth
from chain.p2p.interface import PeerTransport
from chain.p2p.stats import TransportStats, channel_name
from chain.p2p.throttle import ThrottledLog
from chain.p2p.wire import (
    ADDRESS_SIZE,
    HANDSHAKE_FRAME_CAP,
    KEEPALIVE_CHANNEL,
    USER_CHANNELS,
    Address,
    Channel,
    Endpoint,
    MessageHandler,
    Role,
)

log = logging.getLogger(__name__)
COALESCED_WRITE_BYTES = 256 * 1024  # queued frames joined into one write, up to about this
# Refusals that are routine (restarts, reset dials, a flood's silent connections): INFO.
ROUTINE_REFUSALS = frozenset({"connection_lost", "evicted"})


class Transport(PeerTransport):
    """The node-to-node transport: one authenticated, sealed connection per peer.

    `validators` are the peers this node dials (on an observer: the validators and the other
    observers it follows through); `observers` are node keys that may only connect in: never
    dialed, left out of `broadcast`, and a message for one that is not connected is dropped
    (not queued) and what was queued for one is dropped when its connection closes, so a
    validator that loses its observers holds nothing for them. Any other
    key is refused at the handshake.
    """

    def __init__(
        self,
        private_key: PrivateKey,
        chain_id: int,
        validators: Mapping[Address, Endpoint],
        listen_host: str,
        listen_port: int,
        on_message: MessageHandler,
        config: TransportConfig | None = None,
        observers: Collection[Address] = (),
    ) -> None:
        for address in (*validators, *observers):
            if len(address) != ADDRESS_SIZE:
                raise TransportConfigError(f"peer address {address!r} is not 20 bytes")
        self._private_key = private_key
        self._address: Address = private_key.public_key.to_canonical_address()
        self._chain_id = chain_id
        self._config = config or TransportConfig()
        self._listen_host = listen_host
        self._requested_port = listen_port
        self._on_message = on_message
        endpoints: dict[Address, Endpoint | None] = dict.fromkeys(observers)
        endpoints.update(validators)
        self._peers: dict[Address, PeerState] = {
            address: PeerState(address, endpoint, self._config)
            for address, endpoint in endpoints.items()
            if address != self._address
        }
        self._stats = TransportStats()
        self._seen_nonces = NonceCache(self._config.seen_nonce_cache_size)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[PeerConnection] = set()
        self._pending = PendingHandshakes(
            self._config.max_pending_handshakes, self._config.max_pending_per_ip
        )
        self._refusals = ThrottledLog(log, "refused handshakes")
        self._running = False
        self._change_waiters: set[asyncio.Future[None]] = set()

    # ---- public API

    @property
    def address(self) -> Address:
        return self._address

    @property
    def listen_port(self) -> int:
        """The bound port (useful when constructed with port 0); only valid after start()."""
        if self._server is None or not self._server.sockets:
            raise TransportError("transport is not listening")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        if self._running:
            raise TransportError("transport already started")
        self._server = await asyncio.start_server(
            self._accept, self._listen_host, self._requested_port
        )
        self._running = True
        for peer in self._peers.values():
            if peer.endpoint is not None:
                self._spawn(self._dial_loop(peer), name=f"dial-{peer.address.hex()[:8]}")
        log.info("transport 0x%s listening on port %d", self._address.hex(), self.listen_port)

    async def stop(self) -> None:
        self._running = False
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._refusals.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def send(self, address: Address, channel: int, payload: bytes) -> bool:
        """Enqueue without blocking; False (and a counted drop) if it cannot be queued.

        Frames also queue while a dialed peer is disconnected and go out once it reconnects,
        within the same count/byte bounds (an observer's are dropped: it may never come back).
        Delivery is best effort: a frame already taken off the queue when its connection dies
        is lost (consensus retransmits what matters).
        """
        peer = self._peers.get(address)
        if peer is None:
            return self._drop("unknown_peer")
        if peer.endpoint is None and peer.connection is None:
            return self._drop("not_connected")
        if channel not in USER_CHANNELS:
            raise TransportError(f"channel {channel} is not one of {sorted(USER_CHANNELS)}")
        if len(payload) > self._config.max_payload_size:
            log.error("a %d-byte message on channel %d exceeds the %d-byte frame cap; not sent to "
                      "0x%s", len(payload), channel, self._config.max_payload_size, address.hex())
            return self._drop("too_large")
        if not self._running:
            return self._drop("not_running")
        if not peer.queue.put(channel, payload):
            return self._drop("queue_full")
        return True

    def broadcast(self, channel: int, payload: bytes) -> int:
        """`send` to every peer this node dials (not to observers); how many accepted it."""
        return sum(self.send(address, channel, payload)
                   for address, peer in self._peers.items() if peer.endpoint is not None)

    def connected_peers(self) -> set[Address]:
        return {address for address, peer in self._peers.items() if peer.connection is not None}

    def connected_observers(self) -> set[Address]:
        """The connected peers that dialed in as observers (never dialed by this node)."""
        return {address for address, peer in self._peers.items()
                if peer.connection is not None and peer.endpoint is None}

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait, without polling, until `predicate()` holds.

        It is re-checked whenever a connection opens or closes, a handshake is refused or a
        message is dropped; callers bound the wait with `asyncio.wait_for`.
        """
        while not predicate():
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._change_waiters.add(waiter)
            try:
                await waiter
            finally:
                self._change_waiters.discard(waiter)

    def _notify_change(self) -> None:
        for waiter in self._change_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._change_waiters.clear()

    def stats(self) -> dict[str, object]:
        snapshot = self._stats.snapshot()
        snapshot["connected_peers"] = len(self.connected_peers())
        snapshot["peers"] = {
            "0x" + address.hex(): {
                "connected": peer.connection is not None,
                "initiator": ("0x" + peer.connection.initiator.hex() if peer.connection else None),
                "queued_frames": len(peer.queue),
                "queued_bytes": peer.queue.queued_bytes,
            }
            for address, peer in self._peers.items()
        }
        return snapshot

    # ---- task bookkeeping

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _drop(self, reason: str) -> bool:
        self._stats.dropped[reason] += 1
        self._notify_change()
        return False

    # ---- dialing

    def _backoff_delay(self, failures: int) -> float:
        """Capped exponential backoff with jitter, so restarted peers are not stampeded."""
        base = min(self._config.backoff_max, self._config.backoff_initial * 2 ** min(failures, 32))
        return base * random.uniform(0.5, 1.0)

    async def _wait_for_connection(self, peer: PeerState, timeout: float) -> bool:
        """Wait up to `timeout` for some connection to the peer; True if one exists."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(peer.connected.wait(), timeout)
        return peer.connection is not None

    async def _dial_loop(self, peer: PeerState) -> None:
        failures = 0
        while self._running:
            if peer.connection is not None:
                await peer.disconnected.wait()
                continue
            if self._address > peer.address and failures == 0:
                delay = self._config.higher_address_dial_delay
                if await self._wait_for_connection(peer, delay):
                    continue
            if await self._dial_once(peer):
                failures = 0
                continue
            if await self._wait_for_connection(peer, self._backoff_delay(failures)):
                failures = 0
                continue
            failures += 1

    async def _dial_once(self, peer: PeerState) -> bool:
        assert peer.endpoint is not None  # observers are not dialed
        host, port = peer.endpoint
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), self._config.handshake_timeout
            )
        except (OSError, TimeoutError) as exc:
            log.debug("dial 0x%s at %s:%d failed: %s", peer.address.hex(), host, port, exc)
            return False
        connection = await self._authenticate(reader, writer, Role.INITIATOR, peer.address, None)
        if connection is None:
            return False
        self._spawn(self._serve(connection), name=f"conn-out-{peer.address.hex()[:8]}")
        return True

    # ---- accepting

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Server callback: hand the socket to a task we own, so stop() can cancel it."""
        self._spawn(self._serve_inbound(reader, writer), name="conn-in")

    async def _serve_inbound(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if not self._running:
            writer.transport.abort()
            return
        peername = writer.get_extra_info("peername")
        slot = self._pending.admit(str(peername[0]) if peername else "?", writer.transport.abort)
        if isinstance(slot, str):
            self._refuse(writer, HandshakeRefused(slot, "pending handshake slots full"))
            return
        connection = await self._authenticate(reader, writer, Role.RESPONDER, None, slot)
        if connection is not None:
            await self._serve(connection)

    # ---- handshake

    async def _authenticate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        role: Role,
        expected: Address | None,
        slot: PendingHandshake | None,
    ) -> PeerConnection | None:
        """Run the handshake under its deadline; a registered connection or None (refused).
        An inbound one holds its pending `slot` meanwhile (dials hold none)."""
        try:
            async with asyncio.timeout(self._config.handshake_timeout):
                session = await self._handshake(reader, writer, role, expected, slot)
        except TimeoutError:
            self._refuse(writer, HandshakeRefused("timeout", "handshake not finished in time"))
            return None
        except HandshakeRefused as exc:
            self._refuse(writer, exc)
            return None
        except FrameError as exc:
            self._stats.dropped["bad_frame"] += 1
            self._refuse(writer, HandshakeRefused("bad_frame", str(exc)))
            return None
        except (ConnectionClosed, OSError) as exc:
            if slot is not None and slot.evicted:
                refusal = HandshakeRefused("evicted", "silent; its slot went to a newcomer")
            else:
                refusal = HandshakeRefused("connection_lost", str(exc) or type(exc).__name__)
            self._refuse(writer, refusal)
            return None
        finally:
            if slot is not None:
                self._pending.release(slot)
        self._stats.handshakes_completed += 1
        connection = PeerConnection(reader, writer, session, role is Role.INITIATOR, self._address)
        return connection if self._adopt(connection) else None

    async def _handshake(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        role: Role,
        expected: Address | None,
        slot: PendingHandshake | None,
    ) -> Session:
        state = HandshakeState(self._chain_id, role)
        writer.write(encode_frame(state.hello.encode()))
        await writer.drain()
        peer_hello = await self._read_hello(reader)
        transcript, send_cipher, recv_cipher = state.accept_peer_hello(peer_hello)
        if slot is not None:
            slot.greeted = True
        if not self._seen_nonces.check_and_add(peer_hello.nonce):
            raise HandshakeRefused("replayed_nonce", "peer hello nonce was seen before")
        writer.write(encode_frame(send_cipher.seal(sign_auth(self._private_key, role, transcript))))
        await writer.drain()
        sealed_auth = await read_frame(reader, HANDSHAKE_FRAME_CAP)
        try:
            auth = recv_cipher.open(sealed_auth)
        except DecryptError:
            raise HandshakeRefused(
                "bad_auth", "auth does not decrypt (replayed or tampered handshake)"
            ) from None
        peer_address = verify_auth(auth, role.other, transcript)
        self._check_identity(peer_address, expected)
        return Session(peer_address, send_cipher, recv_cipher)

    async def _read_hello(self, reader: asyncio.StreamReader) -> Hello:
        """The peer's HELLO, within the first-frame deadline."""
        try:
            async with asyncio.timeout(self._config.hello_timeout):
                return Hello.decode(await read_frame(reader, HANDSHAKE_FRAME_CAP))
        except TimeoutError:
            timeout = self._config.hello_timeout
            raise HandshakeRefused("no_hello", f"no hello within {timeout:g} s") from None

    def _check_identity(self, peer_address: Address, expected: Address | None) -> None:
        if peer_address == self._address:
            raise HandshakeRefused("self_connection", "peer is ourselves")
        if peer_address not in self._peers:
            raise HandshakeRefused("unknown_key",
                                   f"0x{peer_address.hex()} is not a configured peer")
        if expected is not None and peer_address != expected:
            raise HandshakeRefused(
                "identity_mismatch",
                f"dialed 0x{expected.hex()} but reached 0x{peer_address.hex()}",
            )

    def _refuse(self, writer: asyncio.StreamWriter, refusal: HandshakeRefused) -> None:
        self._stats.handshakes_refused[refusal.reason] += 1
        self._stats.dropped["auth_failure"] += 1
        level = logging.INFO if refusal.reason in ROUTINE_REFUSALS else logging.WARNING
        self._refusals.log(level, refusal.reason, "refused handshake with %s: %s",
                           writer.get_extra_info("peername"), refusal)
        writer.transport.abort()
        self._notify_change()

    # ---- registered connections

    def _adopt(self, connection: PeerConnection) -> bool:
        """Make `connection` the peer's connection unless a preferred one already exists."""
        if not self._running:
            connection.abort()
            return False
        peer = self._peers[connection.peer_address]
        existing = peer.connection
        if existing is not None:
            keep = prefer_connection(existing, connection)
            loser = connection if keep is existing else existing
            self._stats.duplicates_closed += 1
            log.info(
                "duplicate connection to 0x%s: keeping the one initiated by 0x%s",
                peer.address.hex(),
                keep.initiator.hex(),
            )
            self._close(loser, "duplicate connection")
            if keep is existing:
                return False
        peer.connection = connection
        peer.disconnected.clear()
        peer.connected.set()
        self._connections.add(connection)
        connection.writer_task = self._spawn(
            self._write_loop(peer, connection), name=f"write-{peer.address.hex()[:8]}"
        )
        log.info("connected to %s 0x%s", "peer" if peer.endpoint else "observer",
                 peer.address.hex())
        self._notify_change()
        return True

    def _close(self, connection: PeerConnection, reason: str) -> None:
        """Close and unregister; idempotent. The dial loop notices via `disconnected`."""
        if not connection.closed.is_set():
            log.info("closing connection to 0x%s: %s", connection.peer_address.hex(), reason)
        connection.abort()
        self._connections.discard(connection)
        peer = self._peers.get(connection.peer_address)
        if peer is not None and peer.connection is connection:
            peer.connection = None
            peer.connected.clear()
            peer.disconnected.set()
            if peer.endpoint is None:  # an observer: it may never come back, and what was
                peer.queue.clear()  # queued for it would be stale if it did
        self._notify_change()

    async def _serve(self, connection: PeerConnection) -> None:
        """Read frames until the connection dies; the reason ends up in the log and stats."""
        try:
            await self._read_loop(connection)
        except ConnectionClosed:
            self._close(connection, "peer closed the connection")
        except FrameError as exc:
            self._stats.dropped["bad_frame"] += 1
            self._close(connection, f"bad frame: {exc}")
        except DecryptError as exc:
            self._stats.dropped["decrypt_failure"] += 1
            self._close(connection, f"decrypt failure: {exc}")
        except TimeoutError:
            self._close(connection, "idle timeout")
        except OSError as exc:
            self._close(connection, f"socket error: {exc}")
        finally:
            self._close(connection, "connection task ended")

    async def _read_loop(self, connection: PeerConnection) -> None:
        cipher = connection.session.recv_cipher
        while not connection.closed.is_set():
            async with asyncio.timeout(self._config.idle_timeout):
                sealed = await read_frame(connection.reader, self._config.max_frame_size)
            plaintext = cipher.open(sealed)
            if not plaintext:
                raise FrameError("sealed frame without a channel id")
            self._deliver(connection.peer_address, plaintext[0], plaintext[1:])

    def _deliver(self, sender: Address, channel: int, payload: bytes) -> None:
        if channel == KEEPALIVE_CHANNEL:
            return
        name = channel_name(channel)
        self._stats.frames_in[name] += 1
        self._stats.bytes_in[name] += len(payload)
        if channel not in USER_CHANNELS:
            self._drop("unknown_channel")
            return
        try:
            self._on_message(sender, Channel(channel), payload)
        except Exception:
            # A bug in a handler must not tear down the validator link.
            self._drop("handler_error")
            log.exception("message handler failed for channel %s from 0x%s", name, sender.hex())

    def _count_out(self, channel: int, payload: bytes) -> None:
        name = channel_name(channel)
        self._stats.frames_out[name] += 1
        self._stats.bytes_out[name] += len(payload)

    async def _write_loop(self, peer: PeerState, connection: PeerConnection) -> None:
        cipher = connection.session.send_cipher
        try:
            while not connection.closed.is_set():
                item = await peer.queue.get(self._config.keepalive_interval)
                channel, payload = item if item is not None else (KEEPALIVE_CHANNEL, b"")
                frames = [encode_frame(cipher.seal(bytes([channel]) + payload))]
                if item is not None:
                    self._count_out(channel, payload)
                # What else is queued goes out in the same write: a burst's gossip is one
                # frame per transaction, and a write each costs a system call on both ends.
                size = len(frames[0])
                while size < COALESCED_WRITE_BYTES and (item := peer.queue.get_nowait()):
                    channel, payload = item
                    frames.append(encode_frame(cipher.seal(bytes([channel]) + payload)))
                    size += len(frames[-1])
                    self._count_out(channel, payload)
                connection.writer.write(b"".join(frames))
                await connection.writer.drain()
        except (OSError, DecryptError) as exc:
            self._close(connection, f"write failed: {exc}")
