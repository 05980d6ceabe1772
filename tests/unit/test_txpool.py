"""chain.txpool: geth's admission rules and messages, ordering, bounds, pruning."""

from __future__ import annotations

import contextlib
import re

import pytest
from eth.vm.forks import PragueVM
from eth_keys import keys
from hypothesis import given, settings
from hypothesis import strategies as st

from chain.errors import TxPoolError
from chain.txpool import (
    AccountReader,
    PoolLimits,
    ReadyChanges,
    TxPool,
    decode_raw_transaction,
)

CHAIN_ID = 1337
GWEI = 10**9
BUILDER = PragueVM.get_transaction_builder()
ALICE = keys.PrivateKey(b"\x01" * 32)
BOB = keys.PrivateKey(b"\x02" * 32)
TO = b"\x22" * 20
MAX_SIZE = PoolLimits().max_transaction_size


class Accounts(AccountReader):
    """Account state as a dict, standing in for the chain head."""

    def __init__(self) -> None:
        self.nonces: dict[bytes, int] = {}
        self.balances: dict[bytes, int] = {}

    def nonce(self, address: bytes) -> int:
        return self.nonces.get(address, 0)

    def balance(self, address: bytes) -> int:
        return self.balances.get(address, 10**21)


def tx(
    key=ALICE,
    nonce=0,
    max_fee=10 * GWEI,
    tip=GWEI,
    gas=21_000,
    value=1,
    chain_id=CHAIN_ID,
    data=b"",
):
    unsigned = BUILDER.new_unsigned_dynamic_fee_transaction(
        chain_id=chain_id,
        nonce=nonce,
        max_priority_fee_per_gas=tip,
        max_fee_per_gas=max_fee,
        gas=gas,
        to=TO,
        value=value,
        data=data,
        access_list=(),
    )
    return unsigned.as_signed_transaction(key)


def address(key: keys.PrivateKey) -> bytes:
    return key.public_key.to_canonical_address()


@pytest.fixture
def accounts() -> Accounts:
    return Accounts()


@pytest.fixture
def pool(accounts: Accounts) -> TxPool:
    return TxPool(CHAIN_ID, accounts, block_gas_limit=30_000_000)


def add(pool: TxPool, transaction) -> None:
    pool.add(transaction, len(transaction.encode()))


def test_accepts_and_orders_by_arrival_and_nonce(pool: TxPool) -> None:
    a1, b0, a0 = tx(nonce=1), tx(key=BOB, nonce=0), tx(nonce=0)
    for t in (a1, b0, a0):
        add(pool, t)
    batch = pool.executable(base_fee=GWEI, gas_limit=30_000_000, max_count=10)
    # alice's nonce 1 arrived first but waits for her nonce 0, which arrived after bob's
    assert [t.hash for t in batch] == [b0.hash, a0.hash, a1.hash]
    assert pool.pending_nonce(address(ALICE)) == 2


def test_future_nonce_is_held_until_the_gap_closes(pool: TxPool) -> None:
    add(pool, tx(nonce=2))
    assert pool.executable(base_fee=GWEI, gas_limit=30_000_000, max_count=10) == []
    add(pool, tx(nonce=0))
    add(pool, tx(nonce=1))
    assert len(pool.executable(base_fee=GWEI, gas_limit=30_000_000, max_count=10)) == 3


