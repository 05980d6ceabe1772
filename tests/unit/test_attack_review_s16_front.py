"""Attack review (session 16) of the front door's admission: client calls on the event loop
admitted one per turn and within LOOP_SHARE of it while blocks come (chain/rpc/loop_turns.py
`LoopTurns`, `_Gate`, `_Timed`), a request's first call ahead of batches' later ones (commit
ca61859), each HTTP request's handling charged 250 us (chain/rpc/server.py `_guarded`,
`HTTP_HANDLING_SECONDS`). What a client with no keys that reaches the JSON-RPC port can still
do: each finding is a strict xfail named for its gap; each rule that held, a passing test.

1. A batch's handling around its calls (checking, answering, encoding, a turn after each) is
   charged nothing, and its invalid items are answered without an admission, k batches' in
   every turn: the loop's thread takes 4-20 x what LoopTurns charged for such a flood. Fixed:
   each item admitted and its whole handling timed as a step (`Dispatcher._item`), and each
   admission charged ADMISSION_SECONDS.
2. A single request's steps after its first (eth_call, eth_getLogs, eth_getBlockByNumber
   after their worker or child) are admitted LATER: ~64 turns behind 64 batches. Fixed
   (ca7f701, each step in its call's class).
3. A WebSocket message's handling is charged nothing (an HTTP request's, 250 us). Fixed:
   charged as an HTTP request's (`_ws_read`).
4. A refusal (and a handshake) takes a FIRST turn, and a single request queues there twice:
   64 connections pipelining GETs hold an honest eth_chainId ~65 ms (16: ~17 ms). Fixed:
   refusals and handshakes are admitted LATER, and a single request is decoded and
   answered in one admission.
5. A connection is set up outside LoopTurns, all those in the backlog in one turn, charged
   nothing (~0.7 ms one with no request, ~1.1 ms one answered 503, here). Fixed (session 17):
   accepted one per turn, each charged CONNECTION_SECONDS (`RpcServer._accepted`).
6. Connections over max_connections each hold a socket 1 s, with no bound but their rate.
   Fixed: at most BUSY_LINGERING (32) linger, the rest aborted once answered (`_Busy`), and
   the node raises its soft RLIMIT_NOFILE to the hard limit at start.
7. A request's head is paid for only once whole: trickled a byte a segment, never (~24 us of
   the loop a read here, 16,400 reads a second from one Python process: 0.4 s of the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, NamedTuple

import orjson
import pytest
from aiohttp import web, web_protocol

from chain.metrics import NodeMetrics
from chain.p2p.throttle import ThrottledLog
from chain.rpc import child_process
from chain.rpc import dispatcher as dispatcher_module
from chain.rpc.dispatcher import Dispatcher
from chain.rpc.limits import RpcLimits
from chain.rpc.loop_turns import FIRST, LATER, LoopTurns
from chain.rpc.server import (
    HTTP_HANDLING_SECONDS,
    PIECE_COST,
    BodyBudget,
    RpcServer,
    _HttpErrorLog,
)
from chain.rpc.subscriptions import Subscriptions
from tests.unit.test_attack_review_s13_rpc import _call, _post, _rpc
from tests.unit.test_attack_review_s14b_rpc import HANDSHAKE

FLOOD_SECONDS = 1.0


async def _chain_id() -> str:
    return "0x539"


def _front(methods: dict[str, Any], limits: RpcLimits | None = None) -> RpcServer:
    """A node's HTTP and WebSocket front door alone (no node behind it): the request budget
    at the node's rate (what the attacker pays), its dispatcher over `methods`."""
    rpc = _rpc(methods, limits=limits)
    rpc._body_budget = BodyBudget(rpc.limits.max_body_rate, rpc.limits.max_body_bytes)
    rpc._answer_budget = BodyBudget(rpc.limits.max_answer_rate,
                                    rpc.limits.batch.max_response_bytes)
    rpc.subscriptions = Subscriptions(
        SimpleNamespace(add_head_listener=lambda _: None))  # type: ignore[arg-type]
    rpc.node = SimpleNamespace(metrics=NodeMetrics())  # type: ignore[assignment]
    rpc._cuts = ThrottledLog(logging.getLogger("chain.rpc.server"), "cut")
    return rpc


