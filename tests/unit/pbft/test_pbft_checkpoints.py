"""Checkpoints, watermarks, garbage collection, falling behind (Castro & Liskov, OSDI 1999,
section 4.3: stable checkpoints with 2f+1 proofs, h and H = h + k, discarding the log below
h)."""

from __future__ import annotations

from eth_hash.auto import keccak

from pbft_engine.core import FetchCommitted, MessageReceived, StoreName
from pbft_engine.core.records import read_u64, u64
from pbft_engine.messages import (
    Authenticator,
    Checkpoint,
    MessageType,
    WireMessage,
    decode_commit_certificate,
)
from pbft_engine.rpc_records import ConsensusRecords
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


def test_a_replica_killed_before_the_checkpoints_at_m_reached_it_never_holds_m_stable() -> None:
    """Replica 3 executes checkpoint 4 (sending its CHECKPOINT) and commits block 5 (its
    COMMITs at 4 and 5 are in its own certificates), and is killed before the others'
    CHECKPOINTs at 4 reach it. Restarted after the others went on, it fetches the blocks it
    missed and holds a later checkpoint stable, but never 4: nobody sends a CHECKPOINT
    again, and its fetch moves h past 4 (a CHECKPOINT below h is dropped). What it serves
    (pbft_getCheckpoints) names a stable checkpoint above 4 and nothing at 4, while the
    others hold 4 stable with Q CHECKPOINTs: the audit's checkpoint-missing must not ask
    4 of it (the protocol makes stable checkpoints advance, not every multiple stable at
    every replica)."""
    cluster = Cluster(4, checkpoint_interval=4, log_multiplier=2)
    grow(cluster, 3, "before")

    def late(src: int, dst: int, wire: WireMessage) -> bool:  # (they come after the kill)
        body = wire.signed.body
        return not (dst == 3 and body.TYPE is MessageType.CHECKPOINT and body.seq_no == 4)

    cluster.filters.append(late)
    grow(cluster, 2, "around 4")
    victim = cluster.nodes[3]
    assert victim.replica is not None and victim.replica.last_exec == 5
    assert victim.replica.stable_checkpoint == 0 and victim.replica.checkpoints.mine(4)
    cluster.crash(3)
    cluster.filters.remove(late)
    grow(cluster, 8, "while down", nodes=cluster.nodes[:3])
    cluster.restart(3)
    for i in range(8):
        commit(cluster, tx_hashes(1, f"after {i}"))
        if victim.replica.stable_checkpoint > 4 and victim.replica.last_exec >= 16:
            break
    replica = victim.replica
    assert replica.stable_checkpoint > 4 and replica.low_watermark > 4
    served = {read_u64(k) for k, _ in victim.store.items(StoreName.STABLE_CHECKPOINTS)}
    assert 4 not in served and replica.stable_checkpoint in served
    assert all(read_u64(k) > 4 for k, _ in victim.store.items(StoreName.CHECKPOINTS))
    records = ConsensusRecords(victim.store, lambda: cluster.epochs.schedule)
    assert [(int(e["seqNo"], 16), e["stable"]) for e in records.checkpoints(1, 4)] == []
    assert all(4 in {read_u64(k) for k, _ in node.store.items(StoreName.STABLE_CHECKPOINTS)}
               for node in cluster.nodes[:3])
    for block in (4, 5):  # (session 14's audit asked 4 of it: COMMITs at 4 and after it)
        certificate = victim.store.get(StoreName.COMMIT_CERTIFICATES, u64(block))
        assert certificate is not None
        assert 3 in {c.body.replica for c in decode_commit_certificate(certificate)}
