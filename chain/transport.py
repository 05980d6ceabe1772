"""Authenticated, encrypted validator-to-validator transport over asyncio TCP (DESIGN.md §6).

Wire format: every frame is a 4-byte big-endian length followed by that many bytes. The length
is checked against a hard cap *before* the body is read, so a hostile peer cannot make us
allocate more than the cap (frames are read one at a time; asyncio's StreamReader grows its
buffer only as bytes actually arrive).

Handshake (both sides run the same code; the dialer is the *initiator*):

1. Each side sends HELLO = version | chain id | fresh 32-byte nonce | ephemeral X25519 key.
2. Each side computes the transcript hash T = SHA-256(tag | chain id | nonce_i | nonce_r |
   eph_i | eph_r) (initiator's values first) and session keys
   HKDF-SHA256(X25519 shared secret, salt=T) -> one ChaCha20-Poly1305 key per direction.
3. Each side sends AUTH = its address | secp256k1 signature over
   keccak256(auth tag | role | T | its address), sealed with its send key (counter 0).
   The receiver recovers the signer, checks it equals the claimed address, is a validator, is
   not itself and (initiator only) is the address it dialed.

Fresh nonces and ephemeral keys on both sides mean a recorded handshake cannot be replayed
(its AUTH does not decrypt or verify under the new transcript); a bounded cache of recently
seen peer nonces additionally names the replay in the logs. Every later frame is
ChaCha20-Poly1305 sealed with a per-direction counter nonce, so a tampered, replayed,
reordered or dropped frame fails to decrypt and closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import random
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from eth_keys import KeyAPI
from eth_keys.backends import CoinCurveECCBackend
from eth_keys.datatypes import PrivateKey
from eth_utils import keccak

from chain.errors import ChainError

log = logging.getLogger(__name__)

KEYS = KeyAPI(CoinCurveECCBackend)

PROTOCOL_VERSION = 1
TRANSCRIPT_TAG = b"pbft-chain/transport/v1/transcript"
AUTH_TAG = b"pbft-chain/transport/v1/auth"
SESSION_KEYS_INFO = b"pbft-chain/transport/v1/session-keys"

FRAME_HEADER_SIZE = 4
NONCE_SIZE = 32
X25519_KEY_SIZE = 32
ADDRESS_SIZE = 20
SIGNATURE_SIZE = 65
AEAD_TAG_SIZE = 16
CHANNEL_ID_SIZE = 1
HELLO_SIZE = 1 + 8 + NONCE_SIZE + X25519_KEY_SIZE
AUTH_SIZE = ADDRESS_SIZE + SIGNATURE_SIZE
# Handshake frames are tiny; capping them separately means an unauthenticated peer can never
# make us buffer more than this, whatever the configured post-handshake cap.
HANDSHAKE_FRAME_CAP = 256

Address = bytes
Endpoint = tuple[str, int]
MessageHandler = Callable[[Address, int, bytes], None]


class Channel(IntEnum):
    """Logical streams multiplexed on one connection (1 byte inside the sealed frame)."""

    ENGINE = 0
    TX_GOSSIP = 1
    BLOCK_SYNC = 2


USER_CHANNELS = frozenset(int(channel) for channel in Channel)

# Internal keepalive, never handed to the message callback; lets both ends notice a dead peer.
KEEPALIVE_CHANNEL = 255


class Role(Enum):
    """Which end of the TCP connection we are; bound into every signature to stop reflection."""

    INITIATOR = b"I"
    RESPONDER = b"R"

    @property
    def other(self) -> Role:
        return Role.RESPONDER if self is Role.INITIATOR else Role.INITIATOR


# --------------------------------------------------------------------------- exceptions


class TransportError(ChainError):
    """Base of everything the transport raises."""


class TransportConfigError(TransportError):
    """Constructor arguments or limits that cannot work."""


class ConnectionClosed(TransportError):
    """The peer closed the connection cleanly between frames."""


class FrameError(TransportError):
    """A frame that violates the framing rules (zero length, over the cap, truncated)."""


class DecryptError(TransportError):
    """A sealed frame that does not authenticate under the session key and expected counter."""


class HandshakeRefused(TransportError):
    """A handshake we refuse; `reason` is a short stable key used in logs and stats."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class TransportConfig:
    """Limits and timings; defaults suit a LAN/WAN validator set."""

    max_frame_size: int = 16 * 1024 * 1024
    handshake_timeout: float = 5.0
    max_queue_frames: int = 4096
    max_queue_bytes: int = 64 * 1024 * 1024
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    # The higher address waits this long before dialing so that, in the common case, only the
    # lower address's (preferred) connection is made and no duplicate has to be torn down.
    higher_address_dial_delay: float = 0.3
    keepalive_interval: float = 5.0
    idle_timeout: float = 20.0
    max_pending_handshakes: int = 64
    seen_nonce_cache_size: int = 4096

    def __post_init__(self) -> None:
        minimum_frame = CHANNEL_ID_SIZE + AEAD_TAG_SIZE + 1
        if self.max_frame_size < minimum_frame or self.max_frame_size >= 2**32:
            raise TransportConfigError(f"max_frame_size must be in [{minimum_frame}, 2**32)")
        positive = {
            "handshake_timeout": self.handshake_timeout,
            "max_queue_frames": self.max_queue_frames,
            "max_queue_bytes": self.max_queue_bytes,
            "backoff_initial": self.backoff_initial,
            "backoff_max": self.backoff_max,
            "keepalive_interval": self.keepalive_interval,
            "idle_timeout": self.idle_timeout,
            "max_pending_handshakes": self.max_pending_handshakes,
            "seen_nonce_cache_size": self.seen_nonce_cache_size,
        }
        for name, value in positive.items():
            if value <= 0:
                raise TransportConfigError(f"{name} must be positive, got {value}")
        if self.higher_address_dial_delay < 0:
            raise TransportConfigError("higher_address_dial_delay must not be negative")
        if self.idle_timeout <= self.keepalive_interval:
            raise TransportConfigError("idle_timeout must exceed keepalive_interval")

    @property
    def max_payload_size(self) -> int:
        return self.max_frame_size - CHANNEL_ID_SIZE - AEAD_TAG_SIZE


