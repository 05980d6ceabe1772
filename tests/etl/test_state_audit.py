"""The state audit (rule state-root): the test chain's blocks replayed by the chain's own
code from its genesis allocation. An honest export passes; a state root that is not what the
transactions produce (a lying node's consistent header, a different valid transaction), a
block that does not execute, and an export that cannot be replayed from block 0 are each
reported once, at their block."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import rlp
from eth_hash.auto import keccak
from eth_keys import keys
from eth_keys.datatypes import PrivateKey
from eth_typing import Address
from pyspark.sql import SparkSession

from chain.ordered_trie import ordered_trie_root_and_nodes
from cli.state_replay import ChainStateReplay
from spark_etl.audit import Audit, ValidatorSet, Violation, find_violations
from spark_etl.audit.state_rules import state_root_rule
from spark_etl.errors import UsageError
from spark_etl.hexcodec import from_hex, to_hex
from tests.etl.chain_factory import (
    BUILDER,
    CHAIN_ID,
    GWEI,
    OUTSIDER_KEY,
    RECIPIENT,
    SENDER,
    ServedChain,
)
from tests.etl.conftest import NODE_A, NODE_B, Tables, dataset

# chain_factory's Genesis as a file (build_chain makes it in code)
GENESIS = json.dumps({
    "config": {"chainId": CHAIN_ID, "dev": {}},
    "timestamp": hex(1_700_000_000),
    "alloc": {to_hex(SENDER.public_key.to_canonical_address()): {"balance": hex(10**24)}},
}).encode()
STATE_ROOT_FIELD, TRANSACTIONS_ROOT_FIELD = 3, 4
PARENT_HASH_FIELD = 0
LAST_BLOCK = 10
LAST_NONCE = 10  # of the one transfer in block 10 (chain_factory.block_batches)


def state_violations(spark: SparkSession, tables: Tables,
                     validators: ValidatorSet) -> list[Violation]:
    rule = state_root_rule(ChainStateReplay(GENESIS))
    return find_violations(Audit(dataset(spark, tables), validators), (rule,))


def blocks_of(tables: Tables, node: str) -> dict[int, dict[str, Any]]:
    return {row["number"]: row for row in tables["blocks"] if row["node"] == node}


def drop_blocks(tables: Tables, numbers: set[int], nodes: tuple[str, ...]) -> None:
    def kept(row: dict[str, Any]) -> bool:
        number = row["number"] if "number" in row else row.get("block_number")
        return row["node"] not in nodes or number not in numbers

    for table in ("blocks", "transactions"):
        tables[table] = [row for row in tables[table] if kept(row)]


def rewrite_header(tables: Tables, node: str, number: int, **fields: bytes) -> None:
    """Change header fields of `node`'s block `number` as a lying node would, consistently:
    its raw header, columns and hash, and every later block's parent hash and hash (block
    hashes bind nothing the replay reads but the parent links)."""
    blocks = blocks_of(tables, node)
    changes: dict[int, bytes] = {
        {"state_root": STATE_ROOT_FIELD, "transactions_root": TRANSACTIONS_ROOT_FIELD}[name]:
        value for name, value in fields.items()
    }
    for later in range(number, max(blocks) + 1):
        row = blocks[later]
        header = rlp.decode(from_hex(row["raw_header"]))
        for index, value in changes.items():
            header[index] = value
        raw = rlp.encode(header)
        row.update(raw_header=to_hex(raw), hash=to_hex(keccak(raw)),
                   parent_hash=to_hex(header[PARENT_HASH_FIELD]))
        row.update({name: to_hex(value) for name, value in fields.items()})
        changes = {PARENT_HASH_FIELD: keccak(raw)}
        fields = {}


def transfer(key: PrivateKey, nonce: int, value: int) -> bytes:
    return BUILDER.create_unsigned_transaction(
        nonce=nonce, gas_price=5 * GWEI, gas=21_000, to=Address(RECIPIENT), value=value, data=b""
    ).as_signed_transaction(key, chain_id=CHAIN_ID).encode()


def replace_last_transfer(tables: Tables, raw: bytes) -> None:
    """Node A's block 10 (one transfer) with `raw` instead, its header rewritten to match."""
    for row in tables["transactions"]:
        if row["node"] == NODE_A and row["block_number"] == LAST_BLOCK:
            row.update(raw=to_hex(raw), hash=to_hex(keccak(raw)))
    root, _ = ordered_trie_root_and_nodes([raw])
    rewrite_header(tables, NODE_A, LAST_BLOCK, transactions_root=root)


