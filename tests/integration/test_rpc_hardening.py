"""Hostile JSON-RPC input against a real dev node: each gets the right HTTP status or JSON-RPC
error, and the node keeps serving (every test ends by asking it for eth_blockNumber).

HTTP-level cases go over raw asyncio sockets; the node's config sets short read and idle
timeouts and a small connection bound (the [http] section). What test_rpc_api.py and
test_transactions.py already cover (GET/PUT, 415, a 6 MiB body, a Host or Origin refused,
`{not json`, `[]`, 1,001 calls, wrong chain id, "already known", "exceeds block gas limit") is
not repeated here.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

import aiohttp
import pytest
import requests
import rlp
from aiohttp import WSCloseCode, WSMsgType
from eth_account import Account
from web3 import Web3

from chain.rpc.limits import BatchLimits, RpcLimits
from chain.rpc.subscriptions import WebSocketLimits
from chain.txpool import PoolLimits
from testkit.nodes import RunningNode, run_dev_node, wait_for

LIMITS = RpcLimits(read_timeout=1.0, idle_timeout=3.0, max_connections=32)
READ_TIMEOUT, IDLE_TIMEOUT = LIMITS.read_timeout, LIMITS.idle_timeout
MAX_BODY = LIMITS.max_body_bytes
EXCHANGE_DEADLINE = 20.0
GWEI = 10**9
ADDRESS = "0x" + "11" * 20
HASH = "0x" + "ab" * 32
CHAIN_ID_CALL = b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId"}'
INTERNAL_ERROR = -32603
WS = WebSocketLimits()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    yield from run_dev_node(
        tmp_path_factory.mktemp("rpc-hardening"),
        f"read_timeout = {READ_TIMEOUT}\nidle_timeout = {IDLE_TIMEOUT}\n"
        f"max_connections = {LIMITS.max_connections}",
    )


@pytest.fixture(scope="module")
def w3(node: RunningNode) -> Web3:
    # One connection per call: the short idle timeout never races a reused connection.
    headers = {"Content-Type": "application/json", "Connection": "close"}
    provider = Web3.HTTPProvider(node.rpc_url, request_kwargs={"timeout": 30, "headers": headers})
    return Web3(provider)


def port_of(node: RunningNode) -> int:
    return int(node.rpc_url.rsplit(":", 1)[1])


def assert_serving(w3: Web3) -> None:
    assert w3.eth.block_number >= 0


def post(node: RunningNode, payload: Any) -> Any:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    response = requests.post(
        node.rpc_url, data=body, headers={"Content-Type": "application/json"}, timeout=60
    )
    assert response.status_code == 200, response.text
    return response.json()


def call(node: RunningNode, method: str, *params: Any) -> dict[str, Any]:
    return post(node, {"jsonrpc": "2.0", "id": 1, "method": method, "params": list(params)})


# Raw HTTP over asyncio sockets.


def http_head(
    *,
    method: str = "POST",
    target: str = "/",
    host: str = "localhost",
    headers: Iterable[str] = (),
    length: int | None = len(CHAIN_ID_CALL),
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join([*lines, *headers]) + "\r\n\r\n").encode()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """Status and body of one response; None when the server closed without answering."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    status = int(head.split(b" ", 2)[1])
    length = re.search(rb"(?i)content-length: *(\d+)", head)
    body = await reader.readexactly(int(length.group(1))) if length else await reader.read()
    return status, body


async def _exchange(port: int, head: bytes, parts: Iterable[bytes]) -> tuple[int, bytes] | None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(EXCHANGE_DEADLINE):
            try:
                writer.write(head)
                for part in parts:
                    writer.write(part)
                    await writer.drain()
            except ConnectionError:
                pass  # the server answered before taking all of it: read that answer
            return await _read_response(reader)
    finally:
        writer.close()


def exchange(port: int, head: bytes, parts: Iterable[bytes] = ()) -> tuple[int, bytes] | None:
    return asyncio.run(_exchange(port, head, parts))


