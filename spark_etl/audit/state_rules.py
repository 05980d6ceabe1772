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


def _block_of(rows: list[Row]) -> bytes:
    """The encoded block of one block's rows of `_replay_inputs` (its header row, then its
    transactions in index order); ValueError for a value that is missing or not hex."""
    header, transactions = rows[0], rows[1:]
    if header["raw"] is None:
        raise ValueError("the export has no raw_header for it (exported by an older "
                         "pbft-etl? export again)")
    if any(tx["raw"] is None for tx in transactions):
        raise ValueError("a transaction of it has no raw bytes")
    try:
        return encoded_block(from_hex(header["raw"]), [from_hex(tx["raw"]) for tx in transactions])
    except ValueError:
        raise ValueError("its raw header or a raw transaction is not hex") from None


class _Feed:
    """The rows' blocks for the replay, one block's rows in memory at a time, remembering
    each one's certified root until the replay answers for it, and why it stopped feeding
    (a block it cannot hand over: the replay ends there)."""

    def __init__(self, node: str, rows: Iterator[Row]) -> None:
        self.node = node
        self.rows = rows
        self.claimed: dict[int, str] = {}
        self.stopped: Violation | None = None

    def blocks(self) -> Iterator[tuple[int, bytes]]:
        by_block = itertools.groupby(self.rows, key=lambda row: row["block_number"])
        for expected, (number, group) in enumerate(by_block):
            rows = list(group)
            problem = self._problem(number, expected, rows)
            if problem is None:
                try:
                    block = _block_of(rows)
                except ValueError as exc:
                    problem = f"block {number} cannot be rebuilt: {exc}; blocks {number}.. " \
                        "are unverified"
            if problem is not None:
                self.stopped = (RULE, self.node, number, problem)
                return
            self.claimed[number] = rows[0]["state_root"]
            yield number, block

    @staticmethod
    def _problem(number: int, expected: int, rows: list[Row]) -> str | None:
        """Why the replay cannot take block `number` in place of block `expected`."""
        headers = sum(1 for row in rows if row["header"])
        if number == expected and headers == 1:
            return None
        if expected == 0 and headers == 1:
            return (f"the state audit replays every block from block 0, and this export "
                    f"starts at block {number}: export from block 0 to audit the state")
        if number > expected + 1:
            problem = f"blocks {expected}..{number - 1} are missing from the blocks table"
        elif number != expected:
            problem = f"block {expected} is missing from the blocks table"
        elif headers == 0:
            problem = f"block {number} is missing from the blocks table (not its transactions)"
        else:
            problem = f"block {number} is in the blocks table {headers} times"
        return f"{problem}: the replay needs every block once, so blocks {expected}.. are " \
            "unverified"


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
        yield (RULE, node, exc.number, f"block {exc.number} cannot be replayed: {exc.reason}; "
               f"blocks {exc.number}.. are unverified")
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
    """The replayed node's blocks as small rows: per block its header (state root and raw
    header), then its raw transactions."""
    node = F.broadcast(_replayed_node(data.blocks))
    headers = data.blocks.join(node, "node").select(
        "node", F.col("number").alias("block_number"), F.lit(True).alias("header"),
        F.lit(None).cast("long").alias("transaction_index"), "state_root",
        F.col("raw_header").alias("raw"),
    )
    transactions = data.transactions.join(node, "node").select(
        "node", "block_number", F.lit(False).alias("header"), "transaction_index",
        F.lit(None).cast("string").alias("state_root"), "raw",
    )
    # A row without a block number (malformed-value's) is no block's: its block, if any,
    # then lacks it and is reported.
    return headers.unionByName(transactions).where(F.col("block_number").isNotNull())


def state_root_rule(replay: StateReplay) -> Callable[[Audit], DataFrame]:
    """The state-root rule running `replay` (see the module's docstring)."""

    def state_root(audit: Audit) -> DataFrame:
        """state-root: every block's state root is the one replaying the blocks from the
        genesis allocation computes; a block that cannot be replayed (missing, not
        executing) is reported once, and the blocks after it are unverified."""
        # Each block's header row first, then its transactions by index.
        inputs = _replay_inputs(audit.data).repartition(1).sortWithinPartitions(
            "block_number", "header", "transaction_index", ascending=[True, False, True])
        arrow_schema = to_arrow_schema(schemas.VIOLATIONS)
        return inputs.mapInArrow(partial(_run_replay, replay, arrow_schema),
                                 schemas.VIOLATIONS)

    return state_root