@contextlib.asynccontextmanager
async def _accepting(rpc: RpcServer) -> AsyncIterator[int]:
    """Its port, served by `RpcServer._listen` as `start` serves: each connection accepted
    in a turn of the loop and charged (`_accepted`), made by `_accept` (a 503 over
    max_connections), handlers not cancelled when their client leaves."""
    runner = web.AppRunner(rpc._app(), access_log=None,
                           logger=_HttpErrorLog(logging.getLogger("chain.rpc.http"), {}))
    await runner.setup()
    rpc._runner = runner
    port = await rpc._listen("127.0.0.1", 0)
    try:
        yield port
    finally:
        await rpc._unlisten()
        await runner.cleanup()


class _Idle:
    """The time the running loop waits in its selector (for sockets, or for a timer: a call
    resting for the share): the loop's time nobody takes."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def install(self) -> None:
        selector = asyncio.get_running_loop()._selector  # type: ignore[attr-defined]
        select = selector.select

        def timed(timeout: float | None = None) -> Any:
            started = time.perf_counter()
            try:
                return select(timeout)
            finally:
                self.seconds += time.perf_counter() - started

        selector.select = timed


class _Flood(NamedTuple):
    """What a flood took of the loop while blocks came, over FLOOD_SECONDS: the loop
    thread's CPU time (all of it the clients' here: no consensus), what LoopTurns charged
    to the calls' share, the time the loop waited in its selector (idle), the wall time,
    and what the flood's counter grew by a second."""

    cpu: float
    charged: float
    idle: float
    wall: float
    rate: float

    def undercharged(self) -> float:
        """The loop's time the flood took over what was charged for it: the share holds
        the charged time to LOOP_SHARE of the loop's, so the flood may take this many
        times that (its CPU time over the wall time is no measure on a loaded machine,
        where the loop's thread is not run: that counts as idle)."""
        return self.cpu / self.charged

    def __str__(self) -> str:
        return (f"the loop's thread took {self.cpu:.2f} s of {self.wall:.2f} s, "
                f"{self.charged:.2f} s charged, {self.idle:.2f} s idle, "
                f"{self.rate:.0f} a second")


# The clients may take at most this many times what was charged: LOOP_SHARE x 1.2 (the
# tolerance of the attack review s14b-rpc's finding 4), and a little for a machine loaded
# by others (an HTTP request's handling here cost 300-400 us, over its 250 us charge).
UNDERCHARGED = 1.5


async def _flood(rpc: RpcServer, client_code: str, port: int, counted: list[int]) -> _Flood:
    """While the chain makes blocks (the caller's monkeypatch) and a client process
    (`client_code`, its argument the port) floods `rpc` on `port`: what it took of the
    loop. The client is a process of its own: as a thread it would take the interpreter
    from the loop measured."""
    idle, charged = _Idle(), [0.0]
    idle.install()
    turns = rpc.dispatcher.turns
    spent = turns.spent

    def counted_spent(seconds: float) -> None:
        charged[0] += seconds
        spent(seconds)

    turns.spent = counted_spent  # type: ignore[method-assign]
    client = subprocess.Popen([sys.executable, "-c", client_code, str(port)],
                              stderr=subprocess.DEVNULL)
    try:
        await asyncio.sleep(0.5)  # (the client started, the budgets' bursts spent)
        started, cpu, before = time.monotonic(), time.thread_time(), counted[0]
        waited, paid = idle.seconds, charged[0]
        await asyncio.sleep(FLOOD_SECONDS)
        seconds = time.monotonic() - started
        return _Flood(time.thread_time() - cpu, charged[0] - paid, idle.seconds - waited,
                      seconds, (counted[0] - before) / seconds)
    finally:
        client.kill()
        client.wait()


# Finding 1: a batch's work around its calls is the loop's, uncharged: one HTTP request's
# 250 us buys up to 1,000 calls' dispatching, encoding and answering.

# One connection pipelining a body and reading every answer (a process of its own).
PIPELINING_POSTS = r"""
import socket, sys, threading
body = bytes.fromhex(sys.argv[2])
wire = (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)) * 64
def drained(client):
    while client.recv(1 << 20):
        pass
def pipelining():
    client = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    threading.Thread(target=drained, args=(client,), daemon=True).start()
    while True:
        client.sendall(wire)
for _ in range(CONNECTIONS - 1):
    threading.Thread(target=pipelining, daemon=True).start()
pipelining()
"""
CONNECTIONS = 4


def _pipelining(body: bytes) -> str:
    """A client process's code: CONNECTIONS connections pipelining POSTs of `body`."""
    return (PIPELINING_POSTS.replace("sys.argv[2]", repr(body.hex()))
            .replace("CONNECTIONS", str(CONNECTIONS)))


BATCHES = {
    "of eth_chainId": orjson.dumps([_call("eth_chainId", i) for i in range(1_000)]),
    "of invalid items": b"[" + b",".join([b"1"] * 1_000) + b"]",  # 2 kB: never admitted
}