# --------------------------------------------------------------------------- framing


async def read_frame(reader: asyncio.StreamReader, max_size: int) -> bytes:
    """Read one frame body; the length is validated before a single body byte is read."""
    try:
        header = await reader.readexactly(FRAME_HEADER_SIZE)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            raise ConnectionClosed("peer closed the connection") from None
        raise FrameError(f"truncated frame header ({len(exc.partial)} of 4 bytes)") from None
    length = int.from_bytes(header, "big")
    if length == 0:
        raise FrameError("zero-length frame")
    if length > max_size:
        raise FrameError(f"frame length {length} exceeds cap {max_size}")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"truncated frame ({len(exc.partial)} of {length} bytes)") from None


def encode_frame(body: bytes) -> bytes:
    return len(body).to_bytes(FRAME_HEADER_SIZE, "big") + body


class SessionCipher:
    """ChaCha20-Poly1305 in one direction with an implicit counter nonce.

    Both ends count frames, so the nonce is never sent: any replayed, reordered, dropped or
    altered frame fails authentication.
    """

    _COUNTER_LIMIT = 2**64

    def __init__(self, key: bytes) -> None:
        self._aead = ChaCha20Poly1305(key)
        self._counter = 0

    def _next_nonce(self) -> bytes:
        if self._counter >= self._COUNTER_LIMIT:
            raise DecryptError("session counter exhausted")
        nonce = self._counter.to_bytes(12, "big")
        self._counter += 1
        return nonce

    def seal(self, plaintext: bytes) -> bytes:
        return self._aead.encrypt(self._next_nonce(), plaintext, None)

    def open(self, ciphertext: bytes) -> bytes:
        try:
            return self._aead.decrypt(self._counter.to_bytes(12, "big"), ciphertext, None)
        except InvalidTag:
            raise DecryptError(f"frame {self._counter} failed authentication") from None
        finally:
            self._counter += 1


