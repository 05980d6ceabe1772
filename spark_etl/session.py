"""The SparkSession of a `pbft-etl` command: local[*] unless --master (or spark-submit)
says otherwise, with the `pbft_chain` data source registered, and its driver JVM started
from the class archive (`class_archive`) when this process starts that JVM."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from subprocess import TimeoutExpired

from pyspark import SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from spark_etl.class_archive import EXIT_DEADLINE, ClassArchive
from spark_etl.source import ChainDataSource

LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
WORKER_PATH = Path(__file__).with_name("worker_path")  # its sitecustomize: see there
SETTINGS = {
    # read when this process starts the JVM (a local session); spark-submit's own otherwise.
    # The JIT's first tier only: a command's JVM lives seconds to minutes, mostly planning
    # queries and waiting on Python workers, and the second tier (C2) spent more CPU
    # compiling than it saved (an audit of the 11-block test chain: the JVM's CPU time
    # 58 s -> 32 s on this 2-core machine). With the first tier only the JVM reserves 48 MiB
    # for compiled code (the tiered default is 240): an audit of 1,500 blocks filled it, and
    # a full code cache cannot even make a method handle's adapter (the JVM's scheduler
    # thread died: "Out of space in CodeCache for adapters")
    "spark.driver.extraJavaOptions":
        f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()} -XX:TieredStopAtLevel=1 "
        "-XX:ReservedCodeCacheSize=240m",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",  # the ETL prints its own progress
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    # No Python call site sent with each DataFrame and Column call (PySpark 4's DataFrame
    # query context, for error messages: `pyspark.errors.utils._with_origin`): it cost five
    # py4j round trips per call, 24,000 of the 43,000 that building a 5-block chain's audit
    # took (the ETL reports Spark's errors in one line without it)
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # pyspark imported from its installed bytecode in every Python worker (`worker_daemon`)
    "spark.python.daemon.module": "spark_etl.worker_daemon",
}

# When this process starts the JVM (not under spark-submit, whose --conf then decides): no
# web UI, whose server starts with the JVM (the ETL prints its own progress)
OWN_JVM_SETTINGS = {"spark.ui.enabled": "false"}


_recording: ClassArchive | None = None  # the archive this process's JVM records at exit


def spark_session(master: str | None = None, app_name: str = "pbft-etl",
                  settings: Mapping[str, str] | None = None, *,
                  record_classes: bool = False) -> SparkSession:
    """A session for the ETL. Without --master, spark-submit's master or local[*]; a local
    session runs its Python workers on this interpreter (the one with spark_etl installed).
    `settings` add to or override SETTINGS. A JVM this call starts maps the class archive;
    with `record_classes` and no archive yet, it records one (`finish_session` publishes it)."""
    global _recording
    if master is None or master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    starts_jvm = _starts_jvm()
    if starts_jvm:  # the Python processes this JVM starts find pyspark's bytecode
        _prepend_python_path(WORKER_PATH)
    own_jvm = OWN_JVM_SETTINGS if starts_jvm else {}
    configured = {**SETTINGS, **own_jvm, **(settings or {})}
    archive = ClassArchive.for_this_install() if starts_jvm else None
    option = archive.java_option(record_classes) if archive is not None else None
    try:
        spark = _build(master, app_name, configured, option)
    except PySparkRuntimeError as exc:
        if archive is None or option is None or exc.getCondition() != "JAVA_GATEWAY_EXITED":
            raise
        archive.discard()  # a damaged archive kills the JVM at start: once more without it
        archive.discard_recording()
        option = None
        spark = _build(master, app_name, configured, None)
    if archive is not None and option is not None and "ArchiveClassesAtExit" in option:
        _recording = archive
    spark.dataSource.register(ChainDataSource)
    return spark


def _prepend_python_path(directory: Path) -> None:
    """`directory` first on PYTHONPATH (once), for the processes started from here on."""
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if str(directory) not in entries:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(directory), *entries])


def _starts_jvm() -> bool:
    """Whether a session made now starts this process's JVM (not spark-submit's, not one
    already running)."""
    return SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ


def _build(master: str | None, app_name: str, settings: Mapping[str, str],
           java_option: str | None) -> SparkSession:
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in settings.items():
        if key == "spark.driver.extraJavaOptions" and java_option is not None:
            value = f"{value} {java_option}"
        builder = builder.config(key, value)
    return builder.getOrCreate()


def recording_classes() -> Path | None:
    """The archive this process's JVM will write when `finish_session` ends it, if any."""
    return _recording.path if _recording is not None else None


def finish_session() -> None:
    """If this process's JVM records the class archive: stop Spark, let the JVM write the
    archive and exit (it exits when its stdin closes), and publish the archive."""
    global _recording
    archive, _recording = _recording, None
    if archive is None:
        return
    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    gateway = SparkContext._gateway
    process = getattr(gateway, "proc", None)
    if process is None or process.stdin is None:
        archive.discard_recording()
        return
    process.stdin.close()
    try:
        status = process.wait(EXIT_DEADLINE)
    except TimeoutExpired:
        process.kill()
        status = -1
    SparkContext._gateway = None
    SparkContext._jvm = None
    archive.publish(status)
