"""Every table the ETL writes or reads, declared once: column, Spark type and meaning.

Column names follow ethereum-etl / BigQuery `crypto_ethereum` where the column exists there.
Hashes, addresses and byte strings are lower-case 0x hex. A 256-bit quantity X is two
columns: X as DECIMAL(38,0) (null when it does not fit) and X_lossless, its decimal string.
The tables of docs/etl.md are rendered from these declarations (`markdown()`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

STRING = StringType()
LONG = LongType()
BOOLEAN = BooleanType()
WEI = DecimalType(38, 0)


@dataclass(frozen=True)
class Column:
    name: str
    type: DataType
    meaning: str

    def field(self) -> StructField:
        return StructField(self.name, self.type, nullable=True)


def wei(name: str, meaning: str) -> tuple[Column, Column]:
    """A 256-bit quantity: DECIMAL(38,0) where it fits, plus its lossless decimal string."""
    return (
        Column(name, WEI, f"{meaning}; null when >= 10^38"),
        Column(f"{name}_lossless", STRING, f"{meaning}, as a decimal string"),
    )


NODE = Column("node", STRING, "JSON-RPC URL of the node this row was exported from")
RANGE_START = Column("range_start", LONG, "first block number of the block range (partition)")


@dataclass(frozen=True)
class Table:
    name: str
    meaning: str
    columns: tuple[Column, ...]
    partition: tuple[Column, ...]

    @property
    def row_schema(self) -> StructType:
        """The columns without the partition columns (what one fetched block carries)."""
        return StructType([c.field() for c in self.columns])

    @property
    def schema(self) -> StructType:
        """The table as read back: its columns, then the partition columns."""
        return StructType([c.field() for c in self.columns + self.partition])

    @cached_property
    def column_names(self) -> tuple[str, ...]:
        """(Cached: the export orders every row of every block by it.)"""
        return tuple(c.name for c in self.columns)


def _table(
    name: str, meaning: str, *columns: Column | tuple[Column, ...], by_range: bool = True
) -> Table:
    flat: list[Column] = []
    for item in columns:
        flat.extend(item if isinstance(item, tuple) else (item,))
    partition = (NODE, RANGE_START) if by_range else (NODE,)
    return Table(name, meaning, tuple(flat), partition)


BLOCKS = _table(
    "blocks",
    "one row per block",
    Column("number", LONG, "block number"),
    Column("hash", STRING, "block hash (keccak256 of the RLP header)"),
    Column("parent_hash", STRING, "hash of the parent block"),
    Column("nonce", STRING, "8-byte header nonce (zero under PBFT)"),
    Column("sha3_uncles", STRING, "hash of the (empty) ommers list"),
    Column("logs_bloom", STRING, "256-byte bloom filter of the block's logs"),
    Column("transactions_root", STRING, "root of the transactions trie"),
    Column("state_root", STRING, "root of the state trie after the block"),
    Column("receipts_root", STRING, "root of the receipts trie"),
    Column("miner", STRING, "coinbase: the fee recipient (the proposing validator)"),
    wei("difficulty", "difficulty (0 under PBFT)"),
    Column("size", LONG, "size of the RLP-encoded block in bytes"),
    Column("extra_data", STRING, "header extra data"),
    Column("gas_limit", LONG, "block gas limit"),
    Column("gas_used", LONG, "gas used by all transactions of the block"),
    Column("timestamp", LONG, "block time, unix seconds"),
    Column("transaction_count", LONG, "number of transactions in the block"),
    wei("base_fee_per_gas", "EIP-1559 base fee in wei"),
    Column("mix_hash", STRING, "header mix hash (zero under PBFT)"),
    Column("withdrawals_root", STRING, "root of the (empty) withdrawals trie"),
    Column("blob_gas_used", LONG, "EIP-4844 blob gas used"),
    Column("excess_blob_gas", LONG, "EIP-4844 excess blob gas"),
    Column("parent_beacon_block_root", STRING, "EIP-4788 header field"),
    Column("requests_hash", STRING, "EIP-7685 requests hash"),
    Column("raw_header", STRING, "the RLP header, byte for byte as in the node's "
                                 "debug_getRawBlock (its keccak256 is `hash`)"),
)

ACCESS_LIST = ArrayType(
    StructType(
        [
            StructField("address", STRING),
            StructField("storage_keys", ArrayType(STRING)),
        ]
    )
)

TRANSACTIONS = _table(
    "transactions",
    "one row per transaction",
    Column("hash", STRING, "transaction hash (keccak256 of `raw`)"),
    Column("nonce", LONG, "sender's nonce"),
    Column("transaction_index", LONG, "position in the block"),
    Column("from_address", STRING, "sender"),
    Column("to_address", STRING, "recipient; null for a contract creation"),
    wei("value", "value transferred in wei"),
    Column("gas", LONG, "gas limit of the transaction"),
    wei("gas_price", "gas price paid in wei (effective price for EIP-1559)"),
    Column("input", STRING, "call data"),
    Column("block_timestamp", LONG, "block time, unix seconds"),
    Column("block_number", LONG, "block number"),
    Column("block_hash", STRING, "block hash"),
    wei("max_fee_per_gas", "EIP-1559 fee cap in wei; null for older types"),
    wei("max_priority_fee_per_gas", "EIP-1559 tip cap in wei; null for older types"),
    Column("transaction_type", LONG, "EIP-2718 type (0 legacy, 1 access list, 2 dynamic fee)"),
    Column("chain_id", LONG, "EIP-155 chain id; null for a pre-EIP-155 legacy transaction"),
    Column("access_list", ACCESS_LIST, "EIP-2930 access list"),
    Column("v", LONG, "signature v (legacy) or y parity (typed)"),
    Column("r", STRING, "signature r, 32-byte hex"),
    Column("s", STRING, "signature s, 32-byte hex"),
    Column("y_parity", LONG, "signature y parity; null for legacy transactions"),
    Column("raw", STRING, "the signed transaction's consensus encoding, as in the block"),
)

RECEIPTS = _table(
    "receipts",
    "one row per transaction receipt",
    Column("transaction_hash", STRING, "transaction hash"),
    Column("transaction_index", LONG, "position in the block"),
    Column("block_hash", STRING, "block hash"),
    Column("block_number", LONG, "block number"),
    Column("from_address", STRING, "sender"),
    Column("to_address", STRING, "recipient; null for a contract creation"),
    Column("contract_address", STRING, "created contract; null otherwise"),
    Column("cumulative_gas_used", LONG, "gas used in the block up to and with this transaction"),
    Column("gas_used", LONG, "gas used by this transaction"),
    wei("effective_gas_price", "price per gas paid in wei"),
    Column("status", LONG, "1 success, 0 failure (EIP-658)"),
    Column("type", LONG, "EIP-2718 transaction type"),
    Column("logs_bloom", STRING, "256-byte bloom filter of the receipt's logs"),
)

LOGS = _table(
    "logs",
    "one row per log (event)",
    Column("log_index", LONG, "position of the log in the block"),
    Column("transaction_hash", STRING, "transaction that emitted it"),
    Column("transaction_index", LONG, "position of that transaction in the block"),
    Column("address", STRING, "contract that emitted it"),
    Column("data", STRING, "non-indexed data"),
    Column("topics", ArrayType(STRING), "indexed topics (32-byte hex each)"),
    Column("block_timestamp", LONG, "block time, unix seconds"),
    Column("block_number", LONG, "block number"),
    Column("block_hash", STRING, "block hash"),
)

COMMIT_CERTIFICATES = _table(
    "commit_certificates",
    "one row per signed COMMIT in a block's permanent commit certificate",
    Column("block_number", LONG, "block the node stores this certificate for"),
    Column("block_hash", STRING, "hash the node says the certificate certifies"),
    Column("view", LONG, "view of the COMMIT"),
    Column("seq_no", LONG, "sequence number of the COMMIT (= block number)"),
    Column("digest", STRING, "digest the COMMIT is for (= block hash)"),
    Column("replica", LONG, "replica index the COMMIT claims (position in the validator set)"),
    Column("signer", STRING, "validator address the node names for that replica"),
    Column("signature", STRING, "65-byte secp256k1 signature r || s || v"),
    Column("message", STRING, "the signed COMMIT message (RLP, as pbft_engine.messages encodes)"),
)

CHECKPOINTS = _table(
    "checkpoints",
    "one row per signed CHECKPOINT kept for a checkpoint (one row with null message columns "
    "when it has none)",
    Column("seq_no", LONG, "checkpoint sequence number (a block number, a multiple of K)"),
    Column("block_hash", STRING, "block hash the checkpoint records"),
    Column("state_root", STRING, "state root the checkpoint records"),
    Column("stable", BOOLEAN, "whether the node holds it as stable (Q matching CHECKPOINTs)"),
    Column("replica", LONG, "replica index the signed CHECKPOINT claims"),
    Column("signature", STRING, "65-byte signature of that CHECKPOINT"),
    Column("message", STRING, "the signed CHECKPOINT message (RLP)"),
)

VIEW_CHANGES = _table(
    "view_changes",
    "one row per VIEW-CHANGE message that installed a view (partitioned by node only)",
    Column("view", LONG, "the view installed"),
    Column("primary", STRING, "address of the new view's primary"),
    Column("new_view", STRING, "the primary's signed NEW-VIEW message (RLP)"),
    Column("signer", STRING, "address of the VIEW-CHANGE's sender"),
    Column("stable_seq_no", LONG, "the sender's last stable checkpoint"),
    Column("message", STRING, "the signed VIEW-CHANGE message (RLP)"),
    by_range=False,
)

EVIDENCE = _table(
    "evidence",
    "one row per piece of equivocation evidence a node kept (partitioned by node only)",
    Column("signer", STRING, "address of the validator that equivocated"),
    Column("type", STRING, "message type: pre-prepare, prepare, commit, checkpoint, view-change"),
    Column("view", LONG, "view of the conflicting messages"),
    Column("seq_no", LONG, "sequence number of the conflicting messages; null for VIEW-CHANGE "
           "and NEW-VIEW evidence (they have none)"),
    Column("first", STRING, "one signed message (RLP)"),
    Column("second", STRING, "the conflicting signed message (RLP); null if not kept"),
    by_range=False,
)

EPOCHS = _table(
    "epochs",
    "one row per validator-set epoch a node reported (`pbft_getEpoch` from block 1 on, up "
    "to the last block asked); the audit counts each height's signatures with the set of "
    "its epoch and checks every block's extraData against these sets",
    Column("epoch", LONG, "epoch number (0: the genesis set)"),
    Column("first_block", LONG, "first block the set decides"),
    Column("last_block", LONG, "last block it decides (the handover checkpoint); null while "
                               "no change after it is scheduled"),
    Column("validators", ArrayType(STRING), "the set, in replica order"),
    Column("validators_hash", STRING, "keccak256 of the RLP list of the sorted addresses: "
                                      "what the block before first_block has in extraData"),
    Column("n", LONG, "validators in the set"),
    Column("f", LONG, "faulty validators it tolerates, (n-1)//3"),
    Column("quorum", LONG, "Q = (n+f+2)//2 signatures of the set certify a block"),
    by_range=False,
)

EXPORT_MANIFEST = _table(
    "export_manifest",
    "one row per exported block range and node: what the export wrote (resume reads it)",
    Column("first_block", LONG, "first block exported in the range"),
    Column("last_block", LONG, "last block exported in the range"),
    Column("asked_first", LONG, "first block the export asked for (--from)"),
    Column("asked_last", LONG, "last block the export asked for (--to; default the highest "
                               "head among the nodes)"),
    Column("node_head", LONG, "the node's eth_blockNumber (after waiting --lag-wait for it to "
                              "reach asked_last); the node was exported up to it"),
    Column("range_size", LONG, "blocks per range of this export"),
    Column("chain_id", LONG, "the node's eth_chainId"),
    Column("genesis_hash", STRING, "hash of the node's block 0"),
    Column("validators", ArrayType(STRING), "the node's pbft_getValidators, in replica order"),
    Column("validator", STRING, "the node's own address, as its pbft_status names it while it "
                                "is a validator (`validator`); null for an observer"),
    Column("blocks", LONG, "rows written to blocks for the range"),
    Column("transactions", LONG, "rows written to transactions"),
    Column("receipts", LONG, "rows written to receipts"),
    Column("logs", LONG, "rows written to logs"),
    Column("commit_certificates", LONG, "rows written to commit_certificates"),
    Column("checkpoints", LONG, "rows written to checkpoints"),
    Column("exported_at", TimestampType(), "when the range was written"),
)

# What one fetched block carries: the block and its rows of every block-range table.
BLOCK_TABLES = (BLOCKS, TRANSACTIONS, RECEIPTS, LOGS, COMMIT_CERTIFICATES, CHECKPOINTS)
NESTED_TABLES = BLOCK_TABLES[1:]
BUNDLE = StructType(
    [
        NODE.field(),
        RANGE_START.field(),
        StructField("block", BLOCKS.row_schema),
        *(StructField(t.name, ArrayType(t.row_schema)) for t in NESTED_TABLES),
    ]
)

TABLES = (*BLOCK_TABLES, VIEW_CHANGES, EVIDENCE, EPOCHS, EXPORT_MANIFEST)
BY_NAME = {table.name: table for table in TABLES}

VIOLATIONS = StructType(
    [
        StructField("rule", STRING, nullable=False),
        StructField("node", STRING),
        StructField("block_number", LONG),
        StructField("detail", STRING, nullable=False),
    ]
)


def markdown() -> str:
    """The tables as docs/etl.md markdown: one section per table, column | type | meaning (the
    partition columns, the same in every table, are described once on that page)."""
    parts = []
    for table in TABLES:
        lines = [f"`{table.name}`: {table.meaning}.", "", "| column | type | meaning |",
                 "|---|---|---|"]
        for column in table.columns:
            lines.append(f"| `{column.name}` | {column.type.simpleString()} | {column.meaning} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
