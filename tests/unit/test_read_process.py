"""chain/rpc/read_process.py: the heavy reads answered in a child process, against the read
store's tests' chain (every transaction type, logs): the same JSON as the in-process reads
(chain/rpc/served.py, chain/rpc/bundles.py), a child killed mid-read, a deadline in the child
and past it, and a cache bounded in bytes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from chain.blockchain import Blockchain
from chain.rpc import eth
from chain.rpc.backend import RpcSettings
from chain.rpc.bundles import METHOD, BlockBundles
from chain.rpc.child_process import KILL_GRACE_SECONDS
from chain.rpc.errors import LIMIT_EXCEEDED, SERVER_ERROR, RpcError
from chain.rpc.eth import EthApi
from chain.rpc.filters import LogCriteria
from chain.rpc.limits import RpcLimits
from chain.rpc.read_process import (
    BLOCK_HASHES,
    FULL_BLOCK,
    LOGS,
    RECEIPTS,
    ReadProcess,
    ReadProcesses,
    ReadRequest,
    ReadWorkers,
)
from chain.rpc.served import ServedBlocks, WorkerPool
from testkit.nodes import wait_for
from tests.unit.test_block_bundles import ENGINE, LIMIT
from tests.unit.test_evm_process import gone
from tests.unit.test_read_store import chain as read_store_chain  # noqa: F401 (a fixture)


@pytest.fixture
def reads(read_store_chain: Blockchain) -> Iterator[ReadWorkers]:  # noqa: F811
    workers = ReadWorkers(read_store_chain, threads=1, max_pending=4)
    yield workers
    workers.close()


def json(reads: ReadWorkers, request: ReadRequest) -> Any:
    return orjson.loads(orjson.dumps(reads.json(request)))


def whole(kind: str, number: int, timeout: float = 5.0) -> ReadRequest:
    return ReadRequest(kind, head=number, first=number, timeout=timeout)


def refusal(reads: ReadWorkers, request: ReadRequest) -> RpcError:
    with pytest.raises(RpcError) as caught:
        reads.json(request)
    return caught.value


def bundles(chain: Blockchain, reads: WorkerPool, first: int, last: int,
            limit: int = LIMIT) -> Any:
    method = BlockBundles.methods_for(chain, reads, limit, ENGINE)[METHOD]
    return orjson.loads(orjson.dumps(asyncio.run(method(hex(first), hex(last)))))


def test_whole_blocks_are_the_in_process_json(read_store_chain: Blockchain,  # noqa: F811
                                              reads: ReadWorkers) -> None:
    served = ServedBlocks(read_store_chain)
    for number in range(read_store_chain.head().block_number + 1):
        block = served.block(read_store_chain.header_by_number(number))
        for _ in range(2):  # made, then kept
            assert json(reads, whole(FULL_BLOCK, number)) == block.json(True)
            assert json(reads, whole(BLOCK_HASHES, number)) == block.json(False)
            assert json(reads, whole(RECEIPTS, number)) == block.receipts


def test_bundles_are_the_in_process_ones_within_the_same_limit(
    read_store_chain: Blockchain, reads: ReadWorkers  # noqa: F811
) -> None:
    head = read_store_chain.head().block_number
    in_process = WorkerPool(1, 4, "read")
    try:
        for first, last, limit in ((0, head, LIMIT), (1, head + 5, LIMIT), (0, head, 30_000)):
            expected = bundles(read_store_chain, in_process, first, last, limit)
            assert bundles(read_store_chain, reads, first, last, limit) == expected
        assert 0 < len(expected) < head + 1  # the small limit cut the answer
        assert bundles(read_store_chain, reads, head + 1, head + 3) == []
    finally:
        in_process.close()


def test_logs_are_the_in_process_ones_and_bounded_alike(
    read_store_chain: Blockchain, reads: ReadWorkers  # noqa: F811
) -> None:
    served = ServedBlocks(read_store_chain)
    head = read_store_chain.head().block_number
    everything = LogCriteria.parse({})
    expected = list(served.logs(everything, 0, head))
    assert expected
    asked = ReadRequest(LOGS, head=head, first=0, numbers=tuple(range(head + 1)),
                        criteria=everything, max_results=len(expected))
    assert json(reads, asked) == expected
    error = refusal(reads, ReadRequest(LOGS, head=head, first=0, numbers=asked.numbers,
                                       criteria=everything, max_results=len(expected) - 1))
    assert (error.code, error.message) == (
        LIMIT_EXCEEDED, f"query returned more than {len(expected) - 1} results")


def child_pid(reads: ReadWorkers) -> int:
    (pid,) = reads.children.pids
    assert pid is not None
    return pid


def test_a_child_killed_mid_read_fails_that_read_and_the_next_one_works(
    read_store_chain: Blockchain, reads: ReadWorkers,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch
) -> None:
    head = read_store_chain.head().block_number
    expected = json(reads, whole(RECEIPTS, head))
    pid = child_pid(reads)
    answer = ReadProcess._block

    def killing(process: ReadProcess, number: int, last: int) -> bytes:
        os.kill(pid, signal.SIGKILL)  # while it waits for this block
        wait_for(lambda: gone(pid), 10, "the child to die")
        return answer(process, number, last)

    monkeypatch.setattr(ReadProcess, "_block", killing)
    error = refusal(reads, whole(RECEIPTS, head - 1))  # not read yet: the child asks for it
    assert (error.code, error.message) == (
        SERVER_ERROR,
        "read failed: the read process was killed by SIGKILL; the next call starts a new one")
    monkeypatch.setattr(ReadProcess, "_block", answer)
    assert json(reads, whole(RECEIPTS, head)) == expected
    assert child_pid(reads) != pid


def test_a_read_past_its_deadline_is_refused_by_the_child(
    read_store_chain: Blockchain, reads: ReadWorkers  # noqa: F811
) -> None:
    json(reads, whole(RECEIPTS, 0))  # started and ready
    pid = child_pid(reads)
    error = refusal(reads, whole(FULL_BLOCK, 1, timeout=0.0))
    assert (error.code, error.message) == (SERVER_ERROR, "read aborted (timeout = 0s)")
    assert child_pid(reads) == pid  # it stopped itself: kept


def test_a_child_that_stops_answering_is_killed_after_its_grace(
    read_store_chain: Blockchain, reads: ReadWorkers  # noqa: F811
) -> None:
    json(reads, whole(RECEIPTS, 0))
    pid = child_pid(reads)
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    error = refusal(reads, whole(RECEIPTS, 1, timeout=0.3))
    assert (error.code, error.message) == (SERVER_ERROR, "read aborted (timeout = 0.3s)")
    assert 0.3 + KILL_GRACE_SECONDS <= time.monotonic() - started < 0.3 + KILL_GRACE_SECONDS + 2
    assert gone(pid)
    assert json(reads, whole(RECEIPTS, 1)) == ServedBlocks(read_store_chain).block(
        read_store_chain.header_by_number(1)).receipts


@pytest.mark.parametrize(("cache_bytes", "asked_again"), [(64 * 1024 * 1024, False), (1, True)])
def test_the_child_keeps_blocks_within_its_cache_bytes(
    read_store_chain: Blockchain, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    cache_bytes: int, asked_again: bool
) -> None:
    asked: list[int] = []
    answer = ReadProcess._block

    def counted(process: ReadProcess, number: int, last: int) -> bytes:
        asked.append(number)
        return answer(process, number, last)

    monkeypatch.setattr(ReadProcess, "_block", counted)
    workers = ReadWorkers(read_store_chain, threads=1, max_pending=4, cache_bytes=cache_bytes)
    try:
        for kind in (FULL_BLOCK, RECEIPTS, FULL_BLOCK):
            json(workers, whole(kind, 1))
    finally:
        workers.close()
    assert asked == ([1, 1, 1] if asked_again else [1])


def test_the_child_never_reads_above_the_requests_head(
    read_store_chain: Blockchain, reads: ReadWorkers  # noqa: F811
) -> None:
    """What the child keeps must be final: a block above the head it is sent is missing."""
    head = read_store_chain.head().block_number
    process = reads.children._processes[0]
    assert process._block(head, head)[:1] == b"\x01"
    assert process._block(head, head - 1) == b"\x00"


class _Node:
    """What EthApi uses of a node, over the read store's tests' chain."""

    chain_id = 1

    def __init__(self, blockchain: Blockchain) -> None:
        self.blockchain = blockchain

    def rpc_settings(self) -> RpcSettings:
        return RpcSettings("127.0.0.1", 0, (), (), RpcLimits(), 50_000_000)

    def add_head_listener(self, listener: Any) -> None:
        pass


@pytest.mark.parametrize("in_process", [0, 1_000])
def test_a_small_block_is_read_whole_in_process_a_large_one_in_the_child(
    read_store_chain: Blockchain, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    in_process: int
) -> None:
    """Formatting a few transactions here costs less than the child's round trip, and a
    client polling the head is not answered after a nice-19 process's turn."""
    monkeypatch.setattr(eth, "IN_PROCESS_TRANSACTIONS", in_process)
    asked: list[ReadRequest] = []
    monkeypatch.setattr(ReadWorkers, "in_child", lambda self, request: (
        asked.append(request) or ReadProcesses.read(self.children, request)))
    api = EthApi(_Node(read_store_chain))  # type: ignore[arg-type]
    served = ServedBlocks(read_store_chain)
    head = read_store_chain.head().block_number
    try:
        for number in range(head + 1):
            block = served.block(read_store_chain.header_by_number(number))
            full = asyncio.run(api.eth_getBlockByNumber(hex(number), True))
            receipts = asyncio.run(api.eth_getBlockReceipts(hex(number)))
            assert orjson.loads(orjson.dumps(full)) == block.json(True)
            assert orjson.loads(orjson.dumps(receipts)) == block.receipts
    finally:
        api.close()
    larger = [n for n in range(head + 1)
              if served.transaction_count(read_store_chain.header_by_number(n)) > in_process]
    assert bool(larger) == (in_process == 0)
    assert [r.first for r in asked] == sorted(2 * larger)


