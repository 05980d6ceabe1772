"""chain.blockchain: building with one apply_all_transactions, importing with full validation,
committing atomically, and leaving no trace of blocks that are never committed."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import rlp
from eth.chains.base import MiningChain
from eth.db import trie as py_evm_trie
from eth.db.atomic import AtomicDB
from eth.db.chain import ChainDB
from eth.db.trie import _make_trie_root_and_nodes
from eth.vm.forks import PragueVM
from eth.vm.forks.london import transactions as london_transactions
from eth_keys import keys

from chain import ordered_trie
from chain.blockchain import Blockchain
from chain.errors import BlockValidationError, ChainError
from chain.genesis import Genesis, GenesisAccount
from storage import Database
from tests.unit.test_ordered_trie import hexary_root_and_nodes

GWEI = 10**9
SENDER = keys.PrivateKey(b"\x07" * 32)
COINBASE = b"\x33" * 20
BUILDER = PragueVM.get_transaction_builder()


def make_genesis(source: bytes = b"test genesis") -> Genesis:
    return Genesis(
        chain_id=1337,
        engine="dev",
        engine_params={},
        alloc={SENDER.public_key.to_canonical_address(): GenesisAccount(balance=10**24)},
        timestamp=1_700_000_000,
        source=source,
    )


def transfers(count: int, start_nonce: int = 0, value: int = 1) -> list:
    """Signed transfers, decoded from their bytes as the pool does (Prague transaction types)."""
    return [
        BUILDER.decode(
            BUILDER.new_unsigned_dynamic_fee_transaction(
                chain_id=1337,
                nonce=start_nonce + n,
                max_priority_fee_per_gas=GWEI,
                max_fee_per_gas=10 * GWEI,
                gas=21_000,
                to=b"\x22" * 20,
                value=value,
                data=b"",
                access_list=(),
            )
            .as_signed_transaction(SENDER)
            .encode()
        )
        for n in range(count)
    ]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Blockchain, Blockchain]]:
    """A proposer's and a validator's chain, each in its own LevelDB."""
    dbs = [Database(tmp_path / name) for name in ("proposer", "validator")]
    yield tuple(Blockchain(db, make_genesis()) for db in dbs)
    for db in dbs:
        db.close()


def chain_keys(chain: Blockchain) -> int:
    return sum(1 for _ in chain.chain_keyspace.items())


def test_same_genesis_same_hash_and_other_genesis_refused(tmp_path: Path) -> None:
    with Database(tmp_path / "a") as a, Database(tmp_path / "b") as b:
        assert (
            Blockchain(a, make_genesis()).genesis_hash == Blockchain(b, make_genesis()).genesis_hash
        )
        with pytest.raises(ChainError, match="another genesis"):
            Blockchain(a, make_genesis(b"a different file"))


def test_build_import_commit_round_trip(pair: tuple[Blockchain, Blockchain]) -> None:
    proposer, validator = pair
    executed, left_out = proposer.build_block(
        transfers(50), timestamp=1_700_000_001, coinbase=COINBASE
    )
    assert left_out == () and len(executed.block.transactions) == 50
    assert executed.receipts[-1].gas_used == 50 * 21_000
    assert proposer.head().block_number == 0  # nothing committed yet
    imported = validator.execute_block(validator.decode_block(executed.encode()))
    assert imported.hash == executed.hash and imported.state_root == executed.state_root
    proposer.commit(executed)
    validator.commit(imported)
    for chain in pair:
        head = chain.head()
        assert (head.block_number, head.hash) == (1, executed.hash)
        assert chain.vm_at(head).state.get_balance(b"\x22" * 20) == 50
        assert len(chain.receipts(head)) == 50
        assert chain.transaction_location(executed.block.transactions[7].hash) == (1, 7)


def test_equal_timestamps_are_allowed_but_not_earlier(pair: tuple[Blockchain, Blockchain]) -> None:
    proposer, validator = pair
    parent_time = proposer.head().timestamp
    executed, _ = proposer.build_block(transfers(1), timestamp=parent_time, coinbase=COINBASE)
    assert executed.block.header.timestamp == parent_time
    validator.commit(validator.execute_block(executed.block))
    earlier = executed.block.copy(header=executed.block.header.copy(timestamp=parent_time - 1))
    with pytest.raises(BlockValidationError):
        proposer.execute_block(earlier)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda b: b.copy(header=b.header.copy(state_root=b"\x01" * 32)),
        lambda b: b.copy(header=b.header.copy(gas_used=b.header.gas_used + 1)),
        lambda b: b.copy(header=b.header.copy(gas_limit=b.header.gas_limit * 2)),
        lambda b: b.copy(header=b.header.copy(block_number=5)),
        lambda b: b.copy(header=b.header.copy(receipt_root=b"\x02" * 32)),
        lambda b: b.copy(header=b.header.copy(parent_hash=b"\x03" * 32)),
        lambda b: b.copy(transactions=b.transactions[:-1]),
    ],
    ids=["state-root", "gas-used", "gas-limit", "number", "receipt-root", "parent", "tx-list"],
)
def test_bad_blocks_are_rejected_and_leave_no_trace(
    pair: tuple[Blockchain, Blockchain], tamper
) -> None:
    proposer, validator = pair
    executed, _ = proposer.build_block(transfers(3), timestamp=1_700_000_001, coinbase=COINBASE)
    before = chain_keys(validator)
    with pytest.raises(BlockValidationError):
        validator.execute_block(tamper(executed.block))
    assert chain_keys(validator) == before
    assert validator.head().block_number == 0


def test_invalid_transaction_in_a_proposal_is_rejected(pair: tuple[Blockchain, Blockchain]) -> None:
    proposer, validator = pair
    executed, _ = proposer.build_block(transfers(2), timestamp=1_700_000_001, coinbase=COINBASE)
    replayed = executed.block.copy(transactions=transfers(1, start_nonce=5))
    with pytest.raises(BlockValidationError):
        validator.execute_block(replayed)


def test_builder_leaves_out_transactions_that_fail_at_execution(
    pair: tuple[Blockchain, Blockchain],
) -> None:
    proposer, _ = pair
    batch = transfers(2) + transfers(1, start_nonce=7)  # nonce 7 cannot run after 0 and 1
    executed, left_out = proposer.build_block(batch, timestamp=1_700_000_001, coinbase=COINBASE)
    assert [t.nonce for t in executed.block.transactions] == [0, 1]
    assert [t.nonce for t in left_out] == [7]


def test_abandoned_proposal_leaves_no_trace_and_commit_checks_the_parent(
    pair: tuple[Blockchain, Blockchain],
) -> None:
    proposer, _ = pair
    before = chain_keys(proposer)
    first, _ = proposer.build_block(transfers(2), timestamp=1_700_000_001, coinbase=COINBASE)
    rival, _ = proposer.build_block(transfers(1), timestamp=1_700_000_001, coinbase=COINBASE)
    assert chain_keys(proposer) == before
    proposer.commit(first)
    with pytest.raises(BlockValidationError, match="no longer extends the head"):
        proposer.commit(rival)
    assert proposer.head().hash == first.hash


def test_undecodable_block_is_a_validation_error(pair: tuple[Blockchain, Blockchain]) -> None:
    with pytest.raises(BlockValidationError, match="undecodable"):
        pair[0].decode_block(rlp.encode([b"junk"]))


def test_a_sender_is_recovered_once_per_transaction(
    pair: tuple[Blockchain, Blockchain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's decoding, block building, the validator's block decoding and pruning all
    read `tx.sender`; the signature is recovered once."""
    recovered = []
    original = london_transactions.extract_transaction_sender
    monkeypatch.setattr(london_transactions, "extract_transaction_sender",
                        lambda tx: recovered.append(tx) or original(tx))
    proposer, validator = pair
    builder = proposer.view().get_vm().get_transaction_builder()
    pooled = [builder.decode(t.encode()) for t in transfers(3, value=5)]
    assert {t.sender for t in pooled} == {SENDER.public_key.to_canonical_address()}
    executed, _ = proposer.build_block(pooled, timestamp=1_700_000_001, coinbase=COINBASE)
    imported = validator.execute_block(validator.decode_block(executed.encode()))
    assert [t.sender for t in imported.block.transactions] == [t.sender for t in pooled]
    assert len(recovered) == 3