@pytest.mark.parametrize("batch", BATCHES)
def test_batches_take_at_most_the_share_of_the_loop(
        monkeypatch: pytest.MonkeyPatch, batch: str) -> None:
    """LoopTurns times a call's steps, and `_guarded` charges 250 us for an HTTP request's
    handling; what a batch does around each of its calls is neither: `Dispatcher.call`
    (the request checked, its admission, the answer made), the `asyncio.sleep(0)` after it
    (a turn of the loop), the answer encoded, paid and put. For eth_chainId that is ~20 x
    the timed step, and an invalid item (`1`: not an object) has no step at all: it is
    answered without an admission. Four connections pipelining batches of 1,000 while the
    chain makes blocks: the loop's thread took 0.47-0.86 s a second, 4-7 x what was
    charged (0.10-0.12 s) for batches of eth_chainId, 4-21 x (0.04-0.18 s) for invalid
    items, the share never resting them (a single request: 1.1-1.6 x), at 12-80 batches a
    second (a request budget of 16 MiB/s lets ~400 of the first, ~5,000 of the second in).
    So a flood of 2-4 x that takes the whole loop. The fix I would make: charge what a
    batch does around a call (a price a batch item, as `HTTP_HANDLING_SECONDS` prices a
    request, or time `_batch`'s loop body as `_Timed` times a step), and admit an invalid
    item as a call is admitted."""
    answered = [0]

    async def chain_id() -> str:
        answered[0] += 1
        return "0x539"

    rpc = _front({"eth_chainId": chain_id})
    if batch == "of invalid items":
        request_error = dispatcher_module.request_error

        def counted(request: Any) -> Any:
            answered[0] += 1
            return request_error(request)

        monkeypatch.setattr(dispatcher_module, "request_error", counted)
    monkeypatch.setattr(child_process, "_last_block", math.inf)  # blocks keep coming

    async def flooded() -> _Flood:
        async with _accepting(rpc) as port:
            return await _flood(rpc, _pipelining(BATCHES[batch]), port, answered)

    flood = asyncio.run(flooded())
    assert flood.rate > 1_000, f"the client was not served: {flood}"
    assert flood.undercharged() <= UNDERCHARGED, str(flood)


def test_calls_that_compute_take_at_most_the_share_of_the_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule that held, and the measure's control: single requests whose call computes
    on the loop (1 ms a step, timed and charged), pipelined on four connections while
    blocks come, take at most the share of the loop by the same measure. (Single
    eth_chainId requests, ~5 us of call and only the 250 us charge, took 73-85% of the
    loop here under the integrator's load, ~500 us each: the fixed price of a request's
    handling is below what it costs a loaded machine; on a quiet one it may not be.)"""
    answered = [0]

    async def computing() -> str:
        answered[0] += 1
        started = time.perf_counter()
        while time.perf_counter() - started < 0.001:
            pass
        return "0x539"

    rpc = _front({"computing": computing})
    monkeypatch.setattr(child_process, "_last_block", math.inf)  # blocks keep coming

    async def flooded() -> _Flood:
        async with _accepting(rpc) as port:
            return await _flood(rpc, _pipelining(orjson.dumps(_call("computing"))), port,
                                answered)

    flood = asyncio.run(flooded())
    assert flood.rate > 50, f"the client was not served: {flood}"
    assert flood.undercharged() <= UNDERCHARGED, str(flood)


class _Turns:
    """Counts the turns of the running loop (a callback that puts itself back each turn)."""

    def __init__(self) -> None:
        self.turn = 0
        self._handle: asyncio.Handle | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def next_turn() -> None:
            self.turn += 1
            self._handle = loop.call_soon(next_turn)

        self._handle = loop.call_soon(next_turn)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


def test_a_batch_s_invalid_items_are_admitted_one_per_turn(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`Dispatcher.call` answers an invalid request (`request_error`: not an object, no
    "jsonrpc": "2.0", a bad id, no method) before `turns.run`: no admission, no time charged.
    A batch of 1,000 `1`s (2 kB) yields after each item, so k such batches run k items'
    answers in every turn of the loop, the flood LoopTurns exists to stop ("a consensus
    message waits behind one call at most"). Here 16 batches: the items answered in each
    turn of the loop."""
    clients, turns = 16, _Turns()
    answered: dict[int, int] = {}  # invalid items answered, by the turn of the loop
    request_error = dispatcher_module.request_error

    def counted(request: Any) -> Any:
        error = request_error(request)
        if error is not None:
            answered[turns.turn] = answered.get(turns.turn, 0) + 1
        return error

    monkeypatch.setattr(dispatcher_module, "request_error", counted)
    dispatcher = Dispatcher({}, turns=LoopTurns(busy=lambda: False))
    batch = b"[" + b",".join([b"1"] * 200) + b"]"

    async def flooded() -> list[bytes | None]:
        turns.start()
        try:
            return await asyncio.gather(*(dispatcher.handle_payload(batch)
                                          for _ in range(clients)))
        finally:
            turns.stop()

    answers = asyncio.run(flooded())
    dispatcher.close()
    assert all(answer is not None and answer.count(b"-32600") == 200 for answer in answers)
    most = max(answered.values())
    assert most == 1, f"{most} invalid items answered in one turn of the loop"


