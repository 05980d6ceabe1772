"""Checkpoints, watermarks, garbage collection, falling behind (Castro & Liskov, OSDI 1999,
section 4.3: stable checkpoints with 2f+1 proofs, h and H = h + k, discarding the log below
h)."""

from __future__ import annotations

from eth_hash.auto import keccak

from pbft_engine.core import FetchCommitted, MessageReceived, StoreName
from pbft_engine.core.records import read_u64
from pbft_engine.messages import Authenticator, Checkpoint, MessageType, WireMessage
from tests.simulation.cluster import Cluster
from tests.unit.pbft.helpers import commit, drop_type, tx_hashes


def grow(cluster: Cluster, blocks: int, tag: str = "grow", nodes: list | None = None) -> None:
    for i in range(blocks):
        commit(cluster, tx_hashes(1, f"{tag} {i}"), nodes=nodes)


def test_checkpoint_every_k_moves_h_and_collects_every_store() -> None:
    """Section 4.3: a stable checkpoint moves h and discards every message below it."""
    cluster = Cluster(4, checkpoint_interval=4, log_multiplier=2)
    grow(cluster, 10)
    for node in cluster.nodes:
        replica = node.replica
        assert replica.low_watermark == replica.stable_checkpoint == 8
        assert replica.high_watermark == 16
        assert all(n > 8 for _, n in replica.log.certs)
        log = replica.log
        assert all(n > 8 for n in [*log.block_store, *log.pset, *log.certified])
        assert all(n > 8 for n, _ in [*log.outstanding_blocks, *log.qset])
        assert min(replica.checkpoints.votes) == 8
        for store in (StoreName.CERT_STORE, StoreName.BLOCK_STORE, StoreName.PSET,
                      StoreName.QSET, StoreName.OUTSTANDING_BLOCKS):
            assert all(read_u64(k) > 8 for k, _ in node.store.items(store)), store
        assert all(read_u64(k) >= 8 for k, _ in node.store.items(StoreName.CHECKPOINTS))
        signed = [read_u64(k) for k, _ in node.store.items(StoreName.SIGNED)]
        assert signed and all(n > 8 for n in signed)
        # the permanent commit certificates stay
        assert len(list(node.store.items(StoreName.COMMIT_CERTIFICATES))) == 10


def test_primary_stops_at_the_high_watermark() -> None:
    """Section 4.3: no sequence number above H until a checkpoint becomes stable."""
    cluster = Cluster(4, checkpoint_interval=2, log_multiplier=2, request_timeout_ms=100_000)
    cluster.filters.append(drop_type(MessageType.CHECKPOINT))  # nothing ever becomes stable
    for i in range(6):
        cluster.submit(keccak(b"tx %d" % i))
        cluster.run_for(200)
    assert cluster.heights() == [4, 4, 4, 4]  # H = h + L = 0 + 4
    primary = cluster.nodes[0].replica
    assert primary.dropped["primary at the high watermark"] > 0
    assert primary.requests  # still known, waiting for the window (or a view change)


def _signed_checkpoint(cluster: Cluster, signer: int, seq_no: int, root: bytes) -> bytes:
    auth = Authenticator(cluster.params.chain_id, cluster.params.validators, cluster.verifier)
    head = cluster.nodes[0].chain.blocks[seq_no - 1].block_hash
    body = Checkpoint(seq_no, head, root, signer)
    return WireMessage(auth.sign(body, cluster.nodes[signer].signer)).encode()


def test_conflicting_checkpoints_raise_an_alarm_instead_of_forking() -> None:
    cluster = Cluster(4, checkpoint_interval=4, log_multiplier=2)
    cluster.filters.append(lambda src, dst, wire: not (
        wire.signed.body.TYPE is MessageType.CHECKPOINT and dst == 1))
    grow(cluster, 4)
    replica = cluster.nodes[1].replica
    assert replica.low_watermark == 0 and 4 in replica.checkpoints.votes
    for signer in (2, 3):  # f + 1 replicas claim another state root at 4
        cluster.feed(1, MessageReceived(_signed_checkpoint(cluster, signer, 4, keccak(b"x"))))
    assert [a.kind for a in cluster.nodes[1].alarms] == ["checkpoint_conflict"]
    assert replica.halted and replica.low_watermark == 0
    assert replica.step(MessageReceived(b"anything")).actions == []


def test_fall_behind_detected_from_f_plus_1_high_checkpoints() -> None:
    cluster = Cluster(4, checkpoint_interval=2, log_multiplier=2)
    cut_off = [True]
    cluster.filters.append(lambda src, dst, wire: not (cut_off[0] and dst == 3))
    grow(cluster, 7, "while cut off", nodes=cluster.nodes[:3])
    lagging = cluster.nodes[3]
    assert len(lagging.chain.blocks) == 0
    fetches: list[FetchCommitted] = []
    original = cluster.perform

    def spy(node, ready):  # type: ignore[no-untyped-def]
        fetches.extend(a for a in ready.actions
                       if isinstance(a, FetchCommitted) and node is lagging)
        original(node, ready)

    cluster.perform = spy  # type: ignore[method-assign]
    cut_off[0] = False
    grow(cluster, 3, "after")
    assert fetches and fetches[0].target_seq_no > 4  # above its H = 0 + 4
    assert cluster.heights()[3] == cluster.heights()[0]
    assert lagging.replica.low_watermark >= fetches[0].target_seq_no
    assert lagging.replica.log.block_store == {} or min(lagging.replica.log.block_store) > 4
