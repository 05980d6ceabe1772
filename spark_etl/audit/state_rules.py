"""state-root, the state audit: the exported blocks replayed from the genesis allocation, and
every block's certified state root compared with the root the replay computes.

The replay itself (an EVM) is not the ETL's: spark_etl imports no chain code, so the rule
takes a `StateReplay` (the interface below; `cli.state_replay.ChainStateReplay` runs the
chain's own py-evm code). Which node is replayed: the one with the most blocks. Block hashes
bind the state root and, through the transactions root, the transactions, and
`node-agreement` reports any height where nodes hold different blocks; so one replay verifies
every node's blocks wherever they agree, at the cost of one node (the costliest rule, run N
times over for N nodes, would prove nothing more).

The replay is sequential by nature (each block runs on its parent's state): it is one Spark
task, reading the node's blocks sorted by number through Arrow batches, one block in memory
at a time beside the replay's own state (on disk)."""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import pyarrow as pa
import rlp
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from rlp.codec import length_prefix

from spark_etl import schemas
from spark_etl.audit.context import Audit
from spark_etl.hexcodec import from_hex, to_hex
from spark_etl.tables import Dataset, to_record_batch

RULE = "state-root"
# An encoded block of this chain is [header, transactions, ommers, withdrawals] (Prague's
# block; the chain refuses any other shape): a PBFT chain has no ommers and no withdrawals.
EMPTY_LIST = rlp.encode([])
OUTPUT_BATCH = 1_000  # violations per Arrow batch handed back to Spark
# An RLP list's prefix starts at 0xc0: a legacy transaction is a list, a typed one starts
# below 0x80.
LIST_OFFSET = 0xC0


class BlockNotExecuted(Exception):
    """The replay cannot go past block `number` (the message says why)."""

    def __init__(self, number: int, reason: str) -> None:
        super().__init__(f"block {number}: {reason}")
        self.number = number
        self.reason = reason


