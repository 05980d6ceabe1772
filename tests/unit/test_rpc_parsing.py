"""chain.rpc: hex quantities and data, strict JSON, request validation, batches and their
limits, with methods that stand in for the node's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from chain.rpc.dispatcher import MAX_JSON_DEPTH, Dispatcher, decode_json
from chain.rpc.errors import InvalidParams
from chain.rpc.hexcodec import MAX_UINT256, parse_data, parse_quantity
from chain.rpc.limits import BatchLimits


@pytest.mark.parametrize(
    ("text", "value"),
    [("0x0", 0), ("0x1", 1), ("0xAbC", 0xABC), (hex(MAX_UINT256), MAX_UINT256)],
)
def test_quantities(text: str, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0x", 'hex string "0x" has no digits'),
        ("0x01", "leading zero digits"),
        ("0x00", "leading zero digits"),
        ("-0x1", "is not a hex quantity"),
        ("1", "is not a hex quantity"),
        ("0xg", "is not a hex quantity"),
        ("0x1\n", "is not a hex quantity"),
        (hex(MAX_UINT256 + 1), "hex number > 256 bits"),
        (7, "must be a hex string"),
        (None, "must be a hex string"),
        ([], "must be a hex string"),
    ],
)
def test_bad_quantities(text: Any, message: str) -> None:
    with pytest.raises(InvalidParams, match=message):
        parse_quantity(text)


def test_quantity_width() -> None:
    assert parse_quantity(hex(2**64 - 1), bits=64) == 2**64 - 1
    with pytest.raises(InvalidParams, match="> 64 bits"):
        parse_quantity(hex(2**64), bits=64)


@pytest.mark.parametrize("text", ["0x1", "12", "0xzz", "", 5, "0x00\n", "0x00 11", "0X00",
                                  "0x\u0660\u0660", "0x 0"])
def test_bad_data(text: Any) -> None:
    with pytest.raises(InvalidParams, match="is not 0x-prefixed hex bytes"):
        parse_data(text)


def test_data_length() -> None:
    assert parse_data("0x" + "00" * 20, length=20) == b"\x00" * 20
    with pytest.raises(InvalidParams, match="expected 20 bytes, got 19"):
        parse_data("0x" + "00" * 19, length=20)


# Strict JSON.


def nested(depth: int, opener: bytes = b"[", closer: bytes = b"]") -> bytes:
    return opener * depth + closer * depth


@pytest.mark.parametrize(
    "text",
    [
        nested(MAX_JSON_DEPTH),
        b"[" + b"{}," * 10_000 + b"[]]",  # wide is fine
        b'["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]',  # brackets in a string
        b'["\\"[", "\\\\", {"a": [1]}]',  # escaped quotes and backslashes
        b'{"a":' * 16 + b"1" + b"}" * 16,
    ],
)
def test_json_within_the_depth_limit(text: bytes) -> None:
    assert decode_json(text) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        nested(MAX_JSON_DEPTH + 1),
        nested(MAX_JSON_DEPTH + 1, b'{"a":', b"}").replace(b":}", b":1}"),
        b"[" * 1_000_000,  # never closed
        nested(500_000),  # would overflow the C stack under py-evm's recursion limit
        b'["unclosed string' + b"[" * 100,
        b"[NaN]",
        b"Infinity",
        b"-Infinity",
        b"[" + b"9" * 5_000 + b"]",  # more digits than Python converts
        b'"\xff"',
        b"",
    ],
    ids=[
        "one-too-deep", "objects-too-deep", "unclosed", "half-a-million", "unclosed-string",
        "nan", "infinity", "minus-infinity", "5000-digits", "not-utf8", "empty",
    ],
)  # fmt: skip
def test_not_json(text: bytes) -> None:
    with pytest.raises(ValueError):
        decode_json(text)


def test_deep_text_over_websocket_is_refused_too() -> None:
    with pytest.raises(ValueError):
        decode_json(nested(MAX_JSON_DEPTH + 1).decode())


# The dispatcher.


class Methods:
    """Stand-ins: an echo, failures, a big result; `calls` counts what actually ran."""

    def __init__(self) -> None:
        self.calls = 0

    async def echo(self, value: Any, extra: Any = None) -> Any:
        self.calls += 1
        return value

    async def broken(self) -> Any:
        raise RuntimeError("a bug, with details that must not reach the client")

    async def unencodable(self) -> Any:
        return object()

    async def big(self, size: int) -> str:
        self.calls += 1
        return "x" * size

    def table(self) -> dict[str, Any]:
        return {
            "test_echo": self.echo,
            "test_broken": self.broken,
            "test_unencodable": self.unencodable,
            "test_big": self.big,
        }


def handle(dispatcher: Dispatcher, payload: Any) -> Any:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    answer = asyncio.run(dispatcher.handle_payload(body))
    return None if answer is None else json.loads(answer)


def request(method: str = "test_echo", *params: Any, request_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": list(params)}


@pytest.fixture
def methods() -> Methods:
    return Methods()


@pytest.fixture
def dispatcher(methods: Methods) -> Dispatcher:
    return Dispatcher(methods.table(), BatchLimits(max_items=5, max_response_bytes=1_000))


@pytest.mark.parametrize("request_id", ["a", 0, -5, 2**70, 1.5, None])
def test_valid_ids_are_echoed(dispatcher: Dispatcher, request_id: Any) -> None:
    assert handle(dispatcher, request("test_echo", 3, request_id=request_id)) == {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": 3,
    }


@pytest.mark.parametrize(
    ("body", "code", "answer_id", "message"),
    [
        (b"{", -32700, None, "parse error"),
        (b'{"jsonrpc":"2.0","id":1e999,"method":"test_echo"}', -32600, None, "id must be"),
        (b'{"jsonrpc":"2.0","id":true,"method":"test_echo"}', -32600, None, "id must be"),
        (b'{"jsonrpc":"2.0","id":{},"method":"test_echo"}', -32600, None, "id must be"),
        (b'{"jsonrpc":"1.0","id":4,"method":"test_echo"}', -32600, 4, '"jsonrpc" must be "2.0"'),
        (b'{"id":4,"method":"test_echo"}', -32600, 4, '"jsonrpc" must be "2.0"'),
        (b'{"jsonrpc":"2.0","id":4,"method":["x"]}', -32600, 4, "method must be a string"),
        (b"[1]", -32600, None, "not a JSON object"),
        (b'{"jsonrpc":"2.0","id":4,"method":"nope"}', -32601, 4,
         "the method nope does not exist/is not available"),
        (b'{"jsonrpc":"2.0","id":4,"method":"eth_subscribe"}', -32601, 4,
         "notifications not supported"),
        (b'{"jsonrpc":"2.0","id":4,"method":"test_echo","params":{"value":1}}', -32602, 4,
         "non-array args"),
        (b'{"jsonrpc":"2.0","id":4,"method":"test_echo","params":[]}', -32602, 4,
         "missing value for required argument 0"),
        (b'{"jsonrpc":"2.0","id":4,"method":"test_echo","params":[1,2,3]}', -32602, 4,
         "too many arguments, want at most 2"),
        (b'{"jsonrpc":"2.0","id":4,"method":"test_broken"}', -32603, 4, "internal error"),
        (b'{"jsonrpc":"2.0","id":4,"method":"test_unencodable"}', -32603, 4, "internal error"),
    ],
)  # fmt: skip
def test_errors(
    dispatcher: Dispatcher, body: bytes, code: int, answer_id: Any, message: str
) -> None:
    reply = handle(dispatcher, body)
    if isinstance(reply, list):
        (reply,) = reply
    assert reply["id"] == answer_id
    assert reply["error"]["code"] == code
    assert message in reply["error"]["message"]
    assert "details" not in reply["error"]["message"]


def test_absent_or_null_params_are_no_arguments(dispatcher: Dispatcher) -> None:
    for params in ({}, {"params": None}):
        body = {"jsonrpc": "2.0", "id": 1, "method": "test_big", **params}
        assert handle(dispatcher, body)["error"]["code"] == -32602


def test_notifications_get_no_answer_even_when_they_fail(
    dispatcher: Dispatcher, methods: Methods
) -> None:
    notification = {"jsonrpc": "2.0", "method": "test_echo", "params": [1]}
    assert handle(dispatcher, notification) is None
    assert handle(dispatcher, {**notification, "method": "test_broken"}) is None
    assert handle(dispatcher, [notification, notification]) is None
    assert methods.calls == 3


def test_batches(dispatcher: Dispatcher) -> None:
    assert handle(dispatcher, [])["error"] == {"code": -32600, "message": "empty batch"}
    too_many = [request(request_id=i) for i in range(6)]
    assert handle(dispatcher, too_many)["error"] == {"code": -32600, "message": "batch too large"}
    replies = handle(dispatcher, [request("test_echo", 1), 5, request("nope", request_id="b")])
    assert [r["id"] for r in replies] == [1, None, "b"]


def test_a_batch_stops_running_calls_past_the_response_cap(
    dispatcher: Dispatcher, methods: Methods
) -> None:
    """Calls of 400 bytes each against a 1,000-byte cap: two fit, the third crosses it and is
    refused, the rest are refused without being run; notifications get nothing."""
    batch = [request("test_big", 400, request_id=i) for i in range(4)]
    batch.append({"jsonrpc": "2.0", "method": "test_big", "params": [400]})
    replies = handle(dispatcher, batch)
    assert [r["id"] for r in replies] == [0, 1, 2, 3]
    assert [len(r["result"]) for r in replies[:2]] == [400, 400]
    assert all(r["error"] == {"code": -32003, "message": "response too large"} for r in replies[2:])
    assert methods.calls == 3