# HTTP level.


def test_body_over_the_limit_is_refused_without_reading_it(node: RunningNode, w3: Web3) -> None:
    port = port_of(node)
    # The declared length alone is enough: nothing of the body is ever sent.
    assert exchange(port, http_head(length=MAX_BODY + 1)) == (413, b"content length too large\n")
    # Chunked: the server stops reading at the limit and answers while the client still sends.
    chunk = b"%x\r\n%s\r\n" % (64 * 1024, b" " * 64 * 1024)
    chunks = [chunk] * (MAX_BODY // (64 * 1024) + 2)
    assert exchange(port, CHUNKED, chunks) == (413, b"content length too large\n")
    # A compressed body counts at its decompressed size (four times the limit in 100 kB).
    bomb = gzip.compress(b"[" + b" " * (4 * MAX_BODY) + b"]", compresslevel=1)
    head = http_head(length=len(bomb), headers=["Content-Encoding: gzip"])
    assert exchange(port, head, [bomb]) == (413, b"content length too large\n")
    assert_serving(w3)


CHUNKED = http_head(length=None, headers=["Transfer-Encoding: chunked"])


@pytest.mark.parametrize(
    ("head", "body", "answers"),
    [
        (http_head(headers=[f"X-{i}: x" for i in range(200)]), CHAIN_ID_CALL, {400}),
        (http_head(headers=["X: " + "a" * 20_000]), CHAIN_ID_CALL, {400}),
        (http_head(target="/" + "a" * 20_000), CHAIN_ID_CALL, {400}),
        (http_head(length=9, headers=["Content-Encoding: gzip"]), b"not gzip!", {400}),
        # aiohttp refuses a bad chunk size at once when it comes with the headers; when it comes
        # later the body read waits for data that never comes, until the read timeout.
        (CHUNKED, b"zz\r\n{}\r\n", {400, 408}),
    ],
    ids=["many-headers", "huge-header", "huge-request-line", "bad-gzip", "bad-chunk"],
)
def test_malformed_requests_are_refused(
    node: RunningNode, w3: Web3, head: bytes, body: bytes, answers: set[int]
) -> None:
    answer = exchange(port_of(node), head, [body])
    assert answer is not None and answer[0] in answers, answer
    assert_serving(w3)


def test_slow_upload_gets_408(node: RunningNode, w3: Web3) -> None:
    """The read timeout bounds the whole body, however steadily it trickles in."""
    started = time.monotonic()
    answer = asyncio.run(_trickle(port_of(node), http_head(length=10_000)))
    assert answer == (408, b"request body read timeout\n")
    assert time.monotonic() - started >= READ_TIMEOUT
    asyncio.run(_leave_mid_body(port_of(node)))
    assert_serving(w3)


async def _leave_mid_body(port: int) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(http_head(length=10_000) + b"{")
    writer.close()
    await writer.wait_closed()


async def _trickle(port: int, head: bytes) -> tuple[int, bytes] | None:
    """Sends `head`, then one body byte every 0.1 s until the server answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(EXCHANGE_DEADLINE):
            writer.write(head)
            response = asyncio.ensure_future(_read_response(reader))
            while not response.done():
                writer.write(b" ")
                await asyncio.wait({response}, timeout=0.1)
            return response.result()
    finally:
        writer.close()


def test_a_request_that_never_completes_its_headers_is_closed(node: RunningNode, w3: Web3) -> None:
    partial = b"POST / HTTP/1.1\r\nHost: localhost\r\n"  # no blank line: headers never end
    started = time.monotonic()
    assert exchange(port_of(node), partial) is None  # closed, unanswered
    assert time.monotonic() - started >= IDLE_TIMEOUT
    assert_serving(w3)


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (http_head(method="DELETE"), 405),
        (http_head(method="PATCH"), 405),
        (http_head(host="evil.example:8545"), 403),
        (http_head(host="localhost.evil.example"), 403),
        (http_head(headers=["Origin: null"]), 403),
        (http_head(host="[::1]:8545"), 200),
    ],
    ids=["delete", "patch", "host-with-port", "host-suffix", "origin-null", "ipv6-host"],
)
def test_methods_hosts_and_origins(node: RunningNode, w3: Web3, head: bytes, status: int) -> None:
    answer = exchange(port_of(node), head, [CHAIN_ID_CALL])
    assert answer is not None and answer[0] == status, answer
    assert_serving(w3)


def test_too_many_connections_get_503_and_the_node_recovers(node: RunningNode, w3: Web3) -> None:
    """WebSockets hold every connection slot (no idle timeout applies to them); one more
    connection is answered 503 while they are open, and served once they close. Connections
    of earlier tests may hold a slot a little longer (idle or lingering), so rounds are tried
    until one finds every slot free."""

    def saturated_round() -> tuple[Any, Any] | None:
        opened, refused, held = asyncio.run(_saturate(node))
        return (refused, held) if opened == LIMITS.max_connections else None

    refused, held = wait_for(saturated_round, 30, "a round that takes every connection slot")
    assert refused == (503, b"too many connections\n")
    assert held["result"].startswith("0x")  # the connections already open keep working
    wait_for(
        lambda: (exchange(port_of(node), http_head(), [CHAIN_ID_CALL]) or (0,))[0] == 200,
        30,
        "a free connection slot",
    )
    assert_serving(w3)


async def _saturate(node: RunningNode) -> tuple[int, Any, Any]:
    """Opens WebSockets up to the connection limit (stopping at the first refused); when all
    opened, one more connection's answer and a call on an open one."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        sockets: list[aiohttp.ClientWebSocketResponse] = []
        try:
            while len(sockets) < LIMITS.max_connections:
                sockets.append(await session.ws_connect(node.ws_url))
        except aiohttp.WSServerHandshakeError as exc:
            assert exc.status == 503, exc
        try:
            if len(sockets) < LIMITS.max_connections:
                return len(sockets), None, None
            refused = await _exchange(port_of(node), http_head(), [CHAIN_ID_CALL])
            return len(sockets), refused, await _ws_call(sockets[0], 1, "eth_blockNumber")
        finally:
            await asyncio.gather(*(s.close() for s in sockets))


# JSON-RPC envelope.


@pytest.mark.parametrize(
    ("body", "code", "answer_id"),
    [
        (b'{"jsonrpc":"2.0","id":NaN,"method":"eth_chainId"}', -32700, None),
        (b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[Infinity]}', -32700, None),
        (b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":[' + b"9" * 5000 + b"]}",
         -32700, None),
        (b"[" * 100_000 + b"]" * 100_000, -32700, None),
        (b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}', -32700, None),
        (b"5", -32600, None),
        (b'"eth_chainId"', -32600, None),
        (b"null", -32600, None),
        (b'{"id":1,"method":"eth_chainId"}', -32600, 1),
        (b'{"jsonrpc":2.0,"id":1,"method":"eth_chainId"}', -32600, 1),
        (b'{"jsonrpc":"2.0","id":{"a":1},"method":"eth_chainId"}', -32600, None),
        (b'{"jsonrpc":"2.0","id":[1],"method":"eth_chainId"}', -32600, None),
        (b'{"jsonrpc":"2.0","id":true,"method":"eth_chainId"}', -32600, None),
        (b'{"jsonrpc":"2.0","id":"x"}', -32600, "x"),
        (b'{"jsonrpc":"2.0","id":"x","method":7}', -32600, "x"),
        (b'{"jsonrpc":"2.0","id":2.5,"method":"eth_nope"}', -32601, 2.5),
        (b'{"jsonrpc":"2.0","id":3,"method":"eth_chainId","params":{"a":1}}', -32602, 3),
        (b'{"jsonrpc":"2.0","id":3,"method":"eth_chainId","params":[1]}', -32602, 3),
    ],
    ids=[
        "nan", "infinity", "5000-digit-number", "nested-100k-deep", "not-utf8", "number",
        "string", "null", "no-jsonrpc", "jsonrpc-number", "id-object", "id-array", "id-bool",
        "no-method", "method-number", "unknown-method-float-id", "params-object",
        "too-many-params",
    ],
)  # fmt: skip
def test_bad_envelopes(node: RunningNode, w3: Web3, body: bytes, code: int, answer_id: Any) -> None:
    reply = post(node, body)
    assert reply["error"]["code"] == code, reply
    assert reply["id"] == answer_id
    assert "Traceback" not in reply["error"]["message"]
    assert_serving(w3)


