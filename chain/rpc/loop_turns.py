"""Client calls on the event loop take turns, and a bounded share of it.

Lookups that cost less than the hop to a thread (a balance, a nonce, a receipt, decoding a
small body) run on the event loop, which also carries consensus (chain/rpc/served.py). A
batch yields between its calls, but k batches in flight each run a call in every turn of the
loop: 128 batches of eth_getBalance held every consensus message ~90 ms, and the honest
transfers' p90 went from 354 ms to 2 s (the attack review s14-rpc, finding 7); the request
budget counts their bytes, not their work. So every call on the loop is admitted by
`LoopTurns`, one per turn of the loop, whatever the number of clients (first come, first
served): a consensus message waits behind one call at most. So is each later step of a call,
and a WebSocket connection's writer (chain/rpc/server.py `_ws_writer`). A request's first call
is not queued behind other requests' later ones: while both wait they go in turn (`_Gate`),
so 64 clients' batches of balance reads, each with its next call always waiting, put an
honest transaction or receipt lookup two turns back, not 64. And its steps on the
loop are timed: while the chain makes blocks, client calls take at most LOOP_SHARE of the
loop's time (a token bucket in seconds; a call admitted in debt waits until it is paid off),
so what is left of the interpreter for the loop and the block execution threads does not
depend on what clients send. So is the handling of an HTTP request around its calls,
which no step of a call can time (a refusal, with no call, takes a turn as a call does).
On an idle chain they take what they like.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

from chain.rpc.child_process import chain_busy

LOOP_SHARE = 0.5  # of the event loop's time, at most, for client calls while blocks come
BURST_SECONDS = 0.01  # of client calls' loop time that may run at once before the share holds
# What an admission itself costs the loop, outside the step it admits (the gate, the turn, the
# task woken): 15-19 us here, where a batch item's step of eth_chainId was timed ~10 us, so
# batches of 1,000 took the loop ~3 x what was charged (the attack review s16, finding 1).
# Charged a little above, as HTTP_HANDLING_SECONDS prices a request.
ADMISSION_SECONDS = 30e-6

T = TypeVar("T")

FIRST, LATER = 0, 1  # a request's first call; a batch's later calls, a refusal, a handshake,
# a connection accepted (each step of a call is admitted in its call's class)


class _Gate:
    """Who is admitted next, one at a time: first come, first served within a class, and
    while both classes wait, FIRST and LATER in turn (so a flood of single requests never
    starves a batch's later calls either)."""

    def __init__(self) -> None:
        self._waiting: tuple[deque[asyncio.Future[None]], ...] = (deque(), deque())
        self._held = False
        self._last = LATER

    async def enter(self, kind: int) -> None:
        if not self._held:
            self._held = True
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[kind].append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():  # (asyncio.Lock's way: none pile up)
                with contextlib.suppress(ValueError):  # (`_next` passed over it)
                    self._waiting[kind].remove(waiter)
            else:  # (handed the gate as it was cancelled: passed on)
                self.leave()
            raise

    def leave(self) -> None:
        waiter = self._next()
        if waiter is None:
            self._held = False
        else:
            waiter.set_result(None)

    def _next(self) -> asyncio.Future[None] | None:
        for queue in self._waiting:  # (cancelled, their tasks not yet run)
            while queue and queue[0].cancelled():
                queue.popleft()
        first, later = self._waiting
        if first and (not later or self._last == LATER):
            self._last = FIRST
            return first.popleft()
        if later:
            self._last = LATER
            return later.popleft()
        return None


class LoopTurns:
    """Admits client calls to the event loop, one per turn of it, within LOOP_SHARE."""

    def __init__(self, share: float = LOOP_SHARE, burst: float = BURST_SECONDS,
                 busy: Callable[[], bool] = chain_busy) -> None:
        self._share = share
        self._burst = burst
        self._busy = busy
        self._tokens = burst  # seconds of the loop client calls may still take now
        self._refilled = time.monotonic()
        self._gate = _Gate()
        self._loop: asyncio.AbstractEventLoop | None = None  # the gate's
        self._admitted = False  # a call was admitted in this turn of the loop
        self._stepping = False  # a call's step runs now
        self.rests = 0  # how often a call waited for the share (while blocks came)

    async def run(self, call: Coroutine[Any, Any, T], kind: int = FIRST) -> T:
        """`call`'s result, once admitted (as a request's FIRST call or a LATER one), its
        steps on the loop timed and charged. Run within a call's step, its steps are that
        call's (admitted and timed with them: its own admission would wait for the turn that
        step holds, for ever)."""
        if self._stepping:
            return await call
        try:
            await self._admit(kind)
        except BaseException:
            call.close()  # (cancelled while waiting: never started)
            raise
        return await _Timed(call, self, kind)

    async def _admit(self, kind: int) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # (a test's new loop: the gate's futures are bound to one)
            self._gate, self._loop, self._admitted = _Gate(), loop, False
        await self._gate.enter(kind)
        try:
            while self._admitted:
                await asyncio.sleep(0)
            if self._busy():
                self._refill()
                if self._tokens < 0:
                    self.rests += 1
                    await asyncio.sleep(-self._tokens / self._share)
                    self._refill()
            else:
                self._tokens, self._refilled = self._burst, time.monotonic()
            self._admitted = True
            loop.call_soon(self._next_turn)
            self.spent(ADMISSION_SECONDS)
        finally:
            self._gate.leave()

    async def admitted(self) -> None:
        """A turn of the loop and the share's debt waited out, as a call's admission: for
        work of a client's outside any call, charged (`spent`) but held back by no call's
        admission (a request refused before any call, a WebSocket handshake, a connection
        accepted). Waiting out the debt alone let 256 connections' refusals run in one turn
        of the loop. Admitted LATER: as FIRST, 64 connections pipelining GETs put an
        honest request ~130 turns back (the attack review s16, finding 4); a request with
        calls waits at their admissions only (a turn here as well doubled an honest
        request's wait behind a flood)."""
        await self._admit(LATER)

    def _next_turn(self) -> None:
        self._admitted = False

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._share)
        self._refilled = now

    def spent(self, seconds: float) -> None:
        self._tokens -= seconds


class _Timed:
    """Awaits a coroutine, timing each of its steps on the loop (not its waits: a read on a
    worker thread, an execution in a child process) and charging them to `turns`, each step
    after the first admitted too: a call that yields and goes on (txpool's listing, a slice
    at a time) ran its next step in the same turn as every other such call's, k clients'
    txpool_content holding the loop k slices at once (the attack review s14b-rpc, finding
    2). Each step is admitted in the call's class (an honest single request's later steps,
    after a read on a thread, are not queued behind batches' calls). What the admission
    raises (a cancellation) goes to the call where it waits."""

    __slots__ = ("_call", "_kind", "_turns")

    def __init__(self, call: Coroutine[Any, Any, T], turns: LoopTurns, kind: int) -> None:
        self._call = call
        self._turns = turns
        self._kind = kind

    def __await__(self) -> Generator[Any, Any, Any]:
        call, turns, kind, value, error = self._call, self._turns, self._kind, None, None
        while True:
            started = time.perf_counter()
            turns._stepping = True
            try:
                waiting_on = call.send(value) if error is None else call.throw(error)
            except StopIteration as done:
                return done.value
            finally:
                turns._stepping = False
                turns.spent(time.perf_counter() - started)
            value, error = None, None
            try:
                value = yield waiting_on
                yield from turns._admit(kind).__await__()
            except GeneratorExit:
                call.close()
                raise
            except BaseException as exc:  # (cancelled: passed on to the call)
                error = exc
