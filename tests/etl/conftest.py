"""One SparkSession for every ETL test, and a small real chain (tests/etl/chain_factory.py)
turned into the exported tables of two nodes, to plant faults in."""

from __future__ import annotations

import atexit
import copy
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema

from cli.etl import main
from spark_etl import schemas
from spark_etl.audit import Audit, ValidatorSet
from spark_etl.export import NodeInfo, manifest_rows
from spark_etl.rows import bundle_row, evidence_row, view_change_rows
from spark_etl.session import spark_session
from spark_etl.tables import Dataset, to_record_batch
from tests.etl.chain_factory import CHAIN_ID, ServedChain, build_chain, epoch_rows

NODE_A = "http://node-a:8545"
NODE_B = "http://node-b:8545"
RANGE_SIZE = 4

Tables = dict[str, list[dict[str, Any]]]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    small_data = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "1",
                  "spark.sql.codegen.wholeStage": "false"}
    session = spark_session("local[2]", "pbft-etl-tests", small_data)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def test_chain(tmp_path_factory: pytest.TempPathFactory) -> ServedChain:
    return build_chain(tmp_path_factory.mktemp("chain"))


def node_info(chain: ServedChain, url: str) -> NodeInfo:
    return NodeInfo(url, CHAIN_ID, chain.genesis_hash,
                    tuple(chain.set_at(chain.head + 1).addresses), chain.head, view=1)


def export_rows(chain: ServedChain, nodes: tuple[str, ...]) -> Tables:
    """What `pbft-etl export` writes for these nodes of `chain`, as rows of dicts (the
    bundles split as `spark_etl.tables.split_bundle` does, without Spark)."""
    tables: Tables = {t.name: [] for t in schemas.TABLES}
    counts: dict[tuple[str, int], dict[str, Any]] = {}
    for node in nodes:
        for number, payload in enumerate(chain.payloads):
            start = number - number % RANGE_SIZE
            _, _, block, *nested = bundle_row(node, start, payload)
            tables["blocks"] += as_dicts(schemas.BLOCKS, [(*block, node, start)])
            count = counts.setdefault((node, start), {
                "node": node, "range_start": start, "first_block": number, "blocks": 0})
            count.update(last_block=number, blocks=count["blocks"] + 1)
            for table, items in zip(schemas.NESTED_TABLES, nested, strict=True):
                tables[table.name] += as_dicts(table, [(*i, node, start) for i in items])
                count[table.name] = count.get(table.name, 0) + len(items)
        tables["view_changes"] += as_dicts(
            schemas.VIEW_CHANGES,
            [row for entry in chain.view_changes for row in view_change_rows(node, entry)],
        )
        tables["evidence"] += as_dicts(
            schemas.EVIDENCE, [evidence_row(node, e) for e in chain.evidence]
        )
        tables["epochs"] += as_dicts(schemas.EPOCHS, epoch_rows(chain, node))
    infos = {node: node_info(chain, node) for node in nodes}
    tables["export_manifest"] = as_dicts(
        schemas.EXPORT_MANIFEST, manifest_rows(list(counts.values()), infos, RANGE_SIZE)
    )
    return tables


def as_dicts(table: schemas.Table, rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(table.schema.names, row, strict=True)) for row in rows]


@pytest.fixture(scope="session")
def clean_tables(test_chain: ServedChain) -> Tables:
    """The clean export of two nodes of the test chain; copy before changing it."""
    return export_rows(test_chain, (NODE_A, NODE_B))


@pytest.fixture
def tables(clean_tables: Tables) -> Tables:
    return copy.deepcopy(clean_tables)


def dataset(spark: SparkSession, tables: Tables) -> Dataset:
    """The tables as an audit reads an export: Parquet files read with their schemas (about
    3x faster to audit than frames of driver-side rows, whose every job ships the rows)."""
    root = tempfile.mkdtemp(dir=_datasets_root())
    for t in schemas.TABLES:
        arrow_schema = to_arrow_schema(t.schema, timezone="UTC")
        rows = [tuple(row[n] for n in t.schema.names) for row in tables[t.name]]
        os.mkdir(os.path.join(root, t.name))
        pq.write_table(pa.Table.from_batches([to_record_batch(rows, arrow_schema)]),
                       os.path.join(root, t.name, "part-0.parquet"))
    return Dataset.read(spark, root)


@functools.cache
def _datasets_root() -> str:
    root = tempfile.mkdtemp(prefix="pbft-etl-datasets-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


@pytest.fixture(scope="session")
def validator_set(test_chain: ServedChain) -> ValidatorSet:
    return ValidatorSet(tuple(test_chain.validators.addresses), CHAIN_ID)


def make_audit(spark: SparkSession, tables: Tables, validators: ValidatorSet) -> Audit:
    return Audit(dataset(spark, tables), validators)


def etl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`pbft-etl ARGS` in this process (sharing the test session): (status, stdout, stderr)."""
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err