def test_a_batch_of_expensive_calls_stops_at_the_response_size_cap(
    node: RunningNode, w3: Web3
) -> None:
    """Each call returns 1 MB (2 MB of hex); past 25 MB of results the rest of the batch gets
    "response too large" without being run."""
    size = 1_000_000
    call = {"to": _deploy_returner(node, w3), "input": "0x" + size.to_bytes(32, "big").hex()}
    batch = [{"jsonrpc": "2.0", "id": i, "method": "eth_call", "params": [call]} for i in range(20)]
    replies = post(node, batch)
    assert [r["id"] for r in replies] == list(range(20))
    answered = [r for r in replies if "result" in r]
    assert replies[: len(answered)] == answered  # results first, then only errors
    assert all(r["result"] == "0x" + "00" * size for r in answered)
    assert len(answered) * 2 * size <= BatchLimits().max_response_bytes
    assert (len(answered) + 1) * 2 * size > BatchLimits().max_response_bytes
    assert {(r["error"]["code"], r["error"]["message"]) for r in replies[len(answered) :]} == {
        (-32003, "response too large")
    }
    assert_serving(w3)


def _deploy_returner(node: RunningNode, w3: Web3) -> str:
    """A contract that returns as many zero bytes as its first calldata word says."""
    runtime = "6000356000f3"  # PUSH1 0 CALLDATALOAD PUSH1 0 RETURN
    init = "65" + runtime + "600052" + "6006601af3"  # store it, return its 6 bytes
    account = Account.from_key(node.description["accounts"][5]["private_key"])
    tx = {
        "chainId": w3.eth.chain_id,
        "nonce": w3.eth.get_transaction_count(account.address),
        "gas": 100_000,
        "gasPrice": 5 * GWEI,
        "data": "0x" + init,
        "value": 0,
    }
    tx_hash = w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30)
    assert receipt.status == 1
    return receipt.contractAddress


