"""Attack review (session 11) of eth_call's EVM process and the request-body budget (issue
29): what an unauthenticated JSON-RPC client can still do. Each strict xfail names the gap;
it passes once the gap is closed (then remove its mark). Findings 1 (init code over EIP-3860's
limit killed the child), 2 (a small body waited for the flood's whole debt: the budget now
shares the rate as a processor is) and 4 (a call cancelled before it reached a thread kept
its slot) are fixed in session 11; 3 (a body in 1-byte chunks paid for a sixth of what the
loop parsed) in session 12."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from chain.blockchain import Blockchain
from chain.rpc.dispatcher import MAX_HELD_ANSWER_BYTES, HeldBytes
from chain.rpc.errors import SERVER_ERROR, RpcError
from chain.rpc.evm_process import EvmProcesses
from chain.rpc.limits import RpcLimits
from chain.rpc.loop_turns import LoopTurns
from chain.rpc.served import WorkerPool
from chain.rpc.server import PAYMENT, PIECE_COST, BodyBudget, RpcServer
from chain.rpc.subscriptions import Subscriptions
from tests.unit.test_evm_process import (  # noqa: F401 (fixtures)
    ADD_AND_RETURN,
    blockchain,
    evm,
    request,
)
from tests.unit.test_rpc_body_budget import MIB, naps  # noqa: F401 (a fixture)

MAX_INITCODE_SIZE = 49152  # EIP-3860
ETH_BLOCK_NUMBER = b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber"}'


def test_initcode_over_the_limit_is_an_error_of_the_call_not_of_the_evm_process(
    blockchain: Blockchain, evm: EvmProcesses  # noqa: F811
) -> None:
    head = blockchain.head()
    evm.execute(request(head, ADD_AND_RETURN))  # started and ready
    (pid,) = evm.pids
    with pytest.raises(RpcError) as caught:
        evm.execute(request(head, bytes(MAX_INITCODE_SIZE + 1)))
    assert caught.value.code == SERVER_ERROR  # geth: -32000 "max initcode size exceeded"
    assert evm.pids == [pid]  # the process did nothing wrong: it stays, its cache too


def test_a_small_body_does_not_wait_for_every_flooding_connections_debt(
    naps: list[float],  # noqa: F811
) -> None:
    budget = BodyBudget(rate=16 * MIB, burst=5 * MIB)  # http.max_request_rate's default
    flooding_connections, chunk = 100, 3 * MIB // 4

    async def flood_then_one_small_body() -> None:
        await asyncio.gather(*(budget.spend(chunk) for _ in range(flooding_connections)))
        await budget.spend(len(ETH_BLOCK_NUMBER))

    asyncio.run(flood_then_one_small_body())
    assert naps[-1] < 0.1  # now ~4.4 s: 70 MiB of others' chunks at 16 MiB/s


class PaidBudget(BodyBudget):
    """The node's budget, adding up what it was paid."""

    paid = 0

    def charge(self, size: int) -> float:
        self.paid += size
        return super().charge(size)


async def post_in_one_byte_chunks(payload: bytes) -> tuple[int, int]:
    """The budget's takings and the bytes on the wire for `payload` posted to the node's
    body reader as a chunked body of 1-byte chunks."""
    server = object.__new__(RpcServer)  # only its body reader: no node behind it
    server.limits = RpcLimits()
    server._body_budget = budget = PaidBudget(server.limits.max_body_rate,
                                              server.limits.max_body_bytes)

    async def read(request: web.Request) -> web.Response:
        body = await server._read_body(request)
        return body if isinstance(body, web.Response) else web.Response(text=str(len(body)))

    app = web.Application()
    app.router.add_post("/", read)
    body = b"".join(b"1\r\n%c\r\n" % byte for byte in payload) + b"0\r\n\r\n"
    async with TestServer(app) as listening:
        reader, writer = await asyncio.open_connection(listening.host, listening.port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + body)
        answer = await reader.read()
        writer.close()
    assert answer.endswith(b"\r\n\r\n%d" % len(payload))
    return budget.paid, len(body)


