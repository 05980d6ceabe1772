"""eth_subscribe / eth_unsubscribe over WebSocket: newHeads and logs.

Each connection has a bounded outbox; a client that does not read its notifications fast
enough overflows it and is disconnected (geth does the same), so it cannot grow memory.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import TYPE_CHECKING, Any

from chain.rpc.errors import LIMIT_EXCEEDED, InvalidParams, RpcError
from chain.rpc.filters import LogCriteria, matching_logs
from chain.rpc.formatters import header_json

if TYPE_CHECKING:
    from chain.node import CommittedBlock, Node

MAX_SUBSCRIPTIONS_PER_CONNECTION = 100


class Session:
    """One WebSocket connection's subscriptions."""

    def __init__(self, owner: Subscriptions, outbox: asyncio.Queue[str]) -> None:
        self._owner = owner
        self._outbox = outbox
        self._subscriptions: dict[str, LogCriteria | None] = {}  # id -> log criteria (heads: None)
        self.overflowed = False
        self.methods = {
            "eth_subscribe": self.eth_subscribe,
            "eth_unsubscribe": self.eth_unsubscribe,
        }

    def enqueue(self, text: str) -> bool:
        try:
            self._outbox.put_nowait(text)
        except asyncio.QueueFull:
            self.overflowed = True
            return False
        return True

    async def eth_subscribe(self, kind: Any, options: Any = None) -> str:
        if len(self._subscriptions) >= MAX_SUBSCRIPTIONS_PER_CONNECTION:
            limit = MAX_SUBSCRIPTIONS_PER_CONNECTION
            raise RpcError(LIMIT_EXCEEDED, f"too many subscriptions on this connection ({limit})")
        if kind == "newHeads":
            criteria = None
        elif kind == "logs":
            if options is not None and not isinstance(options, dict):
                raise InvalidParams("invalid argument 1: logs options must be an object")
            criteria = LogCriteria.parse(options or {})
        else:
            raise InvalidParams(f"no {kind!r} subscription in eth namespace")
        subscription_id = "0x" + secrets.token_hex(16)
        self._subscriptions[subscription_id] = criteria
        return subscription_id

    async def eth_unsubscribe(self, subscription_id: Any) -> bool:
        if not isinstance(subscription_id, str):
            raise InvalidParams("invalid argument 0: subscription id must be a string")
        return self._subscriptions.pop(subscription_id, False) is not False

    def _notify(self, subscription_id: str, result: Any) -> None:
        message = {
            "jsonrpc": "2.0",
            "method": "eth_subscription",
            "params": {"subscription": subscription_id, "result": result},
        }
        self.enqueue(json.dumps(message))

    def on_block(self, committed: CommittedBlock) -> None:
        for subscription_id, criteria in list(self._subscriptions.items()):
            if criteria is None:
                self._notify(subscription_id, header_json(committed.header))
                continue
            for log in matching_logs(criteria, committed.header, committed.records):
                self._notify(subscription_id, log)

    def close(self) -> None:
        self._subscriptions.clear()
        self._owner.sessions.discard(self)


class Subscriptions:
    METHODS = frozenset({"eth_subscribe", "eth_unsubscribe"})

    def __init__(self, node: Node) -> None:
        self.sessions: set[Session] = set()
        node.head_listeners.append(self._on_block)

    def session(self, outbox: asyncio.Queue[str]) -> Session:
        session = Session(self, outbox)
        self.sessions.add(session)
        return session

    def _on_block(self, committed: CommittedBlock) -> None:
        for session in list(self.sessions):
            session.on_block(committed)

    def close_all(self) -> None:
        for session in list(self.sessions):
            session.close()