def test_batch_bounds_gas_count_and_base_fee(pool: TxPool) -> None:
    for n in range(5):
        add(pool, tx(nonce=n))
    add(pool, tx(key=BOB, max_fee=GWEI // 2, tip=1))
    assert len(pool.executable(base_fee=GWEI, gas_limit=30_000_000, max_count=3)) == 3
    assert len(pool.executable(base_fee=GWEI, gas_limit=21_000 * 2, max_count=10)) == 2
    cheap_excluded = pool.executable(base_fee=GWEI, gas_limit=30_000_000, max_count=10)
    assert all(t.sender != address(BOB) for t in cheap_excluded)


@pytest.mark.parametrize(
    ("transaction", "message"),
    [
        (tx(chain_id=1), "invalid chain id for signer"),
        (tx(gas=30_000_001), "exceeds block gas limit"),
        (tx(gas=20_000), "intrinsic gas too low"),
        (tx(gas=21_000, data=b"\x01" * 10), "intrinsic gas too low"),
        (tx(max_fee=GWEI, tip=2 * GWEI), "max priority fee per gas higher than max fee per gas"),
        (tx(value=10**22), "insufficient funds for gas * price + value"),
    ],
)
def test_rejections(pool: TxPool, transaction, message: str) -> None:
    with pytest.raises(TxPoolError, match=re.escape(message)) as raised:
        add(pool, transaction)
    assert raised.value.code == -32000
    assert len(pool) == 0


def test_nonce_too_low_and_already_known(pool: TxPool, accounts: Accounts) -> None:
    accounts.nonces[address(ALICE)] = 3
    with pytest.raises(TxPoolError, match="nonce too low"):
        add(pool, tx(nonce=2))
    add(pool, tx(nonce=3))
    with pytest.raises(TxPoolError, match="already known"):
        add(pool, tx(nonce=3))


def test_unprotected_legacy_and_bad_signature(pool: TxPool) -> None:
    legacy = BUILDER.create_unsigned_transaction(
        nonce=0, gas_price=GWEI, gas=21_000, to=TO, value=1, data=b""
    )
    with pytest.raises(TxPoolError, match="replay-protected"):
        add(pool, legacy.as_signed_transaction(ALICE))
    forged = decode_raw_transaction(BUILDER, tx().copy(r=12345).encode(), MAX_SIZE)
    with pytest.raises(TxPoolError, match="invalid sender"):
        add(pool, forged)
    with pytest.raises(TxPoolError, match="invalid raw transaction"):
        decode_raw_transaction(BUILDER, b"\xc0", MAX_SIZE)
    with pytest.raises(TxPoolError, match="transaction type not supported"):
        decode_raw_transaction(BUILDER, b"\x07\xc0", MAX_SIZE)


def test_replacement_needs_a_ten_percent_bump(pool: TxPool) -> None:
    add(pool, tx(max_fee=10 * GWEI, tip=GWEI))
    for max_fee, tip in [(10 * GWEI, GWEI), (11 * GWEI - 1, 2 * GWEI), (11 * GWEI, GWEI)]:
        with pytest.raises(TxPoolError, match="replacement transaction underpriced"):
            add(pool, tx(max_fee=max_fee, tip=tip, value=2))
    replacement = tx(max_fee=11 * GWEI, tip=GWEI * 11 // 10, value=2)
    add(pool, replacement)
    assert len(pool) == 1 and replacement.hash in pool


def test_balance_counts_earlier_pending_transactions(pool: TxPool, accounts: Accounts) -> None:
    cost = 21_000 * 10 * GWEI + 1
    accounts.balances[address(ALICE)] = 2 * cost
    add(pool, tx(nonce=0))
    add(pool, tx(nonce=1))
    with pytest.raises(TxPoolError, match="insufficient funds"):
        add(pool, tx(nonce=2))


def test_size_and_count_limits(accounts: Accounts) -> None:
    small = TxPool(CHAIN_ID, accounts, 30_000_000, PoolLimits(max_transactions=2))
    add(small, tx(nonce=0))
    add(small, tx(nonce=1))
    with pytest.raises(TxPoolError, match="txpool is full"):
        add(small, tx(key=BOB))
    tight = TxPool(CHAIN_ID, accounts, 30_000_000, PoolLimits(max_transaction_size=100))
    with pytest.raises(TxPoolError, match="oversized data"):
        add(tight, tx(gas=100_000, data=b"\x01" * 200))
    per_sender = TxPool(CHAIN_ID, accounts, 30_000_000, PoolLimits(max_per_sender=1))
    add(per_sender, tx(nonce=0))
    with pytest.raises(TxPoolError, match="account limit exceeded"):
        add(per_sender, tx(nonce=1))
    by_bytes = TxPool(CHAIN_ID, accounts, 30_000_000, PoolLimits(max_bytes=150))
    add(by_bytes, tx(nonce=0))
    with pytest.raises(TxPoolError, match="txpool is full"):
        add(by_bytes, tx(nonce=1))


def test_remove_and_prune_after_a_commit(pool: TxPool, accounts: Accounts) -> None:
    txs = [tx(nonce=n) for n in range(3)]
    for t in txs:
        add(pool, t)
    pool.remove([txs[0].hash])
    accounts.nonces[address(ALICE)] = 2  # nonce 1 was used by a transaction from elsewhere
    pool.prune([address(ALICE)])
    assert [e.tx.hash for e in pool.entries()] == [txs[2].hash]
    assert pool.size_bytes == len(txs[2].encode())


def reference_batch(pool: TxPool, accounts: Accounts, base_fee: int, gas_limit: int,
                    max_count: int) -> list[bytes]:
    """The batch rule stated plainly: every sender's runs of contiguous nonces from its account
    nonce, each transaction ready at the latest arrival of its run so far, sorted by readiness
    then nonce; taken greedily, a skipped transaction stopping its sender."""
    by_sender: dict[bytes, dict[int, object]] = {}
    for entry in pool.entries():
        by_sender.setdefault(entry.sender, {})[entry.tx.nonce] = entry
    next_nonce = {s: accounts.nonce(s) for s in by_sender}
    ready = []
    for sender, queue in by_sender.items():
        latest, nonce = -1, next_nonce[sender]
        while nonce in queue:
            latest = max(latest, queue[nonce].arrival)
            ready.append((latest, nonce, queue[nonce]))
            nonce += 1
    batch, gas = [], 0
    for _, _, entry in sorted(ready, key=lambda item: item[:2]):
        if len(batch) >= max_count:
            break
        t = entry.tx
        if t.nonce != next_nonce[entry.sender] or t.max_fee_per_gas < base_fee:
            continue
        if gas + t.gas > gas_limit:
            continue
        batch.append(t.hash)
        gas += t.gas
        next_nonce[entry.sender] += 1
    return batch


KEYS = [keys.PrivateKey(bytes([n + 1]) * 32) for n in range(3)]
SIGNED = {(k, n, f): tx(key=KEYS[k], nonce=n, max_fee=f * GWEI)
          for k in range(3) for n in range(5) for f in (10, 20)}


@given(
    arrivals=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4), st.sampled_from([10, 20])),
                      max_size=15),
    base_fee=st.sampled_from([GWEI, 15 * GWEI]),
    gas_limit=st.sampled_from([21_000 * 3, 30_000_000]),
    max_count=st.integers(1, 12),
)
@settings(max_examples=200, deadline=None)
def test_batch_walk_matches_the_stated_rule(
    arrivals: list[tuple[int, int, int]], base_fee: int, gas_limit: int, max_count: int
) -> None:
    accounts = Accounts()
    pool = TxPool(CHAIN_ID, accounts, block_gas_limit=30_000_000)
    for key, nonce, fee in arrivals:
        with contextlib.suppress(TxPoolError):  # duplicates and underpriced replacements
            add(pool, SIGNED[(key, nonce, fee)])
    walked = pool.executable(base_fee=base_fee, gas_limit=gas_limit, max_count=max_count)
    assert [t.hash for t in walked] == reference_batch(pool, accounts, base_fee, gas_limit,
                                                       max_count)


