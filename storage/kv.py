"""A plyvel-backed key-value layer.

One LevelDB per data directory; every component gets a keyspace (a fixed key prefix), and
writes that belong together go into one `WriteBatch` that may span keyspaces, so a change to
the chain and to the consensus stores lands on disk all at once or not at all.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

import plyvel

from storage.errors import DataDirLockedError, StorageError, StorageFailure


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key that starts with `prefix` (None: no bound)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _reason(exc: plyvel.Error) -> str:
    """LevelDB's status message (plyvel passes it as bytes)."""
    if exc.args and isinstance(exc.args[0], bytes):
        return exc.args[0].decode(errors="replace")
    return str(exc)


class Database:
    """One LevelDB database in `path`, opened (and created if missing) for this process only.

    A failed write or a read of a damaged file raises StorageFailure and is reported to
    `on_failure` (from whichever thread it was): LevelDB refuses every later write, and a
    damaged database must not serve, so the node should stop. Each batch is atomic, so what
    was written before a failure stays whole.
    """

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        self.path = Path(path)
        self.on_failure: Callable[[StorageFailure], None] = lambda error: None
        try:
            if create:
                self.path.mkdir(parents=True, exist_ok=True)
            self._db = plyvel.DB(str(self.path), create_if_missing=create)
        except plyvel.IOError as exc:
            if "permission denied" in str(exc).lower():
                raise StorageError(
                    f"cannot open database in {self.path}: permission denied; the node's user "
                    f"needs read and write access to {self.path} and everything in it"
                ) from None
            if "lock" in str(exc).lower():
                raise DataDirLockedError(
                    f"data directory {self.path} is in use by another process; "
                    "stop that node first or choose another --datadir"
                ) from None
            raise StorageError(f"cannot open database in {self.path}: {exc}") from None
        except plyvel.Error as exc:
            raise StorageError(f"cannot open database in {self.path}: {self._damaged(exc)}"
                               ) from None
        except OSError as exc:
            raise StorageError(
                f"cannot create data directory {self.path}: {exc.strerror}"
            ) from None

    def _damaged(self, exc: plyvel.Error) -> str:
        return (
            f"{_reason(exc)}; the database is damaged: move {self.path} aside, run "
            f"`pbft-node init --genesis GENESIS --datadir {self.path.parent}` and start the "
            "node (a validator re-syncs from its peers; keep its validator_state.json)"
        )

    def write_failed(self, exc: plyvel.Error) -> StorageFailure:
        """The error for a failed write, reported to `on_failure` first."""
        return self._fail(
            f"cannot write to the database in {self.path}: {_reason(exc)}; free space on its "
            "disk (or give the node's user write access) and restart the node: every block "
            "committed before this is on disk"
        )

    def read_failed(self, exc: plyvel.Error) -> StorageFailure:
        """The error for a failed read (a damaged file), reported to `on_failure` first."""
        return self._fail(f"cannot read the database in {self.path}: {self._damaged(exc)}")

    def _fail(self, message: str) -> StorageFailure:
        error = StorageFailure(message)
        self.on_failure(error)
        return error

    @property
    def closed(self) -> bool:
        return self._db.closed

    def keyspace(self, prefix: bytes) -> Keyspace:
        return Keyspace(self, prefix)

    def batch(self, *, sync: bool = False) -> WriteBatch:
        """A write batch: use as a context manager; it is written when the block exits cleanly."""
        return WriteBatch(self, sync=sync)

    def close(self) -> None:
        if not self._db.closed:
            self._db.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Keyspace:
    """The keys of one component: every key is stored as `prefix + key`."""

    def __init__(self, database: Database, prefix: bytes) -> None:
        if not prefix:
            raise ValueError("a keyspace needs a non-empty prefix")
        self.database = database
        self.prefix = prefix

    @property
    def _db(self) -> plyvel.DB:
        return self.database._db

    def get(self, key: bytes) -> bytes | None:
        try:
            return self._db.get(self.prefix + key)
        except plyvel.Error as exc:
            raise self.database.read_failed(exc) from None

    def __contains__(self, key: bytes) -> bool:
        return self.get(key) is not None

    def put(self, key: bytes, value: bytes, *, sync: bool = False) -> None:
        try:
            self._db.put(self.prefix + key, value, sync=sync)
        except plyvel.Error as exc:
            raise self.database.write_failed(exc) from None

    def delete(self, key: bytes, *, sync: bool = False) -> None:
        try:
            self._db.delete(self.prefix + key, sync=sync)
        except plyvel.Error as exc:
            raise self.database.write_failed(exc) from None

    def items(
        self,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs with start <= key < stop, the prefix stripped, in key order."""
        lower = self.prefix + (start or b"")
        upper = self.prefix + stop if stop is not None else _prefix_end(self.prefix)
        n = len(self.prefix)
        try:
            with self._db.iterator(start=lower, stop=upper, reverse=reverse) as iterator:
                for key, value in iterator:
                    yield key[n:], value
        except plyvel.Error as exc:
            raise self.database.read_failed(exc) from None

    def keys(self, start: bytes | None = None, stop: bytes | None = None) -> Iterator[bytes]:
        for key, _ in self.items(start, stop):
            yield key


class WriteBatch:
    """Puts and deletes across keyspaces, applied atomically (and synced when asked)."""

    def __init__(self, database: Database, *, sync: bool) -> None:
        self.database = database
        self._batch = database._db.write_batch(transaction=True, sync=sync)

    def put(self, keyspace: Keyspace, key: bytes, value: bytes) -> None:
        self._batch.put(keyspace.prefix + key, value)

    def delete(self, keyspace: Keyspace, key: bytes) -> None:
        self._batch.delete(keyspace.prefix + key)

    def delete_range(
        self, keyspace: Keyspace, start: bytes | None = None, stop: bytes | None = None
    ) -> int:
        """Delete every key of `keyspace` in [start, stop) that is on disk; returns how many.

        Keys put earlier in this same batch are not seen (LevelDB batches cannot be read).
        """
        count = 0
        for key in keyspace.keys(start, stop):
            self._batch.delete(keyspace.prefix + key)
            count += 1
        return count

    def __enter__(self) -> WriteBatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # plyvel's transaction batch writes on a clean exit and discards on an exception.
        try:
            self._batch.__exit__(exc_type, exc, tb)
        except plyvel.Error as error:
            raise self.database.write_failed(error) from None
