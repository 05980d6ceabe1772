"""A WebSocket connection's outbox and subscriptions (chain/rpc/subscriptions.py, issue 29):
bounded in bytes with backpressure, cut with a reason, subscriptions bounded by cost."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import WSMsgType

import tests.unit.test_attack_review_s11_rpc as s11
from chain.rpc.dispatcher import HELD_FLOOR_BYTES, Dispatcher, HeldBytes
from chain.rpc.errors import RpcError
from chain.rpc.loop_turns import LoopTurns
from chain.rpc.server import BodyBudget, RpcServer
from chain.rpc.subscriptions import (
    BEHIND,
    OUTBOX_FULL,
    WRITE_DEADLINE,
    Outbox,
    Subscriptions,
    WebSocketLimits,
)
from tests.unit.test_attack_review_s11_rpc import masked_frame

ROOMY = WebSocketLimits(max_blocks_behind=2)  # a newHeads notification is 1.7 kB
LIMITS = WebSocketLimits(outbox_bytes=1_000, notification_bytes=2_000, max_subscriptions=3,
                         node_subscriptions=5, max_log_entries=4, node_log_entries=7,
                         write_deadline=0.2, max_blocks_behind=2)
ADDRESS = "0x" + "11" * 20
TOPIC = "0x" + "22" * 32


def run(coroutine: Any) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coroutine, 10)

    return asyncio.run(bounded())


def test_answers_over_the_budget_hold_the_reader_until_the_client_takes_them() -> None:
    async def body() -> None:
        outbox = Outbox(LIMITS)
        outbox.put_answer(b"a" * 600)
        assert await asyncio.wait_for(outbox.room(), 1)  # under the budget: read on
        outbox.put_answer(b"b" * 600)  # queued whole, but now over: the reader waits
        room = asyncio.ensure_future(outbox.room())
        await asyncio.sleep(0)
        assert not room.done() and outbox.bytes == 1_200
        first = await outbox.next()
        assert first is not None and first.frame() == b"a" * 600
        assert not room.done()  # counted until written
        outbox.sent(first)
        assert await asyncio.wait_for(room, 1) and outbox.bytes == 600

    run(body())


def test_notifications_past_their_budget_cut_the_client() -> None:
    async def body() -> None:
        outbox = Outbox(LIMITS)
        result = json.dumps({"number": "0x1"})
        while outbox.put_notification("0xab", result):
            pass
        assert outbox.cut_reason == OUTBOX_FULL
        assert outbox.notification_bytes <= LIMITS.notification_bytes
        assert not await outbox.room() and await outbox.next() is None
        assert not outbox.put_notification("0xab", result)

    run(body())


def test_a_notification_is_written_as_json_rpc() -> None:
    async def body() -> None:
        outbox = Outbox(LIMITS)
        assert outbox.put_notification("0xab", '{"number":"0x1"}')
        item = await outbox.next()
        assert item is not None and len(item.frame()) == item.size == outbox.bytes
        assert json.loads(item.frame()) == {
            "jsonrpc": "2.0", "method": "eth_subscription",
            "params": {"subscription": "0xab", "result": {"number": "0x1"}}}

    run(body())


class _StuckSocket:
    """A client that takes the first `taken` messages, then none."""

    def __init__(self, taken: int = 0, error: Exception | None = None) -> None:
        self.taken = taken
        self.error = error
        self.sent: list[bytes] = []

    async def send_frame(self, message: bytes, opcode: WSMsgType) -> None:
        assert opcode is WSMsgType.TEXT  # JSON-RPC over WebSocket is text (as geth's)
        if self.error is not None:
            raise self.error
        if len(self.sent) >= self.taken:
            await asyncio.Event().wait()
        self.sent.append(message)


def test_a_message_not_taken_within_the_write_deadline_cuts_the_client() -> None:
    async def body() -> tuple[str | None, float, list[bytes], bool]:
        outbox = Outbox(LIMITS)
        for text in (b"one", b"two", b"three"):
            outbox.put_answer(text)
        socket = _StuckSocket(taken=1)
        started = time.monotonic()
        reason = await RpcServer._ws_writer(socket, outbox, LIMITS, LoopTurns())  # type: ignore[arg-type]
        return reason, time.monotonic() - started, socket.sent, await outbox.room()

    reason, waited, sent, room = run(body())
    assert reason == WRITE_DEADLINE and sent == [b"one"]
    assert LIMITS.write_deadline <= waited < LIMITS.write_deadline + 2
    assert not room  # the reader stops too


def test_a_client_gone_is_not_a_cut() -> None:
    async def body() -> tuple[str | None, bool]:
        outbox = Outbox(LIMITS)
        outbox.put_answer(b"one")
        socket = _StuckSocket(error=ConnectionResetError("gone"))
        reason = await RpcServer._ws_writer(socket, outbox, LIMITS, LoopTurns())  # type: ignore[arg-type]
        return reason, await outbox.room()

    assert run(body()) == (None, False)


def _subscriptions(limits: WebSocketLimits = LIMITS) -> Subscriptions:
    return Subscriptions(SimpleNamespace(add_head_listener=lambda listener: None),  # type: ignore[arg-type]
                         limits)


def _refusal(coroutine: Any) -> str:
    with pytest.raises(RpcError) as refused:
        run(coroutine)
    assert refused.value.code == -32005
    return refused.value.message


def test_subscriptions_are_bounded_per_connection_and_on_the_node() -> None:
    subscriptions = _subscriptions()
    first, second = subscriptions.session(), subscriptions.session()
    ids = [run(first.eth_subscribe("newHeads")) for _ in range(3)]
    assert _refusal(first.eth_subscribe("newHeads")) == (
        "too many subscriptions on this connection (limit 3)")
    run(second.eth_subscribe("newHeads"))
    run(second.eth_subscribe("newHeads"))
    assert _refusal(second.eth_subscribe("newHeads")) == (
        "too many subscriptions on this node (limit 5)")
    assert run(first.eth_unsubscribe(ids[0])) and not run(first.eth_unsubscribe(ids[0]))
    run(second.eth_subscribe("newHeads"))  # a slot freed on the node
    first.close()
    assert subscriptions.count == 3 and first not in subscriptions.sessions


def test_log_criteria_count_by_their_addresses_and_topics() -> None:
    subscriptions = _subscriptions()
    first, second = subscriptions.session(), subscriptions.session()
    three = {"address": [ADDRESS, "0x" + "33" * 20], "topics": [[TOPIC], None]}
    run(first.eth_subscribe("logs", three))
    run(first.eth_subscribe("logs"))  # a catch-all: one
    assert _refusal(first.eth_subscribe("logs", {"address": ADDRESS})) == (
        "too many log subscription addresses and topics on this connection (limit 4)")
    run(second.eth_subscribe("logs", three))
    assert _refusal(second.eth_subscribe("logs")) == (
        "too many log subscription addresses and topics on this node (limit 7)")
    first.close()
    run(second.eth_subscribe("logs"))
    assert subscriptions.log_entries == 4


def _header(number: int) -> SimpleNamespace:
    zero32, zero20 = b"\x00" * 32, b"\x00" * 20
    return SimpleNamespace(
        block_number=number, hash=number.to_bytes(32, "big"), parent_hash=zero32,
        nonce=b"\x00" * 8, uncles_hash=zero32, bloom=0, transaction_root=zero32,
        state_root=zero32, receipt_root=zero32, coinbase=zero20, difficulty=0, extra_data=b"",
        gas_limit=30_000_000, gas_used=0, timestamp=number, mix_hash=zero32,
        base_fee_per_gas=7, withdrawals_root=zero32, blob_gas_used=0, excess_blob_gas=0,
        parent_beacon_block_root=zero32, requests_hash=zero32)


def test_each_block_is_fanned_out_off_the_commit_path() -> None:
    async def body() -> list[list[str]]:
        subscriptions = _subscriptions(ROOMY)
        sessions = [subscriptions.session() for _ in range(2)]
        ids = [[await s.eth_subscribe("newHeads") for _ in range(2)] for s in sessions]
        subscriptions._on_block(SimpleNamespace(header=_header(1), records=()))  # type: ignore[arg-type]
        assert all(not s.outbox.bytes for s in sessions)  # nothing done on the commit path
        texts: list[list[bytes]] = []
        for session, expected in zip(sessions, ids, strict=True):
            items = [await session.outbox.next() for _ in expected]
            texts.append([item.frame() for item in items if item is not None])
        subscriptions.close_all()
        return [[json.loads(t)["params"]["subscription"] for t in ts] for ts in texts] + ids

    first, second, first_ids, second_ids = run(body())
    assert (first, second) == (first_ids, second_ids)


def test_subscribers_too_far_behind_are_cut() -> None:
    async def body() -> list[str | None]:
        subscriptions = _subscriptions(ROOMY)
        subscribed, idle = subscriptions.session(), subscriptions.session()
        await subscribed.eth_subscribe("newHeads")
        for number in range(ROOMY.max_blocks_behind + 1):  # the fan-out never runs meanwhile
            subscriptions._on_block(SimpleNamespace(header=_header(number), records=()))  # type: ignore[arg-type]
        subscriptions.close_all()
        return [subscribed.outbox.cut_reason, idle.outbox.cut_reason]

    assert run(body()) == [BEHIND, None]


# Answers waiting to be written count against the node's bound on WebSocket answers.

HELD_BOUND = 7_000_000  # the node's bound on WebSocket answers, made small here: two fit
PARKED_ANSWER = 3_000_000  # more than the kernel's buffers take for a client that never reads
PARKERS = 4
SIZED = b'{"jsonrpc":"2.0","id":1,"method":"sized"}'
HANDSHAKE = (b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")


async def _never_reading(port: int) -> socket.socket:
    """A WebSocket client that asks for a `sized` answer and never reads it (its receive
    window small)."""
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    await loop.sock_connect(client, ("127.0.0.1", port))
    await loop.sock_sendall(client, HANDSHAKE)
    answer = b""
    while b"\r\n\r\n" not in answer:  # (a frame before the 101 is refused)
        answer += await loop.sock_recv(client, 1)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    await loop.sock_sendall(client, masked_frame(0x1, True, SIZED))
    return client


def test_answers_waiting_for_a_client_count_against_the_nodes_bound(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """`HeldBytes` bounds the WebSocket answers being made (64 MiB); an answer made was
    given back before it was queued, so clients that never read each parked one answer
    outside the bound, a 25 MB batch's (256 connections: 6.4 GB). Here four clients that
    never read (their receive window small) each ask for a 3 MB answer, the bound 7 MB:
    what their outboxes hold stays within the bound and each connection's 64 KiB floor
    (two answers; the others are "server busy"; it was 12 MB), and is given back when
    they leave."""

    async def sized() -> str:
        return "a" * PARKED_ANSWER

    dispatcher = Dispatcher({"sized": sized})
    dispatcher._held_answers = held = HeldBytes(HELD_BOUND)
    made: list[Subscriptions] = []
    answered: list[int] = []
    put_answer = Outbox.put_answer

    class Kept(Subscriptions):
        def __init__(self, node: Any) -> None:
            super().__init__(node)
            made.append(self)

    def counted(outbox: Outbox, answer: bytes, *args: Any) -> None:
        answered.append(len(answer))
        put_answer(outbox, answer, *args)

    monkeypatch.setattr(s11, "Subscriptions", Kept)
    monkeypatch.setattr(Outbox, "put_answer", counted)

    async def parked() -> tuple[int, int]:
        async with s11.websocket_server(BodyBudget(10**9, 10**9), dispatcher) as listening:
            clients = [await _never_reading(listening.port) for _ in range(PARKERS)]
            try:
                while len(answered) < PARKERS:
                    await asyncio.sleep(0.01)
                parked = made[0].outbox_bytes()
            finally:
                for client in clients:
                    client.close()
            while made[0].sessions:  # (the node saw them leave)
                await asyncio.sleep(0.01)
            return parked, held.held

    outboxes, left = run(parked())
    assert outboxes <= HELD_BOUND + PARKERS * HELD_FLOOR_BYTES, (
        f"{outboxes / 1e6:.1f} MB parked; answers {answered}")
    assert left == 0


def test_a_connections_answers_waiting_share_its_floor() -> None:
    """The first HELD_FLOOR_BYTES of answers are held whatever the node holds, a
    connection's in all, its answers waiting to be written included: per answer, a client
    that reads slowly kept up to its 4 MiB of outbox in small answers beside the bound."""

    async def small() -> str:
        return "a" * 1_000

    dispatcher = Dispatcher({"small": small})
    dispatcher._held_answers = held = HeldBytes(0)  # the node's bound taken
    session = Subscriptions(SimpleNamespace(add_head_listener=lambda _: None)).session()
    call = b'{"jsonrpc":"2.0","id":1,"method":"small"}'

    async def answered() -> list[str]:
        kinds = []
        while len(kinds) < 100 and (not kinds or kinds[-1] == "result"):
            answer = await dispatcher.handle_payload(call, session)
            assert answer is not None
            session.outbox.put_answer(answer, held)
            kinds.append("result" if b'"result"' in answer else "busy")
        return kinds

    kinds = run(answered())
    assert kinds[-1] == "busy", f"{len(kinds)} answers beside the bound"
    assert session.outbox.answer_bytes <= HELD_FLOOR_BYTES
    session.close()
    assert held.held == 0
