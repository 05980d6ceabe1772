"""What an answer costs the node (issue 29's heavy-reads row): a stable checkpoint's entry is
made once from its stored proof, a bundle's final blocks are closed once, an HTTP answer is
written as the bytes the dispatcher made and paid for from the answers' budget before it is
written."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
import rlp
from aiohttp.test_utils import TestServer

from chain.blockchain import Blockchain
from chain.rpc import served
from chain.rpc.bundles import METHOD, BlockBundles
from chain.rpc.limits import RpcLimits
from chain.rpc.read_process import ReadWorkers
from chain.rpc.server import BodyBudget, RpcServer
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


class _Answers:
    """The dispatcher of a node that answers each request with `size` bytes of JSON."""

    def __init__(self, size: int) -> None:
        self.answer = b'"' + b"a" * (size - 2) + b'"'

    async def handle_payload(self, body: bytes, session: object = None) -> bytes:
        return self.answer


class _Paid(BodyBudget):
    def __init__(self, rate: int, burst: int) -> None:
        super().__init__(rate, burst)
        self.paid = 0

    def charge(self, size: int) -> float:
        self.paid += size
        return super().charge(size)


async def _post_twice(size: int, rate: int, burst: int) -> tuple[list[bytes], int, float]:
    """Two requests to the node's HTTP handler alone, its answers `size` bytes and paid from
    a budget of `rate` bytes a second: the answers, what was paid, the seconds taken."""
    rpc = object.__new__(RpcServer)  # only its HTTP handler: no node behind it
    rpc.limits = RpcLimits()
    rpc.host_allowlist, rpc.cors_origins, rpc._websockets = {"*"}, set(), {}
    rpc._body_budget = BodyBudget(rpc.limits.max_body_rate, rpc.limits.max_body_bytes)
    rpc._answer_budget = budget = _Paid(rate, burst)
    rpc.dispatcher = _Answers(size)  # type: ignore[assignment]
    async with TestServer(rpc._app()) as listening, aiohttp.ClientSession() as client:
        started = asyncio.get_running_loop().time()
        answers = []
        for _ in range(2):
            async with client.post(listening.make_url("/"), data=b"{}",
                                   headers={"Content-Type": "application/json"}) as reply:
                assert reply.headers["Content-Type"] == "application/json; charset=utf-8"
                answers.append(await reply.read())
        return answers, budget.paid, asyncio.get_running_loop().time() - started


def test_an_answer_is_the_dispatchers_bytes_paid_for_before_it_is_written() -> None:
    size = 200_000
    answers, paid, _ = asyncio.run(_post_twice(size, rate=10**9, burst=10**9))
    assert answers == [_Answers(size).answer] * 2
    assert paid == 2 * size


def test_answers_beyond_the_burst_wait_for_the_rate() -> None:
    """The second 200 kB answer, beyond a 250 kB burst, waits ~150 kB / 1 MB/s."""
    _, _, seconds = asyncio.run(_post_twice(200_000, rate=1_000_000, burst=250_000))
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
    pace = served.CpuShare(share)
    while clock.now < 10:
        clock.compute(0.001)
        pace.check(clock.monotonic())
    assert clock.cpu / clock.now == pytest.approx(share, rel=0.05)


def test_a_cpu_share_rests_for_what_was_computed_not_for_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A slice spent mostly waiting for a core (a loaded machine) rests for its CPU only."""
    clock = _Clock()
    monkeypatch.setattr(served, "time", clock)
    pace = served.CpuShare(0.25)
    clock.compute(0.002)
    clock.now += 0.1  # waited for a core
    pace.check(clock.monotonic())
    assert clock.slept == pytest.approx(0.006)
