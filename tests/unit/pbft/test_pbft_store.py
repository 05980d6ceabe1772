"""The consensus stores: LevelDB (real plyvel) round trip, byte-identical, and the pure core."""

from __future__ import annotations

import re
from pathlib import Path

from pbft_engine.core import Replica, StoreName
from pbft_engine.core.records import Delete, DeleteRange, Put, u64
from pbft_engine.record_store import LevelDBConsensusStore, MemoryConsensusStore
from storage import Database
from tests.simulation.cluster import Cluster, block_digest
from tests.unit.pbft.helpers import commit, drop_from, tx_hashes

CORE = Path(__file__).resolve().parents[3] / "pbft_engine" / "core"


def test_leveldb_and_memory_stores_apply_ops_identically(tmp_path: Path) -> None:
    ops = [
        Put(StoreName.PSET, u64(1), b"one"),
        Put(StoreName.PSET, u64(2), b"two"),
        Put(StoreName.PSET, u64(3), b"three"),
        DeleteRange(StoreName.PSET, None, u64(3)),  # also covers puts of the same batch
        Put(StoreName.QSET, u64(9), b"nine"),
        Delete(StoreName.QSET, u64(9)),
        Put(StoreName.META, b"state", b"\xc0"),
    ]
    memory = MemoryConsensusStore()
    memory.apply(ops)
    with Database(tmp_path / "db") as database:
        LevelDBConsensusStore(database).apply(ops)
    with Database(tmp_path / "db") as database:
        leveldb = LevelDBConsensusStore(database)
        for name in StoreName:
            assert list(leveldb.items(name)) == list(memory.items(name))
        assert list(leveldb.items(StoreName.PSET)) == [(u64(3), b"three")]
        assert leveldb.get(StoreName.META, b"state") == b"\xc0"


def test_restart_from_leveldb_reads_back_identical_bytes_and_state(tmp_path: Path) -> None:
    cluster = Cluster(4, checkpoint_interval=3, log_multiplier=2)
    database = Database(tmp_path / "node1")
    leveldb = LevelDBConsensusStore(database)
    original = cluster.perform

    def mirror(node, ready):  # type: ignore[no-untyped-def]
        if node.index == 1 and ready.persist is not None:
            leveldb.apply(ready.persist.ops)
        original(node, ready)

    cluster.perform = mirror  # type: ignore[method-assign]
    for i in range(4):
        commit(cluster, tx_hashes(1, f"block {i}"))
    cluster.filters.append(drop_from(0))
    commit(cluster, tx_hashes(1, "view change"), nodes=cluster.nodes[1:])
    database.close()

    node = cluster.nodes[1]
    with Database(tmp_path / "node1") as reopened:
        store = LevelDBConsensusStore(reopened)
        for name in StoreName:
            assert list(store.items(name)) == list(node.store.items(name)), name
        restored = Replica.restore(cluster.params, 1, node.signer, cluster.verifier,
                                   node.chain.head, store, block_digest=block_digest)
    live = node.replica
    assert restored.status() == live.status()
    assert restored.view >= 1 and restored.low_watermark == 3
    assert restored.log.pset == live.log.pset and restored.log.qset == live.log.qset
    assert restored.checkpoints.votes == live.checkpoints.votes
    assert restored.log.signed == live.log.signed
    assert restored.log.block_store == live.log.block_store
    assert {k: s.pre_prepare for k, s in restored.log.certs.items()} == {
        k: s.pre_prepare for k, s in live.log.certs.items()}


def test_core_imports_no_io() -> None:
    forbidden = re.compile(r"^\s*(import|from)\s+(asyncio|socket|plyvel|aiohttp|threading|time|"
                           r"subprocess|storage|chain|random|os)\b", re.MULTILINE)
    for path in CORE.glob("*.py"):
        assert not forbidden.search(path.read_text()), path