# Parameters.

VALID_PARAMS: dict[str, list[Any]] = {
    "web3_sha3": ["0x68656c6c6f"],
    "eth_getBalance": [ADDRESS, "latest"],
    "eth_getTransactionCount": [ADDRESS, "latest"],
    "eth_getCode": [ADDRESS, "latest"],
    "eth_getStorageAt": [ADDRESS, "0x0", "latest"],
    "eth_call": [{"to": ADDRESS, "gas": "0x5208", "value": "0x0", "input": "0x"}, "latest"],
    "eth_estimateGas": [{"from": ADDRESS, "to": ADDRESS, "gasPrice": "0x0"}, "latest"],
    "eth_feeHistory": ["0x1", "latest", [50]],
    "eth_sendRawTransaction": ["0xc0"],
    "eth_getTransactionByHash": [HASH],
    "eth_getTransactionByBlockNumberAndIndex": ["latest", "0x0"],
    "eth_getTransactionByBlockHashAndIndex": [HASH, "0x0"],
    "eth_getTransactionReceipt": [HASH],
    "eth_getBlockReceipts": ["latest"],
    "eth_getBlockByNumber": ["latest", False],
    "eth_getBlockByHash": [HASH, False],
    "eth_getBlockTransactionCountByNumber": ["latest"],
    "eth_getBlockTransactionCountByHash": [HASH],
    "eth_getLogs": [{"fromBlock": "0x0", "toBlock": "latest", "address": ADDRESS, "topics": []}],
    "eth_newFilter": [{"blockHash": HASH}],
    "eth_getFilterChanges": ["0x1"],
    "eth_getFilterLogs": ["0x1"],
    "eth_uninstallFilter": ["0x1"],
}
BAD_VALUES: list[Any] = [
    None, True, 7, -1, 1.5, "", "0x", "0x01", "-0x1", "0x1" + "0" * 64, "zz", "0X1", [], [1],
    {}, {"blockHash": 7}, {"blockNumber": {}}, {"blockHash": HASH, "blockNumber": "0x0"},
    "0x" + "00" * 21,
]  # fmt: skip


