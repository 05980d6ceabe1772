"""Wire constants of the peer protocol: channels, roles, sizes and domain tags."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum, IntEnum

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