# Finding 2: an honest call's later steps are LATER: queued behind every batch's next call.

async def _honest_call_turns(flooders: int = 64) -> tuple[int, int]:
    """Turns of the loop a single request's call (FIRST) waits for its admission, and for
    the admission of its step after a wait (an eth_call's execution, a read on a worker),
    while `flooders` batches flood LATER back to back, each with its next call waiting."""
    turns, counter = LoopTurns(busy=lambda: False), _Turns()
    stop = False

    async def nothing() -> None:
        return None

    async def batch() -> None:
        while not stop:
            await turns.run(nothing(), LATER)

    async def honest() -> tuple[int, int]:
        admitted = counter.turn
        await asyncio.sleep(0)  # the wait (a worker's read): its next step is admitted
        return admitted, counter.turn

    counter.start()
    batches = [asyncio.create_task(batch()) for _ in range(flooders)]
    try:
        for _ in range(3 * flooders):  # every batch's next call is waiting
            await asyncio.sleep(0)
        asked = counter.turn
        admitted, stepped = await asyncio.wait_for(turns.run(honest(), FIRST), 5)
    finally:
        stop = True
        await asyncio.wait_for(asyncio.gather(*batches), 5)
        counter.stop()
    return admitted - asked, stepped - admitted


def test_an_honest_call_s_first_step_is_not_queued_behind_batches() -> None:
    """The rule ca61859 added, held: the first step waits ~2 turns behind 64 batches."""
    first, _later = asyncio.run(_honest_call_turns())
    assert first <= 4, first


def test_an_honest_call_s_later_steps_are_not_queued_behind_batches() -> None:
    """`_Timed` admits every step after a call's first as LATER, whoever's call it is: a
    single request's eth_call (its execution in a child), eth_getLogs, eth_feeHistory,
    eth_getBlockReceipts, eth_getBlockByNumber of a large block (a read on a worker) come
    back to the loop as a batch's next call does, and wait in the same queue, first come
    first served, behind every flooding batch's next call: 64 batches put the honest
    call's last step ~64 turns back (before ca61859 its first step too; now the first
    waits ~2). Here 64 batches flooding LATER: the turns the honest call's step after its
    wait waited. The fix I would make: a call's later steps admitted in its own class (a
    single request's stay FIRST; `_Timed` given `kind`), or fair queueing by request."""
    _first, later = asyncio.run(_honest_call_turns())
    assert later <= 4, f"the honest call's next step waited {later} turns"


# A rule that held: a request whose client left keeps its place among max_connections.

def test_a_request_whose_client_left_keeps_its_connection_s_place() -> None:
    """aiohttp does not cancel a handler whose client left (handler_cancellation: False, as
    the node serves), and a batch whose answer is short (under WRITE_PART: nothing written
    until its end, or notifications: nothing at all) runs every call for no one. But the
    connection is counted (`Server.connections`, which `_accept` checks) until its handler
    ends (aiohttp 3.14 drops it then, not at connection_lost): a client that sends batches
    and leaves at once holds no more requests in flight, nor their bytes, than
    max_connections. Here max_connections 2: two clients send a batch whose first call
    waits (its turn behind a backlog) and leave; a third is answered 503."""
    running: set[asyncio.Task[Any] | None] = set()

    async def waiting() -> str:
        running.add(asyncio.current_task())
        await asyncio.Event().wait()  # its turn, behind the backlog
        return "0x"

    rpc = _front({"waiting": waiting, "eth_chainId": _chain_id},
                 limits=RpcLimits(max_connections=2))
    batch = orjson.dumps([_call("waiting", 0)] + [_call("eth_chainId", i)
                                                  for i in range(1, 1_000)])

    async def left() -> tuple[int, bytes]:
        async with _accepting(rpc) as port:
            for client in range(2):
                _reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(_post(batch))
                async with asyncio.timeout(5):
                    while len(running) <= client:  # its batch is running
                        await asyncio.sleep(0.005)
                writer.transport.abort()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(batch))
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            in_flight = len(running)
            for task in running:  # (the node stopping: what it still runs is cancelled)
                if task is not None:
                    task.cancel()
            return in_flight, answer

    in_flight, answer = asyncio.run(left())
    assert in_flight == 2
    assert answer.startswith(b"HTTP/1.1 503"), answer[:40]


