"""What the transport raises (TransportError and its kinds)."""

from __future__ import annotations

from chain.errors import ChainError


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