class CountingAccounts(Accounts):
    def __init__(self) -> None:
        super().__init__()
        self.nonce_reads = 0

    def nonce(self, address: bytes) -> int:
        self.nonce_reads += 1
        return super().nonce(address)


def test_batches_reuse_the_nonce_read_at_admission_until_a_removal() -> None:
    accounts = CountingAccounts()
    pool = TxPool(CHAIN_ID, accounts, block_gas_limit=30_000_000)
    first, second = tx(nonce=0), tx(nonce=1)
    add(pool, first)
    add(pool, second)
    reads = accounts.nonce_reads
    for _ in range(3):
        assert len(pool.executable(base_fee=GWEI, gas_limit=30_000_000, max_count=10)) == 2
    assert accounts.nonce_reads == reads
    pool.remove([first.hash])  # as after a commit, or a transaction failing in a block
    accounts.nonces[address(ALICE)] = 1
    assert pool.executable(base_fee=GWEI, gas_limit=30_000_000, max_count=10) == [second]
    assert accounts.nonce_reads == reads + 1


def test_the_queue_bound_counts_gapped_transactions_not_the_gap(pool: TxPool) -> None:
    """Like Besu's future-nonce bound: 200 pending in a row are fine, a far nonce is held, and
    the bound is on how many transactions wait behind a gap, whatever its size."""
    for n in range(200):
        add(pool, tx(nonce=n, max_fee=GWEI, tip=1))
    limit = PoolLimits().max_queued_per_sender
    for n in range(limit):
        add(pool, tx(nonce=1_000 + 10 * n, max_fee=GWEI, tip=1))
    with pytest.raises(TxPoolError, match=f"nonce too high: {limit} transactions with a nonce gap"):
        add(pool, tx(nonce=201, max_fee=GWEI, tip=1))
    add(pool, tx(nonce=200, max_fee=GWEI, tip=1))  # continues the run: never refused
    assert len(pool) == 201 + limit