def _mutations() -> Iterator[tuple[str, list[Any]]]:
    """Each method's valid parameters with one position, or one field of an object parameter,
    replaced by each bad value."""
    for method, params in VALID_PARAMS.items():
        for index, value in enumerate(params):
            for bad in BAD_VALUES:
                yield method, [*params[:index], bad, *params[index + 1 :]]
                if isinstance(value, dict):
                    for key in value:
                        yield method, [*params[:index], {**value, key: bad}, *params[index + 1 :]]


def test_wrong_parameter_types_are_refused_not_crashed_on(node: RunningNode, w3: Web3) -> None:
    cases = list(_mutations())
    calls = [
        {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
        for i, (method, params) in enumerate(cases)
    ]
    replies: list[dict[str, Any]] = []
    for start in range(0, len(calls), BatchLimits().max_items):
        replies += post(node, calls[start : start + BatchLimits().max_items])
    crashed = [cases[r["id"]] for r in replies if r.get("error", {}).get("code") == INTERNAL_ERROR]
    assert not crashed, crashed[:10]
    assert len(replies) == len(cases)
    assert {r["error"]["code"] for r in replies if "error" in r} <= {-32602, -32000, -32005}
    assert_serving(w3)


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("eth_getBalance", [ADDRESS, "-0x1"], "is not a hex quantity"),
        ("eth_getBlockByNumber", ["0x10000000000000000", False], "hex number > 64 bits"),
        ("eth_call", [{"to": ADDRESS, "value": "0x1" + "0" * 64}], "hex number > 256 bits"),
        ("eth_feeHistory", ["0x01", "latest"], "hex number with leading zero digits"),
        ("eth_getTransactionCount", [ADDRESS, "0x"], 'hex string "0x" has no digits'),
        ("eth_getBalance", [5, "latest"], "is not 0x-prefixed hex bytes"),
        ("eth_getBalance", [ADDRESS, {}], "exactly one of blockHash and blockNumber"),
        ("eth_getBlockByNumber", ["latest", "yes"], "want a boolean"),
        ("eth_getBalance", [], "missing value for required argument 0"),
        ("eth_uninstallFilter", [[1]], "filter id must be a string"),
    ],
)
def test_bad_parameters_get_32602_with_a_clear_message(
    node: RunningNode, w3: Web3, method: str, params: list[Any], message: str
) -> None:
    error = call(node, method, *params)["error"]
    assert error["code"] == -32602 and message in error["message"], error
    assert_serving(w3)