# Finding 3: a WebSocket message's handling is charged nothing: only its call's steps.

# One WebSocket connection pipelining a request in a frame of its own and reading every
# answer (a process of its own): the handshake, then masked text frames (a zero mask).
PIPELINING_FRAMES = r"""
import socket, sys, threading
request = REQUEST
wire = (bytes([0x81, 0x80 | len(request)]) + bytes(4) + request) * 1_000
def drained(client):
    while client.recv(1 << 20):
        pass
def pipelining():
    client = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                   b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        head += client.recv(1)
    threading.Thread(target=drained, args=(client,), daemon=True).start()
    while True:
        client.sendall(wire)
for _ in range(CONNECTIONS - 1):
    threading.Thread(target=pipelining, daemon=True).start()
pipelining()
"""


def _websockets(request: bytes) -> str:
    """A client process's code: CONNECTIONS WebSocket connections, each pipelining
    `request` (under 126 bytes) in frames of its own, zero-masked."""
    return (PIPELINING_FRAMES.replace("REQUEST", repr(request))
            .replace("CONNECTIONS", str(CONNECTIONS)))


def test_a_websocket_message_is_charged_its_handling_as_an_http_request_is() -> None:
    """An HTTP request's handling outside its calls' steps is charged HTTP_HANDLING_SECONDS
    (250 us) of the calls' share (`_guarded`: pipelined GETs and eth_chainId calls kept the
    loop's thread ~90% busy, the attack review s14b-rpc, finding 4). A WebSocket message
    is charged nothing of the kind: aiohttp parsing its frame, `_PaidReads`, `_ws_read`,
    `handle_payload` (the decoding's admission and the call's: a turn of the loop each, the
    answer held, put in the outbox, its frame written) are outside any step; only the
    steps are timed, and the request budget prices the frame at its bytes and PIECE_COST
    (~15,000 frames a second). Four connections pipelining notifications (no answer: no
    frame written, whose send the writer's step is charged for) while the chain made
    blocks: the loop's thread took 0.5-0.86 s a second, 1.8-3.2 x the 0.23-0.32 s
    charged (a single HTTP request: 1.1-1.6 x), so a flood of 2-3 x that size takes the
    whole loop while the share never rests it (`_flood`'s measure, in
    `test_websocket_notifications_flood`, run by hand: too noisy on a loaded machine for
    a strict test). Here 200 notifications on one connection: the charges of at least
    HTTP_HANDLING_SECONDS (an HTTP request gets one each). The fix I would make: charge
    each WebSocket message in `_ws_read` as `_guarded` charges an HTTP request (a price
    of its own, measured: its handling is lighter than an HTTP request's)."""
    messages, answered = 200, [0]

    async def chain_id() -> str:
        answered[0] += 1
        return "0x539"

    rpc = _front({"eth_chainId": chain_id})
    charges: list[float] = []
    spent = rpc.dispatcher.turns.spent

    def charged(seconds: float) -> None:
        charges.append(seconds)
        spent(seconds)

    rpc.dispatcher.turns.spent = charged  # type: ignore[method-assign]
    notification = b'{"jsonrpc":"2.0","method":"eth_chainId"}'
    frame = bytes([0x81, 0x80 | len(notification)]) + bytes(4) + notification

    async def sent() -> int:
        async with _accepting(rpc) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(HANDSHAKE)
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
            handshake = len(charges)
            writer.write(frame * messages)
            async with asyncio.timeout(10):
                while answered[0] < messages:
                    await asyncio.sleep(0.01)
            writer.transport.abort()
            rpc.subscriptions.close_all()
            return sum(1 for seconds in charges[handshake:] if seconds >= HTTP_HANDLING_SECONDS)

    priced = asyncio.run(sent())
    assert priced >= messages, f"{priced} of {messages} messages charged their handling"


@pytest.mark.skipif(not os.environ.get("S16_MEASURE"), reason="a measurement, run by hand "
                    "(S16_MEASURE=1): too noisy on a loaded machine for a strict test")
