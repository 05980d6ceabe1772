"""Attack review (session 13) of issue 29's answer costs: answers paid from a budget of their
own as they are made and streamed (chain/rpc/server.py `_HttpAnswer`, chain/rpc/dispatcher.py
`answer_into`), bytes end to end, stable checkpoints and a bundle's final blocks kept as JSON
(pbft_engine/rpc_records.py, chain/rpc/bundles.py), eth_call's share of a core
(first `CpuShare` in chain/rpc/served.py, now chain/rpc/child_process.py's `_Child._pace`).
What an unauthenticated client can still do: each finding is a strict xfail naming its gap;
each rule that held, a passing test."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest
import rlp
from aiohttp import web

from chain.blockchain import Blockchain
from chain.metrics import NodeMetrics
from chain.rpc import child_process
from chain.rpc import server as rpc_server
from chain.rpc.bundles import METHOD, BlockBundles
from chain.rpc.dispatcher import Dispatcher
from chain.rpc.errors import INVALID_REQUEST, RESPONSE_TOO_LARGE, RpcError
from chain.rpc.evm_process import EvmProcesses
from chain.rpc.limits import BatchLimits, RpcLimits
from chain.rpc.read_process import ReadWorkers
from chain.rpc.server import WRITE_PART, BodyBudget, HttpCuts, RpcServer, _HttpErrorLog
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.core.records import DeleteRange, Put, StoreName, u16, u64
from pbft_engine.record_store import MemoryConsensusStore
from pbft_engine.rpc_records import ConsensusRecords
from tests.unit.test_evm_process import (  # noqa: F401 (fixtures)
    CHAIN_ID,
    blockchain,
    cpu_ticks,
    evm,
    refusal,
    request,
    running_child,
)
from tests.unit.test_read_process import reads  # noqa: F401 (a fixture)
from tests.unit.test_read_store import chain as read_store_chain  # noqa: F401 (a fixture)
from tests.unit.test_rpc_answer_costs import _checkpoint

HEAD = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


def _call(method: str, call_id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": []}


def _post(body: bytes, headers: bytes = b"") -> bytes:
    return HEAD + headers + b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


def _rpc(methods: dict[str, Any], *, budget: BodyBudget | None = None,
         limits: RpcLimits | None = None, cors: frozenset[str] = frozenset()) -> RpcServer:
    """A node's HTTP handler alone (no node behind it), its dispatcher over `methods`."""
    rpc = object.__new__(RpcServer)
    rpc.limits = limits or RpcLimits()
    rpc.host_allowlist, rpc.cors_origins, rpc._websockets = {"*"}, set(cors), {}
    rpc._body_budget = BodyBudget(10**9, 10**9)
    rpc._answer_budget = budget or BodyBudget(10**9, 10**9)
    rpc.dispatcher = Dispatcher(methods, rpc.limits.batch)
    rpc._http_cuts = HttpCuts(NodeMetrics().http_disconnects)
    return rpc


@contextlib.asynccontextmanager
async def _serving(rpc: RpcServer, send_buffer: int | None = None) -> AsyncIterator[int]:
    """Its port, served as `RpcServer.start` serves: its logger, and handlers not cancelled
    when their client leaves (aiohttp's TestServer cancels them). `send_buffer`: the
    kernel's for each connection (inherited from the listening socket)."""
    runner = web.AppRunner(rpc._app(), access_log=None,
                           logger=_HttpErrorLog(logging.getLogger("chain.rpc.http"), {}))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    listening = site._server.sockets[0]  # type: ignore[attr-defined]
    if send_buffer is not None:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    try:
        yield listening.getsockname()[1]
    finally:
        await runner.cleanup()


