"""A peer's share of the loop that runs consensus (`pbft_engine.peer_budget`): a validator
that floods the others with messages that are expensive to check uses up its budget, is
counted as a fault, and is dropped while the budget refills; the others are not."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import SimpleNamespace

from pbft_engine.engine import PbftEngine
from pbft_engine.peer_budget import BURST, GOSSIP, RATE, PeerBudget
from tests.unit.pbft.helpers import fixed_feed

FLOODER, HONEST = b"\x01" * 20, b"\x02" * 20


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_peer_that_spends_its_burst_is_dropped_until_it_refills() -> None:
    clock = Clock()
    budget = PeerBudget(clock)
    assert budget.allows(FLOODER)
    assert not budget.charge(FLOODER, BURST / 2)
    assert budget.charge(FLOODER, BURST / 2)  # ran dry: one fault
    assert not budget.allows(FLOODER) and budget.allows(HONEST)
    assert not budget.charge(FLOODER, 0.01)  # still dry: not a second fault
    clock.now += 0.02 / RATE  # refilled past what it owes
    assert budget.allows(FLOODER)
    assert budget.charge(FLOODER, 1.0)  # a new episode: a new fault


def test_a_validators_gossip_running_dry_leaves_its_votes_alone() -> None:
    """Transaction gossip has a bucket of its own: a validator forwarding a burst of its
    clients' transactions is still heard on consensus."""
    budget = PeerBudget(Clock())
    assert budget.charge(FLOODER, BURST, GOSSIP)
    assert not budget.allows(FLOODER, GOSSIP) and budget.allows(FLOODER)


def test_the_adapter_charges_the_sender_and_drops_it_once_dry() -> None:
    """The engine measures how long each message took the loop and charges its sender."""
    clock = Clock()
    handled: list[bytes] = []
    faults: list[tuple[bytes, str]] = []
    dropped: list[bytes] = []
    engine = PbftEngine.__new__(PbftEngine)
    engine.engine_params = SimpleNamespace(validators=(FLOODER, HONEST))  # type: ignore[assignment]
    engine.feed = fixed_feed((FLOODER, HONEST))
    engine.budget = PeerBudget(clock, rate=RATE, burst=1e-9)  # any message runs it dry
    engine.metrics = SimpleNamespace(peer_fault=lambda p, k: faults.append((p, k)),
                                     peer_dropped=dropped.append)
    engine.log = SimpleNamespace(warning=lambda *a: None, info=lambda *a: None)
    engine._perform = lambda ready: None  # type: ignore[method-assign]
    engine.replica = SimpleNamespace(  # the core's step: what is charged
        view=0, active=True, fetching=None,
        step=lambda event: handled.append(event.data))
    engine.on_message(FLOODER, b"an expensive VIEW-CHANGE")
    engine.on_message(FLOODER, b"another")
    engine.on_message(HONEST, b"a PREPARE")
    assert handled == [b"an expensive VIEW-CHANGE", b"a PREPARE"]
    assert faults == [(FLOODER, "over_budget"), (HONEST, "over_budget")]
    assert dropped == [FLOODER]


def _engine(budget: PeerBudget, step: Callable[[object], None],
            faults: list[tuple[bytes, str]]) -> PbftEngine:
    """An engine around a core whose step is `step`, its senders charged from `budget`."""
    engine = PbftEngine.__new__(PbftEngine)
    engine.engine_params = SimpleNamespace(validators=(FLOODER, HONEST))  # type: ignore[assignment]
    engine.feed = fixed_feed((FLOODER, HONEST))
    engine.budget = budget
    engine.metrics = SimpleNamespace(peer_fault=lambda p, k: faults.append((p, k)),
                                     peer_dropped=lambda p: None)
    engine.log = SimpleNamespace(warning=lambda *a: None, info=lambda *a: None)
    engine._perform = lambda ready: None  # type: ignore[method-assign]
    engine.replica = SimpleNamespace(view=0, active=True, fetching=None, step=step)
    return engine


def test_a_step_is_charged_the_loops_cpu_time_not_the_hosts_load() -> None:
    """The core does no I/O: what a step takes of the loop beyond its CPU time is the
    thread kept waiting (the host's other processes, the GIL), which the sender did not
    cause. Charged the wall time, a hostile validator's 3,000 duplicates ran it dry after
    about half of them on a loaded host (test_peer_hardening). Here a step that waits
    50 ms without the CPU (as if preempted) leaves a 20 ms budget alone, and a step that
    works 30 ms of CPU runs it dry."""
    faults: list[tuple[bytes, str]] = []

    def waits(event: object) -> None:
        time.sleep(0.05)

    def works(event: object) -> None:
        until = time.thread_time() + 0.03
        while time.thread_time() < until:
            pass

    _engine(PeerBudget(Clock(), burst=0.02), waits, faults).on_message(FLOODER, b"waited")
    assert faults == []
    _engine(PeerBudget(Clock(), burst=0.02), works, faults).on_message(FLOODER, b"worked")
    assert faults == [(FLOODER, "over_budget")]
