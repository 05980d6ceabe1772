"""eth_subscribe / eth_unsubscribe over WebSocket (newHeads and logs), and what each
connection may make the node hold (issue 29).

Each connection has an outbox bounded in bytes (characters of the JSON text, which is ASCII):
- above `outbox_bytes` (4 MiB) the node stops reading the connection's requests until the
  client has taken enough of what is queued: backpressure slows a slow client, it does not
  cut it (its own TCP window then slows its sender);
- notifications are produced by the chain, not by requests, so they are never held back: up
  to `notification_bytes` (4 MiB) of them may wait for the client; one more cuts it at once;
- a message that the client does not take within `write_deadline` (10 s, geth's write
  timeout) cuts it (chain/rpc/server.py);
- an answer counts against the node's bound on WebSocket answers (chain/rpc/dispatcher.py
  `HeldBytes`, 64 MiB) from when it is made until it is written, not only while it is made.
So one connection holds at most 8 MiB and one answer (an answer is queued whole; the next
request is read only once the outbox is under its budget again), and all connections'
answers at most 64 MiB beside 64 KiB each.

Subscriptions are bounded by what they cost, not by a count web3 1.x exceeds (it opens a
newHeads subscription per pending transaction): 10,000 per connection and 100,000 on the
node (~200 bytes each); log subscriptions' criteria, by their addresses and topics, 1,000
entries a connection and 10,000 on the node, which bounds the matching work per block.

Notifications leave the commit path at once: `_on_block` only queues the block; a task
computes each block's results once per distinct criteria (a newHeads header once for all),
fans them out in slices of about 2 ms of the event loop, and writes each notification's text
only when the connection's writer takes it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from chain.rpc.backend import CommittedBlock, RpcBackend
from chain.rpc.errors import LIMIT_EXCEEDED, InvalidParams, RpcError
from chain.rpc.filters import BlockLogs, LogCriteria
from chain.rpc.formatters import header_json

if TYPE_CHECKING:  # (the dispatcher imports this module)
    from chain.rpc.dispatcher import HeldBytes

MiB = 1024 * 1024
ENVELOPE = ('{"jsonrpc":"2.0","method":"eth_subscription",'
            '"params":{"subscription":"%s","result":%s}}')
ENVELOPE_SIZE = len(ENVELOPE) - 4
# Why a client was cut (the label of rpc_websocket_disconnects_total).
WRITE_DEADLINE, OUTBOX_FULL, BEHIND = "write_deadline", "outbox_full", "notifications_behind"
CUT_REASONS = (WRITE_DEADLINE, OUTBOX_FULL, BEHIND)


@dataclass(frozen=True)
class WebSocketLimits:
    outbox_bytes: int = 4 * MiB  # queued for one connection: above it, its requests wait
    notification_bytes: int = 4 * MiB  # notifications queued for one connection: cut beyond
    write_deadline: float = 10.0  # seconds one message may take to be written (geth's)
    max_subscriptions: int = 10_000  # per connection
    node_subscriptions: int = 100_000  # on all connections
    max_log_entries: int = 1_000  # addresses and topics of one connection's log subscriptions
    node_log_entries: int = 10_000  # ... of all connections' log subscriptions
    client_log_entries: int = 2_000  # ... of one client's (remote address's) connections
    # seconds of the event loop the fan-out, and a connection's writer, take at a time
    fan_out_slice: float = 0.002
    max_blocks_behind: int = 64  # blocks waiting for their fan-out: subscribers cut beyond


class _Item(NamedTuple):
    body: bytes | str  # an answer (UTF-8 JSON, as made), or a notification's result
    subscription: str | None  # None: an answer
    size: int  # of the text written

    def frame(self) -> bytes:
        """The text frame's payload. An answer is written as made: decoding a 25 MB answer to
        text and aiohttp encoding it back were two copies of it on the loop."""
        if self.subscription is None:
            assert isinstance(self.body, bytes)
            return self.body
        return (ENVELOPE % (self.subscription, self.body)).encode()


class Outbox:
    """What waits to be written to one WebSocket: answers and notifications, in order."""

    def __init__(self, limits: WebSocketLimits) -> None:
        self._limits = limits
        self._items: deque[_Item] = deque()
        self.bytes = 0  # queued, and the message being written
        self.notification_bytes = 0
        self.cut_reason: str | None = None
        self._closed = False
        self._ready = asyncio.Event()  # something to write, or cut
        self._room = asyncio.Event()  # under the budget, or cut
        self._room.set()
        self._held: HeldBytes | None = None  # the node's bound the answers queued count in

    @property
    def answer_bytes(self) -> int:
        """Answers queued, and the one being written."""
        return self.bytes - self.notification_bytes

    def put_answer(self, answer: bytes, held: HeldBytes | None = None) -> None:
        """Queued whole, whatever its size: the reader waits for `room` before the next. It
        counts in `held` (the node's bound on WebSocket answers, within which it was made)
        until written. Given back once made, four clients that never read parked 12 MB of
        answers beside a bound of 7 MB (tests/unit/test_ws_outbox.py); by reasoning, 256
        connections reading a trickle (each message within the write deadline) could park
        4 MiB and a 25 MB batch's answer each, ~7 GB, made in ~7 minutes of the answers'
        16 MiB/s."""
        if self._closed:
            return
        if held is not None:
            held.take(len(answer), floor=True)  # (was held while made: it fits)
            self._held = held
        self._push(_Item(answer, None, len(answer)))

    def put_notification(self, subscription_id: str, result: str) -> bool:
        """False when the connection is cut (now, if this one does not fit) or closed."""
        if self._closed or self.cut_reason is not None:
            return False
        size = ENVELOPE_SIZE + len(subscription_id) + len(result)
        if self.notification_bytes + size > self._limits.notification_bytes:
            self.cut(OUTBOX_FULL)
            return False
        self.notification_bytes += size
        self._push(_Item(result, subscription_id, size))
        return True

    def _push(self, item: _Item) -> None:
        self._items.append(item)
        self.bytes += item.size
        self._ready.set()
        if self.bytes > self._limits.outbox_bytes:
            self._room.clear()

    async def room(self) -> bool:
        """Wait until the outbox is under its budget; False once it is cut or closed."""
        await self._room.wait()
        return self.cut_reason is None and not self._closed

    async def next(self) -> _Item | None:
        """The next message to write (counted until `sent`), or None once cut or closed."""
        while not self._items and self.cut_reason is None and not self._closed:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft() if self.cut_reason is None and self._items else None

    def sent(self, item: _Item) -> None:
        self.bytes -= item.size
        if item.subscription is not None:
            self.notification_bytes -= item.size
        elif self._held is not None and not self._closed:
            self._held.give(item.size)
        if self.bytes <= self._limits.outbox_bytes:
            self._room.set()

    def cut(self, reason: str) -> None:
        """The connection is to be closed for `reason`; the writer reports it."""
        if self.cut_reason is None:
            self.cut_reason = reason
            self._ready.set()
            self._room.set()

    def close(self) -> None:
        """Nothing more is queued or written (the writer ended, or the connection did)."""
        if self._held is not None and not self._closed:
            self._held.give(self.answer_bytes)
        self._closed = True
        self._items.clear()
        self._ready.set()
        self._room.set()


def _log_entries(criteria: LogCriteria | None) -> int:
    """What a subscription's criteria cost: its addresses and topics (a catch-all: 1)."""
    if criteria is None:
        return 0
    topics = sum(len(position) for position in criteria.topics if position is not None)
    return max(1, len(criteria.addresses) + topics)


class Session:
    """One WebSocket connection's subscriptions and outbox."""

    def __init__(self, owner: Subscriptions, client: str) -> None:
        self._owner = owner
        self.client = client  # the remote address: its connections share one budget
        self.outbox = Outbox(owner.limits)
        self.subscriptions: dict[str, LogCriteria | None] = {}  # id -> criteria (heads: None)
        self.log_entries = 0
        self.methods = {
            "eth_subscribe": self.eth_subscribe,
            "eth_unsubscribe": self.eth_unsubscribe,
        }

    async def eth_subscribe(self, kind: Any, options: Any = None) -> str:
        if kind == "newHeads":
            criteria = None
        elif kind == "logs":
            if options is not None and not isinstance(options, dict):
                raise InvalidParams("invalid argument 1: logs options must be an object")
            criteria = LogCriteria.parse(options or {})
        else:
            raise InvalidParams(f"no {kind!r} subscription in eth namespace")
        self._owner.admit(self, _log_entries(criteria))
        subscription_id = "0x" + secrets.token_hex(16)
        self.subscriptions[subscription_id] = criteria
        return subscription_id

    async def eth_unsubscribe(self, subscription_id: Any) -> bool:
        if not isinstance(subscription_id, str):
            raise InvalidParams("invalid argument 0: subscription id must be a string")
        if subscription_id not in self.subscriptions:
            return False
        self._owner.release(self, _log_entries(self.subscriptions.pop(subscription_id)))
        return True

    def notify(self, subscription_id: str, results: list[str]) -> bool:
        """Queue one subscription's notifications of a block; False once the client is cut."""
        return all(self.outbox.put_notification(subscription_id, r) for r in results)

    def close(self) -> None:
        for criteria in self.subscriptions.values():
            self._owner.release(self, _log_entries(criteria))
        self.subscriptions.clear()
        self.outbox.close()
        self._owner.sessions.discard(self)


def _encode(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # an integer beyond 64 bits
        return json.dumps(value, separators=(",", ":"))


class BlockResults:
    """One block's notification results, each computed and encoded once for all subscribers."""

    def __init__(self, committed: CommittedBlock) -> None:
        self._committed = committed
        self._head: list[str] | None = None
        self._block_logs: BlockLogs | None = None  # indexed by address and topic, on first use
        self._logs: dict[LogCriteria, list[str]] = {}
        self._encoded: dict[int, str] = {}  # each log's text, by the id of its formatted dict

    def of(self, criteria: LogCriteria | None) -> list[str]:
        if criteria is None:
            if self._head is None:
                self._head = [_encode(header_json(self._committed.header))]
            return self._head
        if criteria not in self._logs:
            if self._block_logs is None:
                self._block_logs = BlockLogs(self._committed.header, self._committed.records)
            self._logs[criteria] = [self._encode_log(log)
                                    for log in self._block_logs.matching(criteria)]
        return self._logs[criteria]

    def _encode_log(self, formatted: dict[str, Any]) -> str:
        """BlockLogs formats each log once (one dict for every criteria it matches)."""
        text = self._encoded.get(id(formatted))
        if text is None:
            text = self._encoded[id(formatted)] = _encode(formatted)
        return text


class LoopSlice:
    """Lets the event loop run once the current slice of work has taken `seconds`."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._started = time.perf_counter()

    async def pause(self) -> None:
        if time.perf_counter() - self._started >= self._seconds:
            await asyncio.sleep(0)
            self._started = time.perf_counter()


def client_of(remote: str) -> str:
    """Whose budget a connection from `remote` draws on: its IPv4 address, or its IPv6 /64
    (one host holds a whole /64, and could otherwise take a budget per address)."""
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class Subscriptions:
    METHODS = frozenset({"eth_subscribe", "eth_unsubscribe"})

    def __init__(self, node: RpcBackend, limits: WebSocketLimits | None = None) -> None:
        self.limits = limits or WebSocketLimits()
        self.sessions: set[Session] = set()
        self.count = 0  # subscriptions on all connections
        self.log_entries = 0
        self.client_log_entries: Counter[str] = Counter()  # per remote address
        self._blocks: deque[CommittedBlock] = deque()  # waiting for their fan-out
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        node.add_head_listener(self._on_block)

    def session(self, remote: str = "") -> Session:
        session = Session(self, client_of(remote))
        self.sessions.add(session)
        return session

    def outbox_bytes(self) -> int:
        return sum(session.outbox.bytes for session in self.sessions)

    def admit(self, session: Session, log_entries: int) -> None:
        """Count a new subscription, or refuse it (-32005) saying which bound it passes."""
        limits = self.limits
        for used, more, limit, what in (
            (len(session.subscriptions), 1, limits.max_subscriptions,
             "subscriptions on this connection"),
            (self.count, 1, limits.node_subscriptions, "subscriptions on this node"),
            (session.log_entries, log_entries, limits.max_log_entries,
             "log subscription addresses and topics on this connection"),
            (self.client_log_entries[session.client], log_entries, limits.client_log_entries,
             "log subscription addresses and topics of this client's connections"),
            (self.log_entries, log_entries, limits.node_log_entries,
             "log subscription addresses and topics on this node"),
        ):
            if used + more > limit:
                raise RpcError(LIMIT_EXCEEDED, f"too many {what} (limit {limit})")
        self.count += 1
        self.log_entries += log_entries
        self.client_log_entries[session.client] += log_entries
        session.log_entries += log_entries

    def release(self, session: Session, log_entries: int) -> None:
        self.count -= 1
        self.log_entries -= log_entries
        self.client_log_entries[session.client] -= log_entries
        if not self.client_log_entries[session.client]:
            del self.client_log_entries[session.client]
        session.log_entries -= log_entries

    def _on_block(self, committed: CommittedBlock) -> None:
        """On the commit path: queue the block for the fan-out task, nothing more."""
        if not self.count:
            return
        if len(self._blocks) >= self.limits.max_blocks_behind:
            self._blocks.clear()
            for session in self.sessions:
                if session.subscriptions:
                    session.outbox.cut(BEHIND)
            return
        self._blocks.append(committed)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._fan_out_blocks(), name="subscription fan-out")

    async def _fan_out_blocks(self) -> None:
        while True:
            while not self._blocks:
                self._wake.clear()
                await self._wake.wait()
            await self._fan_out(self._blocks.popleft())

    async def _fan_out(self, committed: CommittedBlock) -> None:
        results = BlockResults(committed)
        work = LoopSlice(self.limits.fan_out_slice)
        for session in list(self.sessions):
            for subscription_id, criteria in list(session.subscriptions.items()):
                if not session.notify(subscription_id, results.of(criteria)):
                    break
                await work.pause()

    def close_all(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for session in list(self.sessions):
            session.close()
