"""The database py-evm runs on, on top of a keyspace.

py-evm 0.12 ships no LevelDB backend, and it calls `atomic_batch()` on whatever database it is
given. `OverlayDB` gives it that: it reads through to LevelDB and keeps every write in memory
until `flush()` puts them into one LevelDB write batch. A block executed on an overlay that is
then abandoned (a rejected or never-committed proposal) leaves no trace on disk.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from eth.abc import AtomicWriteBatchAPI
from eth.db.atomic import AtomicDBWriteBatch
from eth.db.backends.base import BaseAtomicDB, BaseDB

from storage.kv import Keyspace, WriteBatch

_DELETED = None


class KeyspaceDB(BaseDB):
    """A py-evm `BaseDB` reading and writing one keyspace directly."""

    def __init__(self, keyspace: Keyspace) -> None:
        self.keyspace = keyspace

    def __getitem__(self, key: bytes) -> bytes:
        value = self.keyspace.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.keyspace.put(key, value)

    def __delitem__(self, key: bytes) -> None:
        if key not in self.keyspace:
            raise KeyError(key)
        self.keyspace.delete(key)

    def _exists(self, key: bytes) -> bool:
        return key in self.keyspace


class OverlayDB(BaseAtomicDB):
    """Pending writes over a keyspace, written to LevelDB in one batch.

    Over a `parent` overlay (a block executed on an uncommitted block), reads go through the
    parent's pending writes too; writing this overlay writes only its own, so the parent's
    must be written first (blocks commit in order), and from then on reads go to LevelDB.
    """

    def __init__(self, base: Keyspace, parent: OverlayDB | None = None) -> None:
        self.base = base
        self.parent = parent
        self._pending: dict[bytes, bytes | None] = {}

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:  # type: ignore[override]
        if key in self._pending:
            value = self._pending[key]
            return default if value is _DELETED else value
        value = self.base.get(key) if self.parent is None else self.parent.get(key)
        return default if value is None else value

    def __getitem__(self, key: bytes) -> bytes:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self._pending[key] = value

    def __delitem__(self, key: bytes) -> None:
        if self.get(key) is None:
            raise KeyError(key)
        self._pending[key] = _DELETED

    def _exists(self, key: bytes) -> bool:
        return self.get(key) is not None

    @contextmanager
    def atomic_batch(self) -> Iterator[AtomicWriteBatchAPI]:
        with AtomicDBWriteBatch._commit_unless_raises(self) as readable_batch:
            yield readable_batch

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def write_into(self, batch: WriteBatch) -> None:
        """Add the pending writes to `batch` (the caller writes it), then forget them and
        the parent (written before: its writes are in LevelDB)."""
        for key, value in self._pending.items():
            if value is _DELETED:
                batch.delete(self.base, key)
            else:
                batch.put(self.base, key, value)
        self._pending.clear()
        self.parent = None
