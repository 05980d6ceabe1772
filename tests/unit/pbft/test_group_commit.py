"""Issue 29's tail: the adapter writes the records of the steps taken while one write is on
disk with one synced write (`pbft_engine.group_commit`). Checked on the engine's own write and
perform paths, with a real LevelDB store and validator state file: nothing of a step is
performed before its records and bound are durable, actions keep their step order, a failed
write sends nothing of what it covered, the wait is bounded in bytes, and a crash between two
group writes restarts a replica that is neither amnesic nor behind what it sent.

The simulator (tests/simulation) drives the core with its own model of the adapter, one write
per step; these tests are the group commit's coverage."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
from eth_hash.auto import keccak
from prometheus_client import Histogram

from pbft_engine.core import (
    Action,
    BlockValidated,
    Broadcast,
    ChainHead,
    Persist,
    Ready,
    Replica,
    SetTimer,
    TimerKind,
)
from pbft_engine.core.records import Put, StoreName, StoreOp
from pbft_engine.core.signing_bound import SigningBound
from pbft_engine.engine import PbftEngine
from pbft_engine.group_commit import QUIET_STEP_DELAY, GroupCommit
from pbft_engine.messages import KeyVerifier, Prepare
from pbft_engine.record_store import LevelDBConsensusStore
from pbft_engine.validator_state import ValidatorStateFile
from storage import Database, StorageFailure
from tests.unit.pbft.helpers import GENESIS, PARAMS, SIGNERS, from_peer
from tests.unit.pbft.test_pbft_lost_state import ME, pre_prepare, votes

DEADLINE = 10.0  # seconds any awaited condition may take


class GatedStore(LevelDBConsensusStore):
    """The real store; a write waits while `gate` is closed (on the writer thread), and
    `returned` lists, in order, the keys each write carried once it returned."""

    def __init__(self, database: Database) -> None:
        super().__init__(database)
        self.gate = threading.Event()
        self.gate.set()
        self.writing = 0  # writes begun
        self.returned: list[list[bytes]] = []
        self.fail_next = False

    def apply(self, ops: Sequence[StoreOp]) -> None:
        self.writing += 1
        assert self.gate.wait(DEADLINE)
        if self.fail_next:
            raise self.database.write_failed(_PlyvelError(b"IO error: disk gone"))
        super().apply(ops)
        self.returned.append([op.key for op in ops if isinstance(op, Put)])


class _PlyvelError(Exception):
    pass


class Adapter:
    """The engine's write and perform paths (`PbftEngine._write_records`, `_perform_one`)
    around a real LevelDB and state file; each broadcast notes whether its step's record and
    the step's signing bound were on disk when it left."""

    def __init__(self, directory: Path, max_bytes: int | None = None) -> None:
        self.database = Database(directory / "chaindata")
        self.failures: list[StorageFailure] = []
        self.database.on_failure = self.failures.append
        self.store = GatedStore(self.database)
        self.state_file = ValidatorStateFile(directory, SIGNERS[ME].address)
        self.sent: list[tuple[bytes, bool]] = []  # (data, its record and bound were durable)
        self.timers: list[bytes] = []
        engine = PbftEngine.__new__(PbftEngine)
        engine.store, engine.state_file, engine.replica = self.store, self.state_file, None
        engine.context = SimpleNamespace(
            database=self.database, broadcast=self._broadcast, peers=frozenset,
            dialed_peers=frozenset(),
            call_later=self._call_later)
        engine._timers, engine._armed = {}, {}
        engine.metrics = SimpleNamespace(block_started=lambda seq_no: None,
                                         record_writes=Histogram("w", "", registry=None))
        engine._tasks = SimpleNamespace(spawn=lambda work, what: work.close())  # no blocks here
        engine._records = (GroupCommit(engine._write_records, engine._perform_actions)
                           if max_bytes is None else
                           GroupCommit(engine._write_records, engine._perform_actions,
                                       max_bytes))
        self.engine = engine
        self.bounds: dict[bytes, SigningBound] = {}

    def _call_later(self, delay: float, fire: Callable[[], None]) -> SimpleNamespace:
        self.timers.append(b"timer")
        return SimpleNamespace(cancel=lambda: None)

    def _broadcast(self, data: bytes) -> None:
        # a fresh read of what is on disk, not the writer's view of it
        durable = self.store.get(StoreName.SIGNED, data) is not None
        bound = self.state_file.read()
        wanted = self.bounds.get(data)
        covered = wanted is None or (bound is not None and bound.covers(wanted.view,
                                                                        wanted.seq_no))
        self.sent.append((data, durable and covered))

    def step(self, name: bytes, bound: SigningBound | None = None,
             value: bytes = b"record") -> None:
        """A step that writes one record under `name` and broadcasts `name`."""
        if bound is not None:
            self.bounds[name] = bound
        self.engine._perform(Ready(Persist((Put(StoreName.SIGNED, name, value),), bound),
                                   [Broadcast(name)]))