async def _head_and_body(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """An HTTP answer's head and its body (chunked or with a length), read whole."""
    head = await reader.readuntil(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        return head, await reader.readexactly(length)
    body = []
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body.append(await reader.readexactly(size))
        await reader.readexactly(2)
    await reader.readexactly(2)
    return head, b"".join(body)


# Finding 1: a precompile computes without reaching a checked opcode.

BLAKE2F = (9).to_bytes(20, "big")
ROUNDS = 10_000_000  # ~56 s of pure-Python BLAKE2 here (5.6 us a round), 1 gas a round


def _blake2f_input(rounds: int) -> bytes:
    """EIP-152's 213 bytes: rounds, h, m, t, f."""
    return rounds.to_bytes(4, "big") + bytes(64 + 128 + 16) + b"\x01"


def test_a_precompile_computes_within_the_share_while_blocks_come(
    blockchain: Blockchain, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """An eth_call straight to BLAKE2F (0x09) runs no opcode at all: 1 gas a round, 50M gas
    (the gas cap) is ~280 s of pure-Python compression in the child (ecPairing: ~350 s,
    BLS12 pairing: ~540 s). Paced at the EVM's jumps, nothing paced it: the child computed
    a whole core until the parent killed it at the deadline plus KILL_GRACE_SECONDS (7 s
    of CPU against the 1.25 s its share allows). Fixed: the parent stops the child for
    what it computed beyond its share (`_Child._pace`). Here the deadline is 0.5 s and the
    share a tenth: it computed ~2.5 s before; now at most a tenth of its 2.5 s."""
    paced = EvmProcesses(1, CHAIN_ID, blockchain.contracts, blockchain.chain_keyspace,
                         cpu_share=0.1)
    try:
        head, pid = running_child(blockchain, paced)
        before = last = cpu_ticks(pid)
        monkeypatch.setattr(child_process, "_last_block", math.inf)  # blocks keep coming
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(refusal, paced, request(head, _blake2f_input(ROUNDS),
                                                       to=BLAKE2F, timeout=0.5))
            while not call.done():  # the child's CPU until it is killed (sampled: polled)
                with contextlib.suppress(OSError, IndexError):
                    last = cpu_ticks(pid)
                time.sleep(0.05)
        computed = (last - before) / _ticks_per_second()
        assert call.result().message == "execution aborted (timeout = 0.5s)"
        assert computed < 0.6, f"the call computed {computed:.2f} s"
    finally:
        paced.close()


@pytest.mark.xfail(strict=True, reason="finding 1, left: a precompile runs past its deadline "
                                       "until the parent's kill (KILL_GRACE_SECONDS)")
def test_a_precompile_stops_at_the_deadline(
    blockchain: Blockchain, evm: EvmProcesses  # noqa: F811
) -> None:
    """The deadline is looked at in the EVM's jumps and calls; a precompile (pure-Python
    BLAKE2F) runs on until the parent kills the child 2 s later: the answer comes late and
    the next call waits for a new child. (Paced meanwhile while blocks come.)"""
    head, _ = running_child(blockchain, evm)
    started = time.monotonic()
    refusal(evm, request(head, _blake2f_input(ROUNDS), to=BLAKE2F, timeout=0.5))
    assert time.monotonic() - started < 1.0


def _ticks_per_second() -> int:
    return os.sysconf("SC_CLK_TCK")


# Finding 2 (short calls one after another never rested: CpuShare was made anew for each
# call and rested only after a 10 ms slice, and the work around the calls was outside it;
# in the real child, 60,000-gas calls back to back at a share of 0.1 kept it at 0.96 of a
# core) is fixed with finding 1: the parent paces the whole child. Its test:
# tests/unit/test_evm_process.py::test_a_child_computes_within_its_share_of_a_core_while_
# blocks_come[short calls].


# Finding 3: each call's answer in a batch is a wait of its own.


class _CountedWaits(BodyBudget):
    """An answers' budget in debt (another client took its burst and more), counting the
    payers' waits (a sleep each: a turn of the event loop at least)."""

    def __init__(self) -> None:
        super().__init__(16 * 1024 * 1024, 25_000_000)
        self.waits = 0

    def in_debt(self, owed: int) -> None:
        self._tokens, self._since = -float(owed), asyncio.get_running_loop().time()

    def waited(self) -> None:
        self.waits += 1
        super().waited()


def test_a_batch_of_small_answers_in_debt_waits_for_its_bytes_not_once_a_call() -> None:
    """While any client keeps the answers' budget in debt (reading large answers at its
    rate), an honest batch of 1,000 eth_chainId-sized answers (38 kB, 2.3 ms of the budget)
    makes 1,000 payments, each a sleep of ~2 us that costs a turn of the loop: 0.22 s here
    against 0.016 s out of debt, 100 times what its bytes owe, and the loop wakes 1,000
    times for it. Paid by the part (as a body is, every PAYMENT bytes), it would wait once."""

    async def one() -> int:
        return 1

    async def batch() -> int:
        budget = _CountedWaits()
        async with _serving(_rpc({"one": one}, budget=budget)) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            budget.in_debt(25_000_000)
            writer.write(_post(orjson.dumps([_call("one", i) for i in range(1_000)])))
            _, body = await asyncio.wait_for(_head_and_body(reader), 30)
            writer.close()
        assert len(orjson.loads(body)) == 1_000
        return budget.waits

    assert asyncio.run(batch()) <= 10


# Rules that held.


def test_a_streamed_batch_is_json_with_every_id_error_fragment_and_cors_header() -> None:
    """Ids of every type, an error, an invalid member, notifications and a Fragment among
    answers streamed in parts, and "response too large" once past the limit: one JSON array,
    each answer in its place, the CORS header on the chunked answer."""

    async def big() -> str:
        return "a" * 100_000

    async def fragment() -> orjson.Fragment:
        return orjson.Fragment(b'{"made":[1,2]}')

    async def refused() -> None:
        raise RpcError(INVALID_REQUEST, "no")

    ids: list[Any] = [1, "two", 2.5, None, 2**70, -7, "\u00e9"]
    batch: list[Any] = [_call("big", i) for i in ids]
    batch += [{"jsonrpc": "2.0", "method": "big"}, 5, _call("refused", "r"), _call("frag", 9)]
    batch += [_call("big", 100 + i) for i in range(4)] + [{"jsonrpc": "2.0", "method": "one"}]
    limits = RpcLimits(batch=BatchLimits(max_response_bytes=1_000_000))
    origin = "https://audit.example"
    rpc = _rpc({"big": big, "frag": fragment, "refused": refused}, limits=limits,
               cors=frozenset({origin}))

    async def answered() -> tuple[bytes, bytes]:
        async with _serving(rpc) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(json.dumps(batch).encode(), b"Origin: %b\r\n" % origin.encode()))
            answer = await asyncio.wait_for(_head_and_body(reader), 30)
            writer.close()
            return answer

    head, body = asyncio.run(answered())
    assert b"transfer-encoding: chunked" in head.lower() and len(body) > WRITE_PART
    assert f"access-control-allow-origin: {origin}".encode() in head.lower()
    answers = json.loads(body)
    assert [a["id"] for a in answers] == [*ids, None, "r", 9, 100, 101, 102, 103]
    assert [a["result"] for a in answers[:7]] == ["a" * 100_000] * 7
    assert answers[7]["error"]["code"] == INVALID_REQUEST  # 5: not a request object
    assert answers[8]["error"]["message"] == "no"
    assert answers[9]["result"] == {"made": [1, 2]}
    # the tenth 100 kB answer takes the batch past 1 MB: it and those after are too large
    assert [a["result"] for a in answers[10:12]] == ["a" * 100_000] * 2
    assert [a["error"]["code"] for a in answers[12:]] == [RESPONSE_TOO_LARGE] * 2


def test_a_batch_of_notifications_only_is_answered_with_nothing() -> None:
    async def one() -> int:
        return 1

    async def answered() -> tuple[bytes, bytes]:
        async with _serving(_rpc({"one": one})) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(orjson.dumps([{"jsonrpc": "2.0", "method": "one"}] * 1_000)))
            answer = await asyncio.wait_for(_head_and_body(reader), 30)
            writer.close()
            return answer

    head, body = asyncio.run(answered())
    assert head.startswith(b"HTTP/1.1 200") and body == b""


@pytest.mark.parametrize("client", ["stalls", "leaves"])
def test_a_client_gone_or_stalled_mid_stream_stops_its_batch_and_logs_no_traceback(
    caplog: pytest.LogCaptureFixture, client: str
) -> None:
    """As served (handlers not cancelled when their client leaves): the batch stops at its
    next part, and what aiohttp says of the broken answer is at most a debug line."""
    calls = 0

    async def big() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return "a" * 1_000_000

    rpc = _rpc({"big": big}, limits=RpcLimits(read_timeout=0.3))

    async def abandoned() -> None:
        async with _serving(rpc) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(orjson.dumps([_call("big", i) for i in range(100)])))
            if client == "leaves":
                await reader.readexactly(WRITE_PART)
                writer.transport.abort()
            ran = -1
            while ran != calls:  # until the batch stops (or the test's timeout)
                ran = calls
                await asyncio.sleep(0.5)
            writer.transport.abort()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(asyncio.wait_for(abandoned(), 15))
    assert calls < 20
    # the one line that says why a stalled client was cut (the attack review s14-rpc)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == (client == "stalls")
    assert all(w.startswith("HTTP client 127.0.0.1 disconnected") for w in warnings)
    # what aiohttp says of the broken answer, if anything (a client cut is written no more)
    assert {r.levelno for r in caplog.records if r.name == "chain.rpc.http"} <= {logging.DEBUG}
    assert rpc._answer_budget._waiting == 0  # no payer left counted


