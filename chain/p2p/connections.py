"""One authenticated connection to a peer, and which of two to keep."""

from __future__ import annotations

import asyncio

from chain.p2p.config import TransportConfig
from chain.p2p.handshake import Session
from chain.p2p.queues import SendQueue
from chain.p2p.wire import Address, Endpoint


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
    """Everything we keep per peer: where to dial it (None: an observer, who dials us), its
    queue, its live connection."""

    def __init__(self, address: Address, endpoint: Endpoint | None, config: TransportConfig
                 ) -> None:
        self.address = address
        self.endpoint = endpoint
        self.queue = SendQueue(config.max_queue_frames, config.max_queue_bytes)
        self.connection: PeerConnection | None = None
        self.connected = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.disconnected.set()