def test_websocket_notifications_flood(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 3's flood: four connections pipelining notifications while blocks come."""
    answered = [0]

    async def chain_id() -> str:
        answered[0] += 1
        return "0x539"

    rpc = _front({"eth_chainId": chain_id})
    monkeypatch.setattr(child_process, "_last_block", math.inf)  # blocks keep coming
    notification = b'{"jsonrpc":"2.0","method":"eth_chainId"}'

    async def flooded() -> _Flood:
        async with _accepting(rpc) as port:
            try:
                return await _flood(rpc, _websockets(notification), port, answered)
            finally:
                rpc.subscriptions.close_all()

    flood = asyncio.run(flooded())
    assert flood.rate > 1_000, f"the client was not served: {flood}"
    assert flood.undercharged() <= UNDERCHARGED, str(flood)


# Finding 4: a refusal takes a request's FIRST turn: an honest request waits behind every
# connection's refused GET, and twice (its decoding, then its call).

async def _honest_request_turns(refusing: int = 64) -> int:
    """Turns of the loop a single request (its decoding admitted, then its call, as
    `answer_into` runs them) waits until its call is admitted, while `refusing` connections
    pipeline requests refused before any call (each taking a turn: `RpcServer._refused`)."""
    turns, counter = LoopTurns(busy=lambda: False), _Turns()
    stop = False

    async def refused() -> None:
        while not stop:
            await turns.admitted()

    async def decoded() -> None:
        return None

    async def call() -> int:
        return counter.turn

    counter.start()
    refusals = [asyncio.create_task(refused()) for _ in range(refusing)]
    try:
        for _ in range(3 * refusing):  # every connection's next refusal is waiting
            await asyncio.sleep(0)
        asked = counter.turn
        await asyncio.wait_for(turns.run(decoded()), 5)
        admitted = await asyncio.wait_for(turns.run(call()), 5)
    finally:
        stop = True
        await asyncio.wait_for(asyncio.gather(*refusals), 5)
        counter.stop()
    return admitted - asked


def test_an_honest_request_is_not_queued_behind_every_connection_s_refusals() -> None:
    """A request refused before any call (a GET's 405, OPTIONS, a wrong Host: 27 bytes) and
    a WebSocket handshake take a turn as a FIRST call (`LoopTurns.admitted`), first come
    first served with honest requests' first calls; and a single request goes through that
    queue twice, its decoding's admission, then its call's. 64 connections pipelining GETs
    put an honest eth_sendRawTransaction ~130 turns back (255, the connection limit less
    one: ~510), and while blocks come each refusal is charged 250 us of the share: 64 x
    250 us / LOOP_SHARE = 32 ms a pass, ~64 ms before its call runs, for the price of 64
    idle connections' GETs (a valid eth_chainId in their place costs the attacker its body
    and two turns, and is as honest as the honest request: no class tells them apart). The
    fix I would make: refusals and handshakes admitted in a class of their own (in turn
    with FIRST and LATER, or LATER), and a request's call admitted in the turn after its
    decoding's (the decoding's admission held for it, not queued again)."""
    waited = asyncio.run(_honest_request_turns())
    assert waited <= 8, f"the honest request's call waited {waited} turns"


# Finding 5: a connection is the loop's work outside LoopTurns: set up k at once in a turn,
# charged nothing, paid from no budget (one with no request, one over max_connections).

CONNECTIONS_AT_ONCE = 50


async def _connected_at_once(rpc: RpcServer, count: int) -> tuple[dict[int, int], float]:
    """`count` connections made while the loop is busy (as a loaded loop is: they wait in
    the listening socket's backlog), then closed without a request: how many the node set
    up in each turn of the loop, and what it charged the calls' share meanwhile."""
    turns, charged = _Turns(), [0.0]
    made: dict[int, int] = {}
    accept, spent = rpc._accept, rpc.dispatcher.turns.spent

    def counted() -> asyncio.BaseProtocol:
        made[turns.turn] = made.get(turns.turn, 0) + 1
        return accept()

    def counted_spent(seconds: float) -> None:
        charged[0] += seconds
        spent(seconds)

    rpc._accept = counted  # type: ignore[method-assign]
    rpc.dispatcher.turns.spent = counted_spent  # type: ignore[method-assign]
    async with _accepting(rpc) as port:
        turns.start()
        # blocking connects: the kernel completes them, the loop (running this) accepts none
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
        try:
            async with asyncio.timeout(10):
                while sum(made.values()) < count:
                    await asyncio.sleep(0.001)
        finally:
            for client in clients:
                client.close()
            turns.stop()
    return made, charged[0]


@pytest.mark.parametrize("limit", [256, 0], ids=["under the limit", "over it (503)"])
def test_connections_are_set_up_one_per_turn(limit: int) -> None:
    """asyncio accepts what waits in the listening socket's backlog (up to 100) in one
    callback and sets each connection up in a task of its own, all of them in the next
    turn of the loop: `_accept` (aiohttp's RequestHandler, or `_Busy`'s 503 over
    max_connections), the transport, its registration. None of it is admitted, timed or
    charged, and no budget pays for it (the request budget is paid per request; a
    connection may send none, and `_Busy` reads nothing). It cost this loop ~700 us a
    connection closed without a request and ~1.1 ms one answered 503 (loaded machine; 400
    connections from a process of their own, 3 ms apart): ~1,000 connections a second take
    the loop's thread whole, and a backlog of 100 holds a consensus message ~70 ms behind
    them. Here 50 connections made while the loop was busy, then closed: those set up in one
    turn. The fix I would make: accept off a budget of the calls' share (each connection
    charged a measured price in `_accept`, the listening socket's reading paused while the
    share is in debt) and one connection set up per turn; and a limit per client address,
    as geth leaves to a proxy."""
    made, _charged = asyncio.run(_connected_at_once(_front({}, RpcLimits(max_connections=limit)),
                                                    CONNECTIONS_AT_ONCE))
    most = max(made.values())
    assert most == 1, f"{most} connections set up in one turn of the loop"


@pytest.mark.parametrize("limit", [256, 0], ids=["under the limit", "over it (503)"])
def test_a_connection_is_charged_to_the_calls_share(limit: int) -> None:
    """Finding 5's second half: connections closed without a request, or answered 503, are
    charged nothing of the calls' share (at least HTTP_HANDLING_SECONDS each would be
    below what they cost here)."""
    _made, charged = asyncio.run(_connected_at_once(_front({}, RpcLimits(max_connections=limit)),
                                                    CONNECTIONS_AT_ONCE))
    assert charged >= CONNECTIONS_AT_ONCE * HTTP_HANDLING_SECONDS, f"{charged * 1e6:.0f} us"


# Rules that held: the gate is never wedged, and holds nothing for waiters that left.

async def _waiters(turns: LoopTurns, count: int) -> None:
    """Until `count` calls wait in `turns`' gate."""
    async with asyncio.timeout(5):
        while sum(map(len, turns._gate._waiting)) < count:
            await asyncio.sleep(0)


def test_waiters_cancelled_in_the_gate_leave_nothing_held() -> None:
    """1,000 calls of each class wait while a call holds the gate resting in debt, and are
    cancelled (their clients gone, WebSocket writers cut): the next call is admitted as
    soon as the rest is over, the gate's queues are empty once it has, and it is free."""
    async def body() -> tuple[int, bool]:
        turns = LoopTurns(share=0.5, busy=lambda: True)
        turns.spent(0.05)  # in debt: the next admission rests ~100 ms, holding the gate

        async def nothing() -> None:
            return None

        holder = asyncio.create_task(turns.run(nothing()))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(turns.run(nothing(), kind))
                   for kind in (FIRST, LATER) for _ in range(1_000)]
        await _waiters(turns, 2_000)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        await holder
        await asyncio.wait_for(turns.run(nothing(), LATER), 2)
        gate = turns._gate
        return sum(map(len, gate._waiting)), gate._held

    assert asyncio.run(body()) == (0, False)


