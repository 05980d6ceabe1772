"""The export's fetch by `pbft_getBlockBundles` (chain/rpc/bundles.py): rows decoded from the
bytes equal the rows of the Ethereum calls' JSON, block by block and table by table after a
real export; a node without the method is exported by the Ethereum calls; a lying node's
bundles are left out with a warning, never a crash."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import rlp
from pyspark.sql import SparkSession

from chain.blockchain import Blockchain
from chain.genesis import Genesis, GenesisAccount
from chain.rpc.bundles import raw_block
from spark_etl import schemas, tables
from spark_etl.errors import ExtractError
from spark_etl.export import STAGING, ExportOptions, plan_spans, write_by_spark, write_by_tasks
from spark_etl.rows import BlockBundle, block_bundle_row, bundle_row, rlp_list
from spark_etl.rpc import JsonRpcClient
from spark_etl.source import BUNDLE_METHOD, UNREADABLE, Span, fetch_span
from spark_etl.tables import (
    ARROW_BUNDLE,
    Dataset,
    RangeWriter,
    partition_dir,
    read_table,
    to_record_batch,
)
from storage import Database
from tests.etl.chain_factory import CHAIN_ID, SENDER, ServedChain, block_batches
from tests.etl.conftest import etl
from tests.etl.fake_node import FakeNode, serving

NODE = "http://node:8545"
Entry = dict[str, Any]


@pytest.fixture(scope="module")
def bundles(test_chain: ServedChain, tmp_path_factory: pytest.TempPathFactory) -> list[Entry]:
    """Each block's pbft_getBlockBundles entry, its bytes made by the node's own code from
    the test chain built once more (as chain_factory builds it), its consensus records the
    ones the fake node serves."""
    genesis = Genesis(
        chain_id=CHAIN_ID, engine="dev", engine_params={},
        alloc={SENDER.public_key.to_canonical_address(): GenesisAccount(balance=10**24)},
        timestamp=1_700_000_000,
    )
    entries = []
    with Database(tmp_path_factory.mktemp("bundles") / "chaindata") as db:
        chain = Blockchain(db, genesis)
        for number, batch in enumerate(block_batches(), start=1):
            proposer = test_chain.validators.signers[(number - 1) % 4].address
            executed, _ = chain.build_block(batch, timestamp=1_700_000_000 + number,
                                            coinbase=proposer)
            chain.commit(executed)
        for number, payload in enumerate(test_chain.payloads):
            header = chain.header_by_number(number)
            assert header is not None
            raw = raw_block(header, chain.read_store.records(number))
            assert raw.block == payload.raw_block  # the same chain
            entries.append({"number": hex(number), "block": raw.block,
                            "receipts": raw.receipts, "senders": raw.senders,
                            "certificate": payload.certificate,
                            "checkpoints": payload.checkpoints})
    return entries


class BundleNode(FakeNode):
    """The fake node, serving pbft_getBlockBundles too (at most `per_answer` blocks an
    answer, as a node within its byte limit), each entry through `lie`."""

    def __init__(self, chain: ServedChain, entries: list[Entry], per_answer: int = 3) -> None:
        super().__init__(chain)
        self.entries = entries
        self.per_answer = per_answer
        self.lie: Callable[[int, Entry], Any] = lambda number, entry: entry
        self.bundle_calls = 0

    def methods(self) -> dict[str, Callable[..., Any]]:
        return super().methods() | {BUNDLE_METHOD: self._bundles}

    def _bundles(self, first: str, last: str) -> list[Any]:
        self.bundle_calls += 1
        start = int(first, 16)
        stop = min(int(last, 16), self.chain.head, start + self.per_answer - 1)
        return [self.lie(n, dict(self.entries[n])) for n in range(start, stop + 1)]


@pytest.fixture
def bundle_node(test_chain: ServedChain, bundles: list[Entry]) -> Iterator[BundleNode]:
    node = BundleNode(test_chain, bundles)
    with serving(test_chain) as fake:  # its server, answering through `node`
        fake.answer = node.answer  # type: ignore[method-assign]
        node.url = fake.url
        yield node


def test_rows_from_the_bytes_are_the_rows_of_the_json(test_chain: ServedChain,
                                                      bundles: list[Entry]) -> None:
    for number, (payload, entry) in enumerate(zip(test_chain.payloads, bundles, strict=True)):
        from_json = bundle_row(NODE, 0, payload)
        from_bytes = block_bundle_row(NODE, 0, BlockBundle(number, entry))
        for table, json_rows, byte_rows in zip(schemas.BLOCK_TABLES, from_json[2:],
                                               from_bytes[2:], strict=True):
            assert byte_rows == json_rows, f"block {number}: {table.name}"


@pytest.mark.parametrize("items", [
    [],
    [b"", b"\x00", b"\x7f", b"\x80", b"a" * 55, b"b" * 56, b"c" * 300],
    [[b"\x01", [b"d" * 20, []]], b"e" * 55, [[b"f" * 1_000]]],
])
def test_the_export_splits_rlp_as_rlp_decodes_it(items: list[Any]) -> None:
    """The export's splitter (its short strings read without a call) against pyrlp's."""
    assert rlp_list(rlp.encode(items), depth=3) == rlp.decode(rlp.encode(items))


@pytest.mark.parametrize("encoded", [
    bytes([0xC3, 0x83, 0x61, 0x62]),  # a short string past its list
    bytes([0xC2, 0x81]),  # ... past the data
    bytes([0xC4, 0xB8, 0x38, 0x61, 0x62]),  # a long string past its list
    bytes([0xC3, 0xC1, 0xC0, 0x61]),  # nested deeper than asked (depth 1)
])
def test_rlp_that_runs_past_its_list_is_refused(encoded: bytes) -> None:
    with pytest.raises((ValueError, IndexError)):
        rlp_list(encoded, depth=1)


def test_fetch_continues_after_a_prefix_and_stops_at_the_head(
    test_chain: ServedChain, bundle_node: BundleNode,
) -> None:
    head = test_chain.head
    with JsonRpcClient(bundle_node.url) as client:
        fetched = list(fetch_span(client, Span(bundle_node.url, 1, head + 5, 0), 4))
    assert [b.number for b in fetched if isinstance(b, BlockBundle)] == list(range(1, head + 1))
    assert bundle_node.fetched == {}  # no eth_getBlockByNumber: nothing fetched twice


@pytest.mark.parametrize("lie", [
    lambda entry: entry | {"number": hex(int(entry["number"], 16) + 1)},
    lambda entry: entry | {"block": "0xc0"},
    lambda entry: entry | {"block": "0x" + "f8" * 40_000},
    lambda entry: entry | {"receipts": entry["receipts"][:-1] or ["0x01"]},
    lambda entry: entry | {"receipts": ["0x" + "c1" * 2_000] * len(entry["receipts"])},
    lambda entry: entry | {"senders": None},
    lambda entry: {},
    lambda entry: None,
])
def test_an_unreadable_bundle_is_unreadable(bundles: list[Entry], lie: Callable[[Entry], Any],
                                            ) -> None:
    """What the export leaves out (`source._readable`) rather than crash on."""
    with pytest.raises(UNREADABLE):
        block_bundle_row(NODE, 0, BlockBundle(5, lie(dict(bundles[5]))))


def test_export_by_bundles_writes_what_the_json_export_writes(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain, bundle_node: BundleNode,
) -> None:
    """A node with the method is exported by it alone, in answers of a few blocks each; a
    node without it (the fake node, as geth: -32601) by the Ethereum calls; both write the
    same tables, every column."""
    by_bundles, by_json = tmp_path / "bundles", tmp_path / "json"
    with serving(test_chain) as plain:
        for out, url in ((by_bundles, bundle_node.url), (by_json, plain.url)):
            code, _, stderr = etl(capsys, "export", "--rpc", url, "--out", str(out),
                                  "--range-size", "4", "--retries", "1")
            assert code == 0, stderr
        assert plain.fetched and not bundle_node.fetched
    assert bundle_node.bundle_calls >= test_chain.head // bundle_node.per_answer
    left, right = Dataset.read(spark, str(by_bundles)), Dataset.read(spark, str(by_json))
    for table in schemas.BLOCK_TABLES:
        columns = [*table.column_names, "range_start"]
        mine = getattr(left, table.name).select(*columns)
        theirs = getattr(right, table.name).select(*columns)
        assert mine.count() == theirs.count() > 0, table.name
        assert mine.exceptAll(theirs).isEmpty(), table.name


def test_an_answer_longer_than_asked_is_refused(bundle_node: BundleNode) -> None:
    original = bundle_node._bundles
    bundle_node._bundles = lambda first, last: original(first, last) * 10  # type: ignore
    with JsonRpcClient(bundle_node.url) as client, pytest.raises(ExtractError) as refused:
        list(fetch_span(client, Span(bundle_node.url, 1, 8, 0), 4))
    assert "not a list of at most the blocks asked" in str(refused.value)


def test_tasks_write_the_files_spark_writes(spark: SparkSession, tmp_path: Path,
                                            test_chain: ServedChain,
                                            bundle_node: BundleNode) -> None:
    """The export tasks' own Parquet files (an --out they reach as files) hold the rows
    Spark's writer writes from the bundles, in the same partition directories, and tell the
    same counts: the audit reads either alike."""
    nodes = (bundle_node.url,)
    wave = plan_spans(nodes, 0, test_chain.head, 4, {})
    by_tasks, by_spark = tmp_path / "tasks", tmp_path / "spark"
    written = write_by_tasks(spark, ExportOptions(nodes, str(by_tasks), range_size=4,
                                                  partition_blocks=3), wave)
    counted = write_by_spark(spark, ExportOptions(nodes, str(by_spark), range_size=4), wave)
    assert sorted(map(sorted_items, written)) == sorted(map(sorted_items, counted))
    assert partitions(by_tasks) == partitions(by_spark)
    assert not (by_tasks / STAGING).exists()
    for table in schemas.BLOCK_TABLES:
        mine = read_table(spark, str(by_tasks), table)
        theirs = read_table(spark, str(by_spark), table)
        assert mine.count() == theirs.count() > 0, table.name
        assert mine.exceptAll(theirs).isEmpty() and theirs.exceptAll(mine).isEmpty(), table.name


def sorted_items(row: dict[str, Any]) -> list[tuple[str, Any]]:
    return sorted(row.items())


def partitions(root: Path) -> dict[str, set[str]]:
    """Each block-range table's partition directories that hold a Parquet file."""
    return {t.name: {str(p.parent.relative_to(root / t.name))
                     for p in (root / t.name).rglob("*.parquet")}
            for t in schemas.BLOCK_TABLES}


