"""Spark's Python worker daemon for the ETL (`spark.python.daemon.module`): pyspark's own
daemon, with pyspark imported from the installed package instead of `pyspark.zip`.

Spark starts every Python daemon (one per worker module: the tasks' `pyspark.worker`, and
each step of planning a Python data source) with `pyspark.zip` first on its path. Python
never writes bytecode for modules imported from a zip, so each daemon and each worker it
forks compiled pyspark's modules from source again (0.5 CPU-s for `pyspark.worker` alone
against 0.1 s from the installed package's bytecode). The zip is left out only when it is
the installed package's own copy (pip's pyspark ships it inside the package, so both are
the same version); a Spark distribution's zip without that package is kept.

The daemon also imports, before it forks its workers, what every ETL task imports that
starts no thread (pyspark's daemon imports the worker module after the fork because pandas
and pyarrow start threads, which a fork does not copy): pyspark's worker and the decoding
libraries, about 0.5 CPU-s of each worker's start here. pyarrow is still imported by each."""

from __future__ import annotations

import sys
from importlib import import_module
from importlib.machinery import PathFinder
from pathlib import Path

ZIP = "pyspark.zip"
# What each worker would import (tasks of the export and the audit) that starts no thread
PRELOAD = ("pyspark.worker", "rlp", "coincurve", "Crypto.Hash.keccak", "eth_hash.auto",
           "pbft_engine.messages")


def installed_pyspark_first(path: list[str]) -> list[str]:
    """`path` without the pyspark.zip entries that the pyspark package found on the rest of
    it ships (`pyspark/python/lib/pyspark.zip`): the same modules, with bytecode."""
    zips = [entry for entry in path if Path(entry).name == ZIP]
    rest = [entry for entry in path if entry not in zips]
    spec = PathFinder.find_spec("pyspark", rest)
    if spec is None or not spec.submodule_search_locations:
        return path
    shipped = (Path(spec.submodule_search_locations[0]) / "python" / "lib" / ZIP).resolve()
    return [entry for entry in path if entry not in zips or Path(entry).resolve() != shipped]


if __name__ == "__main__":
    sys.path[:] = installed_pyspark_first(sys.path)
    for module in PRELOAD:
        import_module(module)
    from pyspark.daemon import manager

    manager()