def test_a_new_event_loop_is_admitted_though_the_last_one_closed_mid_admission() -> None:
    """A loop closed (not run down: no cancellations) while a call held the gate and
    others waited: on the next loop the first call is admitted at once (the gate's futures
    were the old loop's; `_admit` takes a new gate for a new loop)."""
    turns = LoopTurns(share=0.5, busy=lambda: True)

    async def nothing() -> None:
        return None

    old = asyncio.new_event_loop()
    turns.spent(10.0)  # the holder rests ~20 s in the gate
    held = [old.create_task(turns.run(nothing(), kind)) for kind in (FIRST, LATER, FIRST)]
    old.run_until_complete(_waiters(turns, 2))
    assert not any(task.done() for task in held) and turns._gate._held
    old.close()  # (its pending tasks are never run again)
    turns._tokens = 0.0  # the debt paid meanwhile

    async def admitted() -> None:
        await asyncio.wait_for(turns.run(nothing()), 1)

    asyncio.run(admitted())
    for task in held:  # (the old loop's coroutines, closed: no "never awaited" warning)
        task.get_coro().close()


# Finding 6: connections over max_connections are bounded by nothing: each answered 503
# holds its socket (a file descriptor) for BUSY_LINGER_SECONDS, however many come.

LINGERING = 300