def test_partition_directories_are_named_as_spark_names_them(spark: SparkSession,
                                                             tmp_path: Path) -> None:
    nodes = ["http://h:1/a=b%20c?d#e", "http://[::1]:8545/'*{^}\\\"", "http://é x:2/\x01\x7f"]
    frame = spark.createDataFrame([(n, 7, 1) for n in nodes],
                                  "node string, range_start long, v int")
    frame.write.partitionBy("node", "range_start").parquet(str(tmp_path / "t"))
    named = {str(p.parent.relative_to(tmp_path / "t"))
             for p in (tmp_path / "t").rglob("*.parquet")}
    assert named == {partition_dir(n, 7) for n in nodes}


def test_a_failed_task_leaves_no_file(tmp_path: Path, bundles: list[Entry],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A task whose writer stops with an error removes what it wrote; until a writer is
    closed, its files are hidden from Spark's reader (a killed task leaves nothing that looks
    written)."""
    monkeypatch.setattr(tables, "FLUSH_BYTES", 1)  # every batch written as it comes
    rows = [block_bundle_row(NODE, 0, BlockBundle(n, bundles[n])) for n in range(1, 4)]
    batch = to_record_batch(rows, ARROW_BUNDLE)
    with pytest.raises(ExtractError), RangeWriter(str(tmp_path), NODE, 0, 1) as writer:
        writer.write(batch)
        names = [p.name for p in tmp_path.rglob("*") if p.is_file()]
        assert names and all(name.startswith(".") for name in names)
        raise ExtractError("the node stopped answering")
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    with RangeWriter(str(tmp_path), NODE, 0, 1) as writer:
        writer.write(batch)
    assert writer.counts["blocks"] == 3 and (writer.counts["first_block"],
                                             writer.counts["last_block"]) == (1, 3)
    assert {p.name for p in tmp_path.rglob("*") if p.is_file()} == \
        {"part-00000000000000000001.parquet"}
