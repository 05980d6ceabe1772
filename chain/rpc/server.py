"""The JSON-RPC server: HTTP POST and WebSocket on one port (aiohttp).

Every limit is in `RpcLimits` (chain/rpc/limits.py; set in the node's config). The Host
header must be in the allowlist; a request carrying a browser Origin is refused unless CORS
allows that origin. HTTP-level refusals are plain-text answers with a status; everything
that reaches the dispatcher gets a JSON-RPC answer. A WebSocket's outbox is bounded in bytes,
with backpressure and a write deadline (`WebSocketLimits`, chain/rpc/subscriptions.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import Counter

from chain.p2p.throttle import ThrottledLog
from chain.rpc.backend import RpcBackend
from chain.rpc.bundles import BlockBundles, EngineMethod
from chain.rpc.dispatcher import Dispatcher, PaidPieces, Payment
from chain.rpc.eth import EthApi
from chain.rpc.loop_turns import LoopTurns
from chain.rpc.served import WorkerPool
from chain.rpc.subscriptions import (
    BEHIND,
    CUT_REASONS,
    OUTBOX_FULL,
    WRITE_DEADLINE,
    LoopSlice,
    Outbox,
    Session,
    Subscriptions,
    WebSocketLimits,
)
from chain.rpc.txpool import TxPoolApi

log = logging.getLogger(__name__)

JSON_CONTENT_TYPES = ("application/json", "application/json-rpc", "application/jsonrequest")
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\n"
    b"Connection: close\r\n\r\ntoo many connections\n"
)
BUSY_LINGER_SECONDS = 1.0
BUSY_LINGERING = 32  # connections answered 503 whose sockets linger at most (`_Busy`)
BUSY_READS = 8  # reads of a connection answered 503 (its input ignored) before it is cut
CLIENT_FAULTS = (HttpProcessingError, RequestPayloadError, ConnectionError)
# What a piece the loop handles costs the budget beyond its bytes: a chunk of a chunked body
# (aiohttp parses each in Python, ~1 us with reading it here, as long as ~1 KiB of a large
# chunk at the budget's ~2% of the loop), a read of a plain body's socket, a WebSocket frame.
# A body of 1-byte chunks was paid a sixth of its wire bytes and kept the loop 97% busy at a
# tenth of the rate (the attack review s11-rpc, finding 3).
PIECE_COST = 1024
# What the loop spends on an HTTP request outside its calls' steps (aiohttp parsing it, making
# the Request, `_guarded`, finishing the answer), which LoopTurns cannot time: with a refusal's
# turn (`_refused`) 110-125 us on session 15's quiet machine, 190-213 us on session 16's, 1.6 x
# slower. A request answered before any call (a GET's 405, OPTIONS) is nothing else, and
# pipelined GETs kept the loop's thread 97% busy (the attack review s14b-rpc, finding 4). So
# each request is charged a price above the slowest machine's cost: at 150 us the same flood
# took the loop 40-49% on the quiet machine but 64-71% on the slower one, over LOOP_SHARE.
# (Measuring the machine's pace instead, a fixed piece of Python, varied 2 x between processes
# on one machine.) What it costs: while blocks come, about 1,800 requests a second (an
# admission is charged too) share the loop's half (a batch is one request).
HTTP_HANDLING_SECONDS = 250e-6
# What the loop spends on a connection beyond its requests: asyncio's accept and transport,
# aiohttp's handler made and dropped. One that sends nothing paid nothing (no request, no
# byte), so a connect/close flood took the loop outside LoopTurns' share: 160-230 us a
# connection opened and reset, on session 16's loaded machine (one core's worth is ~5,000
# connections a second). So each is accepted in a turn of the loop with the share's debt
# waited out, and charged this (`_accepted`): above the 260-370 us measured with that turn
# and the accept's own wait (tests/unit/test_rpc_accepts.py). What it costs: while blocks
# come, at most 1,250 connections a second share the loop's half; the kernel's backlog
# holds the rest.
CONNECTION_SECONDS = 400e-6
BACKLOG = 100  # connections the kernel holds until they are accepted (asyncio's default)
# Accepting failed (no file descriptor or memory left): wait this long (asyncio's delay).
ACCEPT_RETRY_SECONDS = 1.0
# A reader pays at least this often: one read of the socket may bring thousands of pieces.
PAYMENT = 64 * 1024
WRITE_PART = 256 * 1024  # a long answer is written in parts of about this (`_HttpAnswer`)


# The engine's methods that read and decode up to 10,000 records a call (pbft_engine/
# rpc_records.py's MAX_RANGE): served on the read workers (`engine_ranges_on`).
ENGINE_RANGES = ("pbft_getCheckpoints", "pbft_getViewChanges", "pbft_getEvidence")


def engine_ranges_on(reads: WorkerPool, methods: dict[str, EngineMethod],
                     ) -> dict[str, EngineMethod]:
    """`methods`' range reads, each run on a read worker's own event loop (as block bundles
    run them), paced by the governor like the chain's heavy reads, not on the loop that
    votes: 1,000 stable checkpoints a call held it ~120 ms (the attack review s14-rpc,
    finding 6)."""
    return {name: _on_worker(reads, methods[name]) for name in ENGINE_RANGES if name in methods}


def _on_worker(reads: WorkerPool, method: EngineMethod) -> EngineMethod:
    @functools.wraps(method)  # (its signature: the dispatcher checks the arity by it)
    async def on_worker(*params: Any) -> Any:
        return await reads.run(_run, method, params)

    return on_worker


def _run(method: EngineMethod, params: tuple[Any, ...]) -> Any:
    return asyncio.run(method(*params))  # type: ignore[arg-type]  # (async defs: coroutines)


class _HttpErrorLog(logging.LoggerAdapter):
    """aiohttp logs each malformed request (too many or too long headers, a bad chunk or
    compression, a client gone mid-body) with a traceback. That is the client's fault, worth a
    debug line: a hostile client must not fill the log. Anything else keeps its traceback."""

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(error, CLIENT_FAULTS):
            self.debug(f"{msg}: %s", *args, error)
        else:
            super().exception(msg, *args, exc_info=exc_info, **kwargs)


class _Lingering:
    """How many connections answered 503 still hold their socket (`_Busy`)."""

    def __init__(self) -> None:
        self.count = 0


class _Busy(asyncio.Protocol):
    """A connection over the limit: answered 503 and closed, its input ignored. The write side
    is shut first and the socket closed a moment later (or when the client closes), so the
    client reads the answer instead of a reset; but at most BUSY_LINGERING do so at a time,
    the rest aborted once answered: each holds a file descriptor, and ~1,000 connections a
    second held ~1,000 (the usual soft limit) with no bound but their rate (the attack review
    s16, finding 6)."""

    def __init__(self, lingering: _Lingering) -> None:
        self._lingering = lingering
        self._counted = False
        self._reads = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(BUSY_RESPONSE)
        if self._lingering.count >= BUSY_LINGERING:
            transport.abort()  # (the 503 is in the kernel's buffer if it fitted: usually)
            return
        try:
            if transport.can_write_eof():
                transport.write_eof()
        except OSError:  # reset already: a traceback in the log for each of a flood's
            transport.abort()
            return
        self._lingering.count += 1
        self._counted = True
        asyncio.get_running_loop().call_later(BUSY_LINGER_SECONDS, transport.close)

    def data_received(self, data: bytes) -> None:
        # Ignored, but each read is the loop's work, paid for by no budget: a client's
        # request comes in a read or two, so one that goes on sending is cut.
        self._reads += 1
        if self._reads > BUSY_READS:
            self._transport.abort()

    def eof_received(self) -> bool:
        self._transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self._lingering.count -= 1


def _closing(status: int, text: str) -> web.Response:
    """A refusal after which the connection is not reused (its body was not read)."""
    response = web.Response(status=status, text=text)
    response.force_close()
    return response


class BodyBudget:
    """Request bytes a second, shared by every connection (HTTP bodies and WebSocket reads:
    a client cannot escape it by switching protocol): what is read is paid for before more is
    read. From a full bucket `burst` bytes are read at once; in debt, the rate is shared as a
    processor is: a payment of s bytes waits s x k / rate, k the payers waiting with it, so
    each of k readers gets rate / k and a small body waits for its own bytes only, not for
    every flooding connection's chunk before it (a queue by debt made a 52-byte request wait
    4.4 s behind 100 flooding connections: the attack review s11-rpc, finding 2)."""

    def __init__(self, rate: int, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = float(burst)
        self._since: float | None = None
        self._waiting = 0

    def charge(self, size: int) -> float:
        """Takes `size` bytes; the seconds the payer waits (0: none). A payer told to wait
        counts as waiting until it calls `waited`."""
        now = asyncio.get_running_loop().time()
        if self._since is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._since) * self.rate)
        self._since = now
        self._tokens -= size
        if self._tokens >= 0:
            return 0.0
        self._waiting += 1
        return size * self._waiting / self.rate

    def waited(self) -> None:
        self._waiting -= 1

    async def spend(self, size: int, transport: asyncio.Transport | None = None) -> None:
        """Pays `size` bytes, waiting out a debt; meanwhile `transport` (the payer's
        connection) is not read, so the kernel's buffer, not the loop, holds what the client
        sends. Only a transport that was reading is paused and resumed: aiohttp's own pauses
        (its buffers full) are its to lift."""
        delay = self.charge(size)
        if not delay:
            return
        paused = transport is not None and transport.is_reading()
        if paused:
            transport.pause_reading()
        try:
            await asyncio.sleep(delay)
        finally:
            self.waited()
            if paused:
                transport.resume_reading()


class _ClientGone(Exception):
    """The client did not take its answer within the read timeout: to be cut."""


class HttpCuts:
    """HTTP clients the node cut for not taking their answers within the read timeout: each
    said (a log line a flood cannot fill) and counted, as WebSocket clients cut are."""

    def __init__(self, counter: Counter) -> None:
        self._log = ThrottledLog(log, "HTTP clients disconnected")
        self._counter = counter

    def cut(self, request: web.Request, seconds: float) -> None:
        if request.transport is not None:
            request.transport.abort()
        self._log.log(logging.WARNING, WRITE_DEADLINE, "HTTP client %s disconnected: an "
                      "answer not taken within the %g s read timeout", request.remote, seconds)
        self._counter.inc()


class _HttpAnswer(PaidPieces):
    """An HTTP answer as the dispatcher makes it (an AnswerSink): its pieces paid for as
    they come (PaidPieces), then held; a short answer is written whole with its length (by
    `RpcServer._sent`), a long one streamed (chunked) a part of about WRITE_PART at a time
    as the pieces come, so it is neither held whole nor copied into the socket's buffer
    whole. The client has the read timeout in all to take it (the time its writes wait on
    the socket, as geth's WriteTimeout bounds an answer: each part within it let a client
    reading ~50 kB/s hold a 25 MB answer for minutes, the attack review s13-rpc, finding
    4); past it `_ClientGone` is raised (the client is to be cut), and its batch stops."""

    def __init__(self, request: web.Request, pay: Payment, timeout: float) -> None:
        super().__init__(pay)
        self._request = request
        self._waits_left = timeout  # seconds the writes may still wait on the client
        self._held: list[bytes] = []
        self._size = 0
        self._stream: web.StreamResponse | None = None

    def holds(self, size: int) -> bool:
        return True  # (streamed: a part is held at a time)

    async def put(self, piece: bytes) -> None:
        await self.owe(len(piece))
        self._held.append(piece)
        self._size += len(piece)
        if self._size >= WRITE_PART:
            await self._write()

    async def _write(self) -> None:
        await self.settle()
        if self._stream is None:
            self._stream = web.StreamResponse(
                headers={"Content-Type": "application/json; charset=utf-8"})
            if origin := self._request.headers.get("Origin"):  # allowed: `_guarded` checked
                self._stream.headers["Access-Control-Allow-Origin"] = origin
            await self._stream.prepare(self._request)
        part = memoryview(b"".join(self._held))  # (one piece: itself, not a copy)
        self._held, self._size = [], 0
        for at in range(0, len(part), WRITE_PART):  # a 25 MB answer of one call too
            await self._waited(self._stream.write(part[at:at + WRITE_PART]))

    async def _waited(self, write: Awaitable[None]) -> None:
        """`write`, within what is left of the client's time to take its answer."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._waits_left):
                await write
        except TimeoutError:
            raise _ClientGone from None
        finally:
            self._waits_left -= time.monotonic() - started

    async def finish(self) -> web.StreamResponse:
        """The answer's end: a short answer to write whole (not yet prepared), or the
        streamed one ended, its end too within the client's time."""
        if self._stream is None:
            await self.settle()
            if not self._held:
                return web.Response(status=200)
            return web.Response(body=b"".join(self._held), content_type="application/json",
                                charset="utf-8")
        if self._held:
            await self._write()
        await self._waited(self._stream.write_eof())
        return self._stream

    @property
    def stream(self) -> web.StreamResponse:
        """The streamed answer (once `_ClientGone` was raised: nothing more is written)."""
        assert self._stream is not None
        return self._stream