def test_a_body_in_tiny_chunks_pays_the_budget_for_what_the_loop_parsed() -> None:
    """A strict xfail until session 12: the budget paid a body's decoded bytes while the
    loop's cost is in its chunks (aiohttp parses each chunk and feeds it to the request's
    stream in Python on the event loop). One client posting chunked 4 MiB bodies of 1-byte
    chunks took an honest eth_blockNumber from 0.8 ms to 72 ms at p50 on the 1-validator
    testnet, two to 145 ms (py-spy: the loop in aiohttp's data_received 777 of 800 samples)
    at ~10 MB/s on the wire, a tenth of the budget. Each chunk now costs PIECE_COST too."""
    paid, wire = asyncio.run(post_in_one_byte_chunks(b"[" + b" " * 20_000 + b"]"))
    assert paid >= wire  # was 20,002 of 120,017 bytes: a sixth


def test_a_body_in_debt_is_not_read_the_kernel_holds_the_rest() -> None:
    """A budget of a byte a second after its first 64 KiB: the node reads what the bucket
    pays for and what aiohttp parsed with it, then waits with the connection's transport
    paused; the rest of 1.8 MB of 1-byte chunks stays with the kernel and the client."""
    budget = PaidBudget(rate=1, burst=64 * 1024)
    server = object.__new__(RpcServer)
    server.limits = RpcLimits()
    server._body_budget = budget
    connections: list[asyncio.Transport | None] = []

    async def read(request: web.Request) -> web.Response:
        connections.append(request.transport)
        await server._read_body(request)
        return web.Response()

    async def flood() -> tuple[int, bool]:
        app = web.Application()
        app.router.add_post("/", read)
        async with TestServer(app) as listening:
            _, writer = await asyncio.open_connection(listening.host, listening.port)
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n" + b"1\r\n \r\n" * 300_000)
            deadline = asyncio.get_running_loop().time() + 10
            while not budget._waiting:  # in debt
                assert asyncio.get_running_loop().time() < deadline, "never in debt"
                await asyncio.sleep(0)
            (connection,) = connections
            assert connection is not None
            reading = connection.is_reading()
            writer.transport.abort()
            connection.abort()
        return budget.paid, reading

    paid, reading = asyncio.run(flood())
    assert 64 * 1024 < paid <= 64 * 1024 + PAYMENT + PIECE_COST and not reading


class LengthOfEachMessage:
    """The dispatcher of a node that answers each message with its length."""

    def __init__(self) -> None:
        self.turns = LoopTurns()  # (the writer's messages take their turns)
        self.held_answers = HeldBytes(MAX_HELD_ANSWER_BYTES)  # (answers count until written)

    async def handle_payload(self, body: str | bytes, session: object,
                             pay: object = None) -> bytes:
        return b"%d" % len(body)


def masked_frame(opcode: int, fin: bool, payload: bytes) -> bytes:
    """A client's frame of up to 125 bytes (a zero mask: its payload reads as sent)."""
    return bytes([fin << 7 | opcode, 0x80 | len(payload)]) + bytes(4) + payload


def one_byte_frames(payload: bytes) -> bytes:
    """`payload` as a text message of 1-byte frames (a text frame, then continuations)."""
    return b"".join(masked_frame(0 if i else 1, i == len(payload) - 1, payload[i:i + 1])
                    for i in range(len(payload)))


@contextlib.asynccontextmanager
async def websocket_server(budget: BodyBudget, dispatcher: object | None = None,
                           ) -> AsyncIterator[TestServer]:
    """The node's WebSocket handler alone (each message answered with its length, or by
    `dispatcher`), paying `budget`; the node's ends of its connections aborted at the end
    (one in debt reads nothing)."""
    server = object.__new__(RpcServer)  # only its WebSocket handler: no node behind it
    server.limits = RpcLimits()
    server._body_budget = budget
    server._answer_budget = BodyBudget(server.limits.max_answer_rate,
                                       server.limits.batch.max_response_bytes)
    server._websockets = {}
    server.subscriptions = Subscriptions(SimpleNamespace(add_head_listener=lambda _: None))
    server.dispatcher = dispatcher or LengthOfEachMessage()  # type: ignore[assignment]
    connections: list[asyncio.Transport | None] = []

    async def websocket(request: web.Request) -> web.StreamResponse:
        connections.append(request.transport)
        return await server._websocket(request)

    app = web.Application()
    app.router.add_get("/", websocket)
    async with TestServer(app) as listening:
        try:
            yield listening
        finally:
            for connection in connections:
                if connection is not None:
                    connection.abort()


