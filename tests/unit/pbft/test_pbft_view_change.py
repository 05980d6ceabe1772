"""View change and NEW-VIEW (Castro & Liskov, OSDI 1999, section 4.4: the P set, NEW-VIEW's
O computed from min-s and max-s and checked by every backup) and its liveness rules (section
4.5.2)."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import pytest
import rlp
from eth_hash.auto import keccak

from pbft_engine.core import (
    BlockCommitted,
    Broadcast,
    CancelTimer,
    MessageReceived,
    RequestReceived,
    SetTimer,
    TimerFired,
    TimerKind,
)
from pbft_engine.core.view_change import plan_new_view
from pbft_engine.messages import (
    Authenticator,
    MessageType,
    NewView,
    PrePrepare,
    ViewChange,
    WireMessage,
)
from tests.simulation.cluster import Cluster, block_txs
from tests.unit.pbft.helpers import capture, commit, drop_from, drop_type, tx_hashes


def auth_of(cluster: Cluster) -> Authenticator:
    return Authenticator(cluster.params.chain_id, cluster.params.validators, cluster.verifier)


def signed_wire(cluster: Cluster, body: object, blocks: tuple[bytes, ...] = ()) -> bytes:
    signer = cluster.nodes[body.replica].signer  # type: ignore[attr-defined]
    return WireMessage(auth_of(cluster).sign(body, signer), blocks).encode()  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [4, 7])
def test_view_change_on_primary_silence(n: int) -> None:
    cluster = Cluster(n)
    cluster.filters.append(drop_from(0))
    commit(cluster, tx_hashes(2), nodes=cluster.nodes[1:])
    assert all(node.replica.view >= 1 and node.replica.active for node in cluster.nodes[1:])


def test_view_change_keeps_seq_no_continuous() -> None:
    cluster = Cluster(4)
    commit(cluster, tx_hashes(1, "before"))
    commit(cluster, tx_hashes(1, "before 2"))
    cluster.filters.append(drop_from(0))
    commit(cluster, tx_hashes(2, "after"), nodes=cluster.nodes[1:])
    replica = cluster.nodes[1].replica
    assert replica.view >= 1
    numbers = [int.from_bytes(rlp.decode(b.block)[0][0], "big")
               for b in cluster.nodes[1].chain.blocks]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 3
    assert replica.seq_no == replica.last_exec == len(numbers)


def _stuck_in_view_change(n: int = 4) -> tuple[Cluster, list[WireMessage]]:
    """Primary 0 silent; replica 3 never receives NEW-VIEW: it waits in view change to 1."""
    cluster = Cluster(n, request_timeout_ms=300, new_view_timeout_ms=100_000,
                      new_view_timeout_cap_ms=100_000)
    new_views: list[WireMessage] = []
    cluster.filters += [drop_from(0), capture(MessageType.NEW_VIEW, new_views),
                        drop_type(MessageType.NEW_VIEW, to=3)]
    cluster.submit(keccak(b"tx"))
    assert cluster.run_until(lambda: bool(new_views), 5_000)
    replica = cluster.nodes[3].replica
    assert replica.view == 1 and not replica.active
    return cluster, new_views


def test_new_view_forged_too_few_or_wrong_o_rejected_then_genuine_accepted() -> None:
    cluster, new_views = _stuck_in_view_change()
    replica = cluster.nodes[3].replica
    genuine = new_views[0]
    nv: NewView = genuine.signed.body
    auth, primary = auth_of(cluster), cluster.nodes[1].signer
    forged_vc = dataclasses.replace(nv.view_changes[0], signature=nv.view_changes[1].signature)
    extra = auth.sign(PrePrepare(1, 99, keccak(b"invented"), 1), primary)
    bad = [
        dataclasses.replace(nv, view_changes=(forged_vc, *nv.view_changes[1:])),
        dataclasses.replace(nv, view_changes=nv.view_changes[:2]),
        dataclasses.replace(nv, pre_prepares=(*nv.pre_prepares, extra)),
    ]
    for body in bad:
        replica.step(MessageReceived(WireMessage(auth.sign(body, primary)).encode()))
        assert replica.view == 1 and not replica.active
    forged_outer = dataclasses.replace(genuine.signed, signature=bytes(65))
    replica.step(MessageReceived(WireMessage(forged_outer).encode()))
    assert not replica.active
    assert sum(c for r, c in replica.dropped.items() if r.startswith("new-view")) == 3
    replica.step(MessageReceived(genuine.encode()))
    assert replica.active and replica.view == 1


def test_xset_is_built_in_a_deterministic_order() -> None:
    cluster, new_views = _stuck_in_view_change()
    view_changes = [vc.body for vc in new_views[0].signed.body.view_changes]
    plans = {plan_new_view(list(p)) for p in itertools.permutations(view_changes)}
    assert len(plans) == 1
    entries = next(iter(plans)).entries
    assert [n for n, _ in entries] == sorted(n for n, _ in entries)


def test_new_view_timeout_escalates_and_doubles_up_to_the_cap() -> None:
    """Section 4.5.2: each view change without progress doubles the timeout (capped)."""
    cluster = Cluster(4, request_timeout_ms=300, new_view_timeout_ms=500,
                      new_view_timeout_cap_ms=2_000)
    cluster.filters += [drop_from(0), drop_type(MessageType.NEW_VIEW)]
    timers: list[int] = []
    original = cluster.perform

    def spy(node, ready):  # type: ignore[no-untyped-def]
        if node.index == 3:
            timers.extend(a.duration_ms for a in ready.actions
                          if isinstance(a, SetTimer) and a.kind is TimerKind.NEW_VIEW)
        original(node, ready)

    cluster.perform = spy  # type: ignore[method-assign]
    cluster.submit(keccak(b"tx"))
    cluster.run_for(60_000)
    # doubles on each expiry of its own timer, is capped, and resets after a new view
    assert set(timers) == {500, 1_000, 2_000} and timers.count(2_000) >= 2
    assert all(b in (a, 2 * a, 2_000, 500) for a, b in itertools.pairwise(timers))
    assert cluster.nodes[3].replica.view >= 4


def test_new_view_timeout_moves_past_a_silent_next_primary() -> None:
    cluster = Cluster(7)
    cluster.filters.append(drop_from(0, 1))
    commit(cluster, tx_hashes(1), nodes=cluster.nodes[2:])
    assert all(node.replica.view >= 2 for node in cluster.nodes[2:])


def test_a_single_timed_out_replica_cannot_force_a_view_change() -> None:
    """Section 4.5.2: one replica that asks for a view change cannot move the others."""
    cluster = Cluster(4, request_timeout_ms=100_000)
    tx = keccak(b"waiting")
    cluster.submit(tx)
    cluster.feed(3, TimerFired(TimerKind.REQUEST, b""))
    assert cluster.nodes[3].replica.view == 1
    commit(cluster, tx_hashes(2), nodes=cluster.nodes[:3])
    assert all(node.replica.view == 0 and node.replica.active for node in cluster.nodes[:3])


def test_duplicate_view_change_never_loops() -> None:
    cluster = Cluster(4)
    replica = cluster.nodes[1].replica
    data = signed_wire(cluster, ViewChange(1, 0, (), (), (), 2))
    first = replica.step(MessageReceived(data)).actions
    assert not any(isinstance(a, Broadcast) for a in first)
    for _ in range(20):
        actions = replica.step(MessageReceived(data)).actions
        assert not any(isinstance(a, Broadcast) for a in actions)
    assert replica.dropped["duplicate"] == 20 and replica.view == 0


def test_view_change_traffic_stops_after_the_new_view() -> None:
    cluster = Cluster(4)
    sent: list[WireMessage] = []
    cluster.filters += [drop_from(0), capture(MessageType.VIEW_CHANGE, sent)]
    commit(cluster, tx_hashes(1), nodes=cluster.nodes[1:])
    settled = len(sent)
    cluster.run_for(10_000)
    assert len(sent) == settled


def test_f_plus_1_higher_view_changes_pull_a_replica_along() -> None:
    """Section 4.5.2: f+1 VIEW-CHANGEs for higher views make a replica join the smallest."""
    cluster = Cluster(4)
    replica = cluster.nodes[3].replica
    replica.step(MessageReceived(signed_wire(cluster, ViewChange(3, 0, (), (), (), 1))))
    assert replica.view == 0 and replica.active  # one is not enough
    higher = signed_wire(cluster, ViewChange(2, 0, (), (), (), 2))
    actions = replica.step(MessageReceived(higher)).actions
    assert replica.view == 2 and not replica.active  # the smallest of the f+1 views
    sent = [WireMessage.decode(a.data).signed.body for a in actions if isinstance(a, Broadcast)]
    assert [(type(b), b.view) for b in sent] == [(ViewChange, 2)]


def test_outstanding_transactions_proposed_again_without_duplicates() -> None:
    cluster = Cluster(4)
    commit(cluster, tx_hashes(1, "warm up"))
    txs = tx_hashes(4, "outstanding")
    cluster.filters.append(drop_from(0))  # the primary builds a block nobody sees
    commit(cluster, txs, nodes=cluster.nodes[1:])
    chain = cluster.nodes[1].chain.blocks
    seen = Counter(tx for block in chain for tx in block_txs(block.block))
    assert all(seen[tx] == 1 for tx in txs)
    assert cluster.nodes[1].replica.view >= 1


def test_the_request_timer_restarts_on_progress_so_a_long_queue_is_no_fault() -> None:
    cluster = Cluster(4)
    commit(cluster, tx_hashes(1))
    replica = cluster.nodes[2].replica
    first, second = tx_hashes(2, "queued")
    timer = SetTimer(TimerKind.REQUEST, b"", cluster.params.request_timeout_ms)
    assert timer in replica.step(RequestReceived(first)).actions
    # a new arrival never resets it
    assert timer not in replica.step(RequestReceived(second)).actions

    def commit_next(*txs: bytes) -> list[object]:
        replica.executing = replica.last_exec + 1
        return replica.step(BlockCommitted(replica.executing, keccak(b"%d" % replica.executing),
                                           keccak(b"root"), txs)).actions

    assert timer in commit_next(first)  # progress while `second` waits: the timer restarts
    assert CancelTimer(TimerKind.REQUEST, b"") in commit_next(second)  # nothing waits
    assert replica.view == 0 and replica.active
