"""What the node needs of a peer transport (PeerTransport)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from chain.p2p.wire import Address


class PeerTransport(ABC):
    """What the node and the consensus engine need from a transport."""

    @abstractmethod
    async def start(self) -> None:
        """Listen and start dialing every configured peer (observers dial in)."""

    @abstractmethod
    async def stop(self) -> None:
        """Close every connection and cancel every task."""

    @abstractmethod
    def send(self, address: Address, channel: int, payload: bytes) -> bool:
        """Queue a message for one peer; False if it was dropped."""

    @abstractmethod
    def broadcast(self, channel: int, payload: bytes) -> int:
        """Queue a message for every peer this node dials; how many accepted it."""

    @abstractmethod
    def connected_peers(self) -> set[Address]:
        """Peers with an authenticated connection right now."""