async def until(condition: Callable[[], object], what: str) -> None:
    """Let the loop run until `condition` holds (a deadline, not a sleep)."""
    end = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


def run(test: Callable[[], object]) -> None:
    asyncio.run(test())  # type: ignore[arg-type]


def test_steps_taken_during_a_write_share_the_next_and_wait_for_it(tmp_path: Path) -> None:
    adapter = Adapter(tmp_path)

    async def scenario() -> None:
        adapter.store.gate.clear()
        adapter.step(b"one", SigningBound(0, 10))
        await until(lambda: adapter.store.writing == 1, "the first write to begin")
        adapter.step(b"two", SigningBound(0, 20))
        adapter.engine._perform(Ready(None, [Broadcast(b"three, nothing to write")]))
        adapter.step(b"four")
        for _ in range(3):
            await asyncio.sleep(0)
        assert adapter.sent == [] and adapter.store.writing == 1  # all wait for write one
        adapter.store.gate.set()
        await until(lambda: len(adapter.sent) == 4, "every step's broadcast")
        await adapter.engine._records.close()

    run(scenario)
    assert adapter.store.returned == [[b"one"], [b"two", b"four"]]  # two synced writes
    assert [data for data, _ in adapter.sent] == [
        b"one", b"two", b"three, nothing to write", b"four"]  # in step order
    assert all(durable for data, durable in adapter.sent if data != b"three, nothing to write")
    assert adapter.state_file.read() == SigningBound(0, 20)
    adapter.database.close()


def test_steps_of_one_loop_iteration_go_in_one_write(tmp_path: Path) -> None:
    adapter = Adapter(tmp_path)

    async def scenario() -> None:
        for name in (b"a", b"b", b"c"):
            adapter.step(name)
        assert adapter.sent == []  # written first
        await until(lambda: len(adapter.sent) == 3, "the broadcasts")
        adapter.engine._perform(Ready(None, [Broadcast(b"idle: at once")]))
        assert adapter.sent[-1] == (b"idle: at once", False)  # nothing waits: not deferred
        await adapter.engine._records.close()

    run(scenario)
    assert adapter.store.returned == [[b"a", b"b", b"c"]]
    assert all(durable for _, durable in adapter.sent[:3])
    adapter.database.close()


def test_records_of_steps_that_perform_nothing_wait_for_a_step_that_does(
    tmp_path: Path,
) -> None:
    """A peer's vote short of a quorum sends nothing: its records go in the write of the
    next step that performs (here one loop iteration later), or alone after
    QUIET_STEP_DELAY."""
    adapter = Adapter(tmp_path)

    def quiet(name: bytes) -> None:
        adapter.engine._perform(Ready(Persist((Put(StoreName.SIGNED, name, b"vote"),))))

    async def scenario() -> None:
        quiet(b"a peer's PREPARE")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert adapter.store.writing == 0  # waits for company
        adapter.step(b"my COMMIT")
        await until(lambda: adapter.sent, "the COMMIT")
        started = time.monotonic()
        quiet(b"a late COMMIT")
        await until(lambda: len(adapter.store.returned) == 2, "the late COMMIT's write")
        assert time.monotonic() - started >= QUIET_STEP_DELAY
        await adapter.engine._records.close()

    run(scenario)
    assert adapter.store.returned == [[b"a peer's PREPARE", b"my COMMIT"], [b"a late COMMIT"]]
    assert adapter.sent == [(b"my COMMIT", True)]
    adapter.database.close()