@pytest.mark.parametrize("in_process", [0, 1_000])
def test_the_logs_of_a_few_small_blocks_are_matched_in_process_and_bounded_alike(
    read_store_chain: Blockchain, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
    in_process: int
) -> None:
    """A dapp polling the newest block's logs is not answered after a nice-19 process's
    turn; the logs and the MAX_LOG_RESULTS rule are the child's."""
    monkeypatch.setattr(eth, "IN_PROCESS_LOG_BLOCKS", in_process)
    monkeypatch.setattr(eth, "IN_PROCESS_TRANSACTIONS", in_process)
    asked: list[ReadRequest] = []
    monkeypatch.setattr(ReadWorkers, "in_child", lambda self, request: (
        asked.append(request) or ReadProcesses.read(self.children, request)))
    api = EthApi(_Node(read_store_chain))  # type: ignore[arg-type]
    head = read_store_chain.head().block_number
    expected = list(ServedBlocks(read_store_chain).logs(LogCriteria.parse({}), 0, head))
    every_block = {"fromBlock": "0x0", "toBlock": hex(head)}
    try:
        assert orjson.loads(orjson.dumps(asyncio.run(api.eth_getLogs(every_block)))) == expected
        monkeypatch.setattr(eth, "MAX_LOG_RESULTS", len(expected) - 1)
        with pytest.raises(RpcError) as caught:
            asyncio.run(api.eth_getLogs(every_block))
    finally:
        api.close()
    assert (caught.value.code, caught.value.message) == (
        LIMIT_EXCEEDED, f"query returned more than {len(expected) - 1} results")
    assert len(asked) == (0 if in_process else 2)