def _head_bytes(request: web.Request) -> int:
    """The size of a request's line and headers as the client sent them."""
    line = len(request.method) + len(request.raw_path) + len(" HTTP/1.1\r\n") + 1
    return line + sum(len(name) + len(value) + 4 for name, value in request.raw_headers) + 2


def _sent_before_the_101(request: web.Request) -> bool:
    """Whether the client sent bytes of its WebSocket with (or after) the upgrade request
    before its answer: aiohttp keeps them as the message's tail (`_message_tail`, private:
    aiohttp 3.x's RequestHandler) for the WebSocket reader."""
    return bool(getattr(request.protocol, "_message_tail", b""))


def _frame_size(head: bytes) -> int | None:
    """The length of a WebSocket frame (head and payload) whose head `head` starts (RFC 6455
    5.2: 2 bytes, an extended length of 2 or 8, a mask of 4); None if `head` is cut short."""
    if len(head) < 2:
        return None
    size, extended = head[1] & 0x7F, {126: 2, 127: 8}.get(head[1] & 0x7F, 0)
    if len(head) < 2 + extended:
        return None
    if extended:
        size = int.from_bytes(head[2:2 + extended], "big")
    return 2 + extended + 4 * (head[1] >> 7) + size


class _Frames:
    """Where a client's frames start in a WebSocket connection's bytes, found from their
    heads alone (their payloads are skipped)."""

    def __init__(self) -> None:
        self._left = 0  # bytes of the current frame still to come
        self._head = b""  # the start of a head the data ended in

    def part(self, data: bytes, start: int) -> tuple[int, int]:
        """The end of the part of `data` from `start` that costs about PAYMENT (its bytes,
        and PIECE_COST for each frame starting in it), and that cost."""
        position, cost = start, 0
        while position < len(data) and cost < PAYMENT:
            if not self._left:  # a frame starts, or its head goes on
                if not self._head:
                    cost += PIECE_COST
                head = self._head + data[position:position + 14]
                if (size := _frame_size(head)) is None:
                    self._head = head
                    cost += len(data) - position
                    return len(data), cost
                self._left, self._head = size - len(self._head), b""
            step = min(self._left, len(data) - position, max(PAYMENT - cost, 0))
            position, cost, self._left = position + step, cost + step, self._left - step
        return position, cost