def test_a_step_whose_action_fails_does_not_take_the_next_steps_actions(
    tmp_path: Path,
) -> None:
    """As when each step ran alone: the failure ends its own step's actions (logged)."""
    adapter = Adapter(tmp_path)

    async def scenario() -> None:
        adapter.engine._perform(Ready(Persist((Put(StoreName.SIGNED, b"bad", b"v"),)),
                                      [SetTimer(TimerKind.REQUEST, b"", -1),
                                       Broadcast(b"bad")]))
        adapter.step(b"next")
        await until(lambda: adapter.sent, "the next step's broadcast")
        await adapter.engine._records.close()

    def refuse(delay: float, fire: Callable[[], None]) -> SimpleNamespace:
        raise ValueError("a timer it cannot set")

    adapter.engine.context.call_later = refuse
    run(scenario)
    assert adapter.sent == [(b"next", True)]
    adapter.database.close()


def test_a_failed_write_sends_nothing_it_covered_nor_anything_after(tmp_path: Path) -> None:
    adapter = Adapter(tmp_path)

    async def scenario() -> None:
        adapter.step(b"kept")
        await until(lambda: len(adapter.sent) == 1, "the first broadcast")
        adapter.store.gate.clear()
        adapter.store.fail_next = True
        adapter.step(b"lost")
        await until(lambda: adapter.store.writing == 2, "the failing write to begin")
        adapter.step(b"after it")
        adapter.store.gate.set()
        await until(lambda: adapter.engine._records.failed, "the failure")
        adapter.engine._perform(Ready(None, [Broadcast(b"later, nothing to write")]))
        adapter.step(b"later still")
        await adapter.engine._records.close()

    run(scenario)
    assert adapter.sent == [(b"kept", True)]
    assert len(adapter.failures) == 1 and "disk gone" in str(adapter.failures[0])
    assert adapter.store.get(StoreName.SIGNED, b"lost") is None
    adapter.database.close()


def test_a_state_file_that_cannot_be_written_stops_the_node_before_the_vote_leaves(
    tmp_path: Path,
) -> None:
    adapter = Adapter(tmp_path)
    adapter.engine.state_file = ValidatorStateFile(tmp_path / "gone", SIGNERS[ME].address)

    async def scenario() -> None:
        adapter.step(b"a vote", SigningBound(0, 10))
        await until(lambda: adapter.engine._records.failed, "the failure")
        await adapter.engine._records.close()

    run(scenario)
    assert len(adapter.failures) == 1 and "cannot write" in str(adapter.failures[0])
    assert adapter.sent == []
    assert adapter.store.get(StoreName.SIGNED, b"a vote") is not None  # the store first
    adapter.database.close()


def test_the_adapter_writes_the_store_before_the_state_file(tmp_path: Path) -> None:
    """The order that makes a crash between the two writes harmless
    (test_pbft_lost_state's crash between the two writes of a step)."""
    order: list[str] = []
    engine = PbftEngine.__new__(PbftEngine)
    engine.state_file = SimpleNamespace(write=lambda bound: order.append("file"))
    engine.store = SimpleNamespace(apply=lambda ops: order.append("store"))
    engine.context = SimpleNamespace(broadcast=lambda data: order.append("send"))
    engine.replica, engine._armed = None, {}
    engine.metrics = SimpleNamespace(record_writes=Histogram("w", "", registry=None))
    engine._records = GroupCommit(engine._write_records, engine._perform_actions)

    async def scenario() -> None:
        engine._perform(Ready(Persist((), SigningBound(0, 10)), [Broadcast(b"a vote")]))
        await until(lambda: "send" in order, "the vote")
        await engine._records.close()

    run(scenario)
    assert order == ["store", "file", "send"]


def test_what_waits_is_bounded_in_bytes_a_step_past_it_flushes(tmp_path: Path) -> None:
    """With 100 bytes of room the third step of 60 waits, on the loop, for the write in
    flight and writes the second step at once: the loop holds at most one more step."""
    adapter = Adapter(tmp_path, max_bytes=100 + 2 * 64)  # (an action counts 64 bytes too)

    async def scenario() -> None:
        adapter.store.gate.clear()
        adapter.step(b"one", value=b"x" * 60)
        await until(lambda: adapter.store.writing == 1, "the first write to begin")
        adapter.step(b"two", value=b"x" * 60)
        assert adapter.sent == []
        adapter.store.gate.set()
        adapter.step(b"three", value=b"x" * 60)  # would pass the bound: flushes first
        assert [data for data, _ in adapter.sent] == [b"one", b"two"]
        await until(lambda: len(adapter.sent) == 3, "the last broadcast")
        await adapter.engine._records.close()

    run(scenario)
    assert adapter.store.returned == [[b"one"], [b"two"], [b"three"]]
    assert all(durable for _, durable in adapter.sent)
    adapter.database.close()