def test_consecutive_nonces_arriving_out_of_order_are_all_held(pool: TxPool) -> None:
    """Nonces 100-199 reach this validator before gossip brings 0-99 (a load balancer
    spraying one account's transactions): none is refused, and all become ready."""
    for n in range(100, 100 + PoolLimits().max_queued_per_sender):
        add(pool, tx(nonce=n))
    assert pool.ready_changes(GWEI) == ReadyChanges()
    for n in range(100):
        add(pool, tx(nonce=n))
    assert len(pool.ready_changes(GWEI).ready) == 100 + PoolLimits().max_queued_per_sender


def test_ready_changes_report_only_what_a_block_could_include(
    pool: TxPool, accounts: Accounts
) -> None:
    gapped, cheap, first = tx(nonce=1), tx(key=BOB, max_fee=GWEI, tip=1), tx(nonce=0)
    add(pool, gapped)
    add(pool, cheap)
    assert pool.ready_changes(2 * GWEI) == ReadyChanges()  # a gap, a fee cap below the base fee
    add(pool, first)
    assert pool.ready_changes(2 * GWEI) == ReadyChanges(ready=(first.hash, gapped.hash))
    assert pool.ready_changes(GWEI) == ReadyChanges(ready=(cheap.hash,))
    assert pool.ready_changes(20 * GWEI) == ReadyChanges(
        unready=(first.hash, gapped.hash, cheap.hash))


def test_a_moving_base_fee_cuts_and_restores_runs_where_a_fee_cap_decides(
    pool: TxPool,
) -> None:
    """Alice's fee caps are 5, 3 and 5 gwei, Bob's 10: a base fee of 4 cuts Alice's run
    after its first nonce, 11 empties both, and 1 gives both back, in the pool's order."""
    a0, a1, a2 = (tx(nonce=n, max_fee=cap * GWEI, tip=1) for n, cap in enumerate((5, 3, 5)))
    b0 = tx(key=BOB, max_fee=10 * GWEI, tip=1)
    for t in (a0, a1, a2, b0):
        add(pool, t)
    everything = (a0.hash, a1.hash, a2.hash, b0.hash)
    assert pool.ready_changes(GWEI) == ReadyChanges(ready=everything)
    assert pool.ready_changes(4 * GWEI) == ReadyChanges(unready=(a1.hash, a2.hash))
    assert pool.ready_changes(4 * GWEI) == ReadyChanges()
    assert pool.ready_changes(11 * GWEI) == ReadyChanges(unready=(a0.hash, b0.hash))
    assert pool.ready_changes(GWEI) == ReadyChanges(ready=everything)


