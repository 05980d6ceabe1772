"""Attack review (session 14) of session 13's front door: answers paid from a budget and
streamed (chain/rpc/server.py `_HttpAnswer`, chain/rpc/dispatcher.py `answer_into`), the RPC's
children paced from the parent (chain/rpc/child_process.py `_Child._pace`) and killed with it,
the caches of stable checkpoints and closed blocks. What a client with no keys can still do:
each finding is a test (a strict xfail while its gap is open); each rule that held, a
passing test. Findings 1 (an answer the client never took held its connection for good),
2 (the client cut for it was cut silently), 3 (a node that is pid 1 had every child exit at
once) and 6 (pbft_getCheckpoints decoded 1,000 checkpoints on the loop that votes) are fixed
in session 14; 4 (a WebSocket answer is made whole), 5 (the share of a core is each
child's, not the node's) and 7 (batches of light reads on the loop, their work unbounded
but by their bytes) stand as strict xfails."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson
import pytest
import rlp
from aiohttp import web

from chain.metrics import NodeMetrics
from chain.rpc import child_process
from chain.rpc import dispatcher as dispatcher_module
from chain.rpc.dispatcher import BUSY_ANSWERS, Dispatcher, HeldBytes
from chain.rpc.limits import RpcLimits
from chain.rpc.served import MAX_PENDING_READS, READ_WORKERS, WorkerPool
from chain.rpc.server import (
    BodyBudget,
    HttpCuts,
    RpcServer,
    _HttpErrorLog,
    engine_ranges_on,
)
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.core.params import EngineParams
from pbft_engine.core.records import Put, StoreName, u64
from pbft_engine.engine import PbftEngine
from pbft_engine.messages import Checkpoint, Signed
from pbft_engine.record_store import MemoryConsensusStore
from pbft_engine.rpc_records import ConsensusRecords
from tests.unit.test_attack_review_s11_rpc import websocket_server
from tests.unit.test_attack_review_s13_rpc import _call, _post, _rpc

SMALL_BUFFER = 16 * 1024  # the kernel's, each way: a client that reads nothing fills it soon


@contextlib.asynccontextmanager
async def _served(rpc: RpcServer) -> AsyncIterator[tuple[int, web.Server]]:
    """Its port and aiohttp's server (its open connections), served as `RpcServer.start`
    serves, each connection's send buffer small."""
    runner = web.AppRunner(rpc._app(), access_log=None,
                           logger=_HttpErrorLog(logging.getLogger("chain.rpc.http"), {}))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None and runner.server is not None
    listening = site._server.sockets[0]  # type: ignore[attr-defined]
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUFFER)
    try:
        yield listening.getsockname()[1], runner.server
    finally:
        await runner.cleanup()


