"""Authenticated, encrypted validator-to-validator transport over asyncio TCP.

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

Modules: `wire` (constants), `framing` (frames and the session cipher), `handshake`, `queues`,
`connections`, `stats`, `config`, `errors`, `interface` (what the node needs) and `transport`
(the asyncio implementation).
"""

from __future__ import annotations

from chain.p2p.config import TransportConfig
from chain.p2p.interface import PeerTransport
from chain.p2p.transport import Transport
from chain.p2p.wire import Channel

__all__ = ["Channel", "PeerTransport", "Transport", "TransportConfig"]
