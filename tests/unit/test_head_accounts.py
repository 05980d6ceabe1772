"""The accounts a block changed (`ExecutedBlock.changed_accounts`, from py-evm's state diff)
and the pool's `HeadAccounts`, which keeps account reads across blocks by updating exactly
those: after every commit each kept value must equal a fresh read of the state trie."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import rlp
from eth.vm.forks import PragueVM
from eth_keys import keys
from eth_utils import keccak

from chain.blockchain import Blockchain
from chain.genesis import Genesis, GenesisAccount
from chain.node import HeadAccounts
from storage import Database

GWEI = 10**9
SENDERS = [keys.PrivateKey(bytes([n]) * 32) for n in (7, 8)]
IDLE = b"\x44" * 20  # funded, never touched by a block
RECIPIENT = b"\x22" * 20
COINBASE = b"\x33" * 20
BUILDER = PragueVM.get_transaction_builder()
# init code that deploys an empty contract: RETURN(0, 0)
EMPTY_CONTRACT_INIT = bytes.fromhex("60006000f3")


def address(key: keys.PrivateKey) -> bytes:
    return key.public_key.to_canonical_address()


def signed(key: keys.PrivateKey, nonce: int, to: bytes, value: int, data: bytes = b"",
           gas: int = 21_000) -> object:
    unsigned = BUILDER.new_unsigned_dynamic_fee_transaction(
        chain_id=1337, nonce=nonce, max_priority_fee_per_gas=GWEI, max_fee_per_gas=10 * GWEI,
        gas=gas, to=to, value=value, data=data, access_list=())
    return BUILDER.decode(unsigned.as_signed_transaction(key).encode())


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Blockchain, Blockchain]]:
    alloc = {address(k): GenesisAccount(balance=10**24) for k in SENDERS}
    alloc[IDLE] = GenesisAccount(balance=5)
    genesis = Genesis(chain_id=1337, engine="dev", engine_params={}, alloc=alloc,
                      timestamp=1_700_000_000, source=b"head accounts")
    dbs = [Database(tmp_path / name) for name in ("proposer", "validator")]
    yield tuple(Blockchain(db, genesis) for db in dbs)
    for db in dbs:
        db.close()


def fresh(chain: Blockchain, account: bytes) -> tuple[int, int]:
    state = chain.vm_at(chain.head()).state
    return state.get_nonce(account), state.get_balance(account)


def decoded(encoded: bytes) -> tuple[int, int]:
    if not encoded:
        return 0, 0
    nonce, balance, _, _ = rlp.decode(encoded)
    return rlp.sedes.big_endian_int.deserialize(nonce), rlp.sedes.big_endian_int.deserialize(
        balance)


def test_a_block_reports_the_accounts_it_changed_with_their_new_values(
    pair: tuple[Blockchain, Blockchain],
) -> None:
    proposer, validator = pair
    first, second = SENDERS
    created = keccak(rlp.encode([address(second), 0]))[12:]
    txs = [signed(first, 0, RECIPIENT, 10), signed(first, 1, RECIPIENT, 1),
           signed(second, 0, b"", 7, EMPTY_CONTRACT_INIT, gas=100_000)]
    built, _ = proposer.build_block(txs, timestamp=1_700_000_001, coinbase=COINBASE)
    imported = validator.execute_block(validator.decode_block(built.encode()))
    assert dict(imported.changed_accounts) == dict(built.changed_accounts)
    proposer.commit(built)
    changed = built.changed_accounts
    for account in (address(first), address(second), RECIPIENT, COINBASE, created):
        assert decoded(changed[account]) == fresh(proposer, account), account.hex()
    assert decoded(changed[created]) == (1, 7)
    assert IDLE not in changed  # read by nobody, changed by nothing
    assert all(decoded(value) == fresh(proposer, key) for key, value in changed.items())


def test_head_accounts_stay_true_across_blocks(pair: tuple[Blockchain, Blockchain]) -> None:
    chain = pair[0]
    accounts = HeadAccounts(chain, size=3)
    watched = [address(SENDERS[0]), address(SENDERS[1]), RECIPIENT, IDLE, COINBASE]
    nonces = [0, 0]
    for block in range(1, 5):
        for account in watched:  # read (and kept, three at most) before the block
            assert (accounts.nonce(account), accounts.balance(account)) == fresh(chain, account)
        txs = [signed(key, nonces[i] + n, RECIPIENT, block + n)
               for i, key in enumerate(SENDERS) for n in range(block % 3 + 1)]
        for i in range(2):
            nonces[i] += block % 3 + 1
        executed, left_out = chain.build_block(
            txs, timestamp=1_700_000_000 + block, coinbase=COINBASE)
        assert left_out == ()
        chain.commit(executed)
        accounts.advance(executed.changed_accounts)
        for account in reversed(watched):  # kept ones first: they must have moved with it
            assert (accounts.nonce(account), accounts.balance(account)) == fresh(chain, account)