async def _stalled_client(port: int, requests: bytes) -> socket.socket:
    """A client that sends `requests` and never reads (its receive buffer small)."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUFFER)
    client.setblocking(False)
    await asyncio.get_running_loop().sock_connect(client, ("127.0.0.1", port))
    await asyncio.get_running_loop().sock_sendall(client, requests)
    return client


async def _held_for(server: web.Server, seconds: float) -> float:
    """How long the node held the connection it accepted (until it had none), at most
    `seconds`."""
    accepted = time.monotonic() + 5
    while not server.connections and time.monotonic() < accepted:
        await asyncio.sleep(0.01)
    started = time.monotonic()
    while server.connections and time.monotonic() - started < seconds:
        await asyncio.sleep(0.02)
    return time.monotonic() - started


# Finding 1: an answer the client never takes holds its connection for good.

READ_TIMEOUT = 0.3


@pytest.mark.parametrize("answers", ["one of 200 kB", "300 pipelined of 1 kB"])
def test_a_client_that_never_takes_a_short_answer_is_cut_within_the_read_timeout(
    answers: str
) -> None:
    """Fixed (was a strict xfail): session 13 gave a client the read timeout in all to take
    its answer, but only in the parts `_HttpAnswer` streams: an answer under WRITE_PART
    (written whole by aiohttp after the handler, `finish_response`), pipelined answers, and
    the end of every answer (`write_eof`) waited on the socket with no deadline. A client
    that never read held its connection, its handler and the answer for good (10 s on, 30
    times the read timeout, here; on a node 256 such clients took every connection, 503 for
    all others, for as long as they liked, where an idle connection is closed after 120 s
    and a slow body after 30 s). Now `RpcServer._sent` writes those within the timeout.
    On a 4-validator testnet, 16 clients pipelining batches answered 259,841 bytes each
    (whole) and reading nothing still held their connections 70 s on; now cut by 40 s."""

    async def sized(size: int) -> str:
        return "a" * size

    async def held() -> float:
        rpc = _rpc({"sized": sized}, limits=RpcLimits(read_timeout=READ_TIMEOUT))
        async with _served(rpc) as (port, server):
            if answers == "one of 200 kB":
                requests = _post(orjson.dumps({**_call("sized"), "params": [200_000]}))
            else:
                requests = _post(orjson.dumps({**_call("sized"), "params": [1_000]})) * 300
            client = await _stalled_client(port, requests)
            try:
                return await _held_for(server, 3)
            finally:
                client.close()

    assert asyncio.run(held()) < READ_TIMEOUT + 1.5



# Finding 2: a client cut for not taking its answer was cut silently.


def test_a_client_cut_for_not_taking_its_answer_is_said_and_counted(
    caplog: pytest.LogCaptureFixture
) -> None:
    """Fixed (was a strict xfail): `_HttpAnswer` aborted a client past its read timeout
    with no log line and no metric (a WebSocket client cut is both: `rpc_websocket_
    disconnects_total{reason}`), so an operator whose honest exporters were cut (a slow
    link, a 25 MB answer in 30 s) saw only their errors. Now a throttled warning says who
    and why, and `rpc_http_disconnects_total` counts it."""

    async def big() -> str:
        return "a" * 1_000_000  # streamed (over WRITE_PART)

    metrics = NodeMetrics()
    rpc = _rpc({"big": big}, limits=RpcLimits(read_timeout=READ_TIMEOUT))
    rpc._http_cuts = HttpCuts(metrics.http_disconnects)

    async def cut() -> float:
        async with _served(rpc) as (port, server):
            client = await _stalled_client(port, _post(orjson.dumps(_call("big"))))
            try:
                return await _held_for(server, 3)
            finally:
                client.close()

    with caplog.at_level(logging.INFO, logger="chain.rpc.server"):
        assert asyncio.run(cut()) < READ_TIMEOUT + 1.5
    assert [r.getMessage() for r in caplog.records if r.name == "chain.rpc.server"] == [
        f"HTTP client 127.0.0.1 disconnected: an answer not taken within the "
        f"{READ_TIMEOUT:g} s read timeout"]
    assert metrics.registry.get_sample_value("rpc_http_disconnects_total") == 1


# Finding 3: a node that is pid 1 (a container's) had every child exit at once.

IN_A_CONTAINER = """import os
from chain.rpc.child_process import _Child
child = _Child("json.tool", "a child", 1 << 20, 1.0)  # echoes its stdin's JSON
answer, _ = child._process.communicate(b"[1]", timeout=30)
print(os.getpid(), child._process.returncode, answer == b"[\\n    1\\n]\\n")
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1)")
def test_a_child_of_a_node_that_is_pid_1_runs() -> None:
    """Fixed (was a strict xfail): `LAUNCH` took a parent of pid 1 for a parent gone before
    its prctl (its orphan adopted by init), but a node is pid 1 when it is a container's
    entrypoint (`docker run ... pbft-node run`): there every EVM and read child exited at
    once with status 1, and every eth_call, eth_estimateGas and heavy read failed with
    "execution failed: the EVM process exited with status 1". Here a node's stand-in is pid
    1 of a PID namespace of its own (unprivileged: a user namespace too)."""
    ran = subprocess.run(["unshare", "--user", "--map-root-user", "--pid", "--fork",
                          sys.executable, "-c", IN_A_CONTAINER], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    if ran.returncode and "unshare" in ran.stderr:
        pytest.skip(f"no namespaces here: {ran.stderr.strip()}")
    assert ran.stdout.split() == ["1", "0", "True"], ran.stderr  # pid 1; the child ran


# Finding 4: a WebSocket answer is held whole while it is made.

CLIENTS = 16
ANSWER_BYTES = 2_000_000  # each client's batch: 20 answers of 100 kB


class _Held:
    """The bytes of WebSocket answers being made (`_Collected`), all clients', and their
    peak."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = self.peak = 0
        held = self

        class Counted(dispatcher_module._Collected):
            async def put(self, piece: bytes) -> None:
                await super().put(piece)
                held.now += len(piece)
                held.peak = max(held.peak, held.now)

        handle_payload = Dispatcher.handle_payload

        async def counted(self: Dispatcher, *args: Any) -> bytes | None:
            answer = await handle_payload(self, *args)
            held.now -= 0 if answer is None else len(answer)
            return answer

        monkeypatch.setattr(dispatcher_module, "_Collected", Counted)
        monkeypatch.setattr(Dispatcher, "handle_payload", counted)


HELD_BOUND = 8_000_000  # the node's bound on WebSocket answers being made, made small here


def test_websocket_answers_being_made_are_held_within_the_nodes_bound(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session 13 streams an HTTP answer as it is paid for (a part of 256 KiB held at a
    time, `_HttpAnswer`), but a WebSocket's is collected whole (`handle_payload`'s
    `_Collected`: a message goes in one frame), then joined for the outbox. The answers'
    budget shares its rate among the payers as a processor is, so k clients' batches were
    made side by side and each held all it had made until its last piece: k x 25 MB before
    any was done (256 connections: 6.4 GB in ~400 s of the 16 MiB/s budget), none of it in
    `rpc_websocket_outbox_bytes`; 16 clients' 2 MB batches held ~31 MB at once. Fixed: the
    node holds at most MAX_HELD_ANSWER_BYTES of them (8 MB here); a call whose answer does
    not fit is answered "server busy" (BUSY_ANSWERS), and what a batch held is given back
    when its answer is made."""

    async def sized() -> str:
        return "a" * (ANSWER_BYTES // 20)

    held = _Held(monkeypatch)
    budget = BodyBudget(64 * 1024 * 1024, 1024 * 1024)
    batch = orjson.dumps([_call("sized", i) for i in range(20)]).decode()
    dispatcher = Dispatcher({"sized": sized})
    dispatcher._held_answers = HeldBytes(HELD_BOUND)

    async def clients() -> list[Any]:
        async with (websocket_server(BodyBudget(10**9, 10**9), dispatcher)
                    as listening, aiohttp.ClientSession() as session):
            sockets = [await session.ws_connect(listening.make_url("/"))
                       for _ in range(CLIENTS)]
            await asyncio.gather(*(socket.send_str(batch) for socket in sockets))
            return [orjson.loads(a) for a in
                    await asyncio.gather(*(socket.receive_str() for socket in sockets))]

    monkeypatch.setattr(RpcServer, "_payment", lambda _self, _request: budget.spend)
    answers = asyncio.run(asyncio.wait_for(clients(), 30))
    assert all(len(answer) == 20 for answer in answers)
    busy = [item for answer in answers for item in answer if "error" in item]
    assert busy and all(item["error"]["message"] == BUSY_ANSWERS.message for item in busy)
    assert held.peak <= HELD_BOUND + 20 * CLIENTS * 200, f"{held.peak / 1e6:.1f} MB held"
    assert dispatcher._held_answers.held == 0


# Finding 5: the children's share of a core is each child's, not the node's.


class _ComputingChildren:
    """Children that compute whenever they are not stopped (their CPU as `_pace` reads it:
    the wall time they ran since last looked at), and how long they ran in all."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ran: dict[int, float] = {}
        self._since: dict[int, float] = {}  # running since (absent: stopped)
        self._lock = threading.Lock()
        send_signal = subprocess.Popen.send_signal

        def signalled(process: subprocess.Popen[bytes], sig: int) -> None:
            with self._lock:
                self._account(process.pid)
                if sig == signal.SIGSTOP:
                    self._since.pop(process.pid, None)
                elif sig == signal.SIGCONT:
                    self._since[process.pid] = time.monotonic()
            send_signal(process, sig)

        monkeypatch.setattr(subprocess.Popen, "send_signal", signalled)
        monkeypatch.setattr(child_process, "cpu_seconds", self.cpu_seconds)

    def start(self, pid: int) -> None:
        self.ran[pid], self._since[pid] = 0.0, time.monotonic()

    def _account(self, pid: int) -> None:
        if (since := self._since.get(pid)) is not None:
            now = time.monotonic()
            self.ran[pid] += now - since
            self._since[pid] = now

    def cpu_seconds(self, pid: int) -> float:
        with self._lock:
            self._account(pid)
            return self.ran[pid]


def test_a_nodes_children_together_compute_within_the_share_while_blocks_come(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """`_Child._pace` holds each child to its share of a core (0.25) while the chain makes
    blocks, but a node has a child per EVM worker and one per read worker (1 + READ_WORKERS
    = 3 by default) and nothing adds their shares up: looping eth_calls and a cold heavy
    read on each read worker may compute 0.75 of a core beside the validators, on this 2-core
    machine where any process computing beside them slowed consensus 1.6-1.9 times (the
    CHANGELOG, session 13: "The RPC's child processes compute at most a quarter of a core";
    its hostile row measured each attack alone). Measured with three real EVM children at
    a share of 0.1 looping together on an idle machine: 0.39 s of CPU in 1.8 s, 0.22 of a
    core. Here (the machine is shared: real CPU under load says little) three children
    that compute whenever they are not stopped, paced as a node's are, for 3 s (their first
    PACE_SECONDS, before any look, are unpaced). Fixed: the share is the node's, divided
    among the children working (`_Working`)."""
    computing = _ComputingChildren(monkeypatch)
    children = [child_process._Child("json.tool", "child", 1 << 20, 0.25)  # idle: stdin
                for _ in range(1 + READ_WORKERS)]
    monkeypatch.setattr(child_process, "_last_block", math.inf)  # blocks keep coming

    def working(child: child_process._Child) -> None:
        computing.start(child.pid)
        ends = time.monotonic() + 3.0
        while time.monotonic() < ends:  # a request's waits for the child's answer
            with contextlib.suppress(child_process._Late):
                child._wait(ends, writing=False)

    try:
        started = time.monotonic()
        with ThreadPoolExecutor(len(children)) as threads:
            list(threads.map(working, children))
        share = sum(computing.ran.values()) / (time.monotonic() - started)
    finally:
        for child in children:
            child.kill()
    assert share < 0.25 * 1.2, f"together {share:.2f} of a core"


# Finding 6: pbft_getCheckpoints over a wide range is decoded on the loop that votes.

INTERVAL = 10  # the default checkpoint interval (K)


def _stable_checkpoints(store: MemoryConsensusStore, first: int, last: int) -> None:
    """A stable checkpoint every INTERVAL blocks in [first, last], each proven by Q = 3."""
    store.apply([Put(StoreName.STABLE_CHECKPOINTS, u64(n), rlp.encode([
        Signed(Checkpoint(n, n.to_bytes(32, "big"), bytes(32), r), bytes(65)).encode()
        for r in range(3)])) for n in range(first, last + 1, INTERVAL)])


def _engine_methods(records: ConsensusRecords) -> dict[str, Any]:
    """The pbft engine's RPC methods as a validator serves them, over `records`."""
    validators = tuple(bytes([i]) * 20 for i in range(1, 5))
    engine = SimpleNamespace(records=records, feed=None, context=None,
                             engine_params=EngineParams(1337, validators),
                             log=logging.getLogger("pbft"))
    methods: dict[str, Any] = PbftEngine.rpc_methods(engine)  # type: ignore[arg-type]
    return methods


async def _turns_while(work: Awaitable[Any]) -> tuple[int, float]:
    """How many turns the event loop gave a 1 ms ticker while `work` ran, and the longest
    it went without one (seconds)."""
    turns, longest, last = 0, 0.0, time.monotonic()
    done = False

    async def ticking() -> None:
        nonlocal turns, longest, last
        while not done:
            await asyncio.sleep(0.001)
            now = time.monotonic()
            turns, longest, last = turns + 1, max(longest, now - last), now

    ticker = asyncio.create_task(ticking())
    await asyncio.sleep(0.01)
    turns, longest, last = 0, 0.0, time.monotonic()
    try:
        await work
    finally:
        done = True
        await ticker
    return turns, longest


def test_a_wide_range_of_checkpoints_does_not_hold_the_loop_that_votes() -> None:
    """Fixed (was a strict xfail): the engine's range methods were served on the event
    loop that carries consensus (pbft_engine/engine.py `rpc_methods`: `records.checkpoints`
    called in the coroutine). `pbft_getCheckpoints(0x1, 0x2710)` (MAX_RANGE: 10,000
    seqNos, 1,000 stable checkpoints at K = 10) decodes each stable checkpoint's Q signed
    messages: 113-245 ms of the loop for a range not in session 13's cache, a ~1.08 MB
    answer. The cache (4 MiB) holds ~2.5 such ranges, so a client cycling 3 ranges of a
    chain past 30,000 blocks is never served from it; the answers' budget (16 MiB/s) lets
    ~15 such answers out a second, ~1.7 s of the loop's work a second: one client
    saturated the loop that votes (with K = 1, 10,000 checkpoints a call: ~1.2 s at once).
    Now they run on the read workers, as block bundles call them (`engine_ranges_on`): the
    loop took 1 turn during such a call (held 245 ms) before, 27 after (held 12 ms at most,
    the interpreter's switch interval and the machine's)."""
    store = MemoryConsensusStore()
    _stable_checkpoints(store, INTERVAL, 10_000)
    records = ConsensusRecords(store, lambda: EpochSchedule.genesis((bytes(20),) * 4))
    engine = _engine_methods(records)
    reads = WorkerPool(READ_WORKERS, MAX_PENDING_READS, "read")
    dispatcher = Dispatcher(engine | engine_ranges_on(reads, engine))
    body = orjson.dumps({**_call("pbft_getCheckpoints"), "params": ["0x1", "0x2710"]})

    async def served() -> tuple[int, float, int]:
        answer: list[bytes | None] = []

        async def answered() -> None:
            answer.append(await dispatcher.handle_payload(body))

        turns, stall = await _turns_while(answered())
        assert answer[0] is not None
        return turns, stall, len(orjson.loads(answer[0])["result"])

    try:
        turns, stall, entries = asyncio.run(served())
    finally:
        reads.close()
    assert entries == 1_000
    # on the loop: one turn at most meanwhile (the call's work is one step of it)
    assert turns >= 10, f"{turns} turns of the loop; it was held {stall * 1000:.0f} ms"


# Finding 7: batches of light reads take the loop that votes; the request budget bounds
# their bytes, not their work.

STATE_READ_SECONDS = 0.00024  # an eth_getBalance on the testnet's node: 238 ms a 1,000-batch


async def _state_read() -> str:
    """A light read as the node serves it, on the event loop (eth_getBalance: a state
    lookup, ~0.24 ms a call measured through a batch of 1,000 on a validator)."""
    ends = time.perf_counter() + STATE_READ_SECONDS
    while time.perf_counter() < ends:
        pass
    return "0xd3c21bcecceda1000000"


async def _loop_lateness(seconds: float) -> list[float]:
    """How late a 5 ms tick ran, each time, for `seconds` (as consensus's timers and
    messages wait for their turn)."""
    late: list[float] = []
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        due = time.monotonic() + 0.005
        await asyncio.sleep(0.005)
        late.append(time.monotonic() - due)
    return late


def test_batches_of_light_reads_do_not_make_the_loop_late() -> None:
    """A batch runs its calls on the event loop, yielding between two (`_batch`'s
    `sleep(0)`), and lookups that cost less than the hop to a thread (a balance, a nonce,
    code, a receipt) run there: nothing bounds the loop's time they take but the request
    budget, which counts their bytes. A batch of 1,000 eth_getBalance is 127 kB, ~0.8% of
    a second of the budget, and 238 ms of the loop on a validator of the testnet (~1,500
    times what the budget's bytes cost the loop to parse); with k batches in flight each
    turn of the loop runs k calls before consensus's next message. Measured on the
    4-validator testnet (a machine loaded by others, load ~7): 128 connections each
    pipelining 2 such batches to the primary (32 MB of bodies, 2 s of the budget) made its
    eth_chainId p50 / max 10 / 90 -> 326 / 1,287 ms and the honest transfers through a
    backup p50 / p90 262 / 354 -> 713 / 2,083 ms; a client that leaves has its batches run
    to their end all the same (nothing is written before 256 KiB of answers). The
    governor that paces the read workers' threads (a loop late by over 10 ms makes client
    work rest) does not see this work. Here 128 batches of 100 (each decoded on the loop,
    as a body under 16 KiB is) in flight: the loop ran ~90 ms late at every tick. Fixed:
    calls are admitted one per turn of the loop (`LoopTurns`): ~0.5 ms late."""
    dispatcher = Dispatcher({"eth_getBalance": _state_read})
    body = orjson.dumps([_call("eth_getBalance", i) for i in range(100)])

    async def flooded() -> list[float]:
        batches = [asyncio.create_task(dispatcher.handle_payload(body)) for _ in range(128)]
        try:
            await asyncio.sleep(0.05)
            return await _loop_lateness(0.5)
        finally:
            for batch in batches:
                batch.cancel()
            await asyncio.gather(*batches, return_exceptions=True)

    late = sorted(asyncio.run(flooded()))
    assert late[len(late) // 2] < 0.010, f"the loop late by {late[len(late) // 2] * 1000:.0f} ms"


# Rules that held.


def _state(pid: int) -> str:
    """A process's state (R, S, T: stopped, Z: a zombie), "gone" once reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


@pytest.mark.parametrize("meanwhile", ["the deadline passes", "the child is killed"])
def test_a_child_stopped_by_the_pacing_is_never_left_stopped(
    monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """The parent stops a child for 3 times what it computed (here, as it reads, 0.1 s
    between two looks: stopped 0.3 s each time, past its call's 0.5 s deadline); whatever
    happens meanwhile, the child is continued when the stop ends, the call ends (late, or
    the child gone) and the child is reaped: never left stopped, never a zombie."""
    signals: list[int] = []
    send_signal = subprocess.Popen.send_signal

    def signalled(process: subprocess.Popen[bytes], sig: int) -> None:
        signals.append(sig)
        send_signal(process, sig)

    monkeypatch.setattr(subprocess.Popen, "send_signal", signalled)
    child = child_process._Child("json.tool", "child", 1 << 20, 0.25)  # idle: its stdin
    computed = iter(range(100))
    monkeypatch.setattr(child_process, "cpu_seconds", lambda _pid: next(computed) * 0.1)
    monkeypatch.setattr(child_process, "_last_block", math.inf)  # blocks keep coming
    if meanwhile == "the child is killed":  # while it is stopped
        threading.Timer(0.2, os.kill, (child.pid, signal.SIGKILL)).start()
    deadline = time.monotonic() + 0.5
    with pytest.raises(child_process._Gone if meanwhile == "the child is killed"
                       else child_process._Late):
        while True:
            child._wait(deadline, writing=False)
            if meanwhile == "the child is killed":
                child._read(1, deadline + 10)  # its pipe: closed
    assert signals[:2] == [signal.SIGSTOP, signal.SIGCONT] and _state(child.pid) != "T"
    ended = child.kill()
    assert _state(child.pid) == "gone"
    assert ended == "was killed by SIGKILL"


def test_the_share_is_divided_among_the_children_working_only() -> None:
    """A child counts while it is looked at or stopped by its pacing, and no longer two
    PACE_SECONDS after: a child alone later has the node's whole share again."""
    working, now = child_process._Working(), 100.0
    assert working.count(1, now) == 1
    working.stopped_until(1, now + 1.0)  # resting a second: still one of the working
    assert working.count(2, now + 0.5) == 2
    assert working.count(2, now + 1.0 + 2 * child_process.PACE_SECONDS + 0.01) == 1
