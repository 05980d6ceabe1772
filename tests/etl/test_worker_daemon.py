"""The Python processes Spark starts for the ETL import pyspark from the installed package
(its bytecode), not from the `pyspark.zip` Spark puts first on their path
(spark_etl/worker_daemon.py, spark_etl/worker_path/sitecustomize.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from spark_etl.session import WORKER_PATH
from spark_etl.worker_daemon import installed_pyspark_first


def _package(root: Path, with_zip: bool) -> Path:
    """A pyspark package under `root`, shipping its zip or not; the zip's path."""
    lib = root / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (root / "pyspark" / "__init__.py").write_text("")
    shipped = lib / "pyspark.zip"
    if with_zip:
        zipfile.ZipFile(shipped, "w").close()
    return shipped


def test_the_installed_packages_own_zip_is_left_out_only(tmp_path: Path) -> None:
    shipped = _package(tmp_path / "site", with_zip=True)
    other = tmp_path / "spark-home" / "pyspark.zip"
    other.parent.mkdir()
    zipfile.ZipFile(other, "w").close()
    site = str(tmp_path / "site")
    assert installed_pyspark_first([str(shipped), "x.zip", site]) == ["x.zip", site]
    # a Spark distribution's zip, or no installed package: the zip stays
    assert installed_pyspark_first([str(other), site]) == [str(other), site]
    assert installed_pyspark_first([str(shipped)]) == [str(shipped)]


def test_the_interpreters_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.CUSTOMIZED = 1\n")
    path = os.pathsep.join([str(WORKER_PATH), str(tmp_path), os.environ.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", "print(CUSTOMIZED)"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": path})
    assert run.stdout.strip() == "1", run.stderr


class _WhereFrom(DataSource):
    """Reports where pyspark came from in the planner (`partitions`) and in the task."""

    @classmethod
    def name(cls) -> str:
        return "pyspark_where_from"

    def schema(self) -> str:
        return "planner string, task string"

    def reader(self, schema: StructType) -> DataSourceReader:
        return _WhereFromReader()


class _WhereFromReader(DataSourceReader):
    def partitions(self) -> list[InputPartition]:
        return [InputPartition(pyspark.__file__)]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, str]]:
        import pyspark as in_task

        yield partition.value, in_task.__file__


def test_planners_and_tasks_import_the_installed_pyspark(spark: SparkSession) -> None:
    spark.dataSource.register(_WhereFrom)
    row = spark.read.format("pyspark_where_from").load().collect()[0]
    installed = str(Path(pyspark.__file__))
    assert (row["planner"], row["task"]) == (installed, installed)