class _PaidReads(asyncio.Protocol):
    """A WebSocket connection's protocol, in front of aiohttp's: what the client sends is
    passed on in parts, each paid for from the node's budget (its bytes and PIECE_COST for
    each frame: the loop's work is in the frames too) before the next; in debt the rest of
    the read waits here and the transport does not read, so the kernel's buffer, not the
    loop, holds what the client sends. Paid by the frame, not by the message: frames that
    make no message (pings, a message never finished) pay too."""

    def __init__(self, handler: asyncio.Protocol, transport: asyncio.Transport,
                 budget: BodyBudget) -> None:
        self._handler, self._transport, self._budget = handler, transport, budget
        self._frames = _Frames()
        # the read being passed on: one, or two if aiohttp resumed reading in debt (256 KiB each)
        self._held, self._at = b"", 0
        self._debt: asyncio.TimerHandle | None = None
        self._paused = False

    def data_received(self, data: bytes) -> None:
        if self._at < len(self._held):  # aiohttp resumed reading while in debt
            self._held, self._at = self._held[self._at:] + data, 0
        else:
            self._held, self._at = data, 0
        self._pass_on()

    def _pass_on(self) -> None:
        while self._debt is None and self._at < len(self._held):
            end, cost = self._frames.part(self._held, self._at)
            self._handler.data_received(self._held[self._at:end])
            self._at = end
            if delay := self._budget.charge(cost):
                self._debt = asyncio.get_running_loop().call_later(delay, self._paid)
        if self._debt is not None and self._transport.is_reading():
            # (only a transport that is reading: aiohttp's own pauses are its to lift)
            self._transport.pause_reading()
            self._paused = True

    def _paid(self) -> None:
        self._debt = None
        self._budget.waited()
        self._pass_on()
        if self._debt is None and self._paused:
            self._paused = False
            # aiohttp may have paused reading itself meanwhile (its queue of messages full:
            # the handler is not taking them); that pause is its to lift (the attack review
            # s12 final, finding 1: lifting it let a stalled client's bytes pile up unparsed).
            if not getattr(self._handler, "_reading_paused", False):
                self._transport.resume_reading()

    def abort_in_debt(self) -> None:
        if self._debt is not None:
            self._transport.abort()

    def eof_received(self) -> bool | None:
        if self._at < len(self._held):  # what the client sent before it ended goes first
            self._handler.data_received(self._held[self._at:])
            self._held = b""
        return self._handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._debt is not None:
            self._debt.cancel()
            self._budget.waited()
        self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()


