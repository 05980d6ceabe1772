"""Concurrent consensus: several blocks in flight inside the watermarks (DESIGN.md section 4).
The primary proposes n+1 on n's executed, uncommitted state once n is prepared at it, backups
validate n+1 on their validated n and PREPARE it once n is prepared (or committed) at them,
blocks commit strictly in order, and a view change keeps every prepared block's parent."""

from __future__ import annotations

import pytest

from pbft_engine.core.actions import BuildBlock
from pbft_engine.messages import MessageType, NewView, WireMessage, wire_as
from tests.simulation.cluster import Cluster, Execution, NetworkFaults, Node
from tests.simulation.ledger import decode_block
from tests.unit.pbft.helpers import capture, commit, tx_hashes


def pipelined_cluster(depth: int) -> Cluster:
    """One transaction a block, 20 ms links and 5 ms a block: rounds long enough to overlap."""
    return Cluster(4, faults=NetworkFaults(20, 20), execution=Execution(5_000),
                   max_txs_per_block=1, max_in_flight=depth, checkpoint_interval=10,
                   log_multiplier=4, request_timeout_ms=5_000)


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_the_primary_proposes_before_the_previous_block_is_executed_only_when_pipelined(
        depth: int) -> None:
    cluster = pipelined_cluster(depth)
    ahead: list[int] = []  # blocks proposed beyond the primary's last executed one + 1

    def watch(src: int, dst: int, wire: WireMessage) -> bool:
        body = wire.signed.body
        if body.TYPE is MessageType.PRE_PREPARE and dst == 1:
            ahead.append(body.seq_no - len(cluster.nodes[src].chain.blocks) - 1)
        return True

    cluster.filters.append(watch)
    commit(cluster, tx_hashes(12))
    assert cluster.heights() == [12] * 4
    assert max(ahead) == min(depth, 2) - 1  # beyond 2: the lock on the parent paces it
    assert all(0 <= a < depth for a in ahead)


def watch_builds(cluster: Cluster) -> list[tuple[int, bool]]:
    """(seqNo, whether its parent was locked at the primary) of every block it builds."""
    builds: list[tuple[int, bool]] = []
    build = cluster._build

    def watched(node: Node, action: BuildBlock):  # type: ignore[no-untyped-def]
        assert node.replica is not None
        locked = node.replica._locked_digest(action.seq_no - 1) == action.parent_hash
        builds.append((action.seq_no, locked))
        return build(node, action)

    cluster._build = watched  # type: ignore[method-assign]
    return builds


def test_under_a_backlog_the_primary_builds_before_the_parent_locks_and_holds_the_block(
        ) -> None:
    """Blocks of one transaction and eight waiting: each block leaves a backlog, so the
    primary builds n+1 while n is validated; n+1 still goes out only once n is prepared."""
    cluster = pipelined_cluster(2)
    builds = watch_builds(cluster)
    early: list[int] = []  # PRE-PREPAREs sent before their parent was locked at the primary

    def watch(src: int, dst: int, wire: WireMessage) -> bool:
        body = wire.signed.body
        replica = cluster.nodes[src].replica
        if body.TYPE is MessageType.PRE_PREPARE and dst == 1 and replica is not None:
            parent = replica.log.certs.get((0, body.seq_no - 1))
            if parent is not None and replica._locked_digest(body.seq_no - 1) != parent.digest:
                early.append(body.seq_no)
        return True

    cluster.filters.append(watch)
    commit(cluster, tx_hashes(8))
    assert cluster.heights() == [8] * 4
    assert any(not locked for _, locked in builds)
    assert early == []


def test_without_a_backlog_the_primary_builds_once_the_parent_locks_with_what_arrived(
        ) -> None:
    """Blocks hold whatever waits (no count cap, a budget of 200): transactions arriving
    while block 1 is agreed on all go into block 2, built once block 1 is prepared."""
    cluster = Cluster(4, faults=NetworkFaults(20, 20), execution=Execution(5_000),
                      max_in_flight=2, request_timeout_ms=5_000)
    builds = watch_builds(cluster)
    txs = tx_hashes(4)
    cluster.submit(txs[0], to=0)
    for tx in txs[1:]:
        cluster.run_for(8)
        cluster.submit(tx, to=0)
    assert cluster.run_until(lambda: cluster.all_committed(txs), 20_000)
    cluster.check_safety()
    assert all(locked for _, locked in builds)
    sizes = [len(decode_block(block.block)[2])  # type: ignore[index]
             for block in cluster.nodes[0].chain.blocks]
    assert sizes == [1, 3]


def test_a_view_change_in_the_middle_of_a_pipeline_keeps_each_prepared_block_on_its_parent(
        ) -> None:
    """No COMMIT of view 0 arrives: blocks 1 and 2 are prepared, none commits, the request
    timer (5 s) replaces the primary, and NEW-VIEW's O re-proposes both, in order, on one
    chain."""
    cluster = pipelined_cluster(2)
    cluster.filters.append(lambda src, dst, wire: not (
        wire.signed.body.TYPE is MessageType.COMMIT and wire.signed.body.view == 0))
    new_views: list[WireMessage] = []
    cluster.filters.append(capture(MessageType.NEW_VIEW, new_views))
    commit(cluster, tx_hashes(2), limit_ms=30_000)
    assert cluster.heights() == [2] * 4
    plan = wire_as(new_views[0], NewView)
    assert plan is not None
    assert [pp.body.seq_no for pp in plan.signed.body.pre_prepares] == [1, 2]
    assert all(node.replica.view >= 1 for node in cluster.nodes)


