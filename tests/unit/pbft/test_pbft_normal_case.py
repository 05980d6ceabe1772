"""Normal case: PRE-PREPARE / PREPARE / COMMIT, and what replicas drop (Castro & Liskov,
OSDI 1999, section 4.2: the acceptance conditions of a pre-prepare, the prepared and
committed-local predicates)."""

from __future__ import annotations

import pytest
from eth_hash.auto import keccak
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pbft_engine.core import MessageReceived
from pbft_engine.messages import (
    Authenticator,
    KeySigner,
    MessageType,
    Prepare,
    WireMessage,
)
from tests.simulation.cluster import Cluster, block_txs
from tests.unit.pbft.helpers import capture, commit, tx_hashes


@pytest.mark.parametrize("n", [1, 4, 7])
def test_single_block_commits_on_all_replicas(n: int) -> None:
    cluster = Cluster(n)
    commit(cluster, tx_hashes(1))
    assert cluster.heights() == [1] * n
    assert all(node.replica.status().last_executed == 1 for node in cluster.nodes)


@pytest.mark.parametrize("n", [4, 7])
def test_many_sequential_blocks_reset_state_after_each_commit(n: int) -> None:
    cluster = Cluster(n, checkpoint_interval=100, log_multiplier=2)
    for round_ in range(6):
        commit(cluster, tx_hashes(2, f"round {round_}"))
    height = cluster.heights()[0]
    assert height >= 6 and cluster.heights() == [height] * n
    for node in cluster.nodes:
        replica = node.replica
        assert replica.seq_no == replica.last_exec == height
        assert replica.executing is None and replica.building is None
        assert not replica.requests
        assert replica.log.outstanding_blocks == {}  # committed blocks are no longer outstanding


def test_n1_commits_alone_without_messages() -> None:
    cluster = Cluster(1)
    sent: list[WireMessage] = []
    cluster.filters.append(capture(MessageType.PREPARE, sent))
    commit(cluster, tx_hashes(1))
    assert cluster.heights() == [1] and sent == []


def test_empty_blocks_every_block_period_when_configured() -> None:
    quiet = Cluster(4)
    quiet.run_for(2_000)
    assert quiet.heights() == [0, 0, 0, 0]
    periodic = Cluster(4, empty_blocks=True)
    periodic.run_for(2_000)
    assert min(periodic.heights()) >= 5
    assert all(block_txs(b.block) == () for b in periodic.nodes[0].chain.blocks)
    periodic.check_safety()


def _inject(cluster: Cluster, target: int, signer_index: int, body: object) -> bytes:
    auth = Authenticator(cluster.params.chain_id, cluster.params.validators, cluster.verifier)
    data = WireMessage(auth.sign(body, cluster.nodes[signer_index].signer)).encode()  # type: ignore[arg-type]
    cluster.feed(target, MessageReceived(data))
    return data


def test_prepare_from_primary_is_ignored_and_is_evidence() -> None:
    """Section 4.2: the primary sends PRE-PREPARE, never PREPARE."""
    cluster = Cluster(4)
    replica = cluster.nodes[1].replica
    _inject(cluster, 1, 0, Prepare(0, 1, keccak(b"x"), 0))
    assert replica.log.certs.get((0, 1)) is None or 0 not in replica.log.certs[(0, 1)].prepares
    assert replica.evidence, "evidence against the primary is kept"
    assert not replica.active and replica.view == 1  # and it asks for a view change


def test_sender_mismatch_and_non_member_dropped() -> None:
    cluster = Cluster(4)
    replica = cluster.nodes[1].replica
    _inject(cluster, 1, 2, Prepare(0, 1, keccak(b"x"), 3))  # signed by 2, claims 3
    outsider = KeySigner(keccak(b"outsider"))
    auth = Authenticator(cluster.params.chain_id, cluster.params.validators, cluster.verifier)
    data = WireMessage(auth.sign(Prepare(0, 1, keccak(b"x"), 2), outsider)).encode()
    cluster.feed(1, MessageReceived(data))
    assert replica.dropped["SignatureError"] == 2
    assert replica.log.certs == {}


def test_digest_mismatch_does_not_count() -> None:
    """Section 4.2: prepares and commits count only if they match the pre-prepare's digest."""
    cluster = Cluster(4)
    cluster.filters.append(lambda src, dst, wire: not (
        wire.signed.body.TYPE is MessageType.PREPARE and src == 3))
    _inject(cluster, 1, 3, Prepare(0, 1, keccak(b"another block"), 3))
    commit(cluster, tx_hashes(1))
    slot = cluster.nodes[1].replica.log.certs[(0, 1)]
    assert 3 in slot.prepares
    assert [p.body.replica for p in slot.matching(slot.prepares, exclude=0)] == [1, 2]


def test_outside_watermarks_and_other_views_dropped() -> None:
    """Section 4.2: a replica accepts messages only for its view and h < n <= H."""
    cluster = Cluster(4)
    replica = cluster.nodes[1].replica
    _inject(cluster, 1, 2, Prepare(0, replica.high_watermark + 1, keccak(b"x"), 2))
    _inject(cluster, 1, 2, Prepare(0, 0, keccak(b"x"), 2))
    assert replica.dropped["outside the watermarks"] == 2
    assert replica.log.certs == {}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzzed_messages_rejected_without_crash(data: bytes) -> None:
    cluster = _FUZZ_CLUSTER
    before = cluster.nodes[1].replica.status()
    assert cluster.nodes[1].replica.step(MessageReceived(data)).actions == []
    assert cluster.nodes[1].replica.status() == before


def test_mutated_real_messages_rejected_without_crash() -> None:
    cluster = Cluster(4)
    sent: list[WireMessage] = []
    cluster.filters.append(capture(MessageType.COMMIT, sent))
    commit(cluster, tx_hashes(1))
    replica = cluster.nodes[1].replica
    data = sent[0].encode()
    for position in range(len(data)):
        mutated = bytearray(data)
        mutated[position] ^= 0x55
        replica.step(MessageReceived(bytes(mutated)))
    assert cluster.heights() == [1, 1, 1, 1]
    assert not replica.halted


_FUZZ_CLUSTER = Cluster(4)