def test_executing_a_block_leaves_no_memoized_tries(pair: tuple[Blockchain, Blockchain]) -> None:
    proposer, validator = pair
    executed, _ = proposer.build_block(transfers(2), timestamp=1_700_000_001, coinbase=COINBASE)
    assert _make_trie_root_and_nodes.cache_info().currsize == 0
    validator.execute_block(validator.decode_block(executed.encode()))
    assert _make_trie_root_and_nodes.cache_info().currsize == 0


def test_an_import_reads_no_receipt_back_and_reports_the_stored_ones(
    pair: tuple[Blockchain, Blockchain], monkeypatch: pytest.MonkeyPatch
) -> None:
    """py-evm reads an imported block's receipts back from the database (for Prague's deposit
    requests, and for the caller): ChainVM hands over the ones its execution made, which must
    be the ones stored."""
    proposer, validator = pair
    executed, _ = proposer.build_block(transfers(5), timestamp=1_700_000_001, coinbase=COINBASE)
    reads = []
    original = ChainDB.get_receipts
    monkeypatch.setattr(ChainDB, "get_receipts",
                        lambda self, *args: reads.append(args) or original(self, *args))
    imported = validator.execute_block(validator.decode_block(executed.encode()))
    assert reads == []
    validator.commit(imported)
    assert imported.receipts == validator.receipts(validator.head()) == executed.receipts