def test_replicas_restarted_with_several_blocks_prepared_commit_them_in_order() -> None:
    cluster = pipelined_cluster(2)
    held = True
    cluster.filters.append(lambda src, dst, wire: not (
        held and wire.signed.body.TYPE is MessageType.COMMIT))
    for tx in tx_hashes(3):
        cluster.submit(tx)
    assert cluster.run_until(lambda: all(
        (0, 2) in node.replica.log.certs and len(node.replica.log.pset) == 2
        for node in cluster.nodes), 2_000)
    for node in cluster.nodes:
        cluster.crash(node.index)
    held = False
    for node in cluster.nodes:
        cluster.restart(node.index)
    # Each resends what it signed: the held COMMITs certify 1 and 2, then 3 is proposed,
    # all in view 0, well within the 5 s request timer.
    commit(cluster, tx_hashes(3), limit_ms=4_000)
    assert cluster.heights() == [3] * 4
    assert all(node.replica.view == 0 for node in cluster.nodes)


def test_no_block_is_prepared_or_certified_while_its_parent_is_not() -> None:
    """Block 1 commits; in view 0 block 2 never prepares (its PREPAREs and COMMITs are lost),
    while the backlog has the primary build block 3 on it at once. Block 3 must not go out,
    prepare or collect COMMITs: a certificate for it would stand on a parent that the view
    change (whose O ends at the gap at 2) drops, beside the block 3 the next view certifies.
    The chain then commits in view 1."""
    cluster = pipelined_cluster(2)
    cluster.filters.append(lambda src, dst, wire: not (
        wire.signed.body.view == 0 and wire.signed.body.seq_no == 2
        and wire.signed.body.TYPE in (MessageType.PREPARE, MessageType.COMMIT)))
    sent: list[WireMessage] = []
    for kind in (MessageType.PRE_PREPARE, MessageType.PREPARE, MessageType.COMMIT):
        cluster.filters.append(capture(kind, sent))
    builds = watch_builds(cluster)
    txs = tx_hashes(4)
    cluster.submit(txs[0], to=0)
    cluster.run_for(2)  # block 1 is being built: the rest wait for block 2, which holds one
    for tx in txs[1:]:
        cluster.submit(tx, to=0)
    commit(cluster, txs, limit_ms=30_000)
    assert cluster.heights() == [4] * 4
    assert (3, False) in builds  # built before block 2 locked
    assert [(w.signed.body.TYPE, w.signed.body.seq_no) for w in sent
            if w.signed.body.view == 0 and w.signed.body.seq_no > 2] == []


def test_backups_do_not_vote_for_a_block_a_byzantine_primary_proposed_before_its_parent(
        ) -> None:
    """The backups' half of the lock rule. A byzantine primary proposes block 2 at once, on a
    block 1 that never prepares in view 0 (its PREPAREs are lost). Were the backups to
    PREPARE block 2, it would be certified at them in view 0 on a parent that the view
    change, whose O ends at the gap at 1, drops: a second certificate at seqNo 2 beside the
    one of view 1. So no backup PREPAREs or COMMITs it in view 0 while block 1 is not locked
    there; view 1 then commits both on one chain."""
    cluster = pipelined_cluster(2)
    primary = cluster.nodes[0].replica
    assert primary is not None

    def anything_proposed(seq_no: int) -> bytes | None:  # the lie: every parent is locked
        if seq_no == primary.last_exec:
            return primary.last_exec_hash
        slot = primary.log.certs.get((primary.view, seq_no))
        return None if slot is None else slot.digest

    primary._locked_digest = anything_proposed  # type: ignore[method-assign]
    cluster.byzantine.add(0)
    cluster.filters.append(lambda src, dst, wire: not (
        wire.signed.body.view == 0 and wire.signed.body.seq_no == 1
        and wire.signed.body.TYPE is MessageType.PREPARE))
    early: list[tuple[MessageType, int]] = []  # a backup's vote for 2 on an unlocked 1
    proposed: list[int] = []

    def watch(src: int, dst: int, wire: WireMessage) -> bool:
        body = wire.signed.body
        replica = cluster.nodes[src].replica
        if body.view != 0 or replica is None:
            return True
        if body.TYPE is MessageType.PRE_PREPARE:
            proposed.append(body.seq_no)
        elif (body.TYPE in (MessageType.PREPARE, MessageType.COMMIT) and src != 0
              and body.seq_no == 2 and replica._locked_digest(1) is None):
            early.append((body.TYPE, src))
        return True

    cluster.filters.append(watch)
    commit(cluster, tx_hashes(2), limit_ms=30_000)
    assert 2 in proposed  # the lie worked: block 2 went out while block 1 could not prepare
    assert early == []
    assert cluster.heights() == [2] * 4
    assert all(node.replica.view >= 1 for node in cluster.honest())