def test_requests_pipelined_behind_a_streamed_answer_are_answered_each_in_turn() -> None:
    """A streamed (chunked) batch, then a call, a batch of notifications, a single long
    answer and a body that is not JSON, all sent at once on one connection."""

    async def big() -> str:
        return "a" * 100_000

    async def one() -> int:
        return 1

    bodies = [orjson.dumps([_call("big", i) for i in range(30)]), orjson.dumps(_call("one", 7)),
              orjson.dumps([{"jsonrpc": "2.0", "method": "one"}]), orjson.dumps(_call("big", 8)),
              b"[1,"]

    async def answers() -> list[tuple[bytes, bytes]]:
        async with _serving(_rpc({"big": big, "one": one})) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"".join(_post(body) for body in bodies))
            got = [await asyncio.wait_for(_head_and_body(reader), 30) for _ in bodies]
            writer.close()
            return got

    (head, streamed), *rest = asyncio.run(answers())
    assert b"chunked" in head.lower()
    assert [a["id"] for a in orjson.loads(streamed)] == list(range(30))
    assert [body[:40] for _, body in rest] == [
        b'{"jsonrpc":"2.0","id":7,"result":1}', b"", b'{"jsonrpc":"2.0","id":8,"result":"aaaaaa',
        b'{"jsonrpc":"2.0","id":null,"error":{"cod']