def test_stop_waits_for_the_write_in_flight_and_performs_nothing_after(
    tmp_path: Path,
) -> None:
    adapter = Adapter(tmp_path)

    async def scenario() -> None:
        adapter.store.gate.clear()
        adapter.step(b"in flight")
        await until(lambda: adapter.store.writing == 1, "the write to begin")
        adapter.step(b"waiting")
        closing = asyncio.get_running_loop().create_task(adapter.engine._records.close())
        await asyncio.sleep(0)
        assert not closing.done()  # the database must not close under the write
        adapter.store.gate.set()
        await closing

    run(scenario)
    assert adapter.store.returned == [[b"in flight"]] and adapter.sent == []
    adapter.database.close()


@pytest.mark.parametrize("crash_after_writes", [1, 2])
def test_a_crash_between_group_writes_restarts_a_replica_that_votes_as_it_sent(
    tmp_path: Path, crash_after_writes: int,
) -> None:
    """A real replica's steps through the adapter: its start (the first bound), then the
    PRE-PREPARE, the block's validation (its PREPARE, raising the bound) and two peers'
    PREPAREs (its COMMIT) while the first write is on disk, in one group. The process dies after
    `crash_after_writes` writes; the replica restored from LevelDB and the state file is not
    amnesic, and it holds every vote that left before the crash."""
    adapter = Adapter(tmp_path)
    sent: list[Action] = []
    adapter.engine.context.broadcast = lambda data: sent.append(Broadcast(data))

    def steps(replica: Replica) -> None:
        digest, message = pre_prepare(1, b"group")
        adapter.engine._perform(replica.step(message))
        adapter.engine._perform(replica.step(BlockValidated(1, digest, True)))
        for peer in (1, 3):
            adapter.engine._perform(replica.step(from_peer(Prepare(0, 1, digest, peer))))

    async def scenario() -> None:
        replica = Replica.restore(PARAMS, ME, SIGNERS[ME], KeyVerifier(),
                                  ChainHead(0, GENESIS), adapter.store, block_digest=keccak,
                                  signing_bound=adapter.state_file.read(),
                                  fresh_validator=False)
        adapter.engine.replica = replica
        adapter.store.gate.clear()
        adapter.engine._perform(replica.start())
        await until(lambda: adapter.store.writing == 1, "the first write to begin")
        steps(replica)
        if crash_after_writes == 1:  # dies once the write in flight returned
            crash = asyncio.get_running_loop().create_task(adapter.engine._records.close())
            await asyncio.sleep(0)
            adapter.store.gate.set()
            await crash
            return
        adapter.store.gate.set()
        await until(lambda: len(adapter.store.returned) == 2 and adapter.engine._records.idle,
                    "the second write and its actions")
        await adapter.engine._records.close()  # dies after it

    run(scenario)
    assert len(adapter.store.returned) == crash_after_writes
    restored = Replica.restore(PARAMS, ME, SIGNERS[ME], KeyVerifier(), ChainHead(0, GENESIS),
                               adapter.store, block_digest=keccak,
                               signing_bound=adapter.state_file.read())
    assert restored.amnesia is None
    voted = votes(sent)
    if crash_after_writes == 1:
        assert voted == []  # the group was lost whole: nothing of it left
    else:
        assert [v[0].name for v in voted] == ["PREPARE", "COMMIT"]
        assert restored.status() == adapter.engine.replica.status()
        assert adapter.state_file.read() == SigningBound(0, PARAMS.log_size)
    adapter.database.close()


def test_a_timer_of_a_waiting_step_is_set_only_after_its_write(tmp_path: Path) -> None:
    adapter = Adapter(tmp_path)

    async def scenario() -> None:
        adapter.store.gate.clear()
        adapter.engine._perform(Ready(Persist((Put(StoreName.SIGNED, b"t", b"v"),)),
                                      [SetTimer(TimerKind.REQUEST, b"", 1000)]))
        await until(lambda: adapter.store.writing == 1, "the write to begin")
        assert adapter.timers == []
        adapter.store.gate.set()
        await until(lambda: adapter.timers, "the timer")
        await adapter.engine._records.close()

    run(scenario)
