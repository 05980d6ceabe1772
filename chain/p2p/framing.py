"""Length-prefixed frames, read against a cap before the body, and the per-direction
ChaCha20-Poly1305 session cipher that seals them."""

from __future__ import annotations

import asyncio

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from chain.p2p.errors import ConnectionClosed, DecryptError, FrameError
from chain.p2p.wire import FRAME_HEADER_SIZE


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