@pytest.mark.parametrize(
    ("method", "params", "message"),
    [
        ("eth_getBalance", [ADDRESS, "{future}"], "header not found"),
        ("eth_getTransactionCount", [ADDRESS, "{future}"], "header not found"),
        ("eth_getCode", [ADDRESS, "{future}"], "header not found"),
        ("eth_getStorageAt", [ADDRESS, "0x0", "{future}"], "header not found"),
        ("eth_call", [{"to": ADDRESS}, "{future}"], "header not found"),
        ("eth_estimateGas", [{"to": ADDRESS}, "{future}"], "header not found"),
        ("eth_getBalance", [ADDRESS, {"blockNumber": "{future}"}], "header not found"),
        ("eth_getBalance", [ADDRESS, {"blockHash": HASH}], "header for hash not found"),
        ("eth_feeHistory", ["0x1", "{future}"], "request beyond head block: requested"),
        ("eth_getBlockByNumber", ["{future}", False], None),
        ("eth_getBlockTransactionCountByNumber", ["{future}"], None),
        ("eth_getTransactionByBlockNumberAndIndex", ["{future}", "0x0"], None),
        ("eth_getBlockReceipts", ["{future}"], None),
    ],
)
def test_blocks_beyond_the_head_as_geth(
    node: RunningNode, w3: Web3, method: str, params: list[Any], message: str | None
) -> None:
    """geth's answers: state at a future block is an error, a future block is null."""
    future = hex(w3.eth.block_number + 1_000)
    reply = call(node, method, *json.loads(json.dumps(params).replace("{future}", future)))
    if message is None:
        assert reply["result"] is None, reply
    else:
        assert reply["error"]["code"] == -32000 and message in reply["error"]["message"], reply
    assert_serving(w3)


# Raw transactions.


def _unsigned_legacy() -> bytes:
    return rlp.encode([0, GWEI, 21_000, bytes.fromhex(ADDRESS[2:]), 0, b"", 0, 0, 0])


def _zero_signature_dynamic_fee(chain_id: int) -> bytes:
    fields = [chain_id, 0, GWEI, 10 * GWEI, 21_000, bytes.fromhex(ADDRESS[2:]), 0, b"", []]
    return b"\x02" + rlp.encode([*fields, 0, 0, 0])


class Signer:
    """Signs transfers for one funded dev account; the nonce defaults to its account nonce."""

    def __init__(self, w3: Web3, private_key: str) -> None:
        self.w3 = w3
        self.account = Account.from_key(private_key)

    @property
    def nonce(self) -> int:
        return self.w3.eth.get_transaction_count(self.account.address)

    def sign(self, **fields: Any) -> bytes:
        tx = {
            "chainId": self.w3.eth.chain_id,
            "nonce": self.nonce,
            "gas": 21_000,
            "maxFeePerGas": 10 * GWEI,
            "maxPriorityFeePerGas": GWEI,
            "to": ADDRESS,
            "value": 1,
            **fields,
        }
        return self.account.sign_transaction(tx).raw_transaction


@pytest.fixture(scope="module")
def signer(node: RunningNode, w3: Web3) -> Signer:
    return Signer(w3, node.description["accounts"][6]["private_key"])


def test_raw_transactions_refused_with_geth_messages(
    node: RunningNode, w3: Web3, signer: Signer
) -> None:
    limits = PoolLimits()
    cases = {
        b"": "invalid raw transaction: ",
        b"\xc0": "invalid raw transaction: ",
        b"\xf8\x05\x01": "invalid raw transaction: ",
        b"\x02": "invalid raw transaction: ",
        rlp.encode([0, GWEI, 21_000, b"\x11" * 20, 0, b""]): "invalid raw transaction: ",
        signer.sign() + b"\x00": "invalid raw transaction: ",
        b"\x07\xc0": "transaction type not supported",
        _unsigned_legacy(): "only replay-protected (EIP-155) transactions allowed over RPC",
        _zero_signature_dynamic_fee(w3.eth.chain_id): "invalid sender",
        signer.sign(data=b"\x00" * (limits.max_transaction_size + 1), gas=3_000_000): (
            "oversized data"
        ),
    }
    for raw, message in cases.items():
        error = call(node, "eth_sendRawTransaction", "0x" + raw.hex())["error"]
        assert error["code"] == -32000 and error["message"].startswith(message), (raw[:20], error)
    assert_serving(w3)


def test_a_far_future_nonce_is_held(w3: Web3, signer: Signer) -> None:
    """The pool bounds how many transactions wait behind a gap, not the gap's size."""
    held = signer.sign(nonce=signer.nonce + 10_000)
    pending = w3.eth.get_transaction(w3.eth.send_raw_transaction(held))
    assert pending["blockNumber"] is None
    address = signer.account.address
    assert w3.eth.get_transaction_count(address, "pending") == signer.nonce  # a gap: not next
    assert_serving(w3)


