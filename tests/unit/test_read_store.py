"""chain.read_store, chain.bloom_index and chain.rpc.served: what JSON-RPC serves from the read
store equals what py-evm's own block and receipts say, byte for byte where it is bytes."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import rlp
from eth._utils.address import generate_contract_address
from eth_bloom import BloomFilter

from chain.blockchain import Blockchain
from chain.bloom_index import SECTION_BLOCKS, BloomIndex
from chain.genesis import Genesis, GenesisAccount
from chain.read_store import (
    BLOCK_PREFIX,
    LOCATION_PREFIX,
    META_PREFIX,
    TX_PREFIX,
    StoredLog,
    TxRecord,
)
from chain.rpc import served as served_module
from chain.rpc.filters import LogCriteria
from chain.rpc.served import ServedBlocks
from storage import Database
from tests.etl.chain_factory import CHAIN_ID, SENDER, block_batches


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Blockchain]:
    """The ETL tests' chain: a contract deployed, events, a revert, legacy, EIP-2930 and
    EIP-1559 transactions, empty blocks."""
    genesis = Genesis(
        chain_id=CHAIN_ID, engine="dev", engine_params={},
        alloc={SENDER.public_key.to_canonical_address(): GenesisAccount(balance=10**24)},
        timestamp=1_700_000_000,
    )
    with Database(tmp_path_factory.mktemp("read") / "chaindata") as db:
        blockchain = Blockchain(db, genesis)
        for number, batch in enumerate(block_batches(), start=1):
            executed, left_out = blockchain.build_block(
                batch, timestamp=1_700_000_000 + number, coinbase=b"\x33" * 20)
            assert not left_out
            blockchain.commit(executed)
        yield blockchain


def _blocks(chain: Blockchain) -> Iterator:
    for number in range(chain.head().block_number + 1):
        header = chain.header_by_number(number)
        assert header is not None
        yield chain.block_by_header(header), chain.receipts(header)


def _expected_receipt(tx, receipt, previous_gas: int, base_fee: int) -> dict:
    """A receipt's fields as py-evm's objects give them, derived independently here."""
    return {
        "from": "0x" + tx.sender.hex(),
        "to": "0x" + tx.to.hex() if tx.to else None,
        "contractAddress": (None if tx.to else
                            "0x" + generate_contract_address(tx.sender, tx.nonce).hex()),
        "cumulativeGasUsed": hex(receipt.gas_used),
        "gasUsed": hex(receipt.gas_used - previous_gas),
        "status": hex(1 if receipt.state_root == b"\x01" else 0),
        "logsBloom": "0x" + receipt.bloom.to_bytes(256, "big").hex(),
        "effectiveGasPrice": hex(min(tx.max_fee_per_gas,
                                     base_fee + tx.max_priority_fee_per_gas)),
        "logs": [("0x" + log.address.hex(), ["0x" + t.to_bytes(32, "big").hex()
                                            for t in log.topics], "0x" + log.data.hex())
                 for log in receipt.logs],
    }


def test_receipts_and_transactions_match_py_evm(chain: Blockchain) -> None:
    served = ServedBlocks(chain)
    kinds = set()
    log_count = 0
    for block, receipts in _blocks(chain):
        header = block.header
        served_block = served.block(header)
        previous_gas, log_index = 0, 0
        for index, (tx, receipt) in enumerate(zip(block.transactions, receipts, strict=True)):
            kinds.add((getattr(tx, "type_id", None) or 0, bool(tx.to), receipt.state_root))
            located = served.locate(tx.hash)
            assert located is not None and located.index == index
            got = served.receipt(located)
            assert got == served_block.receipts[index]
            expected = _expected_receipt(tx, receipt, previous_gas, header.base_fee_per_gas)
            assert {k: got[k] for k in expected if k != "logs"} == {
                k: v for k, v in expected.items() if k != "logs"}
            assert [(g["address"], g["topics"], g["data"]) for g in got["logs"]] == expected["logs"]
            assert [g["logIndex"] for g in got["logs"]] == [
                hex(log_index + i) for i in range(len(receipt.logs))]
            assert got["blockHash"] == "0x" + header.hash.hex()
            transaction = served.transaction(located)
            assert transaction == served_block.transactions[index]
            assert transaction == served.transaction_at(header, index)
            assert (transaction["hash"], transaction["from"], transaction["nonce"],
                    transaction["value"], transaction["input"], transaction["gas"]) == (
                "0x" + tx.hash.hex(), "0x" + tx.sender.hex(), hex(tx.nonce), hex(tx.value),
                "0x" + tx.data.hex(), hex(tx.gas))
            assert (transaction["r"], transaction["s"]) == (hex(tx.r), hex(tx.s))
            previous_gas = receipt.gas_used
            log_index += len(receipt.logs)
            log_count += len(receipt.logs)
        assert served.transaction_at(header, len(block.transactions)) is None
        assert ServedBlocks(chain).transaction_at(header, 2**40) is None  # beyond a 4-byte key
    # every kind the chain was made to hold: legacy, 2930, 1559; a creation; a revert
    assert {k[0] for k in kinds} == {0, 1, 2}
    assert (0, False, b"\x01") in kinds and any(k[2] == b"" for k in kinds)
    assert log_count > 0


def test_raw_block_and_size_are_py_evm_bytes(chain: Blockchain) -> None:
    served = ServedBlocks(chain)
    for block, _ in _blocks(chain):
        encoded = rlp.encode(block)
        assert served.raw_block(block.header) == encoded
        assert served.block(block.header).json(False)["size"] == hex(len(encoded))
        assert served.transaction_count(block.header) == len(block.transactions)


def test_record_encoding_is_canonical_rlp() -> None:
    record = TxRecord(
        raw=b"\x02" + b"\x01" * 120, hash=b"\x02" * 32, sender=b"\x03" * 20, status=0,
        cumulative_gas_used=2**40, gas_used=0, effective_gas_price=7, contract_address=None,
        first_log_index=127,
        logs=(StoredLog(b"\x04" * 20, (b"\x05" * 32, b"\x00" * 32), b""),
              StoredLog(b"\x06" * 20, (), b"\x7f"), StoredLog(b"\x07" * 20, (), b"\x08" * 70)),
    )
    assert record.encode() == rlp.encode([
        record.raw, record.hash, record.sender, 0, 2**40, 0, 7, b"", 127,
        [[log.address, list(log.topics), log.data] for log in record.logs],
    ])
    assert TxRecord.decode(record.encode()) == record


def test_a_store_from_before_the_read_store_is_indexed_at_open(
    chain: Blockchain, caplog: pytest.LogCaptureFixture
) -> None:
    served = ServedBlocks(chain)
    head = chain.head().block_number
    before = [served.block(chain.header_by_number(n)).receipts for n in range(head + 1)]
    with chain.db.batch() as batch:
        for prefix in (TX_PREFIX, LOCATION_PREFIX, BLOCK_PREFIX, META_PREFIX):
            batch.delete_range(chain.db.keyspace(prefix))
    assert chain.read_store.indexed_height() == -1
    with caplog.at_level(logging.INFO, logger="chain.blockchain"):
        reopened = Blockchain(chain.db, chain.genesis)
    assert f"indexing blocks 0..{head} for JSON-RPC reads" in caplog.text
    assert reopened.read_store.indexed_height() == head
    again = ServedBlocks(reopened)
    assert [again.block(chain.header_by_number(n)).receipts for n in range(head + 1)] == before


def test_logs_by_bloom_bits_equal_a_scan_of_every_block(chain: Blockchain) -> None:
    served = ServedBlocks(chain)
    head = chain.head().block_number
    every_log = [log for n in range(head + 1)
                 for log in served.block(chain.header_by_number(n)).receipts
                 for log in log["logs"]]
    assert every_log
    assert list(served.logs(LogCriteria.parse({}), 0, head)) == every_log
    for log in every_log:
        query = {"address": log["address"], "topics": [log["topics"][0]]}
        expected = [x for x in every_log
                    if x["address"] == log["address"] and x["topics"][:1] == log["topics"][:1]]
        assert list(served.logs(LogCriteria.parse(query), 0, head)) == expected
    unknown = LogCriteria.parse({"address": "0x" + "99" * 20})
    assert list(served.logs(unknown, 0, head)) == []


def test_bloom_index_candidates_are_exactly_the_matching_blooms(tmp_path: Path) -> None:
    rng = random.Random(7)
    values = [bytes([i]) * 20 for i in range(40)]
    blooms: dict[int, int] = {}
    last = 3 * SECTION_BLOCKS + 17
    with Database(tmp_path / "db") as db:
        keyspace = db.keyspace(b"bloom/")
        index = BloomIndex(keyspace)
        for number in range(last + 1):
            if number == 2 * SECTION_BLOCKS + 5:
                index = BloomIndex(keyspace)  # a restart in the middle of a section
            bloom = BloomFilter()
            for value in rng.sample(values, rng.choice((0, 0, 1, 3))):
                bloom.add(value)
            blooms[number] = int(bloom)
            with db.batch() as batch:
                index.add(batch, number, int(bloom))
        for _ in range(200):
            groups = [rng.sample(values, rng.randint(1, 3)) for _ in range(rng.randint(0, 2))]
            first = rng.randint(0, last)
            end = rng.randint(first, last)
            expected = [
                n for n in range(first, end + 1)
                if blooms[n] and all(any(v in BloomFilter(blooms[n]) for v in g) for g in groups)
            ]
            assert list(index.candidates(first, end, groups)) == expected


def test_the_cache_is_bounded_in_blocks_and_transactions(
    chain: Blockchain, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(served_module, "MAX_CACHED_TRANSACTIONS", 3)
    monkeypatch.setattr(served_module, "MAX_CACHED_BLOCKS", 4)
    served = ServedBlocks(chain)
    for number in range(chain.head().block_number + 1):
        served.block(chain.header_by_number(number))
        cached = served._cache.values()
        assert len(cached) <= 4
        assert len(cached) == 1 or sum(len(b.records) for b in cached) <= 3