@contextlib.asynccontextmanager
async def websocket_to(budget: BodyBudget) -> AsyncIterator[
        tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client's connection to the node's WebSocket handler, the handshake done."""
    async with websocket_server(budget) as listening:
        reader, writer = await asyncio.open_connection(listening.host, listening.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
        try:
            yield reader, writer
        finally:
            writer.transport.abort()


async def send_in_one_byte_frames(payload: bytes) -> tuple[int, int]:
    """The budget's takings and the bytes on the wire for `payload` sent to the node's
    WebSocket handler as a text message of 1-byte frames."""
    budget = PaidBudget(RpcLimits().max_body_rate, RpcLimits().max_body_bytes)
    frames = one_byte_frames(payload)
    async with websocket_to(budget) as (reader, writer):
        writer.write(frames)
        header = await reader.readexactly(2)
        answer = await reader.readexactly(header[1] & 0x7F)
    assert answer == b"%d" % len(payload)
    return budget.paid, len(frames)


def test_a_websocket_message_in_tiny_frames_pays_the_budget_for_what_the_loop_parsed() -> (
        None):
    """WebSocket reads were not paced at all (session 11): two clients sending 5 MiB
    messages got 57-64 MiB/s accepted (honest HTTP p99 2.6 -> 24.7 ms), and one sending
    1-byte continuation frames kept the loop in data_received 712 of 800 samples
    (eth_blockNumber 0.9 -> 15 ms). What a WebSocket client sends is now paid from the
    budget HTTP bodies pay from: its bytes and PIECE_COST for each frame."""
    paid, wire = asyncio.run(send_in_one_byte_frames(b"[" + b" " * 20_000 + b"]"))
    assert paid >= wire + 20_002 * PIECE_COST  # was 0 of 140,014 bytes on the wire


def test_a_websocket_client_in_debt_is_not_read_the_kernel_holds_the_rest() -> None:
    """A budget of a byte a second after its first 64 KiB: the node passes on what the
    bucket pays for and a part more, then waits, its transport paused; the rest of 2 MB of
    1-byte frames (or pings: a frame is a frame) stays with the kernel and the client."""
    budget = PaidBudget(rate=1, burst=64 * 1024)

    async def flood() -> int:
        async with websocket_to(budget) as (_, writer):
            writer.write(one_byte_frames(b" " * 300_000))
            deadline = asyncio.get_running_loop().time() + 10
            while not budget._waiting:  # in debt
                assert asyncio.get_running_loop().time() < deadline, "never in debt"
                await asyncio.sleep(0)
            return budget.paid

    paid = asyncio.run(flood())
    assert 64 * 1024 < paid <= 64 * 1024 + PAYMENT + PIECE_COST + 14


def test_a_call_cancelled_while_it_waits_for_the_thread_gives_its_slot_back() -> None:
    pool = WorkerPool(1, 2, "eth_call/eth_estimateGas", governed=False)
    started, gate = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait()

    async def until(condition: Callable[[], bool]) -> None:
        deadline = asyncio.get_running_loop().time() + 5
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, "timed out"
            await asyncio.sleep(0)

    async def cancel_a_waiting_call_then_fill_the_pool() -> None:
        running = asyncio.create_task(pool.run(hold))
        await until(started.is_set)
        waiting = asyncio.create_task(pool.run(lambda: None))
        await until(lambda: pool._executor._work_queue.qsize() == 1)  # waits for the thread
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        gate.set()
        await running
        started.clear()
        gate.clear()
        again = asyncio.create_task(pool.run(hold))
        await until(started.is_set)
        second = asyncio.create_task(pool.run(lambda: None))  # the pool's second slot
        await until(lambda: second.done() or pool._executor._work_queue.qsize() == 1)
        gate.set()
        await again
        await second  # "server busy" now

    try:
        asyncio.run(cancel_a_waiting_call_then_fill_the_pool())
    finally:
        pool.close()