# WebSocket.


def test_websocket_hostile_messages(node: RunningNode, w3: Web3) -> None:
    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(node.ws_url) as ws:
                await ws.send_str("{not json")
                seen["parse"] = await ws.receive_json(timeout=EXCHANGE_DEADLINE)
                seen["subscriptions"] = await _ws_subscribe(ws, WS.max_subscriptions + 1)
                await _ws_call(ws, 0, "eth_unsubscribe", seen["subscriptions"][0]["result"])
                seen["after_unsubscribe"] = await _ws_call(ws, 1, "eth_subscribe", "newHeads")
            async with session.ws_connect(node.ws_url) as ws:
                with contextlib.suppress(ConnectionError):  # closed while still sending
                    await ws.send_str(CHAIN_ID_CALL.decode() + " " * MAX_BODY)
                seen["oversized"] = await ws.receive(timeout=EXCHANGE_DEADLINE)
        return seen

    seen = asyncio.run(scenario())
    assert seen["parse"]["error"] == {"code": -32700, "message": "parse error"}
    *accepted, refused = seen["subscriptions"]
    assert all(r["result"].startswith("0x") for r in accepted)
    assert refused["error"]["code"] == -32005, refused
    assert "result" in seen["after_unsubscribe"]
    # Closed with 1009, or reset before the client could read that close frame.
    oversized = seen["oversized"]
    assert oversized.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR), oversized
    assert oversized.type != WSMsgType.CLOSE or oversized.data == WSCloseCode.MESSAGE_TOO_BIG
    assert_serving(w3)


async def _ws_call(
    ws: aiohttp.ClientWebSocketResponse, request_id: int, method: str, *params: Any
) -> Any:
    """The answer to one call (notifications that arrive first are skipped)."""
    await ws.send_json(
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": list(params)}
    )
    while True:
        message = await ws.receive_json(timeout=EXCHANGE_DEADLINE)
        if message.get("id") == request_id:
            return message


async def _ws_subscribe(ws: aiohttp.ClientWebSocketResponse, count: int) -> list[Any]:
    """`count` newHeads subscriptions, in batches of up to 1,000: their answers, in order."""
    answers: list[Any] = []
    while len(answers) < count:
        ids = range(len(answers), min(count, len(answers) + BatchLimits().max_items))
        await ws.send_json([{"jsonrpc": "2.0", "id": i, "method": "eth_subscribe",
                             "params": ["newHeads"]} for i in ids])
        while not isinstance(batch := await ws.receive_json(timeout=EXCHANGE_DEADLINE), list):
            pass  # a notification
        answers += sorted(batch, key=lambda answer: answer["id"])
    return answers


def test_a_thousand_subscriptions_on_one_connection(node: RunningNode, signer: Signer) -> None:
    """web3 1.x opens a newHeads subscription per pending transaction: 1,000 on one
    connection are served, each notified of the next block (101 were refused before)."""

    async def scenario() -> dict[str, int]:
        async with aiohttp.ClientSession() as session, session.ws_connect(node.ws_url) as ws:
            subscriptions = {a["result"] for a in await _ws_subscribe(ws, 1_000)}
            assert len(subscriptions) == 1_000
            await asyncio.to_thread(lambda: signer.w3.eth.send_raw_transaction(signer.sign()))
            heads: dict[str, int] = {}  # subscription -> block number
            while len(heads) < 1_000:
                message = await ws.receive_json(timeout=EXCHANGE_DEADLINE)
                params = message["params"]
                heads.setdefault(params["subscription"], int(params["result"]["number"], 16))
            assert set(heads) == subscriptions
            return heads

    assert len(set(asyncio.run(scenario()).values())) == 1  # all of one block, the first
    assert_serving(signer.w3)


