"""storage/: keyspaces, atomic batches, iteration, locking and the py-evm overlay, on LevelDB."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import Database, DataDirLockedError, OverlayDB, StorageError


@pytest.fixture
def db(tmp_path: Path) -> Database:
    database = Database(tmp_path / "db")
    yield database
    database.close()


def test_keyspaces_are_isolated_and_iterate_in_order(db: Database) -> None:
    a, b = db.keyspace(b"a/"), db.keyspace(b"b/")
    for n in (3, 1, 2):
        a.put(n.to_bytes(8, "big"), b"a%d" % n)
    b.put((1).to_bytes(8, "big"), b"b1")
    assert [v for _, v in a.items()] == [b"a1", b"a2", b"a3"]
    assert [v for _, v in a.items(reverse=True)] == [b"a3", b"a2", b"a1"]
    start, stop = (2).to_bytes(8, "big"), (3).to_bytes(8, "big")
    assert list(a.items(start, stop)) == [(start, b"a2")]
    assert list(b.keys()) == [(1).to_bytes(8, "big")]
    assert a.get(b"missing") is None and b"missing" not in a


def test_prefix_ending_in_ff_iterates_only_its_keys(db: Database) -> None:
    high = db.keyspace(b"\x01\xff")
    high.put(b"k", b"v")
    db.keyspace(b"\x02").put(b"k", b"other")
    assert list(high.items()) == [(b"k", b"v")]


def test_batch_is_atomic_across_keyspaces(db: Database) -> None:
    a, b = db.keyspace(b"a/"), db.keyspace(b"b/")
    a.put(b"old", b"1")
    with pytest.raises(RuntimeError), db.batch(sync=True) as batch:
        batch.put(a, b"k", b"v")
        batch.delete(a, b"old")
        raise RuntimeError("crash before the batch is written")
    assert a.get(b"k") is None and a.get(b"old") == b"1"
    with db.batch(sync=True) as batch:
        batch.put(a, b"k", b"v")
        batch.put(b, b"k", b"w")
        assert batch.delete_range(a, b"o", b"p") == 1
    assert (a.get(b"k"), b.get(b"k"), a.get(b"old")) == (b"v", b"w", None)


def test_reopen_reads_back_identical_bytes(tmp_path: Path) -> None:
    with Database(tmp_path / "db") as first:
        first.keyspace(b"x/").put(b"\x00\x01", bytes(range(256)))
    with Database(tmp_path / "db") as second:
        assert second.keyspace(b"x/").get(b"\x00\x01") == bytes(range(256))


def test_second_process_gets_a_clear_locked_error(db: Database) -> None:
    with pytest.raises(DataDirLockedError, match="in use by another process"):
        Database(db.path)


def test_unwritable_location_is_a_storage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="cannot"):
        Database(blocker / "db")


def test_overlay_reads_through_and_writes_only_on_flush(db: Database) -> None:
    keyspace = db.keyspace(b"c/")
    keyspace.put(b"base", b"1")
    overlay = OverlayDB(keyspace)
    overlay[b"new"] = b"2"
    del overlay[b"base"]
    assert overlay.get(b"new") == b"2" and b"base" not in overlay
    assert keyspace.get(b"base") == b"1" and keyspace.get(b"new") is None
    with overlay.atomic_batch() as batch:
        batch[b"inner"] = b"3"
    assert overlay[b"inner"] == b"3"
    with db.batch(sync=True) as write:
        overlay.write_into(write)
    assert (keyspace.get(b"base"), keyspace.get(b"new"), keyspace.get(b"inner")) == (
        None,
        b"2",
        b"3",
    )
    assert overlay.pending_count == 0
