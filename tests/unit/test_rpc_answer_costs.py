"""What an answer costs the node (issue 29's heavy-reads row): a stable checkpoint's entry is
made once from its stored proof, a bundle's final blocks are closed once, an HTTP answer is
written as the bytes the dispatcher made and paid for from the answers' budget before it is
written."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import aiohttp
import orjson
import pytest
import rlp
from aiohttp.test_utils import TestServer

from chain.blockchain import Blockchain
from chain.metrics import NodeMetrics
from chain.rpc import child_process
from chain.rpc.bundles import METHOD, BlockBundles
from chain.rpc.child_process import BUSY_SECONDS, chain_busy, mark_block
from chain.rpc.dispatcher import Dispatcher
from chain.rpc.limits import RpcLimits
from chain.rpc.read_process import ReadWorkers
from chain.rpc.server import WRITE_PART, BodyBudget, HttpCuts, RpcServer
from pbft_engine import rpc_records
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.core.records import Put, StoreName, u16, u64
from pbft_engine.messages import Checkpoint, Signed
from pbft_engine.record_store import MemoryConsensusStore
from pbft_engine.rpc_records import ConsensusRecords
from tests.unit.test_read_process import reads  # noqa: F401 (a fixture)
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
        rpc._http_cuts = HttpCuts(NodeMetrics().http_disconnects)
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


def test_a_batch_is_paid_as_it_is_made_and_written_in_parts() -> None:
    """Three 300 kB answers and 997 short ones: paid as they are made, at least every
    ANSWER_PAYMENT bytes (the batch's work and its writing go at the budget's rate), not
    once a call, and streamed as made (chunked), never held whole."""
    size = 300_000
    batch = [_call("big", i) for i in range(3)] + [_call("one", i) for i in range(3, 1_000)]
    answers, budget, _ = asyncio.run(_post_twice(batch, size, 10**9, 10**9))
    assert [[a["result"] for a in answer] for answer in answers] == [
        ["a" * (size - 2)] * 3 + [1] * 997] * 2
    assert budget.payments == 2 * 4  # each large answer, then the short ones together


def test_answers_beyond_the_burst_wait_for_the_rate() -> None:
    """The second 200 kB answer, beyond a 250 kB burst, waits ~150 kB / 1 MB/s."""
    _, _, seconds = asyncio.run(_post_twice(_call("big"), 200_000, 1_000_000, 250_000))
    assert seconds >= 0.14


def test_the_chain_is_busy_for_a_while_after_each_block() -> None:
    """The children's share of a core holds while blocks come (`_Child._pace`)."""
    child_process._last_block = -math.inf
    assert not chain_busy()
    mark_block()
    assert chain_busy()
    child_process._last_block -= BUSY_SECONDS
    assert not chain_busy()