def test_connections_over_the_limit_hold_a_bounded_number_of_sockets() -> None:
    """`_accept` answers a connection over max_connections with `_Busy`: the 503 written,
    the write side shut, the socket closed BUSY_LINGER_SECONDS (1 s) later or when the
    client closes. A client that never closes holds one of the node's file descriptors a
    second for each connection it opens, with no bound but its rate: 256 idle connections
    (held up to the idle timeout, 120 s) then ~1,000 connections a second keep ~1,000
    descriptors open, the soft limit of a process started by systemd or a shell on most
    distributions (1,024; the node never raises it). At the limit the node's own sockets
    and files fail with EMFILE: its peers' connections, the store's files, its children's
    pipes; asyncio stops accepting for a second. (Each also cost the loop ~1.1 ms here:
    finding 5.) Here max_connections 0 and 300 connections made at once, held open: the
    node's sockets still open once all were answered. The fix I would make: stop reading
    the listening socket while at max_connections (the kernel's backlog holds what comes,
    bounded), or abort at once, not linger, beyond a few dozen lingering 503s."""
    busy: list[asyncio.BaseProtocol] = []
    rpc = _front({}, RpcLimits(max_connections=0))
    accept = rpc._accept

    def counted() -> asyncio.BaseProtocol:
        protocol = accept()
        busy.append(protocol)
        return protocol

    rpc._accept = counted  # type: ignore[method-assign]

    async def lingering() -> int:
        async with _accepting(rpc) as port:
            clients = []
            try:
                for _ in range(LINGERING):
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    clients.append(writer)
                    assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 503")
                transports: list[asyncio.Transport] = [
                    protocol._transport for protocol in busy]  # type: ignore[attr-defined]
                return len([t for t in transports if not t.is_closing()])
            finally:
                for writer in clients:
                    writer.transport.abort()

    held = asyncio.run(lingering())
    assert held <= 64, f"{held} sockets held open by 503s"


# Finding 7: a request's head is read for free: paid (its bytes and one PIECE_COST) only
# once whole, never if it never is.

HEAD_READS = 200


@pytest.mark.xfail(strict=True, reason="finding 7: the reads of a request's head are paid "
                   "for only once it is whole")
def test_the_reads_of_a_head_are_paid_as_they_come(monkeypatch: pytest.MonkeyPatch) -> None:
    """A body is paid piece by piece (its bytes and PIECE_COST a read or chunk: 1-byte
    chunks kept the loop 97% busy, the attack review s11-rpc, finding 3), a WebSocket's
    reads by `_PaidReads`; a request's head is paid in `_guarded`, once aiohttp has parsed
    it whole. Sent a byte a segment, each byte is a read of the socket, a wake-up and a
    parse on the loop (~24 us here), and a head that never ends (128 header lines of up to
    8,190 bytes: ~1 MB of 1-byte reads, then a 400 and a new connection, or the idle
    timeout's 120 s) is never paid and never charged. One Python process trickling heads on
    1-64 connections: 16,400 reads a second, the loop's thread 0.40 s busy a second, 0 s
    charged, 0 bytes paid (a faster client takes the loop whole). Here 200 bytes of a head,
    each read on its own: what the request budget was charged. The fix I would make: the
    `_PaidReads` protocol in front of aiohttp's from `_accept` on (a head's reads paid
    PIECE_COST each as a WebSocket's frames are), and a deadline for a whole head."""
    reads = [0]
    data_received = web_protocol.RequestHandler.data_received

    def counted(handler: Any, data: bytes) -> None:
        reads[0] += 1
        data_received(handler, data)

    monkeypatch.setattr(web_protocol.RequestHandler, "data_received", counted)
    rpc = _front({})
    paid = [0]
    charge = rpc._body_budget.charge

    def paying(size: int) -> float:
        paid[0] += size
        return charge(size)

    rpc._body_budget.charge = paying  # type: ignore[method-assign]

    async def trickled() -> int:
        async with _accepting(rpc) as port:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX: ")
            async with asyncio.timeout(10):
                for sent in range(1, HEAD_READS + 1):
                    while reads[0] < sent:  # the last byte read on its own
                        await asyncio.sleep(0.001)
                    writer.write(b"a")
            writer.transport.abort()
            return reads[0]

    read = asyncio.run(trickled())
    assert paid[0] >= read * PIECE_COST, f"{paid[0]} bytes paid for {read} reads of a head"
