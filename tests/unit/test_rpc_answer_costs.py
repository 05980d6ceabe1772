"""What an answer costs the node (issue 29's heavy-reads row): a stable checkpoint's entry is
made once from its stored proof, a bundle's final blocks are closed once, an HTTP answer is
written as the bytes the dispatcher made and paid for from the answers' budget before it is
written."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import aiohttp
import orjson
import pytest
import rlp
from aiohttp.test_utils import TestServer

from chain.blockchain import Blockchain
from chain.rpc import served
from chain.rpc.bundles import METHOD, BlockBundles
from chain.rpc.child_process import BlockClock
from chain.rpc.dispatcher import Dispatcher
from chain.rpc.limits import RpcLimits
from chain.rpc.read_process import ReadWorkers
from chain.rpc.server import WRITE_PART, BodyBudget, RpcServer
from pbft_engine import rpc_records
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.core.records import Put, StoreName, u16, u64
from pbft_engine.messages import Checkpoint, Signed
from pbft_engine.record_store import MemoryConsensusStore
from pbft_engine.rpc_records import ConsensusRecords
from tests.unit.test_read_store import chain as read_store_chain  # noqa: F401 (a fixture)

STABLE, PENDING = 10, 20


def _checkpoint(seq_no: int, replica: int) -> bytes:
    body = Checkpoint(seq_no, bytes([seq_no]) * 32, bytes([7]) * 32, replica)
    return Signed(body, bytes(65)).encode()


def _records() -> ConsensusRecords:
    store = MemoryConsensusStore()
    proof = rlp.encode([_checkpoint(STABLE, r) for r in range(3)])
    store.apply([Put(StoreName.STABLE_CHECKPOINTS, u64(STABLE), proof),
                 Put(StoreName.CHECKPOINTS, u64(PENDING) + u16(0), _checkpoint(PENDING, 0))])
    return ConsensusRecords(store, lambda: EpochSchedule.genesis((bytes(20),) * 4))


def test_a_stable_checkpoint_is_made_once_and_each_reader_gets_its_own(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _records()
    decoded: list[bytes] = []
    decode = rpc_records.decode_signed_bytes

    def counting(data: bytes, expected: Any = None) -> Any:
        decoded.append(data)
        return decode(data, expected)

    monkeypatch.setattr(rpc_records, "decode_signed_bytes", counting)
    first = records.checkpoints(0, 100)
    assert [(c["seqNo"], c["stable"], len(c["proof"])) for c in first] == [
        (hex(STABLE), True, 3), (hex(PENDING), False, 1)]
    assert first[0]["proof"][0] == "0x" + _checkpoint(STABLE, 0).hex()  # the stored bytes
    assert len(decoded) == 4
    first[0]["proof"].clear()  # a reader's own: the next one is whole
    again = records.checkpoints(0, 100)
    assert len(again[0]["proof"]) == 3 and again[1:] == first[1:]
    assert len(decoded) == 5  # only the pending one was decoded again


@pytest.fixture
def reads(read_store_chain: Blockchain) -> Any:  # noqa: F811
    workers = ReadWorkers(read_store_chain, threads=1, max_pending=4)
    yield workers
    workers.close()


def test_a_bundles_block_is_kept_closed_once_final_and_never_before(
    read_store_chain: Blockchain, reads: ReadWorkers  # noqa: F811
) -> None:
    """Final: its certificate written and a stable checkpoint at or above it. A pending
    checkpoint's block, a block above the last stable one and a block without a certificate
    are closed again at each read (their entries change)."""
    head = read_store_chain.head().block_number
    assert head >= 4
    stable: dict[str, bool] = {"yes": False}

    async def certificate(number: str) -> dict[str, Any] | None:
        return None if int(number, 16) == 1 else {"blockNumber": number}

    async def checkpoints(first: str, last: str) -> list[dict[str, Any]]:
        return [{"seqNo": "0x2", "stable": stable["yes"]}] if int(first, 16) <= 2 else []

    engine = {"pbft_getCommitCertificate": certificate, "pbft_getCheckpoints": checkpoints}
    method = BlockBundles.methods_for(read_store_chain, reads, 25_000_000, engine)[METHOD]
    bundles: BlockBundles = method.__self__  # type: ignore[attr-defined]

    def ask() -> list[dict[str, Any]]:
        made = asyncio.run(method("0x0", hex(head)))
        answer: list[dict[str, Any]] = orjson.loads(orjson.dumps(made))
        return answer

    assert ask()[2]["checkpoints"] == [{"seqNo": "0x2", "stable": False}]
    assert bundles._closed_blocks.bytes == 0  # nothing final yet
    stable["yes"] = True
    answer = ask()
    assert answer[2]["checkpoints"] == [{"seqNo": "0x2", "stable": True}]
    assert answer[1]["certificate"] is None
    kept = {int.from_bytes(k, "big") for k in bundles._closed_blocks._values}
    assert kept == {0, 2}
    assert ask() == answer


def _dispatcher(size: int) -> Dispatcher:
    """A node's dispatcher whose `big` answers `size` bytes of JSON and `one` answers 1."""

    async def big() -> str:
        return "a" * (size - 2)

    async def one() -> int:
        return 1

    return Dispatcher({"big": big, "one": one})


