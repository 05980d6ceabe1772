"""The SparkSession of a `pbft-etl` command: local[*] unless --master (or spark-submit)
says otherwise, with the `pbft_chain` data source registered."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from spark_etl.source import ChainDataSource

LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
SETTINGS = {
    # read when this process starts the JVM (a local session); spark-submit's own otherwise
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",  # the ETL prints its own progress
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
}


def spark_session(master: str | None = None, app_name: str = "pbft-etl",
                  settings: Mapping[str, str] | None = None) -> SparkSession:
    """A session for the ETL. Without --master, spark-submit's master or local[*]; a local
    session runs its Python workers on this interpreter (the one with spark_etl installed).
    `settings` add to or override SETTINGS."""
    if master is None or master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in {**SETTINGS, **(settings or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.dataSource.register(ChainDataSource)
    return spark
