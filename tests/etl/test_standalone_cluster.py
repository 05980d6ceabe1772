"""Spark beyond one machine: a standalone Spark master and one worker on 127.0.0.1, started
from the pyspark distribution (`spark-class ...deploy.master.Master` / `...worker.Worker`),
run `pbft-etl run --master spark://...`; its tables and verdict equal local mode's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from cli.testnet import stop_processes
from spark_etl import schemas
from spark_etl.tables import Dataset
from testkit.nodes import free_port, wait_for
from tests.etl.chain_factory import ServedChain
from tests.etl.conftest import etl
from tests.etl.fake_node import serving

pytestmark = pytest.mark.integration

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
DEADLINE = 120
# The JIT's first tier only, for the master, the worker and the executor, as the ETL's own
# driver runs (spark_etl/session.py): JVMs that live a minute spent more CPU compiling than
# it saved (this test's CPU time 133 s -> 92 s); a test setting, not the cluster's
C1_ONLY = "-XX:TieredStopAtLevel=1"


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as reply:
            return int(json.load(reply).get("aliveworkers", 0))
    except (OSError, ValueError):  # not listening yet, or a half-started UI's empty answer
        return 0


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """spark://127.0.0.1:PORT with one worker (2 cores) registered; both stopped after."""
    directory = tmp_path_factory.mktemp("spark-standalone")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOG_DIR": str(directory), "SPARK_WORKER_DIR": str(directory / "work"),
           "SPARK_DAEMON_JAVA_OPTS": C1_ONLY}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with open(directory / "master.log", "wb") as log:
            processes.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host",
                 "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
                env=env, stdout=log, stderr=log))
        wait_for(lambda: _listening(port), DEADLINE, "the Spark master")
        with open(directory / "worker.log", "wb") as log:
            processes.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker",
                 f"spark://127.0.0.1:{port}", "--host", "127.0.0.1", "--webui-port",
                 str(worker_ui), "--cores", "2", "--memory", "2g"],
                env=env, stdout=log, stderr=log))
        wait_for(lambda: _alive_workers(ui) == 1, DEADLINE, "a worker registered")
        yield f"spark://127.0.0.1:{port}"
    finally:
        stop_processes(processes)


def _rows(spark: SparkSession, out: Path) -> dict[str, list[str]]:
    """Every table but the manifest (it records when it ran), each row as sorted JSON."""
    data = Dataset.read(spark, str(out))
    return {t.name: sorted(json.dumps(row.asDict(recursive=True), sort_keys=True, default=str)
                           for row in getattr(data, t.name).collect())
            for t in schemas.TABLES if t.name != "export_manifest"}


@pytest.mark.timeout(900)  # four JVMs and two runs: 300 s was passed beside make test's others
def test_export_and_audit_on_a_standalone_cluster_equal_local_mode(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain, standalone: str,
) -> None:
    local, remote = tmp_path / "local", tmp_path / "cluster"
    with serving(test_chain) as node:
        code, stdout, stderr = etl(capsys, "run", "--rpc", node.url, "--out", str(local),
                                   "--trust-node", "--report", str(tmp_path / "local.json"))
        assert code == 0, stdout + stderr
        executor = f"--conf spark.executor.extraJavaOptions={C1_ONLY} pyspark-shell"
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_SUBMIT_ARGS": executor}
        result = subprocess.run(
            [sys.executable, "-m", "cli.etl", "run", "--rpc", node.url, "--out", str(remote),
             "--master", standalone, "--trust-node", "--report", str(tmp_path / "cluster.json")],
            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "no violations" in result.stdout
    local_rows, remote_rows = _rows(spark, local), _rows(spark, remote)
    assert local_rows == remote_rows and sum(map(len, local_rows.values())) > 0
    reports = [json.loads((tmp_path / f"{name}.json").read_text())
               for name in ("local", "cluster")]
    verdicts = [(r["ok"], r["violations"], r["signatures"]) for r in reports]
    assert verdicts[0] == verdicts[1]
