"""The consensus stores: apply the core's `Persist` operations and read them back on restore.

`LevelDBConsensusStore` keeps every store as a keyspace of the node's one LevelDB (prefixes in
`pbft_engine.core.records.StoreName`); `MemoryConsensusStore` is the same model in dicts for
the simulator. Both give back exactly the bytes that were written.
"""

from __future__ import annotations

import bisect
from abc import abstractmethod
from collections.abc import Iterator, Sequence

from pbft_engine.core.records import Delete, Put, RecordReader, StoreName, StoreOp
from storage import Database, Keyspace, WriteBatch


class ConsensusStore(RecordReader):
    """Durable consensus records. `apply` writes one step's operations atomically and synced."""

    @abstractmethod
    def apply(self, ops: Sequence[StoreOp]) -> None:
        """Write `ops` (in order) as one atomic, durable batch."""


class MemoryConsensusStore(ConsensusStore):
    def __init__(self) -> None:
        self._data: dict[StoreName, dict[bytes, bytes]] = {name: {} for name in StoreName}

    def apply(self, ops: Sequence[StoreOp]) -> None:
        for op in ops:
            records = self._data[op.store]
            if isinstance(op, Put):
                records[op.key] = op.value
            elif isinstance(op, Delete):
                records.pop(op.key, None)
            else:
                for key in [k for k, _ in self.items(op.store, op.start, op.stop)]:
                    del records[key]

    def items(
        self, store: StoreName, start: bytes | None = None, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        records = self._data[store]
        keys = sorted(records)
        lower = bisect.bisect_left(keys, start) if start is not None else 0
        upper = bisect.bisect_left(keys, stop) if stop is not None else len(keys)
        for key in keys[lower:upper]:
            yield key, records[key]


class LevelDBConsensusStore(ConsensusStore):
    """The stores as keyspaces of a `storage.Database` (the node's single LevelDB)."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._keyspaces: dict[StoreName, Keyspace] = {
            name: database.keyspace(name.value) for name in StoreName
        }

    def apply(self, ops: Sequence[StoreOp]) -> None:
        with self.database.batch(sync=True) as batch:
            self.write(batch, ops)

    def write(self, batch: WriteBatch, ops: Sequence[StoreOp]) -> None:
        """Add `ops` to a batch the adapter also uses for chain writes (one atomic write).

        A range delete also covers keys put earlier in the same batch, as if applied in order.
        """
        written: dict[StoreName, set[bytes]] = {name: set() for name in StoreName}
        for op in ops:
            keyspace = self._keyspaces[op.store]
            if isinstance(op, Put):
                batch.put(keyspace, op.key, op.value)
                written[op.store].add(op.key)
            elif isinstance(op, Delete):
                batch.delete(keyspace, op.key)
            else:
                batch.delete_range(keyspace, op.start, op.stop)
                for key in [k for k in written[op.store] if _in_range(k, op.start, op.stop)]:
                    batch.delete(keyspace, key)
                    written[op.store].discard(key)

    def items(
        self, store: StoreName, start: bytes | None = None, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return self._keyspaces[store].items(start, stop)


def _in_range(key: bytes, start: bytes | None, stop: bytes | None) -> bool:
    return (start is None or key >= start) and (stop is None or key < stop)