def test_blocks_built_and_validated_on_uncommitted_blocks_commit_in_order(
    pair: tuple[Blockchain, Blockchain],
) -> None:
    """Concurrent consensus: block 2 is built on block 1's executed state before block 1 is
    committed (a stacked overlay), validated elsewhere on the validator's executed block 1,
    and committed after it; until then neither leaves anything on disk."""
    proposer, validator = pair
    keys_before = chain_keys(validator)
    first, _ = proposer.build_block(transfers(3), timestamp=1_700_000_001, coinbase=COINBASE)
    second, _ = proposer.build_block(transfers(2, start_nonce=3), timestamp=1_700_000_002,
                                     coinbase=COINBASE, parent=first)
    assert second.block.header.parent_hash == first.hash and second.parent is first
    with pytest.raises(BlockValidationError, match="does not extend the head"):
        validator.execute_block(validator.decode_block(second.encode()))
    imported_first = validator.execute_block(validator.decode_block(first.encode()))
    imported_second = validator.execute_block(validator.decode_block(second.encode()),
                                              imported_first)
    assert imported_second.state_root == second.state_root
    assert chain_keys(validator) == keys_before  # nothing speculative reached LevelDB
    with pytest.raises(BlockValidationError, match="no longer extends the head"):
        validator.commit(imported_second)  # strictly in order
    validator.commit(imported_first)
    validator.commit(imported_second)
    assert imported_second.parent is None and imported_second.overlay.parent is None
    head = validator.head()
    assert (head.block_number, head.hash) == (2, second.hash)
    state = validator.vm_at(head).state
    assert state.get_nonce(SENDER.public_key.to_canonical_address()) == 5


def test_py_evm_alone_accepts_the_blocks_built_and_validated_here(
    pair: tuple[Blockchain, Blockchain], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node builds block tries in one pass (`chain.ordered_trie`), keeps state-trie nodes
    across blocks and shares unchanged fields when py-evm copies a block or an account: py-evm
    on its own (its HexaryTrie tries, no cache, deep copies) must import the same blocks."""
    proposer, validator = pair
    monkeypatch.setattr(py_evm_trie, "_make_trie_root_and_nodes",
                        py_evm_trie._make_trie_root_and_nodes)  # py-evm's again afterwards
    ordered_trie.install()
    nonce, encoded = 0, []
    for number, (count, value) in enumerate(((150, 1), (3, 10**18), (40, 7)), start=1):
        proposed, _ = proposer.build_block(transfers(count, nonce, value),
                                           timestamp=1_700_000_000 + number, coinbase=COINBASE)
        validated = validator.execute_block(validator.decode_block(proposed.encode()))
        proposer.commit(proposed)
        validator.commit(validated)
        encoded.append(proposed.encode())
        nonce += count
    monkeypatch.setattr(py_evm_trie, "_make_trie_root_and_nodes",
                        functools.lru_cache(4)(hexary_root_and_nodes))
    genesis = make_genesis()
    plain = MiningChain.configure(vm_configuration=((0, PragueVM),), chain_id=1337).from_genesis(
        AtomicDB(), genesis.header_params(), genesis.state())
    assert plain.get_canonical_head().hash == proposer.genesis_hash
    for data in encoded:
        block = rlp.decode(data, sedes=plain.get_vm().get_block_class())
        assert plain.import_block(block).imported_block.hash == block.hash
    assert plain.get_canonical_head().hash == validator.head().hash
    assert plain.get_vm().state.get_balance(b"\x22" * 20) == 150 + 3 * 10**18 + 40 * 7
