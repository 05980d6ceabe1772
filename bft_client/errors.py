"""What the BFT client raises: every failure is a BftClientError, whose message says what
each node answered."""

from __future__ import annotations


class BftClientError(Exception):
    """The client cannot confirm the transaction; the message says what each node answered."""


class RpcUnreachable(BftClientError):
    """A node that did not answer (refused, timed out, not JSON-RPC)."""


class RpcReplyError(BftClientError):
    """A node that answered with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class TransactionRejected(BftClientError):
    """The node the transaction was submitted to refused it (bad nonce, funds, fees ...)."""


class NoAgreement(BftClientError):
    """No f+1 validators reported the same receipt before the deadline."""
