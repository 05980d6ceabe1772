"""chain.system_contracts through py-evm: a toy system contract (a counter in storage) run by
signed transactions and CALLs on a Blockchain over LevelDB, as the validator registry is."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from eth.vm.forks import PragueVM
from eth_keys import keys

from chain.blockchain import Blockchain, ExecutedBlock
from chain.errors import BlockValidationError
from chain.genesis import Genesis, GenesisAccount
from chain.system_contracts import (
    ContractStorage,
    ScratchStorage,
    SystemContract,
    SystemContractRevert,
    read_blob,
    revert_data,
    write_blob,
)
from storage import Database

GWEI = 10**9
SENDER = keys.PrivateKey(b"\x07" * 32)
COUNTER = b"\0" * 18 + b"\xc0\x01"
CALLER = b"\x44" * 20  # a contract that CALLs the counter (its code below)
BUILDER = PragueVM.get_transaction_builder()
INTRINSIC = 21_000


class Counter(SystemContract):
    """Counts its calls in slot 0 and keeps the last caller's calldata as a blob at 1;
    reverts for calldata b"fail"."""

    address = COUNTER
    gas = 5_000

    def call(self, storage: ContractStorage, sender: bytes, data: bytes,
             block_number: int) -> bytes:
        if data == b"fail":
            raise SystemContractRevert(f"told to fail in block {block_number}")
        count = storage.get(0) + 1
        storage.set(0, count)
        write_blob(storage, 1, data)
        return count.to_bytes(32, "big")


def _calling(opcode: int, with_value: bool) -> bytes:
    """Code that calls COUNTER with no calldata and stores the call's success in slot 0."""
    value = b"\x60\x00" if with_value else b""
    return (b"\x60\x00" * 4 + value + b"\x73" + COUNTER + b"\x5a" + bytes([opcode])
            + b"\x60\x00\x55\x00")


CALL, DELEGATECALL, STATICCALL = 0xF1, 0xF4, 0xFA
CALLERS = {
    CALL: b"\x44" * 20,
    DELEGATECALL: b"\x45" * 20,
    STATICCALL: b"\x46" * 20,
}


def make_genesis() -> Genesis:
    alloc = {SENDER.public_key.to_canonical_address(): GenesisAccount(balance=10**24)}
    for opcode, address in CALLERS.items():
        alloc[address] = GenesisAccount(code=_calling(opcode, with_value=opcode == CALL))
    return Genesis(chain_id=1337, engine="dev", engine_params={}, alloc=alloc,
                   timestamp=1_700_000_000, source=b"system contracts")


def transaction(nonce: int, data: bytes, to: bytes = COUNTER, value: int = 0,
                gas: int = 100_000) -> object:
    return BUILDER.decode(
        BUILDER.new_unsigned_dynamic_fee_transaction(
            chain_id=1337, nonce=nonce, max_priority_fee_per_gas=GWEI,
            max_fee_per_gas=10 * GWEI, gas=gas, to=to, value=value, data=data,
            access_list=(),
        ).as_signed_transaction(SENDER).encode())


@pytest.fixture
def chains(tmp_path: Path) -> Iterator[tuple[Blockchain, Blockchain, Blockchain]]:
    """A proposer and a validator running the counter, and a chain without it."""
    dbs = [Database(tmp_path / name) for name in ("proposer", "validator", "plain")]
    yield (Blockchain(dbs[0], make_genesis(), [Counter()]),
           Blockchain(dbs[1], make_genesis(), [Counter()]),
           Blockchain(dbs[2], make_genesis()))
    for db in dbs:
        db.close()


def commit(chain: Blockchain, *txs: object) -> ExecutedBlock:
    executed, left_out = chain.build_block(list(txs), timestamp=1_700_000_001,
                                           coinbase=b"\x33" * 20)
    assert left_out == ()
    chain.commit(executed)
    return executed


def counter(chain: Blockchain) -> ContractStorage:
    return chain.system_storage(chain.head(), COUNTER)


