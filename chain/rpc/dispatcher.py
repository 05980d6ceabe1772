"""JSON-RPC 2.0 decoding, validation, dispatch and batches; shared by HTTP and WebSocket.

Every input gets a JSON-RPC answer, never an exception: bodies that are not JSON (NaN,
Infinity and numbers too long to convert included) get -32700; anything but a request object,
a `jsonrpc` other than "2.0", an id that is not a string, number or null, an empty or
over-limit batch get -32600; unknown methods -32601; wrong argument counts and types -32602.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import orjson

from chain.rpc.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    LIMIT_EXCEEDED,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RESPONSE_TOO_LARGE,
    InvalidParams,
    RpcError,
)
from chain.rpc.eth import Method
from chain.rpc.limits import BatchLimits
from chain.rpc.loop_turns import FIRST, LATER, LoopTurns
from chain.rpc.served import WorkerPool
from chain.rpc.subscriptions import Session, Subscriptions
from encoding.json_bounds import nesting_within, without_strings
from storage import StorageFailure

log = logging.getLogger(__name__)


# Arrays and objects nested deeper are refused before parsing: the C decoder recurses on the
# C stack, and py-evm raises the recursion limit so far that deep input would crash the process.
MAX_JSON_DEPTH = 32
# What decoding may cost is bounded before it starts. The decoder holds the interpreter for
# its whole length (~0.3 us a value: 5 MiB of small arrays took 0.8 s), so a body is refused
# when it may hold more values than this (a batch of 1,000 eth_calls holds ~27,000) ...
MAX_JSON_VALUES = 50_000
# ... or a number longer than this (converting one is quadratic in its digits: 1,200 numbers
# of 4,300 digits took 0.1 s; a 256-bit number has 78), or more digits in all than this
# (a float's cost is in its digits: 5 MiB of them took 74 ms).
MAX_NUMBER_DIGITS = 100
MAX_DIGITS = 100_000
# Bodies up to this size in UTF-8 (at most ~5 ms of decoding) are decoded on the event loop;
# larger ones on one thread of their own, one at a time, so the loop runs between any two of them.
INLINE_DECODE_BYTES = 16 * 1024
MAX_PENDING_DECODES = 64  # large bodies decoding or waiting; one more: "server busy"
# Batch answers a WebSocket sends larger than this are joined on a worker under the governor of
# client work (chain/rpc/served.py): 25 MB of block bundles took 5-10 ms of copying in one
# piece. Smaller ones cost less than the hop. (HTTP writes a batch's answer in its pieces.)
INLINE_ANSWER_BYTES = 1024 * 1024
MAX_PENDING_ANSWERS = 64  # large answers joining or waiting; one more: joined on the loop
_NOT_SEPARATORS = bytes(b for b in range(256) if b not in b"[{,:")
_AS_DIGIT_RUNS = bytes(ord("0") if chr(b) in "0123456789" else ord(" ") for b in range(256))
_LONG_NUMBER = b"0" * (MAX_NUMBER_DIGITS + 1)  # in the digit runs: a substring search


def _values_within_limit(raw: bytes) -> bool:
    """Whether `raw` holds at most MAX_JSON_VALUES values, counted from above without parsing:
    every value but a container's first follows a comma or a colon, so those and the opening
    brackets bound them (counted inside strings too, where Ethereum's hex has none)."""
    return len(raw) < MAX_JSON_VALUES or (
        len(raw.translate(None, _NOT_SEPARATORS)) < MAX_JSON_VALUES)


# Pays for `size` bytes of answer before more is made (the server's answers' budget).
Payment = Callable[[int], Awaitable[None]]
ANSWER_PAYMENT = 64 * 1024  # answer bytes owed before they are paid (PaidPieces)


# WebSocket answers are held whole while they are made (a message is sent in one frame), all
# clients' side by side as the answers' budget shares its rate: 256 connections' batches of
# 25 MB would hold 6.4 GB (the attack review s14-rpc, finding 4). The node holds at most this
# much of them; a call whose answer does not fit is answered "server busy". The first
# HELD_FLOOR_BYTES of every answer are held whatever is held (256 connections: 16 MiB more):
# the bound is the node's, so three connections' batches holding it with slow calls at their
# ends had every other client's eth_chainId answered "server busy" for as long as they ran
# (the attack review s14b-rpc, finding 3). An answer is held until it is written (the
# connection's `Outbox`), and the floor is a connection's: its answers queued count in it.
MAX_HELD_ANSWER_BYTES = 64 * 1024 * 1024
HELD_FLOOR_BYTES = 64 * 1024
BUSY_ANSWERS = RpcError(LIMIT_EXCEEDED, f"server busy: {MAX_HELD_ANSWER_BYTES >> 20} MiB of "
                        "WebSocket answers are being made; retry later, or ask for less")


class AnswerSink(Protocol):
    """Where an answer's pieces go, in order, as they are made."""

    async def put(self, piece: bytes) -> None: ...

    def holds(self, size: int) -> bool:
        """Whether a call's answer of `size` bytes may be put (else it is answered
        BUSY_ANSWERS: small enough to be put whatever holds)."""
        ...


class HeldBytes:
    """Bytes held node-wide, up to a bound (`take` refuses beyond it, but an answer's
    floor)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.held = 0

    def take(self, size: int, floor: bool = False) -> bool:
        if self.held + size > self.bound and not floor:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size


async def _free(size: int) -> None:
    """No budget (tests, and what has none)."""


TOO_LARGE = RpcError(RESPONSE_TOO_LARGE, "response too large")


class _NotJson(ValueError):
    pass


class _OverLimit(_NotJson):
    """JSON, perhaps, but more than the node decodes (said in the -32700 answer)."""


def _reject_constant(name: str) -> NoReturn:
    raise _NotJson(f"{name} is not JSON")


def decode_json(body: bytes | str) -> Any:
    """Strict JSON, at most MAX_JSON_DEPTH deep, MAX_JSON_VALUES values, numbers of at most
    MAX_NUMBER_DIGITS digits and MAX_DIGITS in all, each checked in linear time before
    parsing: raises ValueError on anything else."""
    raw = body.encode() if isinstance(body, str) else body
    if not _values_within_limit(raw):
        raise _OverLimit(f"more than {MAX_JSON_VALUES} values: send it as smaller requests")
    skeleton = without_strings(raw)
    if not nesting_within(skeleton, MAX_JSON_DEPTH):
        raise _NotJson(f"nested deeper than {MAX_JSON_DEPTH}")
    digit_runs = skeleton.translate(_AS_DIGIT_RUNS)
    if _LONG_NUMBER in digit_runs:
        raise _OverLimit(f"a number of more than {MAX_NUMBER_DIGITS} digits: send a hex quantity")
    if digit_runs.count(b"0") > MAX_DIGITS:
        raise _OverLimit(f"numbers of more than {MAX_DIGITS} digits in all: send it as smaller "
                         "requests")
    return json.loads(raw, parse_constant=_reject_constant)


def _decode_paced(body: bytes | str) -> Any:
    """decode_json on the decoding thread, which then rests as long as it worked: the
    decoder holds the interpreter throughout, so large bodies, however many, get at most
    half of it, and the loop runs between any two of them."""
    started = time.monotonic()
    try:
        return decode_json(body)
    finally:
        time.sleep(time.monotonic() - started)


def _response(request_id: Any, result: Any = None, error: RpcError | None = None) -> dict:
    response: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    if error is not None:
        response["error"] = error.to_json()
    else:
        response["result"] = result
    return response


def _encode(response: dict) -> bytes:
    """orjson (a 1,000-transaction block in 2 ms; the json module took 20 ms, holding the
    event loop), as bytes: the answer goes out as they are, never decoded to text and
    encoded back (two copies of every answer on the loop: under 8 clients reading 25 MB
    batches of bundles, the largest share of its client work). The json module for what
    orjson refuses: integers beyond 64 bits (a request id may be one: then only the id, since
    a result may be JSON made elsewhere, an orjson.Fragment, which the json module cannot
    write: chain/rpc/read_process.py)."""
    try:
        return orjson.dumps(response)
    except TypeError:
        pass
    try:
        rest = orjson.dumps({k: v for k, v in response.items() if k != "id"})
        return b'{"id":' + json.dumps(response["id"]).encode() + b"," + rest[1:]
    except TypeError:
        pass
    try:
        return json.dumps(response, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError):  # a method's bug: still an answer, not a 500
        log.exception("cannot encode the answer to id %r", response["id"])
        error = RpcError(INTERNAL_ERROR, "internal error")
        return json.dumps(_response(response["id"], error=error), separators=(",", ":")).encode()


def _valid_id(request_id: Any) -> bool:
    if isinstance(request_id, float):
        return math.isfinite(request_id)  # 1e999 parses as infinity, which JSON cannot say
    return request_id is None or (
        isinstance(request_id, str | int) and not isinstance(request_id, bool)
    )


def request_error(request: Any) -> RpcError | None:
    """Why `request` is not a valid JSON-RPC 2.0 request object (None: it is)."""
    if not isinstance(request, dict):
        return RpcError(INVALID_REQUEST, "invalid request: not a JSON object")
    if request.get("jsonrpc") != "2.0":
        return RpcError(INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"')
    if not _valid_id(request.get("id")):
        return RpcError(INVALID_REQUEST, "invalid request: id must be a string, number or null")
    if not isinstance(request.get("method"), str):
        return RpcError(INVALID_REQUEST, "invalid request: method must be a string")
    return None


def _answer_id(request: Any) -> Any:
    """The id to answer with: the request's when it is a valid id, else null."""
    request_id = request.get("id") if isinstance(request, dict) else None
    return request_id if _valid_id(request_id) else None


def _is_notification(request: Any) -> bool:
    return isinstance(request, dict) and "id" not in request and request_error(request) is None


def _arity(parameters: list[inspect.Parameter]) -> tuple[int, int]:
    """(at most, at least) how many positional arguments these parameters take."""
    required = sum(1 for p in parameters if p.default is inspect.Parameter.empty)
    return len(parameters), required


@functools.lru_cache(maxsize=1_024)
def _function_arity(function: Callable[..., Any], bound: bool) -> tuple[int, int]:
    """A method's arity by its function (`self` not counted when bound): reading a
    signature took a tenth of the node's time per call."""
    parameters = list(inspect.signature(function).parameters.values())
    return _arity(parameters[1:] if bound else parameters)


def check_arity(method: Method, params: list[Any]) -> None:
    function = getattr(method, "__func__", None)
    most, least = (_function_arity(function, True) if function is not None
                   else _function_arity(method, False))
    if len(params) > most:
        raise InvalidParams(f"too many arguments, want at most {most}")
    if len(params) < least:
        raise InvalidParams(f"missing value for required argument {len(params)}")


class Dispatcher:
    """Calls methods by name; a session (a WebSocket connection) may add its own."""

    def __init__(self, methods: dict[str, Method], limits: BatchLimits | None = None,
                 turns: LoopTurns | None = None) -> None:
        self.methods = methods
        self.limits = limits or BatchLimits()
        self.turns = turns or LoopTurns()  # every call and decoding on the loop: its turns
        self._decoder = WorkerPool(1, MAX_PENDING_DECODES, "large-request")
        self._answers = WorkerPool(1, MAX_PENDING_ANSWERS, "large-answer")
        self._held_answers = HeldBytes(MAX_HELD_ANSWER_BYTES)  # WebSocket answers, until written

    @property
    def held_answers(self) -> HeldBytes:
        """The node's bound on WebSocket answers, made or waiting to be written."""
        return self._held_answers

    async def _decode(self, body: bytes | str) -> Any:
        """Decoded on the loop up to INLINE_DECODE_BYTES of UTF-8, else on the decoding
        thread. A WebSocket text frame comes as text, up to 4 bytes a character: counted in
        characters, 16 Ki of them were 64 KiB of UTF-8 decoded on the loop (344 us, above
        the 288 us of 16 KiB of the worst ASCII, escaped quotes). Only text that may be
        inline is encoded here (at most 64 KiB, ~60 us, as decode_json did on the loop
        anyway); longer text is longer than the bound in bytes too."""
        if isinstance(body, str) and len(body) <= INLINE_DECODE_BYTES:
            body = body.encode()
        if len(body) <= INLINE_DECODE_BYTES:
            return decode_json(body)
        return await self._decoder.run(_decode_paced, body)

    async def call(self, request: Any, session: Any = None) -> dict | None:
        """One request object; None for a notification (a valid request without an id).
        Run within a request's or a batch item's step (`answer_into`), its call is that
        step's."""
        invalid = request_error(request)
        if invalid is not None:
            return _response(_answer_id(request), error=invalid)
        try:
            result = await self.turns.run(self._invoke(request, session))
        except RpcError as exc:
            outcome = _response(request.get("id"), error=exc)
        except Exception as exc:
            if not isinstance(exc, StorageFailure):  # that one the database reported; stopping
                log.exception("internal error in %s", request["method"])
            outcome = _response(request.get("id"), error=RpcError(INTERNAL_ERROR, "internal error"))
        else:
            outcome = _response(request.get("id"), result)
        return None if "id" not in request else outcome

    def close(self) -> None:
        self._decoder.close()
        self._answers.close()

    def _method(self, name: str, session: Any) -> Method:
        if session is not None and name in session.methods:
            return session.methods[name]
        if name in self.methods:
            return self.methods[name]
        if name in Subscriptions.METHODS:
            raise RpcError(METHOD_NOT_FOUND, "notifications not supported")
        raise RpcError(METHOD_NOT_FOUND, f"the method {name} does not exist/is not available")

    async def _invoke(self, request: dict, session: Any) -> Any:
        method = self._method(request["method"], session)
        params = request.get("params")
        if params is None:
            params = []
        if not isinstance(params, list):
            raise InvalidParams("non-array args")
        check_arity(method, params)
        return await method(*params)

    async def handle_payload(self, body: bytes | str, session: Any = None,
                             pay: Payment = _free) -> bytes | None:
        """A whole body, a single request or a batch, to the encoded answer, UTF-8 JSON
        (None: nothing to answer), each piece paid for (`pay`) as it is made; a large
        batch's answer is joined on a worker. A session's answers waiting to be written
        count in its answer's floor (HELD_FLOOR_BYTES)."""
        collected = _Collected(pay, self._held_answers, _queued(session))
        try:
            await self.answer_into(body, collected, session)
            await collected.settle()
            pieces = collected.pieces
            if not pieces:
                return None
            if len(pieces) > 1 and collected.size > INLINE_ANSWER_BYTES:
                with contextlib.suppress(RpcError):  # the answers' queue is full: joined here
                    return await self._answers.run(b"".join, pieces)
            return b"".join(pieces)
        finally:
            collected.release()

    async def answer_into(self, body: bytes | str, sink: AnswerSink, session: Any = None,
                          ) -> None:
        """The answer's pieces put into `sink` in order, each as soon as it is made (a batch:
        its brackets, each call's answer and the commas; nothing: no answer). The sink pays
        for them as they come (at least every ANSWER_PAYMENT bytes: PaidPieces) and may
        write them at once: a batch's work and its writing go at the rate it is paid for.
        Made whole, then paid, 8 clients' batches of block bundles came in bursts, each
        ending with 25 MB joined and copied into the socket at once: ~1 s of the node's
        CPU, and the honest transfers' p99 tripled. (What the sink raises, a client gone,
        stops the batch.) A single request is decoded and answered in one admission (its
        call admitted again, queued behind every other request's first, doubled its wait
        behind a flood: the attack review s16, finding 4); a batch's items one by one."""
        batch = await self.turns.run(self._answered_or_batch(body, sink, session))
        if batch is not None:
            await self._batch(batch, session, sink)

    async def _answered_or_batch(self, body: bytes | str, sink: AnswerSink, session: Any,
                                 ) -> list[Any] | None:
        """`body` decoded and answered, unless it is a batch to run item by item (returned).
        Its call runs within this step (`LoopTurns.run` within a step)."""
        try:
            payload = await self._decode(body)
        except _OverLimit as exc:
            return await _answered(sink, RpcError(PARSE_ERROR, f"parse error: {exc}"))
        except ValueError:
            return await _answered(sink, RpcError(PARSE_ERROR, "parse error"))
        except RpcError as exc:  # the decoding thread is busy
            return await _answered(sink, exc)
        if not isinstance(payload, list):
            response = await self.call(payload, session)
            if response is not None:
                await sink.put(_held(response, sink))
            return None
        if not payload:
            return await _answered(sink, RpcError(INVALID_REQUEST, "empty batch"))
        if len(payload) > self.limits.max_items:
            return await _answered(sink, RpcError(INVALID_REQUEST, "batch too large"))
        return payload

    async def _batch(self, payload: list[Any], session: Any, sink: AnswerSink) -> None:
        """Each item admitted (the first as a request's FIRST call, the others LATER) and its
        whole handling timed as a call's step is: checked, called, its answer encoded and
        put. Only the call was: 1,000 items' handling took the loop 4-21 x what was charged
        for it, and an invalid item, answered without an admission, ran in the same turn as
        every other batch's (the attack review s16, finding 1). Each response is encoded
        once and counted; once the results pass the size limit, that call and every later
        one get "response too large" without being run (geth), all of those put together
        (a piece each cost a payment and a turn of the loop)."""
        answer = _BatchAnswer()
        for at, item in enumerate(payload):
            if answer.size > self.limits.max_response_bytes:
                await self.turns.run(_refused(payload[at:], answer.opening, sink), LATER)
                return
            await self.turns.run(self._item(item, session, sink, answer),
                                 LATER if at else FIRST)
        if answer.opening == b",":
            await sink.put(b"]")

    async def _item(self, item: Any, session: Any, sink: AnswerSink,
                    answer: _BatchAnswer) -> None:
        response = await self.call(item, session)
        if response is None:
            return
        text = _encode(response)
        answer.size += len(text)
        if answer.size > self.limits.max_response_bytes:
            text = _encode(_response(response["id"], error=TOO_LARGE))
        else:
            text = _held(response, sink, text)
        await sink.put(answer.opening + text)  # (a copy of one call's answer, never the whole)
        answer.opening = b","


@dataclass
class _BatchAnswer:
    """A batch's answer so far: its bytes, and what opens the next call's answer."""

    size: int = 0
    opening: bytes = b"["


async def _answered(sink: AnswerSink, error: RpcError) -> None:
    """The request answered with `error` alone (no id: it could not be read)."""
    await sink.put(_encode(_response(None, error=error)))


def _queued(session: Any) -> Callable[[], int]:
    """How many bytes of answers `session` has waiting to be written (none: not a
    WebSocket's)."""
    if isinstance(session, Session):
        outbox = session.outbox
        return lambda: outbox.answer_bytes
    return lambda: 0


def _held(response: dict, sink: AnswerSink, text: bytes | None = None) -> bytes:
    """A call's encoded answer if the sink holds it, else its BUSY_ANSWERS error."""
    text = _encode(response) if text is None else text
    return text if sink.holds(len(text)) else _encode(_response(response["id"],
                                                                 error=BUSY_ANSWERS))


async def _refused(items: list[Any], opening: bytes, sink: AnswerSink) -> None:
    """The rest of a batch past its size limit, answered "response too large" (none to a
    notification), and the batch's closing bracket if it was opened."""
    answers = [_encode(_response(_answer_id(item), error=TOO_LARGE))
               for item in items if not _is_notification(item)]
    if answers:
        await sink.put(opening + b",".join(answers) + b"]")
    elif opening == b",":
        await sink.put(b"]")


class PaidPieces:
    """A sink's payments: each piece is owed, and paid once ANSWER_PAYMENT bytes are owed
    (and what is left, by `settle`, before what was owed is written or the answer ends),
    not piece by piece: in debt each payment is a sleep, a turn of the loop (1,000 small
    answers woke it 1,000 times: the attack review s13-rpc, finding 3)."""

    def __init__(self, pay: Payment) -> None:
        self._pay = pay
        self._owed = 0

    async def owe(self, size: int) -> None:
        self._owed += size
        if self._owed >= ANSWER_PAYMENT:
            await self.settle()

    async def settle(self) -> None:
        if self._owed:
            owed, self._owed = self._owed, 0
            await self._pay(owed)


class _Collected(PaidPieces):
    """An answer's pieces, paid for as they come, held within the node's bound for them
    (the floor shared with the connection's answers `queued`: per answer, a client that
    reads slowly had up to its 4 MiB of outbox in small answers outside the bound)."""

    def __init__(self, pay: Payment, held: HeldBytes, queued: Callable[[], int]) -> None:
        super().__init__(pay)
        self.pieces: list[bytes] = []
        self.size = 0
        self._held = held
        self._queued = queued
        self._taken = 0

    def holds(self, size: int) -> bool:
        floor = self._queued() + self._taken + size <= HELD_FLOOR_BYTES
        if not self._held.take(size, floor=floor):
            return False
        self._taken += size
        return True

    def release(self) -> None:
        self._held.give(self._taken)
        self._taken = 0

    async def put(self, piece: bytes) -> None:
        await self.owe(len(piece))
        self.pieces.append(piece)
        self.size += len(piece)
