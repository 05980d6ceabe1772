"""The authenticated handshake: HELLO, the transcript, session keys, AUTH, and the
cache of recently seen peer nonces."""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from eth_keys import KeyAPI
from eth_keys.backends import CoinCurveECCBackend
from eth_keys.datatypes import PrivateKey
from eth_utils import keccak

from chain.p2p.errors import HandshakeRefused
from chain.p2p.framing import SessionCipher
from chain.p2p.wire import (
    ADDRESS_SIZE,
    AUTH_SIZE,
    AUTH_TAG,
    HELLO_SIZE,
    NONCE_SIZE,
    PROTOCOL_VERSION,
    SESSION_KEYS_INFO,
    TRANSCRIPT_TAG,
    Address,
    Role,
)

KEYS = KeyAPI(CoinCurveECCBackend)


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