def _proof(seq_no: int, replicas: range) -> bytes:
    return rlp.encode([_checkpoint(seq_no, r) for r in replicas])


def _consensus_records(store: MemoryConsensusStore) -> ConsensusRecords:
    return ConsensusRecords(store, lambda: EpochSchedule.genesis((bytes(20),) * 4))


def test_a_stable_checkpoint_stored_again_with_another_proof_is_answered_with_it() -> None:
    """The entries are kept by the stored proof's bytes, not by seqNo: a proof written again
    at the same seqNo (another Q of the votes) is the one answered."""
    store = MemoryConsensusStore()
    records = _consensus_records(store)
    store.apply([Put(StoreName.STABLE_CHECKPOINTS, u64(4), _proof(4, range(3)))])
    assert len(records.checkpoints(0, 10)[0]["proof"]) == 3
    store.apply([Put(StoreName.STABLE_CHECKPOINTS, u64(4), _proof(4, range(1, 4)))])
    (entry,) = records.checkpoints(0, 10)
    assert entry["proof"][0] == "0x" + _checkpoint(4, 1).hex()


def test_a_bundle_kept_closed_is_what_a_fresh_node_answers_across_a_skipped_checkpoint(
    read_store_chain: Blockchain, reads: ReadWorkers  # noqa: F811
) -> None:
    """Checkpoint 2 pending (never stable here), then 4 stable: `stabilize` writes 4's proof
    and deletes the pending votes below it in one batch, so block 2's checkpoints go from
    one pending entry to none. What the closed cache keeps once 4 is stable is what a node
    with empty caches answers, then and after."""
    assert read_store_chain.head().block_number >= 4
    store = MemoryConsensusStore()
    records = _consensus_records(store)

    async def certificate(number: str) -> dict[str, Any]:
        return {"blockNumber": number}

    async def checkpoints(first: str, last: str) -> list[dict[str, Any]]:
        return records.checkpoints(int(first, 16), int(last, 16))

    engine = {"pbft_getCommitCertificate": certificate, "pbft_getCheckpoints": checkpoints}

    def bundles() -> Any:
        return BlockBundles.methods_for(read_store_chain, reads, 25_000_000, engine)[METHOD]

    kept = bundles()

    def ask(method: Any) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = orjson.loads(orjson.dumps(asyncio.run(method("0x0",
                                                                                  "0x4"))))
        return answer

    store.apply([Put(StoreName.CHECKPOINTS, u64(2) + u16(0), _checkpoint(2, 0))])
    assert ask(kept)[2]["checkpoints"][0]["stable"] is False
    store.apply([Put(StoreName.STABLE_CHECKPOINTS, u64(4), _proof(4, range(3))),
                 DeleteRange(StoreName.CHECKPOINTS, None, u64(4))])
    answer = ask(kept)
    assert answer[2]["checkpoints"] == [] and answer[4]["checkpoints"][0]["stable"] is True
    assert len(kept.__self__._closed_blocks._values) == 5
    assert ask(kept) == answer == ask(bundles())


