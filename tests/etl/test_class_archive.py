"""The driver JVM's class archive (spark_etl/class_archive.py) with a real JVM: the first
command records it and publishes it whole, later ones map it, and a damaged one is dropped
without failing the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_etl.class_archive import ClassArchive

ROOT = Path(__file__).resolve().parents[2]


def _export_from_nowhere(cache: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The cheapest command that starts Spark: an export whose node does not answer."""
    environment = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(ROOT)}
    environment.pop("PBFT_ETL_CLASS_ARCHIVE", None)
    return subprocess.run(
        [sys.executable, "-m", "cli.etl", "export", "--rpc", "http://127.0.0.1:1", "--out",
         str(cwd / "out"), "--retries", "0"],
        capture_output=True, text=True, timeout=300, cwd=cwd, env=environment)


def _archives(cache: Path) -> list[Path]:
    return sorted((cache / "pbft-chain").glob("*"))


def test_recorded_once_published_whole_and_a_damaged_one_dropped(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    cache = tmp_path / "cache"
    first = _export_from_nowhere(cache, tmp_path)
    assert first.returncode == 3, first.stderr
    assert "recording Spark's classes" in first.stderr
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    archive = ClassArchive.for_this_install()
    assert archive is not None
    assert _archives(cache) == [archive.path]  # published; no recording left behind
    assert archive.java_option(record=True) == (
        f"-XX:SharedArchiveFile={archive.path} -Xlog:cds=off,cds+dynamic=off")

    second = _export_from_nowhere(cache, tmp_path)
    assert second.returncode == 3 and "recording" not in second.stderr, second.stderr
    assert second.stdout == "", second.stdout  # HotSpot's archive warnings stay off stdout

    whole = archive.path.read_bytes()
    archive.path.chmod(0o600)
    archive.path.write_bytes(whole[: len(whole) // 4])  # HotSpot crashes mapping this
    third = _export_from_nowhere(cache, tmp_path)
    assert third.returncode == 3, third.stderr  # the node's error, not the JVM's
    assert "127.0.0.1:1" in third.stderr.strip().splitlines()[-1]
    assert _archives(cache) == []

    monkeypatch.setenv("PBFT_ETL_CLASS_ARCHIVE", "off")
    assert ClassArchive.for_this_install() is None