# --------------------------------------------------------------------------- handshake


@dataclass(frozen=True)
class Hello:
    chain_id: int
    nonce: bytes
    ephemeral_public: bytes

    def encode(self) -> bytes:
        return (
            bytes([PROTOCOL_VERSION])
            + self.chain_id.to_bytes(8, "big")
            + self.nonce
            + self.ephemeral_public
        )

    @classmethod
    def decode(cls, data: bytes) -> Hello:
        if len(data) != HELLO_SIZE:
            raise HandshakeRefused("bad_hello", f"hello is {len(data)} bytes, not {HELLO_SIZE}")
        if data[0] != PROTOCOL_VERSION:
            raise HandshakeRefused("bad_hello", f"unsupported protocol version {data[0]}")
        nonce_end = 9 + NONCE_SIZE
        return cls(int.from_bytes(data[1:9], "big"), data[9:nonce_end], data[nonce_end:])


def transcript_hash(chain_id: int, initiator: Hello, responder: Hello) -> bytes:
    """Binds the chain and both sides' fresh values, initiator's first (fixed order)."""
    return hashlib.sha256(
        TRANSCRIPT_TAG
        + chain_id.to_bytes(8, "big")
        + initiator.nonce
        + responder.nonce
        + initiator.ephemeral_public
        + responder.ephemeral_public
    ).digest()


def auth_signing_hash(role: Role, transcript: bytes, address: Address) -> bytes:
    """What a side signs: the role keeps an initiator's signature from passing as a responder's."""
    return keccak(AUTH_TAG + role.value + transcript + address)


def derive_session_keys(shared_secret: bytes, transcript: bytes) -> tuple[bytes, bytes]:
    """(initiator->responder key, responder->initiator key)."""
    okm = HKDF(
        algorithm=hashes.SHA256(), length=64, salt=transcript, info=SESSION_KEYS_INFO
    ).derive(shared_secret)
    return okm[:32], okm[32:]


def sign_auth(private_key: PrivateKey, role: Role, transcript: bytes) -> bytes:
    """AUTH plaintext: own address | 65-byte recoverable signature."""
    address = private_key.public_key.to_canonical_address()
    signature = KEYS.ecdsa_sign(auth_signing_hash(role, transcript, address), private_key)
    return address + signature.to_bytes()


def verify_auth(data: bytes, signer_role: Role, transcript: bytes) -> Address:
    """The claimed address, after proving the signature over the transcript recovers to it."""
    if len(data) != AUTH_SIZE:
        raise HandshakeRefused("bad_auth", f"auth is {len(data)} bytes, not {AUTH_SIZE}")
    claimed, signature_bytes = data[:ADDRESS_SIZE], data[ADDRESS_SIZE:]
    try:
        signature = KEYS.Signature(signature_bytes)
        recovered = KEYS.ecdsa_recover(
            auth_signing_hash(signer_role, transcript, claimed), signature
        ).to_canonical_address()
    except Exception as exc:  # eth-keys raises several types for malformed signatures
        raise HandshakeRefused("bad_signature", f"unusable signature: {exc}") from None
    if recovered != claimed:
        raise HandshakeRefused(
            "bad_signature", f"claims 0x{claimed.hex()} but signed by 0x{recovered.hex()}"
        )
    return claimed


@dataclass(frozen=True)
class Session:
    """What a finished handshake yields: who the peer is and the two directional ciphers."""

    peer_address: Address
    send_cipher: SessionCipher
    recv_cipher: SessionCipher