def test_a_slow_reader_is_slowed_not_cut(node: RunningNode, w3: Web3, signer: Signer) -> None:
    """A client that stops reading while its answers (2,000 of 16 kB) and notifications keep
    coming: the node stops reading its requests once its outbox holds 4 MiB, and the client,
    reading again, gets every answer and notification. Before, the 1,000th queued message cut
    it (Hyperledger Caliper lost its connection so at 100 tx/s)."""
    call = {"to": _deploy_returner(node, w3), "input": "0x" + (8_192).to_bytes(32, "big").hex()}
    requests = [{"jsonrpc": "2.0", "id": i, "method": "eth_call", "params": [call]}
                for i in range(2_000)]

    async def scenario() -> tuple[set[int], set[int], set[int], float]:
        async with aiohttp.ClientSession() as session, session.ws_connect(node.ws_url) as ws:
            (subscribed,) = await _ws_subscribe(ws, 1)
            sender = asyncio.ensure_future(_send_all(ws, requests))
            # Not reading: the outbox fills to its budget, and the node stops reading.
            await asyncio.to_thread(wait_for, lambda: _outbox_bytes(node) >= WS.outbox_bytes,
                                    30, "the outbox at its budget")
            heads = {await asyncio.to_thread(_transfer, signer) for _ in range(2)}
            held = await asyncio.to_thread(_outbox_bytes, node)
            answered: set[int] = set()
            notified: set[int] = set()
            while len(answered) < len(requests) or not heads <= notified:
                message = await ws.receive_json(timeout=EXCHANGE_DEADLINE)
                if "id" in message:
                    assert message["result"] == "0x" + "00" * 8_192, message
                    answered.add(message["id"])
                    if len(answered) % 50 == 0:
                        await asyncio.sleep(0.005)  # a slow reader
                else:
                    assert message["params"]["subscription"] == subscribed["result"]
                    notified.add(int(message["params"]["result"]["number"], 16))
            await sender
            return answered, heads, notified, held

    answered, heads, notified, held = asyncio.run(scenario())
    assert answered == set(range(len(requests)))
    assert heads <= notified
    assert held <= WS.outbox_bytes + 20_000  # the budget, one answer and two notifications
    assert _metric(node, "rpc_websocket_disconnects_total") == 0
    assert_serving(w3)


async def _send_all(ws: aiohttp.ClientWebSocketResponse, requests: list[Any]) -> None:
    for request in requests:
        await ws.send_json(request)


def _transfer(signer: Signer) -> int:
    """A committed transfer's block number."""
    receipt = signer.w3.eth.wait_for_transaction_receipt(
        signer.w3.eth.send_raw_transaction(signer.sign()), timeout=30)
    return int(receipt.blockNumber)


def _metric(node: RunningNode, name: str) -> float:
    """A metric's value, summed over its labels."""
    text = requests.get(node.node["metrics_url"], timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name)] in " {")


def _outbox_bytes(node: RunningNode) -> float:
    return _metric(node, "rpc_websocket_outbox_bytes")


def test_a_node_with_a_websocket_open_stops_promptly(node: RunningNode, w3: Web3) -> None:
    """Open WebSockets are closed (1001) on stop, rather than holding the shutdown until
    aiohttp's minute runs out (past RunningNode.stop's deadline, which kills the node)."""

    async def stop_with_a_subscriber() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session, session.ws_connect(node.ws_url) as ws:
            await _ws_call(ws, 1, "eth_subscribe", "newHeads")
            code = await asyncio.to_thread(node.stop)
            return code, await ws.receive(timeout=EXCHANGE_DEADLINE)

    code, closing = asyncio.run(stop_with_a_subscriber())
    assert code == 0
    assert (closing.type, closing.data) == (WSMsgType.CLOSE, WSCloseCode.GOING_AWAY)
    node.start()
    assert_serving(w3)


def test_the_node_logged_no_traceback(node: RunningNode, w3: Web3) -> None:
    """Last: hostile input is the client's fault; it never puts a traceback in the log."""
    assert_serving(w3)
    assert "Traceback" not in node.log_path.read_text()