def test_the_honest_export_replays_to_every_certified_state_root(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    assert state_violations(spark, tables, validator_set) == []


def test_a_consistent_lie_about_a_state_root_is_caught_at_its_block(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet,
    test_chain: ServedChain,
) -> None:
    claimed = b"\x5a" * 32
    rewrite_header(tables, NODE_A, 4, state_root=claimed)
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [("state-root", NODE_A, 4)]
    assert to_hex(claimed) in found[0].detail
    assert test_chain.payloads[4].block["stateRoot"] in found[0].detail  # the computed root


def test_a_different_valid_transaction_gives_another_state_root(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    """Block 10's transfer of 9 wei replaced by one of 10 wei (same sender, nonce and gas),
    its state root left as certified."""
    replace_last_transfer(tables, transfer(SENDER, LAST_NONCE, value=10))
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [
        ("state-root", NODE_A, LAST_BLOCK)]
    assert "replaying the blocks from the genesis allocation gives state root" in found[0].detail


def test_a_transaction_that_cannot_execute_stops_the_replay_once(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    """Block 10's transfer replaced by one from an account without funds (the block's body
    matches its header: only executing it shows the fault)."""
    replace_last_transfer(tables, transfer(keys.PrivateKey(OUTSIDER_KEY), 0, value=1))
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [
        ("state-root", NODE_A, LAST_BLOCK)]
    assert "does not execute on the replayed state: ValidationError" in found[0].detail


def test_a_transaction_missing_from_the_export_stops_the_replay_once(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    tables["transactions"] = [
        row for row in tables["transactions"]
        if not (row["node"] == NODE_A and row["block_number"] == 4
                and row["transaction_index"] == 1)
    ]
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [("state-root", NODE_A, 4)]
    assert "its exported transactions are not the ones its header commits to" in found[0].detail
    assert "blocks 4.. are unverified" in found[0].detail


def test_a_transaction_without_a_block_number_is_missing_from_its_block(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    for row in tables["transactions"]:
        if row["node"] == NODE_A and row["block_number"] == 4:
            row["block_number"] = None
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [("state-root", NODE_A, 4)]
    assert "its exported transactions are not the ones its header commits to" in found[0].detail


def test_an_export_not_starting_at_block_0_is_one_finding(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    drop_blocks(tables, {0, 1, 2, 3}, (NODE_A, NODE_B))
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [("state-root", NODE_A, 4)]
    assert "export from block 0" in found[0].detail


def test_a_missing_block_stops_the_replay_once(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    drop_blocks(tables, {6}, (NODE_A, NODE_B))
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [("state-root", NODE_A, 7)]
    assert "blocks 6.. are unverified" in found[0].detail


def test_a_block_exported_twice_stops_the_replay_once(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    tables["blocks"].append(dict(blocks_of(tables, NODE_A)[3]))
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [("state-root", NODE_A, 3)]
    assert "in the blocks table 2 times" in found[0].detail


def test_a_raw_header_that_is_not_hex_stops_the_replay_once(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    blocks_of(tables, NODE_A)[3]["raw_header"] = "0xnot-hex"
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [("state-root", NODE_A, 3)]
    assert "not hex" in found[0].detail


def test_the_node_with_the_most_blocks_is_replayed(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    drop_blocks(tables, {LAST_BLOCK}, (NODE_A,))
    rewrite_header(tables, NODE_B, LAST_BLOCK, state_root=b"\x5a" * 32)
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [
        ("state-root", NODE_B, LAST_BLOCK)]


def test_a_genesis_file_the_chain_refuses_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "genesis.json"
    path.write_text(json.dumps({"config": {"chainId": CHAIN_ID}}))
    with pytest.raises(UsageError, match="no engine section"):
        ChainStateReplay.from_file(path)
    with pytest.raises(UsageError, match="cannot read"):
        ChainStateReplay.from_file(tmp_path / "missing.json")


def test_the_replay_pickles_for_an_executor() -> None:
    replay = ChainStateReplay(GENESIS)
    assert pickle.loads(pickle.dumps(replay)) == replay


def test_an_export_without_raw_headers_is_one_finding(
    spark: SparkSession, tables: Tables, validator_set: ValidatorSet
) -> None:
    """An export by a pbft-etl before raw_header, read back: the column is null."""
    for row in tables["blocks"]:
        row["raw_header"] = None
    found = state_violations(spark, tables, validator_set)
    assert [(v.rule, v.node, v.block_number) for v in found] == [("state-root", NODE_A, 0)]
    assert "no raw_header" in found[0].detail