class HandshakeState:
    """The key-agreement half of the handshake, without I/O (tests drive it directly too)."""

    def __init__(self, chain_id: int, role: Role) -> None:
        self.chain_id = chain_id
        self.role = role
        self._ephemeral = X25519PrivateKey.generate()
        self.hello = Hello(
            chain_id, os.urandom(NONCE_SIZE), self._ephemeral.public_key().public_bytes_raw()
        )

    def accept_peer_hello(self, peer: Hello) -> tuple[bytes, SessionCipher, SessionCipher]:
        """(transcript, send cipher, receive cipher) from the peer's HELLO."""
        if peer.chain_id != self.chain_id:
            raise HandshakeRefused(
                "chain_id_mismatch", f"peer is on chain {peer.chain_id}, we are {self.chain_id}"
            )
        if peer.nonce == self.hello.nonce or peer.ephemeral_public == self.hello.ephemeral_public:
            raise HandshakeRefused("reflected_hello", "peer echoed our own hello")
        initiator, responder = (
            (self.hello, peer) if self.role is Role.INITIATOR else (peer, self.hello)
        )
        transcript = transcript_hash(self.chain_id, initiator, responder)
        try:
            shared = self._ephemeral.exchange(
                X25519PublicKey.from_public_bytes(peer.ephemeral_public)
            )
        except ValueError as exc:  # low-order point: all-zero shared secret
            raise HandshakeRefused("bad_hello", f"unusable ephemeral key: {exc}") from None
        i2r, r2i = derive_session_keys(shared, transcript)
        send_key, recv_key = (i2r, r2i) if self.role is Role.INITIATOR else (r2i, i2r)
        return transcript, SessionCipher(send_key), SessionCipher(recv_key)


class NonceCache:
    """Bounded memory of peer nonces seen recently, so a replayed HELLO is named as such."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def check_and_add(self, nonce: bytes) -> bool:
        """True if the nonce is new (and remember it)."""
        if nonce in self._seen:
            return False
        self._seen[nonce] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return True


# --------------------------------------------------------------------------- queues


class SendQueue:
    """Per-peer outbound queue bounded in frames and bytes; full means drop, never wait."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self._max_frames = max_frames
        self._max_bytes = max_bytes
        self._items: deque[tuple[int, bytes]] = deque()
        self._bytes = 0
        self._not_empty = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def put(self, channel: int, payload: bytes) -> bool:
        size = len(payload)
        if len(self._items) >= self._max_frames or self._bytes + size > self._max_bytes:
            return False
        self._items.append((channel, payload))
        self._bytes += size
        self._not_empty.set()
        return True

    async def get(self, timeout: float) -> tuple[int, bytes] | None:
        """The next frame, or None if nothing arrived within `timeout` (time for a keepalive)."""
        if not self._items:
            self._not_empty.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._not_empty.wait(), timeout)
            if not self._items:
                return None
        channel, payload = self._items.popleft()
        self._bytes -= len(payload)
        return channel, payload


# --------------------------------------------------------------------------- stats


class TransportStats:
    """Counters for metrics; `snapshot()` is what `Transport.stats()` returns."""

    def __init__(self) -> None:
        self.frames_in: Counter[str] = Counter()
        self.bytes_in: Counter[str] = Counter()
        self.frames_out: Counter[str] = Counter()
        self.bytes_out: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.handshakes_refused: Counter[str] = Counter()
        self.handshakes_completed = 0
        self.duplicates_closed = 0

    def snapshot(self) -> dict[str, object]:
        return {
            "frames_in": dict(self.frames_in),
            "bytes_in": dict(self.bytes_in),
            "frames_out": dict(self.frames_out),
            "bytes_out": dict(self.bytes_out),
            "dropped": dict(self.dropped),
            "handshakes_refused": dict(self.handshakes_refused),
            "handshakes_completed": self.handshakes_completed,
            "duplicates_closed": self.duplicates_closed,
        }


