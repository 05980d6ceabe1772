"""The governor of client work (chain/rpc/served.py): units of work from every pool run one at a
time, a long one shares the turn, and the holder rests as long as it worked only while the
event loop is late (real threads, a real event loop); large batch answers are joined on a
worker (chain/rpc/dispatcher.py)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from chain.rpc.dispatcher import INLINE_ANSWER_BYTES, Dispatcher
from chain.rpc.served import (
    GOVERNOR,
    LOOP_LATE_SECONDS,
    PULSE_SECONDS,
    SLICE_SECONDS,
    LoopPulse,
    WorkerPool,
)

WORK_SECONDS = 0.3  # of a unit that measures its pauses
DEADLINE = 10.0


def _spin(seconds: float) -> None:
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        pass


@dataclass
class Measured:
    wall: float
    cpu: float  # the thread's own
    paused: float  # in checkpoints (rests)


def _work(seconds: float) -> Measured:
    """Works `seconds` in small steps with a checkpoint between."""
    started, cpu = time.monotonic(), time.thread_time()
    paused = 0.0
    while time.monotonic() - started < seconds:
        _spin(0.00005)
        before = time.monotonic()
        GOVERNOR.checkpoint()
        paused += time.monotonic() - before
    return Measured(time.monotonic() - started, time.thread_time() - cpu, paused)


def test_units_of_every_pool_run_one_at_a_time() -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def unit() -> None:
        """10 ms of work, counted as running between its checkpoints."""
        nonlocal running, most
        ends = time.monotonic() + 0.01
        while time.monotonic() < ends:
            with lock:
                running += 1
                most = max(most, running)
            _spin(0.0001)
            with lock:
                running -= 1
            GOVERNOR.checkpoint()

    async def scenario() -> None:
        pools = [WorkerPool(2, 64, f"test-{i}") for i in range(3)]
        await asyncio.wait_for(
            asyncio.gather(*(pool.run(unit) for pool in pools for _ in range(8))), DEADLINE)
        for pool in pools:
            pool.close()

    asyncio.run(scenario())
    assert most == 1


def test_a_long_unit_passes_the_turn_to_the_others() -> None:
    short_done = threading.Event()

    def long_unit() -> bool:
        """Works until the short unit, queued behind it, has run."""
        ends = time.monotonic() + DEADLINE
        while not short_done.is_set() and time.monotonic() < ends:
            _work(0.001)
        return short_done.is_set()

    async def scenario() -> bool:
        executions, reads = WorkerPool(1, 4, "test-long"), WorkerPool(1, 4, "test-short")
        long_run = asyncio.ensure_future(executions.run(long_unit))
        await asyncio.sleep(0.05)
        await reads.run(short_done.set)
        finished = await long_run
        executions.close()
        reads.close()
        return finished

    assert asyncio.run(scenario())


def test_the_loop_is_late_by_its_last_beat_or_the_one_it_owes() -> None:
    pulse = LoopPulse()
    now = time.monotonic()
    pulse.due, pulse.lag = now + PULSE_SECONDS / 2, 0.0
    assert not pulse.late(now)
    pulse.due = now - LOOP_LATE_SECONDS / 2  # due: the loop has not had its turn yet
    assert not pulse.late(now)
    pulse.due = now - 2 * LOOP_LATE_SECONDS
    assert pulse.late(now)
    pulse.due, pulse.lag = now + PULSE_SECONDS / 2, 2 * LOOP_LATE_SECONDS
    assert pulse.late(now)


def test_client_work_takes_at_most_half_while_the_loop_is_late() -> None:
    async def late() -> Measured:
        """The loop's callbacks block it (without the interpreter) past a beat and
        LOOP_LATE_SECONDS: every beat is late."""
        pool = WorkerPool(1, 4, "test-late")
        work = asyncio.ensure_future(pool.run(_work, WORK_SECONDS))
        while not work.done():
            time.sleep(PULSE_SECONDS + 2 * LOOP_LATE_SECONDS)
            await asyncio.sleep(0)
        pool.close()
        return work.result()

    resting = asyncio.run(late())
    # As long as it worked (its CPU time), in every slice but those before the first beat
    # was overdue by LOOP_LATE_SECONDS, and the last.
    unseen = PULSE_SECONDS + LOOP_LATE_SECONDS + 2 * SLICE_SECONDS
    assert resting.paused > resting.cpu - unseen, resting
    assert resting.cpu < resting.wall / 2 + unseen, resting


def test_a_large_batch_answer_is_joined_off_the_loop_and_whole() -> None:
    """Three answers of 600 KB: past INLINE_ANSWER_BYTES, so joined on a worker."""
    big = "ab" * 300_000

    async def blob(index: int) -> str:
        return big + str(index)

    async def scenario() -> list[dict[str, Any]]:
        dispatcher = Dispatcher({"test_blob": blob})
        body = json.dumps([{"jsonrpc": "2.0", "id": i, "method": "test_blob", "params": [i]}
                           for i in range(3)])
        answer = await dispatcher.handle_payload(body)
        dispatcher.close()
        assert answer is not None and len(answer) > INLINE_ANSWER_BYTES
        decoded: list[dict[str, Any]] = json.loads(answer)
        return decoded

    assert asyncio.run(scenario()) == [
        {"jsonrpc": "2.0", "id": i, "result": big + str(i)} for i in range(3)]