# Finding 4: a slow reader's answer has no total bound.


def test_a_client_taking_its_answer_a_part_per_read_timeout_is_cut_within_a_total_bound(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that takes a part of its answer within each read timeout holds its
    connection, its batch (the decoded body: up to 5 MiB of JSON, more as objects) and a
    part in the node for as long as the answer lasts: a 25 MB answer in parts of 256 KiB,
    each taken within 30 s, is read at ~10-60 kB/s (the part, the transport's 64 KiB and
    the third of the kernel's send buffer that wakes a writer) for 7-40 minutes; 256 such
    clients hold every connection and their batches. geth bounds the whole answer (its
    WriteTimeout). Here parts of 32 KiB, a 1 s read timeout and small kernel buffers: a
    client reading less than ~100 kB/s is cut within the second (2 s apart: cut at 2 s);
    one reading 64 KiB every 0.1 s is still being answered its 25 MB batch 3 s on."""
    monkeypatch.setattr(rpc_server, "WRITE_PART", 32 * 1024)

    async def big() -> str:
        return "a" * 25_000

    async def slow_reader() -> bool:
        """Whether the node stopped answering within 3 s of the answer starting."""
        rpc = _rpc({"big": big}, limits=RpcLimits(read_timeout=1.0))
        ended = asyncio.Event()
        answer_into = rpc.dispatcher.answer_into

        async def watched(*args: Any) -> None:
            try:
                await answer_into(*args)
            finally:
                ended.set()

        rpc.dispatcher.answer_into = watched  # type: ignore[method-assign]
        async with _serving(rpc, send_buffer=16 * 1024) as port:
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            client.setblocking(False)
            await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", port))
            reader, writer = await asyncio.open_connection(sock=client)
            writer.write(_post(orjson.dumps([_call("big", i) for i in range(1_000)])))
            await reader.readuntil(b"\r\n\r\n")
            ends = time.monotonic() + 3
            try:
                while time.monotonic() < ends and not ended.is_set():
                    await reader.read(64 * 1024)
                    await asyncio.sleep(0.1)
                return ended.is_set()
            finally:
                writer.transport.abort()

    assert asyncio.run(slow_reader())