def channel_name(channel: int) -> str:
    try:
        return Channel(channel).name.lower()
    except ValueError:
        return f"channel_{channel}"


# --------------------------------------------------------------------------- connections


class PeerConnection:
    """One authenticated TCP connection; owns its socket and its reader/writer tasks."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session: Session,
        outbound: bool,
        local_address: Address,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.session = session
        self.outbound = outbound
        self.initiator = local_address if outbound else session.peer_address
        self.closed = asyncio.Event()
        self.writer_task: asyncio.Task[None] | None = None

    @property
    def peer_address(self) -> Address:
        return self.session.peer_address

    def abort(self) -> None:
        """Drop the socket now: nothing more is read, nothing buffered is flushed."""
        self.closed.set()
        if self.writer_task is not None:
            self.writer_task.cancel()
        self.writer.transport.abort()


def prefer_connection(existing: PeerConnection, new: PeerConnection) -> PeerConnection:
    """The one of two connections to the same peer to keep; both ends choose the same one.

    The connection initiated by the lower address wins. If both were initiated by the same side
    the newer wins: the old one is most likely half-dead (the peer restarted).
    """
    if existing.initiator != new.initiator:
        return existing if existing.initiator < new.initiator else new
    return new


class PeerState:
    """Everything we keep per validator: where to dial it, its queue, its live connection."""

    def __init__(self, address: Address, endpoint: Endpoint, config: TransportConfig) -> None:
        self.address = address
        self.endpoint = endpoint
        self.queue = SendQueue(config.max_queue_frames, config.max_queue_bytes)
        self.connection: PeerConnection | None = None
        self.connected = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.disconnected.set()


# --------------------------------------------------------------------------- interface


class PeerTransport(ABC):
    """What the node and the consensus engine need from a transport."""

    @abstractmethod
    async def start(self) -> None:
        """Listen and start dialing every other validator."""

    @abstractmethod
    async def stop(self) -> None:
        """Close every connection and cancel every task."""

    @abstractmethod
    def send(self, address: Address, channel: int, payload: bytes) -> bool:
        """Queue a message for one validator; False if it was dropped."""

    @abstractmethod
    def broadcast(self, channel: int, payload: bytes) -> int:
        """Queue a message for every other validator; how many accepted it."""

    @abstractmethod
    def connected_peers(self) -> set[Address]:
        """Validators with an authenticated connection right now."""


# --------------------------------------------------------------------------- transport


class Transport(PeerTransport):
    """The validator-to-validator transport: one authenticated, sealed connection per peer."""

    def __init__(
        self,
        private_key: PrivateKey,
        chain_id: int,
        validators: Mapping[Address, Endpoint],
        listen_host: str,
        listen_port: int,
        on_message: MessageHandler,
        config: TransportConfig | None = None,
    ) -> None:
        for address in validators:
            if len(address) != ADDRESS_SIZE:
                raise TransportConfigError(f"validator address {address!r} is not 20 bytes")
        self._private_key = private_key
        self._address: Address = private_key.public_key.to_canonical_address()
        self._chain_id = chain_id
        self._config = config or TransportConfig()
        self._listen_host = listen_host
        self._requested_port = listen_port
        self._on_message = on_message
        self._peers: dict[Address, PeerState] = {
            address: PeerState(address, endpoint, self._config)
            for address, endpoint in validators.items()
            if address != self._address
        }
        self._stats = TransportStats()
        self._seen_nonces = NonceCache(self._config.seen_nonce_cache_size)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[PeerConnection] = set()
        self._pending_handshakes = 0
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
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def send(self, address: Address, channel: int, payload: bytes) -> bool:
        """Enqueue without blocking; False (and a counted drop) if it cannot be queued.

        Frames also queue while the peer is disconnected and go out once it reconnects, within
        the same count/byte bounds. Delivery is best effort: a frame already taken off the
        queue when its connection dies is lost (consensus retransmits what matters).
        """
        peer = self._peers.get(address)
        if peer is None:
            return self._drop("unknown_peer")
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
        """`send` to every other validator; how many queues accepted it."""
        return sum(self.send(address, channel, payload) for address in self._peers)

    def connected_peers(self) -> set[Address]:
        return {address for address, peer in self._peers.items() if peer.connection is not None}

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
        host, port = peer.endpoint
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), self._config.handshake_timeout
            )
        except (OSError, TimeoutError) as exc:
            log.debug("dial 0x%s at %s:%d failed: %s", peer.address.hex(), host, port, exc)
            return False
        connection = await self._authenticate(reader, writer, Role.INITIATOR, peer.address)
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
        if self._pending_handshakes >= self._config.max_pending_handshakes:
            self._refuse(writer, HandshakeRefused("too_many_pending", "handshake slots full"))
            return
        connection = await self._authenticate(reader, writer, Role.RESPONDER, None)
        if connection is not None:
            await self._serve(connection)

    # ---- handshake

    async def _authenticate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        role: Role,
        expected: Address | None,
    ) -> PeerConnection | None:
        """Run the handshake under its deadline; a registered connection or None (refused)."""
        self._pending_handshakes += 1
        try:
            async with asyncio.timeout(self._config.handshake_timeout):
                session = await self._handshake(reader, writer, role, expected)
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
            self._refuse(
                writer, HandshakeRefused("connection_lost", str(exc) or type(exc).__name__)
            )
            return None
        finally:
            self._pending_handshakes -= 1
        self._stats.handshakes_completed += 1
        connection = PeerConnection(reader, writer, session, role is Role.INITIATOR, self._address)
        return connection if self._adopt(connection) else None

    async def _handshake(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        role: Role,
        expected: Address | None,
    ) -> Session:
        state = HandshakeState(self._chain_id, role)
        writer.write(encode_frame(state.hello.encode()))
        await writer.drain()
        peer_hello = Hello.decode(await read_frame(reader, HANDSHAKE_FRAME_CAP))
        transcript, send_cipher, recv_cipher = state.accept_peer_hello(peer_hello)
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

    def _check_identity(self, peer_address: Address, expected: Address | None) -> None:
        if peer_address == self._address:
            raise HandshakeRefused("self_connection", "peer is ourselves")
        if peer_address not in self._peers:
            raise HandshakeRefused("unknown_key", f"0x{peer_address.hex()} is not a validator")
        if expected is not None and peer_address != expected:
            raise HandshakeRefused(
                "identity_mismatch",
                f"dialed 0x{expected.hex()} but reached 0x{peer_address.hex()}",
            )

    def _refuse(self, writer: asyncio.StreamWriter, refusal: HandshakeRefused) -> None:
        self._stats.handshakes_refused[refusal.reason] += 1
        self._stats.dropped["auth_failure"] += 1
        # a peer going away mid-handshake is routine (restarts, reset dials); the rest is not
        level = logging.INFO if refusal.reason == "connection_lost" else logging.WARNING
        log.log(level, "refused handshake with %s: %s", writer.get_extra_info("peername"), refusal)
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
        log.info("connected to validator 0x%s", peer.address.hex())
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

    async def _write_loop(self, peer: PeerState, connection: PeerConnection) -> None:
        cipher = connection.session.send_cipher
        try:
            while not connection.closed.is_set():
                item = await peer.queue.get(self._config.keepalive_interval)
                channel, payload = item if item is not None else (KEEPALIVE_CHANNEL, b"")
                frame = encode_frame(cipher.seal(bytes([channel]) + payload))
                connection.writer.write(frame)
                await connection.writer.drain()
                if item is not None:
                    name = channel_name(channel)
                    self._stats.frames_out[name] += 1
                    self._stats.bytes_out[name] += len(payload)
        except (OSError, DecryptError) as exc:
            self._close(connection, f"write failed: {exc}")