def test_a_commit_reevaluates_its_own_senders_not_the_whole_pool(
    pool: TxPool, accounts: Accounts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a block, the runs of the senders it did not touch change only with the base
    fee, and only where a fee cap is at stake: a burst's pool of thousands of senders must
    not be walked again at every commit."""
    senders = [keys.PrivateKey(bytes([i + 3]) * 32) for i in range(50)]
    first = [tx(key=key) for key in senders]
    for t in first:
        add(pool, t)
    pool.ready_changes(GWEI)
    reevaluated: list[bytes] = []
    ready_run = pool._ready_run
    monkeypatch.setattr(pool, "_ready_run",
                        lambda sender, base_fee: reevaluated.append(sender)
                        or ready_run(sender, base_fee))
    pool.remove([first[7].hash], committed=True)
    accounts.nonces[address(senders[7])] = 1
    pool.prune([address(senders[7])])
    assert pool.ready_changes(GWEI) == ReadyChanges()
    assert reevaluated == [address(senders[7])]
    reevaluated.clear()
    assert pool.ready_changes(GWEI // 2) == ReadyChanges()  # lower: no cap was at stake
    assert reevaluated == []
    assert len(pool.ready_changes(11 * GWEI).unready) == 49  # higher than every cap
    assert len(reevaluated) == 49


def test_ready_changes_after_replacement_commit_and_prune(
    pool: TxPool, accounts: Accounts
) -> None:
    first, second = tx(nonce=0), tx(nonce=1)
    add(pool, first)
    add(pool, second)
    pool.ready_changes(GWEI)
    bumped = tx(nonce=1, max_fee=20 * GWEI, tip=2 * GWEI)
    add(pool, bumped)  # replace-by-fee: the old one is no longer ready
    assert pool.ready_changes(GWEI) == ReadyChanges(ready=(bumped.hash,), unready=(second.hash,))
    pool.remove([first.hash], committed=True)  # committed: the engine hears it from the block
    accounts.nonces[address(ALICE)] = 2  # and another validator's copy of nonce 1 committed
    pool.prune([address(ALICE)])
    assert pool.ready_changes(GWEI) == ReadyChanges(unready=(bumped.hash,))


def test_a_fee_bump_keeps_its_place_in_line(pool: TxPool) -> None:
    """Bumping nonce 0 must not send the sender's waiting nonces behind later arrivals: the
    engine times them from when they became executable (a primary seemed to censor them)."""
    first, second = tx(nonce=0), tx(nonce=1)
    later = tx(key=BOB, nonce=0)
    for t in (first, second, later):
        add(pool, t)
    bumped = tx(nonce=0, max_fee=20 * GWEI, tip=2 * GWEI)
    add(pool, bumped)
    batch = pool.executable(base_fee=GWEI, gas_limit=30_000_000, max_count=10)
    assert [t.hash for t in batch] == [bumped.hash, second.hash, later.hash]


def test_by_status_splits_pending_from_queued_as_geth(pool: TxPool, accounts: Accounts) -> None:
    accounts.nonces[address(BOB)] = 5
    a3, a0, a1, b5, b7 = (tx(nonce=3), tx(nonce=0, max_fee=1, tip=0), tx(nonce=1),
                          tx(key=BOB, nonce=5), tx(key=BOB, nonce=7))
    for t in (a3, a0, a1, b5, b7):
        add(pool, t)
    pending, queued = pool.by_status()
    hashes = {sender: [e.tx.hash for e in entries] for sender, entries in pending.items()}
    # a fee cap under any base fee is still pending: its nonce follows on
    assert hashes == {address(ALICE): [a0.hash, a1.hash], address(BOB): [b5.hash]}
    assert {s: [e.tx.hash for e in es] for s, es in queued.items()} == {
        address(ALICE): [a3.hash], address(BOB): [b7.hash]}