class StateReplay(ABC):
    """Executes blocks from a genesis state, in order, and tells the state root each one
    leaves. An implementation is pickled to the Spark executor that runs the replay."""

    @abstractmethod
    def state_roots(self, blocks: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
        """For each (number, encoded block as debug_getRawBlock serves it), starting at 0 and
        consecutive, (number, the state root computed by executing the block on the state
        its predecessor left; block 0: the genesis allocation's root). The root in the
        block's header is never taken for the computed one. Raises BlockNotExecuted for a
        block that does not execute (nothing after it can be replayed). Lazy: it reads the
        next block only after yielding the root of the one before."""


Row = dict[str, Any]
Violation = tuple[str, str, int, str]


def encoded_block(raw_header: bytes, raw_transactions: list[bytes]) -> bytes:
    """The block [header, transactions, [], []] as the chain encodes it, around the header's
    own bytes: a typed transaction is an RLP string of its bytes, a legacy one its list."""
    transactions = b"".join(
        raw if raw[:1] >= bytes([LIST_OFFSET]) else rlp.encode(raw)
        for raw in raw_transactions
    )
    body = raw_header + length_prefix(len(transactions), LIST_OFFSET) + transactions \
        + EMPTY_LIST + EMPTY_LIST
    return length_prefix(len(body), LIST_OFFSET) + body


def _block_of(row: Row) -> bytes:
    """The encoded block of a row of `_replay_inputs`; ValueError for a value that is
    missing or not hex."""
    if row["raw_header"] is None:
        raise ValueError("the export has no raw_header for it (exported by an older "
                         "pbft-etl? export again)")
    transactions = row["transactions"] or []
    if any(tx["raw"] is None for tx in transactions):
        raise ValueError("a transaction of it has no raw bytes")
    try:
        return encoded_block(from_hex(row["raw_header"]),
                             [from_hex(tx["raw"]) for tx in transactions])
    except ValueError:
        raise ValueError("its raw header or a raw transaction is not hex") from None


class _Feed:
    """The rows' blocks for the replay, remembering each one's certified root until the
    replay answers for it, and why it stopped feeding (a block it cannot hand over)."""

    def __init__(self, node: str, rows: Iterator[Row]) -> None:
        self.node = node
        self.rows = rows
        self.claimed: dict[int, str] = {}
        self.stopped: Violation | None = None

    def blocks(self) -> Iterator[tuple[int, bytes]]:
        for expected, row in enumerate(self.rows):
            number = row["block_number"]
            if number != expected:
                self.stopped = (RULE, self.node, number, self._out_of_order(number, expected))
                return
            try:
                block = _block_of(row)
            except ValueError as exc:
                self.stopped = (RULE, self.node, number, f"block {number} cannot be rebuilt: "
                                f"{exc}; blocks {number}.. are unverified")
                return
            self.claimed[number] = row["state_root"]
            yield number, block

    @staticmethod
    def _out_of_order(number: int, expected: int) -> str:
        if expected == 0:
            return (f"the state audit replays every block from block 0, and this export "
                    f"starts at block {number}: export from block 0 to audit the state")
        return (f"block {number} follows block {expected - 1}: the replay needs every block, "
                f"so blocks {expected}.. are unverified")


def replay_violations(replay: StateReplay, rows: Iterator[Row]) -> Iterator[Violation]:
    """state-root violations of one node's rows (sorted by number), as the replay goes."""
    first = next(rows, None)
    if first is None:
        return
    node = first["node"]
    feed = _Feed(node, itertools.chain([first], rows))
    first_difference: int | None = None
    try:
        for number, root in replay.state_roots(feed.blocks()):
            claimed, computed = feed.claimed.pop(number), to_hex(root)
            if computed == claimed:
                continue
            first_difference = number if first_difference is None else first_difference
            since = "" if first_difference == number else \
                f" (the replayed state first differed at block {first_difference})"
            yield (RULE, node, number, f"replaying the blocks from the genesis allocation "
                   f"gives state root {computed}; the header has {claimed}{since}")
    except BlockNotExecuted as exc:
        yield (RULE, node, exc.number, f"block {exc.number} does not execute on its parent's "
               f"state: {exc.reason}; blocks {exc.number}.. are unverified")
    if feed.stopped is not None:
        yield feed.stopped


def _run_replay(replay: StateReplay, arrow_schema: pa.Schema,
                batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    rows = (row for batch in batches for row in batch.to_pylist())
    found = replay_violations(replay, rows)
    while chunk := list(itertools.islice(found, OUTPUT_BATCH)):
        yield to_record_batch(chunk, arrow_schema)


def _replayed_node(blocks: DataFrame) -> DataFrame:
    """The node with the most blocks (the first by name among equals)."""
    counts = blocks.groupBy("node").count()
    return counts.orderBy(F.desc("count"), "node").limit(1).select("node")


def _replay_inputs(data: Dataset) -> DataFrame:
    """One row per block of the replayed node: number, certified state root, raw header and
    its raw transactions in index order."""
    keys = ["node", "block_number"]
    raw_header = F.col("raw_header") if "raw_header" in data.blocks.columns \
        else F.lit(None).cast("string")
    blocks = data.blocks.join(F.broadcast(_replayed_node(data.blocks)), "node").select(
        "node", F.col("number").alias("block_number"), "state_root",
        raw_header.alias("raw_header"),
    )
    transactions = data.transactions.groupBy(*keys).agg(
        F.sort_array(F.collect_list(F.struct("transaction_index", "raw"))).alias("transactions")
    )
    return blocks.join(transactions, keys, "left")


def state_root_rule(replay: StateReplay) -> Callable[[Audit], DataFrame]:
    """The state-root rule running `replay` (see the module's docstring)."""

    def state_root(audit: Audit) -> DataFrame:
        """state-root: every block's state root is the one replaying the blocks from the
        genesis allocation computes; a block that cannot be replayed (missing, not
        executing) is reported once, and the blocks after it are unverified."""
        inputs = _replay_inputs(audit.data).repartition(1).sortWithinPartitions("block_number")
        arrow_schema = to_arrow_schema(schemas.VIOLATIONS)
        return inputs.mapInArrow(partial(_run_replay, replay, arrow_schema),
                                 schemas.VIOLATIONS)

    return state_root