def _call(method: str, call_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": call_id, "method": method, "params": []}


def test_a_client_that_takes_none_of_its_answer_is_cut_and_its_batch_stops() -> None:
    """A batch of 100 calls answering 1 MB each, its client reading nothing: within the
    read timeout of a part it cannot write the node cuts the client, and the batch's later
    calls are not run."""
    calls = 0

    async def big() -> str:
        nonlocal calls
        calls += 1
        return "a" * 1_000_000

    async def stalled() -> BaseException | None:
        rpc = object.__new__(RpcServer)  # only its HTTP handler: no node behind it
        rpc.limits = RpcLimits(read_timeout=0.5)
        rpc.host_allowlist, rpc.cors_origins, rpc._websockets = {"*"}, set(), {}
        rpc._body_budget = BodyBudget(10**9, 10**9)
        rpc._answer_budget = BodyBudget(10**9, 10**9)
        rpc.dispatcher = dispatcher = Dispatcher({"big": big})
        answered = asyncio.get_running_loop().create_future()
        answer_into = dispatcher.answer_into

        async def watched(*args: Any) -> None:
            try:
                await answer_into(*args)
            except BaseException as exc:
                answered.set_result(exc)
                raise
            answered.set_result(None)

        dispatcher.answer_into = watched  # type: ignore[method-assign]
        async with TestServer(rpc._app()) as listening:
            _, writer = await asyncio.open_connection(listening.host, listening.port)
            body = orjson.dumps([_call("big", i) for i in range(100)])
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            try:
                async with asyncio.timeout(30):
                    return await answered
            finally:
                writer.transport.abort()

    assert type(asyncio.run(stalled())).__name__ == "_ClientGone"
    assert calls < 100


class _Paid(BodyBudget):
    def __init__(self, rate: int, burst: int) -> None:
        super().__init__(rate, burst)
        self.paid = self.payments = 0

    def charge(self, size: int) -> float:
        self.paid += size
        self.payments += 1
        return super().charge(size)


async def _post_twice(request: Any, size: int, rate: int, burst: int,
                      ) -> tuple[list[Any], _Paid, float]:
    """`request` twice to the node's HTTP handler alone (its `big` answering `size` bytes),
    paid from a budget of `rate` bytes a second: the answers, the budget, the seconds."""
    rpc = object.__new__(RpcServer)  # only its HTTP handler: no node behind it
    rpc.limits = RpcLimits()
    rpc.host_allowlist, rpc.cors_origins, rpc._websockets = {"*"}, set(), {}
    rpc._body_budget = BodyBudget(rpc.limits.max_body_rate, rpc.limits.max_body_bytes)
    rpc._answer_budget = budget = _Paid(rate, burst)
    rpc.dispatcher = _dispatcher(size)
    async with TestServer(rpc._app()) as listening, aiohttp.ClientSession() as client:
        started = asyncio.get_running_loop().time()
        answers = []
        for _ in range(2):
            async with client.post(listening.make_url("/"), data=orjson.dumps(request),
                                   headers={"Content-Type": "application/json"}) as reply:
                assert reply.headers["Content-Type"] == "application/json; charset=utf-8"
                body = await reply.read()
                streamed = reply.headers.get("Transfer-Encoding") == "chunked"
                assert streamed == (len(body) >= WRITE_PART), reply.headers
                answers.append(orjson.loads(body))
        return answers, budget, asyncio.get_running_loop().time() - started


@pytest.mark.parametrize("size", [200_000, 1_000_000])  # written whole / streamed in parts
def test_an_answer_is_paid_for_from_the_answers_budget(size: int) -> None:
    answers, budget, _ = asyncio.run(_post_twice(_call("big"), size, 10**9, 10**9))
    assert [a["result"] for a in answers] == ["a" * (size - 2)] * 2
    assert budget.payments == 2 and budget.paid > 2 * size


def test_a_batch_is_paid_call_by_call_as_it_is_made_and_written_in_parts() -> None:
    """Three 300 kB answers and 997 short ones: each call's answer paid before the next
    call runs (the batch's work and its writing go at the budget's rate), the answer
    streamed as it is made (chunked), never held whole."""
    size = 300_000
    batch = [_call("big", i) for i in range(3)] + [_call("one", i) for i in range(3, 1_000)]
    answers, budget, _ = asyncio.run(_post_twice(batch, size, 10**9, 10**9))
    assert [[a["result"] for a in answer] for answer in answers] == [
        ["a" * (size - 2)] * 3 + [1] * 997] * 2
    assert budget.payments == 2 * 1_001  # each call's answer, and the closing bracket


def test_answers_beyond_the_burst_wait_for_the_rate() -> None:
    """The second 200 kB answer, beyond a 250 kB burst, waits ~150 kB / 1 MB/s."""
    _, _, seconds = asyncio.run(_post_twice(_call("big"), 200_000, 1_000_000, 250_000))
    assert seconds >= 0.14


class _Clock:
    """time for CpuShare: a process that computes every moment it is not asleep."""

    def __init__(self) -> None:
        self.now = self.cpu = self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def process_time(self) -> float:
        return self.cpu

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds

    def compute(self, seconds: float) -> None:
        self.now += seconds
        self.cpu += seconds


@pytest.mark.parametrize("share", [0.25, 0.5])
def test_a_cpu_share_rests_what_its_share_leaves(monkeypatch: pytest.MonkeyPatch,
                                                 share: float) -> None:
    clock = _Clock()
    monkeypatch.setattr(served, "time", clock)
    pace = served.CpuShare(share, busy=lambda: True)
    while clock.now < 10:
        clock.compute(0.001)
        pace.check(clock.monotonic())
    assert clock.cpu / clock.now == pytest.approx(share, rel=0.05)


def test_a_cpu_share_rests_for_what_was_computed_not_for_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A slice spent mostly waiting for a core (a loaded machine) rests for its CPU only."""
    clock = _Clock()
    monkeypatch.setattr(served, "time", clock)
    pace = served.CpuShare(0.25, busy=lambda: True)
    clock.compute(0.002)
    clock.now += 0.1  # waited for a core
    pace.check(clock.monotonic())
    assert clock.slept == pytest.approx(0.006)


def test_a_cpu_share_rests_only_while_the_chain_makes_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(served, "time", clock)
    busy = {"now": False}
    pace = served.CpuShare(0.25, busy=lambda: busy["now"])
    while clock.now < 5:
        clock.compute(0.001)
        busy["now"] = clock.now >= 4  # blocks come for the last second
        pace.check(clock.monotonic())
    assert clock.slept == pytest.approx(0.75, rel=0.05)  # 3/4 of the busy second


@pytest.mark.parametrize("tail", ["calls", "notifications"])
def test_a_batch_past_its_size_limit_answers_the_rest_in_one_piece(tail: str) -> None:
    """Past the 25 MB limit the rest of a batch is refused unrun, its answers put (and paid)
    as one piece: each had cost a payment and a turn of the loop. Notifications get none."""
    dispatcher = _dispatcher(10_000_000)
    rest = ([_call("one", i) for i in range(3, 1_000)] if tail == "calls" else
            [{"jsonrpc": "2.0", "method": "one", "params": []}] * 997)
    puts: list[int] = []

    async def pay(size: int) -> None:
        puts.append(size)

    batch = [_call("big", i) for i in range(3)] + rest
    answer = orjson.loads(asyncio.run(dispatcher.handle_payload(orjson.dumps(batch),
                                                                pay=pay)) or b"null")
    errors = [a["error"]["message"] for a in answer if "error" in a]
    assert [a.get("result", "") != "" for a in answer[:2]] == [True, True]
    if tail == "calls":
        assert len(answer) == 1_000 and errors == ["response too large"] * 998
        assert len(puts) == 4  # three calls' answers, then the rest with the bracket
    else:
        assert len(answer) == 3 and errors == ["response too large"]
        assert len(puts) == 4  # three calls' answers, then the closing bracket


def test_a_child_sees_the_blocks_its_parent_commits() -> None:
    """The block clock is one for the node and its children (a memfd they map): a child
    started before the block sees it, and a chain idle for BUSY_SECONDS is not busy."""
    clock = BlockClock.create()
    assert not clock.busy()
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from chain.rpc.child_process import block_clock;"
         " sys.stdin.readline(); print(block_clock().busy(), flush=True)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, pass_fds=(clock.fd,),
        env={**os.environ, BlockClock.ENV: str(clock.fd), "PYTHONPATH": os.getcwd()})
    clock.mark()
    answer, _ = child.communicate("go\n", timeout=60)
    assert answer.strip() == "True"
    assert clock.busy()