def test_a_call_writes_storage_in_the_state_root_and_costs_intrinsic_plus_fixed_gas(
        chains: tuple[Blockchain, Blockchain, Blockchain]) -> None:
    proposer, validator, plain = chains
    genesis_root = proposer.head().state_root
    assert genesis_root == plain.head().state_root  # no storage yet: the genesis is unchanged
    executed = commit(proposer, transaction(0, b"\x01\x02"), transaction(1, b"\x03"))
    assert [r.state_root for r in executed.receipts] == [b"\x01", b"\x01"]
    calldata_gas = 2 * 16
    assert executed.receipts[0].gas_used == INTRINSIC + calldata_gas + Counter.gas
    assert counter(proposer).get(0) == 2  # the account outlived the first transaction
    assert read_blob(counter(proposer), 1) == b"\x03"
    validator.commit(validator.execute_block(validator.decode_block(executed.encode())))
    assert validator.head().state_root == executed.state_root != genesis_root
    with pytest.raises(BlockValidationError):  # a VM without the contract disagrees
        plain.execute_block(plain.decode_block(executed.encode()))


def test_a_revert_keeps_storage_returns_the_reason_and_charges_only_what_it_used(
        chains: tuple[Blockchain, Blockchain, Blockchain]) -> None:
    proposer, _, _ = chains
    executed = commit(proposer, transaction(0, b"ok"), transaction(1, b"fail"))
    assert executed.receipts[1].state_root == b""
    # (a receipt's gas is cumulative)
    assert executed.receipts[1].gas_used - executed.receipts[0].gas_used == (
        INTRINSIC + 4 * 16 + Counter.gas)
    assert counter(proposer).get(0) == 1
    state = proposer.vm_at(proposer.head()).state  # on a view: written nowhere
    computation = state.apply_transaction(transaction(2, b"fail"))
    assert computation.is_error
    assert computation.output == revert_data(f"told to fail in block {state.block_number}")


def test_value_and_too_little_gas_are_refused(
        chains: tuple[Blockchain, Blockchain, Blockchain]) -> None:
    proposer, _, _ = chains
    executed = commit(proposer, transaction(0, b"", value=1),
                      transaction(1, b"", gas=INTRINSIC + Counter.gas - 1))
    assert [r.state_root for r in executed.receipts] == [b"", b""]
    used = executed.receipts[1].gas_used - executed.receipts[0].gas_used
    assert used == INTRINSIC + Counter.gas - 1  # out of gas: all of it
    assert counter(proposer).get(0) == 0
    assert proposer.vm_at(proposer.head()).state.get_balance(COUNTER) == 0


@pytest.mark.parametrize(("opcode", "calls"), [(CALL, 1), (DELEGATECALL, 0), (STATICCALL, 0)],
                         ids=["call", "delegatecall", "staticcall"])
def test_a_contract_calls_it_by_call_only(
        chains: tuple[Blockchain, Blockchain, Blockchain], opcode: int, calls: int) -> None:
    proposer, _, _ = chains
    executed = commit(proposer, transaction(0, b"", to=CALLERS[opcode], gas=1_000_000))
    assert executed.receipts[0].state_root == b"\x01"
    state = proposer.vm_at(proposer.head()).state
    assert state.get_storage(CALLERS[opcode], 0) == calls  # the inner call's success
    assert counter(proposer).get(0) == calls


def test_a_blob_is_read_back_and_a_shorter_one_clears_the_words_it_no_longer_uses() -> None:
    storage = ScratchStorage()
    write_blob(storage, 7, bytes(range(70)))
    assert read_blob(storage, 7) == bytes(range(70))
    write_blob(storage, 7, b"\xff" * 33)
    assert read_blob(storage, 7) == b"\xff" * 33 and storage.get(7 + 3) == 0
    write_blob(storage, 7, b"")
    assert not any(storage.slots.values())


def test_scratch_storage_keeps_writes_over_its_base() -> None:
    base = ScratchStorage()
    base.set(1, 5)
    scratch = ScratchStorage(base)
    scratch.set(2, 7)
    assert (scratch.get(1), scratch.get(2), base.get(2)) == (5, 7, 0)