async def _written(socket: web.WebSocketResponse, outbox: Outbox, limits: WebSocketLimits,
                   ) -> str | None:
    """What the outbox holds, written as it comes, each message within the write deadline,
    the loop let run after every `fan_out_slice` of writing; why the client is to be cut."""
    work = LoopSlice(limits.fan_out_slice)
    while (item := await outbox.next()) is not None:
        async with asyncio.timeout(limits.write_deadline):
            await socket.send_frame(item.frame(), WSMsgType.TEXT)
        outbox.sent(item)
        await work.pause()
    return outbox.cut_reason


class RpcServer:
    def __init__(self, node: RpcBackend, websocket: WebSocketLimits | None = None) -> None:
        self.node = node
        self.settings = settings = node.rpc_settings()
        self.limits = settings.limits
        self._body_budget = BodyBudget(self.limits.max_body_rate, self.limits.max_body_bytes)
        self._answer_budget = BodyBudget(self.limits.max_answer_rate,
                                         self.limits.batch.max_response_bytes)
        self.host_allowlist = {h.lower() for h in settings.host_allowlist}
        self.cors_origins = set(settings.cors_origins)
        self.eth = EthApi(node)
        methods = self.eth.methods() | TxPoolApi(node).methods()
        engine_methods = node.engine_rpc_methods()
        methods.update(engine_methods)
        methods.update(BlockBundles.methods_for(
            node.blockchain, self.eth.reads, self.limits.batch.max_response_bytes,
            engine_methods))
        methods.update(engine_ranges_on(self.eth.reads, engine_methods))
        self.dispatcher = Dispatcher(methods, self.limits.batch)
        self.subscriptions = Subscriptions(node, websocket)
        self._cuts = ThrottledLog(log, "WebSocket clients disconnected")
        self._http_cuts = HttpCuts(node.metrics.http_disconnects)
        for reason in CUT_REASONS:  # each counted from zero
            node.metrics.websocket_disconnects.labels(reason)
        node.metrics.websocket_outbox_bytes.set_function(self.subscriptions.outbox_bytes)
        self._runner: web.AppRunner | None = None
        self._listening: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        # each open WebSocket, and what its client's bytes pass through (None: it left)
        self._websockets: dict[web.WebSocketResponse, _PaidReads | None] = {}
        self.port: int | None = None

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        app.router.add_route("*", "/", self._guarded)
        app.on_shutdown.append(self._close_websockets)
        return app

    async def _guarded(self, request: web.Request) -> web.StreamResponse:
        """The Host allowlist and CORS around every request (a plain call: as an aiohttp
        middleware it cost a tenth of a short call's time). Every request pays for its head
        first: without a body (GET, OPTIONS, pipelined by the thousand) it was free (the
        attack review s12-rpc, finding 3); and its handling is charged to the calls' share
        of the loop (`HTTP_HANDLING_SECONDS`; a refusal takes a turn, `_refused`)."""
        await self._body_budget.spend(_head_bytes(request) + PIECE_COST, request.transport)
        self.dispatcher.turns.spent(HTTP_HANDLING_SECONDS)
        host = (request.host or "").rsplit(":", 1)[0].strip("[]").lower()
        if "*" not in self.host_allowlist and host not in self.host_allowlist:
            return await self._refused(web.Response(status=403, text="invalid host specified\n"))
        origin = request.headers.get("Origin")
        if origin and "*" not in self.cors_origins and origin not in self.cors_origins:
            return await self._refused(web.Response(status=403, text="origin not allowed\n"))
        response = await self._handle(request)
        if not response.prepared:
            if origin:
                response.headers["Access-Control-Allow-Origin"] = origin
            await self._sent(request, response)
        return response

    async def _sent(self, request: web.Request, response: web.StreamResponse) -> None:
        """Writes an answer within the read timeout, as a long answer's parts are
        (`_HttpAnswer`): left to aiohttp after the handler, a short answer (or any, at its
        end) waited on the socket for as long as the client liked, so a client that never
        read held its connection for good (the attack review s14-rpc, finding 1)."""
        try:
            async with asyncio.timeout(self.limits.read_timeout):
                await response.prepare(request)
                await response.write_eof()
        except TimeoutError:
            self._http_cuts.cut(request, self.limits.read_timeout)
        except ConnectionError:
            pass  # the client left (aiohttp's own end of the answer says so: a debug line)

    def _refusal(self, request: web.Request) -> web.Response | None:
        """The answer to a request refused on its method and headers alone."""
        if request.method == "OPTIONS":
            return web.Response(status=200)
        if request.method != "POST":
            return web.Response(status=405, text="method not allowed\n")
        if request.content_type not in JSON_CONTENT_TYPES:
            return web.Response(
                status=415, text="invalid content type, only application/json is supported\n"
            )
        if request.content_length is not None and request.content_length > (
            self.limits.max_body_bytes
        ):
            return _closing(413, "content length too large\n")
        return None

    async def _read_body(self, request: web.Request) -> bytes | web.Response:
        """The body, or the answer when it is too long (chunked: reading stops at the limit)
        or too slow."""
        try:
            async with asyncio.timeout(self.limits.read_timeout):
                return await self._read_within_budget(request)
        except web.HTTPRequestEntityTooLarge:
            return _closing(413, "content length too large\n")
        except TimeoutError:
            return _closing(408, "request body read timeout\n")
        except (RequestPayloadError, ConnectionError):  # bad encoding, or the client left
            return _closing(400, "malformed or incomplete request body\n")

    async def _read_within_budget(self, request: web.Request) -> bytes:
        """The body, piece by piece as aiohttp parsed it (a chunk of a chunked body, else
        what one read of the socket brought), each costing its bytes and PIECE_COST: the
        loop's work is in the pieces too. What was parsed is paid for from the node's budget
        before more is parsed (at least every PAYMENT bytes owed, as one read may bring
        thousands of chunks); in debt the connection is not read, and the kernel makes the
        client wait."""
        content = request.content
        pieces: list[bytes] = []
        size = owed = 0
        while True:
            piece, end_of_chunk = await content.readchunk()
            if not piece and not end_of_chunk:
                break  # the end of the body
            size += len(piece)
            if size > self.limits.max_body_bytes:
                raise web.HTTPRequestEntityTooLarge(max_size=self.limits.max_body_bytes,
                                                    actual_size=size)
            pieces.append(piece)
            owed += len(piece) + PIECE_COST
            if owed >= PAYMENT or content.total_bytes == size:  # or all parsed is read
                await self._body_budget.spend(owed, request.transport)
                owed = 0
        return b"".join(pieces)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket":
            await self.dispatcher.turns.admitted()  # (no call's admission holds a handshake)
            return await self._websocket(request)
        refusal = self._refusal(request)
        if refusal is not None:
            return await self._refused(refusal)
        body = await self._read_body(request)
        if isinstance(body, web.Response):
            return await self._refused(body)
        answer = _HttpAnswer(request, self._payment(request), self.limits.read_timeout)
        try:
            await self.dispatcher.answer_into(body, answer)
            return await answer.finish()
        except _ClientGone:
            self._http_cuts.cut(request, self.limits.read_timeout)
            return answer.stream

    async def _refused(self, response: web.Response) -> web.Response:
        """A request answered without a call: its handling was charged to the calls' share
        of the loop, and it takes a turn as a call would (pipelined GETs kept the loop's
        thread 97% busy: the attack review s14b-rpc, finding 4)."""
        await self.dispatcher.turns.admitted()
        return response

    def _payment(self, request: web.Request | None) -> Payment:
        """Paying for answer bytes from the node's answers' budget; meanwhile the request's
        connection (if any) is not read."""
        transport = request.transport if request is not None else None

        async def pay(size: int) -> None:
            await self._answer_budget.spend(size, transport)

        return pay

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        # No permessage-deflate: the loop would inflate up to max_msg_size from a frame that
        # paid its compressed bytes (the attack review s12-rpc, finding 2).
        socket = web.WebSocketResponse(max_msg_size=self.limits.max_body_bytes, heartbeat=30,
                                       compress=False)
        if _sent_before_the_101(request):
            # RFC 6455 4.1: a client sends no frame before the 101. Such bytes would reach
            # aiohttp unpaid, and `_Frames` count from inside a frame (finding 1).
            if request.transport is not None:
                request.transport.abort()
            return _closing(400, "WebSocket frames sent before the handshake's answer\n")
        # Paid from the first byte after the request: installed before the 101 is sent.
        self._websockets[socket] = self._pay_for_reads(request)
        await socket.prepare(request)
        session = self.subscriptions.session(request.remote or "")
        writer = asyncio.create_task(self._ws_writer(
            socket, session.outbox, self.subscriptions.limits, self.dispatcher.turns))
        writer.add_done_callback(functools.partial(self._ws_cut, request, session))
        try:
            await self._ws_read(socket, session)
        finally:
            del self._websockets[socket]
            session.close()
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            await socket.close()
        return socket

    def _pay_for_reads(self, request: web.Request) -> _PaidReads | None:
        """From now on what this connection's client sends (a WebSocket's) is paid from the
        node's budget, the one HTTP bodies pay from."""
        if (transport := request.transport) is None:  # the client left
            return None
        paid_reads = _PaidReads(request.protocol, transport, self._body_budget)
        transport.set_protocol(paid_reads)
        return paid_reads

    async def _close_websockets(self, _app: web.Application) -> None:
        """On stop: without this, each open WebSocket would hold the shutdown for a minute. A
        client in debt is cut: its close frame would wait behind what it owes."""
        for paid_reads in self._websockets.values():
            if paid_reads is not None:
                paid_reads.abort_in_debt()
        sockets = list(self._websockets)
        await asyncio.gather(*(s.close(code=WSCloseCode.GOING_AWAY) for s in sockets))

    async def _ws_read(self, socket: web.WebSocketResponse, session: Session) -> None:
        """Requests, one at a time, each read only while the outbox is under its budget, and
        its handling charged as an HTTP request's is (aiohttp's frame parsing, reading it,
        its answer queued: only its calls' steps were, and a flood of notifications took
        the loop 1.8-3.2 x what was charged, the attack review s16, finding 3)."""
        while await session.outbox.room():
            message = await socket.receive()
            if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                return  # CLOSE or ERROR (a message over the limit: closed with 1009)
            self.dispatcher.turns.spent(HTTP_HANDLING_SECONDS)
            result = await self.dispatcher.handle_payload(message.data, session,
                                                          self._payment(None))
            if result is not None:
                session.outbox.put_answer(result, self.dispatcher.held_answers)

    @staticmethod
    async def _ws_writer(socket: web.WebSocketResponse, outbox: Outbox,
                         limits: WebSocketLimits, turns: LoopTurns) -> str | None:
        """Writes what the outbox holds, a client's work on the loop taking its turns
        (`turns`, a slice of writing at a time: written in one turn, one connection's
        10,000 notifications of a block held the loop 80 ms, the attack review s14b-rpc,
        finding 1); why the client is to be cut (None: it left). The outbox is closed when
        it ends, so the reader stops waiting for room in it."""
        try:
            return await turns.run(_written(socket, outbox, limits))
        except TimeoutError:
            return WRITE_DEADLINE
        except ConnectionError:
            return None
        finally:
            outbox.close()

    def _ws_cut(self, request: web.Request, session: Session, writer: asyncio.Task[Any]) -> None:
        """The writer ended: if it was to cut the client, say why (log and metric) and close
        the connection (the reader then ends too)."""
        if writer.cancelled():
            return
        if (error := writer.exception()) is not None:  # a bug: its traceback, and the client cut
            log.error("WebSocket writer failed", exc_info=error)
            reason = None
        elif (reason := writer.result()) is not None:
            self._report_cut(request, session.outbox, reason)
        if (error is not None or reason is not None) and request.transport is not None:
            request.transport.abort()

    def _report_cut(self, request: web.Request, outbox: Outbox, reason: str) -> None:
        limits = self.subscriptions.limits
        why = {
            WRITE_DEADLINE: f"a message not taken within the {limits.write_deadline:g} s "
                            "write deadline",
            OUTBOX_FULL: f"over {limits.notification_bytes} bytes of notifications waiting",
            BEHIND: f"notifications over {limits.max_blocks_behind} blocks behind",
        }[reason]
        self._cuts.log(logging.WARNING, reason, "WebSocket client %s disconnected: %s "
                       "(%d bytes queued)", request.remote, why, outbox.bytes)
        self.node.metrics.websocket_disconnects.labels(reason).inc()

    def _accept(self) -> asyncio.BaseProtocol:
        """A protocol for each accepted connection: aiohttp's, or a 503 over the limit."""
        server = self._runner.server if self._runner else None
        if server is None or len(server.connections) >= self.limits.max_connections:
            return _Busy(self._busy)
        return server()

    async def start(self) -> None:
        settings = self.settings
        self._runner = web.AppRunner(
            self._app(),
            access_log=None,
            keepalive_timeout=self.limits.idle_timeout,
            lingering_time=self.limits.linger_time,
            logger=_HttpErrorLog(logging.getLogger("chain.rpc.http"), {}),
        )
        await self._runner.setup()
        self.port = await self._listen(settings.http_addr, settings.http_port)
        log.info("JSON-RPC on http://%s:%d (HTTP and WebSocket)", settings.http_addr, self.port)

    async def _listen(self, host: str, port: int) -> int:
        """Listens on `host` (a name: each of its addresses, one socket a family) and
        accepts connections as `_accepted` does; the port (port 0 with a name of several
        addresses: each socket has a port of its own, as asyncio's; the first's)."""
        loop = asyncio.get_running_loop()
        # asyncio makes the listening sockets (the address resolved, one per family) but
        # accepts in a loop of its own, as fast as connections come: `_accepted` does.
        made = await loop.create_server(self._accept, host, port, start_serving=False)
        self._busy = _Lingering()
        self._accept_errors = ThrottledLog(log, "failed accepts")
        self._listening = [socket.socket(fileno=os.dup(s.fileno())) for s in made.sockets]
        made.close()
        for listening in self._listening:
            listening.setblocking(False)
            listening.listen(BACKLOG)
        self._accepting = [loop.create_task(self._accepted(listening), name="JSON-RPC accepts")
                           for listening in self._listening]
        return int(self._listening[0].getsockname()[1])

    async def _unlisten(self) -> None:
        """Stops accepting and closes the listening sockets (the backlog's connections are
        reset by the kernel)."""
        for accepting in self._accepting:
            accepting.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        for listening in self._listening:
            listening.close()
        self._accepting, self._listening = [], []

    async def _accepted(self, listening: socket.socket) -> None:
        """Accepts connections, each in a turn of the loop and charged CONNECTION_SECONDS
        to the calls' share, as a request is: in debt none is accepted, and the kernel's
        backlog holds what comes meanwhile."""
        loop = asyncio.get_running_loop()
        turns = self.dispatcher.turns
        while True:
            await turns.admitted()
            try:
                client, _ = await loop.sock_accept(listening)
            except ConnectionAbortedError:  # reset before it was accepted: the next
                continue
            except OSError as exc:  # (a line a second while it lasts: throttled)
                self._accept_errors.log(logging.ERROR, type(exc).__name__,
                                        "JSON-RPC cannot accept connections: %s", exc)
                await asyncio.sleep(ACCEPT_RETRY_SECONDS)
                continue
            turns.spent(CONNECTION_SECONDS)
            try:
                await loop.connect_accepted_socket(self._accept, client)
            except OSError:  # the client left already
                client.close()
            except Exception:  # a bug: said, and the node still accepts the next
                log.exception("JSON-RPC connection not set up")
                client.close()

    async def stop(self) -> None:
        self.subscriptions.close_all()
        await self._unlisten()
        if self._runner is not None:
            await self._runner.cleanup()
        self.dispatcher.close()
        self.eth.close()
