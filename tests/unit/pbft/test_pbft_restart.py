"""Restart: restoreState from the persisted stores (Fabric v0.6's `restoreState`; a replica
never signs two different messages for one view, seqNo and phase)."""

from __future__ import annotations

import pytest
from eth_hash.auto import keccak

from pbft_engine.core import Replica
from pbft_engine.errors import SafetyError
from pbft_engine.messages import Prepare
from tests.simulation.cluster import Cluster, block_digest
from tests.unit.pbft.helpers import commit, drop_from, tx_hashes


def restart_all(cluster: Cluster, indices: list[int]) -> None:
    for index in indices:
        cluster.crash(index)
    for index in indices:
        cluster.restart(index)


@pytest.mark.parametrize("n", [4, 7])
def test_restart_of_two_replicas_including_the_primary(n: int) -> None:
    cluster = Cluster(n)
    commit(cluster, tx_hashes(2, "before"))
    cluster.crash(0)
    cluster.crash(1)
    cluster.submit(keccak(b"while down"))
    cluster.run_for(2_000)
    cluster.restart(0)
    cluster.restart(1)
    commit(cluster, [keccak(b"while down"), *tx_hashes(2, "after")])
    assert len(set(cluster.heights())) == 1


def test_restart_of_all_replicas_after_a_view_change() -> None:
    cluster = Cluster(4)
    silence = drop_from(0)
    cluster.filters.append(silence)
    commit(cluster, tx_hashes(2, "view 1"), nodes=cluster.nodes[1:])
    views = [node.replica.view for node in cluster.nodes]
    assert min(views[1:]) >= 1
    cluster.filters.remove(silence)
    restart_all(cluster, [0, 1, 2, 3])
    assert [node.replica.view for node in cluster.nodes][1:] == views[1:]
    commit(cluster, tx_hashes(2, "after restart"), nodes=cluster.nodes[1:])


def test_restart_after_garbage_collection() -> None:
    cluster = Cluster(4, checkpoint_interval=4, log_multiplier=2)
    for i in range(9):
        commit(cluster, tx_hashes(1, f"gc {i}"))
    before = [node.replica.status() for node in cluster.nodes]
    assert all(s.low_watermark == 8 for s in before)
    restart_all(cluster, [0, 1, 2, 3])
    assert [node.replica.status() for node in cluster.nodes] == before
    for i in range(4):
        commit(cluster, tx_hashes(1, f"after {i}"))
    assert all(node.replica.low_watermark == 12 for node in cluster.nodes)


def test_first_start_is_view_zero() -> None:
    cluster = Cluster(4)
    assert all(node.replica.view == 0 and node.replica.active for node in cluster.nodes)


def test_never_signs_two_messages_for_one_slot_across_a_restart() -> None:
    cluster = Cluster(4)
    commit(cluster, tx_hashes(1))
    node = cluster.nodes[1]
    restored = Replica.restore(cluster.params, 1, node.signer, cluster.verifier,
                               node.chain.head, node.store, block_digest=block_digest)
    digest = restored.log.certs[(0, 1)].digest
    assert restored._sign(Prepare(0, 1, digest, 1)).body.digest == digest  # same: re-used
    with pytest.raises(SafetyError):
        restored._sign(Prepare(0, 1, keccak(b"something else"), 1))
