"""A class-data-sharing archive for the driver JVM (HotSpot's dynamic AppCDS, JDK 13 and up):
the classes a `pbft-etl` command loads from Spark's ~250 jars, mapped from one file instead.

Measured here (Java 17, PySpark 4): a session and two small jobs in 5.2 s instead of 8.1 s.
The first command records the archive as its JVM exits (about 15 s more, once per JVM and
PySpark install); later commands, and any session this package starts, map it.

HotSpot crashes on a truncated archive but ignores, and runs without, one made by another JVM
or for other jars. So a recording is written under a temporary name and published by rename
only after its JVM exited cleanly, and a JVM that dies at start with an archive is started
again without it (and the archive removed). The archives live in $XDG_CACHE_HOME/pbft-chain
(~/.cache/pbft-chain), about 190 MB each; PBFT_ETL_CLASS_ARCHIVE=off turns them off."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyspark

SWITCH = "PBFT_ETL_CLASS_ARCHIVE"
EXIT_DEADLINE = 180.0  # seconds for the recording JVM to write its archive and exit
# HotSpot logs what it could not archive (signed jars, old class files) to stdout, where the
# commands print their results
QUIET = "-Xlog:cds=off,cds+dynamic=off"


def _java() -> str:
    """The java that spark-submit starts: $JAVA_HOME/bin/java, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return os.path.realpath(found) if found else "java"


def _build_stamp(java: str) -> int:
    """When the JDK's class image was installed: an updated JDK at the same path gets its own
    archive (HotSpot would ignore the old one)."""
    try:
        return Path(java).parent.parent.joinpath("lib", "modules").stat().st_mtime_ns
    except OSError:
        return 0


def _cache_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pbft-chain"


@dataclass(frozen=True)
class ClassArchive:
    """The archive of this JVM and PySpark install, and where a recording of it goes."""

    path: Path

    @classmethod
    def for_this_install(cls) -> ClassArchive | None:
        """None when PBFT_ETL_CLASS_ARCHIVE=off."""
        if os.environ.get(SWITCH, "").lower() in ("off", "0", "false", "no"):
            return None
        java = _java()
        key = f"{java}|{_build_stamp(java)}|{pyspark.__version__}|{Path(pyspark.__file__).parent}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        return cls(_cache_directory() / f"spark-driver-{digest}.jsa")

    @property
    def recording(self) -> Path:
        return self.path.with_name(f"{self.path.name}.{os.getpid()}.recording")

    def java_option(self, record: bool) -> str | None:
        """Map the archive if it exists; else, if `record`, record it at the JVM's exit."""
        if self.path.exists():
            return f"-XX:SharedArchiveFile={self.path} {QUIET}"
        if not record:
            return None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None  # no cache directory: start as without an archive
        return f"-XX:ArchiveClassesAtExit={self.recording} {QUIET}"

    def publish(self, exit_status: int) -> None:
        """After the recording JVM exited: keep its archive only if it exited cleanly."""
        if exit_status == 0 and self.recording.exists():
            with contextlib.suppress(OSError):  # a cache we cannot write only costs speed
                os.replace(self.recording, self.path)
                return
        self.discard_recording()

    def discard_recording(self) -> None:
        with contextlib.suppress(OSError):
            self.recording.unlink(missing_ok=True)

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)
