"""The transport's configuration (TransportConfig)."""

from __future__ import annotations

from dataclasses import dataclass

from chain.p2p.errors import TransportConfigError
from chain.p2p.wire import AEAD_TAG_SIZE, CHANNEL_ID_SIZE


@dataclass(frozen=True)
class TransportConfig:
    """Limits and timings; defaults suit a LAN/WAN validator set."""

    max_frame_size: int = 16 * 1024 * 1024
    # The whole handshake (2 round trips and a signature each way), and the first part of it:
    # a peer's HELLO, which a validator sends as soon as it connects. Until its HELLO is in, a
    # connection holds a slot that a newcomer may take (chain/p2p/admission.py).
    handshake_timeout: float = 5.0
    hello_timeout: float = 2.0
    max_queue_frames: int = 4096
    max_queue_bytes: int = 64 * 1024 * 1024
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    # The higher address waits this long before dialing so that, in the common case, only the
    # lower address's (preferred) connection is made and no duplicate has to be torn down.
    higher_address_dial_delay: float = 0.3
    keepalive_interval: float = 5.0
    idle_timeout: float = 20.0
    max_pending_handshakes: int = 64  # inbound handshakes at once; dials are not counted
    max_pending_per_ip: int = 16  # of those, from one source IP
    seen_nonce_cache_size: int = 4096

    def __post_init__(self) -> None:
        minimum_frame = CHANNEL_ID_SIZE + AEAD_TAG_SIZE + 1
        if self.max_frame_size < minimum_frame or self.max_frame_size >= 2**32:
            raise TransportConfigError(f"max_frame_size must be in [{minimum_frame}, 2**32)")
        positive = {
            "handshake_timeout": self.handshake_timeout,
            "hello_timeout": self.hello_timeout,
            "max_queue_frames": self.max_queue_frames,
            "max_queue_bytes": self.max_queue_bytes,
            "backoff_initial": self.backoff_initial,
            "backoff_max": self.backoff_max,
            "keepalive_interval": self.keepalive_interval,
            "idle_timeout": self.idle_timeout,
            "max_pending_handshakes": self.max_pending_handshakes,
            "max_pending_per_ip": self.max_pending_per_ip,
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
