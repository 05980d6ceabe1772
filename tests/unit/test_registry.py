"""pbft_engine.registry: the validator registry's rules (research/membership.md 8.8 items 1-3),
through real py-evm execution of signed vote transactions on a Blockchain over LevelDB, with
the contracts the pbft engine's entry point provides (as every node runs them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import rlp
from eth.abc import ComputationAPI
from eth.vm.forks import PragueVM
from eth_keys import keys

from chain.blockchain import Blockchain, ExecutedBlock
from chain.genesis import Genesis, GenesisAccount, load_genesis_bytes
from chain.node import engine_contracts
from chain.registry import available_engines
from chain.system_contracts import (
    ContractStorage,
    ScratchStorage,
    SystemContractRevert,
    revert_data,
)
from cli.state_replay import ChainStateReplay
from pbft_engine.core.epochs import EpochSchedule, handover_checkpoint
from pbft_engine.core.params import EngineParams
from pbft_engine.errors import ConfigError
from pbft_engine.registry import (
    EPOCH,
    GET_VALIDATORS,
    REGISTRY_ADDRESS,
    REGISTRY_GAS,
    VOTE,
    Change,
    ValidatorRegistry,
    Vote,
    encode_retract,
    encode_vote,
    read_changes,
    schedule_from,
)
from storage import Database

GWEI = 10**9
CHAIN_ID = 1337
KEYS = [keys.PrivateKey(bytes([i + 1]) * 32) for i in range(8)]
ADDRESSES = [k.public_key.to_canonical_address() for k in KEYS]
OUTSIDER = 7  # funded, never a validator
BUILDER = PragueVM.get_transaction_builder()


def genesis(validators: int = 4, **pbft: Any) -> Genesis:
    params = {"validators": ["0x" + a.hex() for a in ADDRESSES[:validators]], **pbft}
    return Genesis(chain_id=CHAIN_ID, engine="pbft", engine_params=params,
                   alloc={a: GenesisAccount(balance=10**24) for a in ADDRESSES},
                   timestamp=1_700_000_000, source=repr(params).encode())


class Harness:
    """A chain and its voters: each `block` commits one block of vote transactions."""

    def __init__(self, chain: Blockchain) -> None:
        self.chain = chain
        self.nonces = [0] * len(KEYS)
        self.registry = ValidatorRegistry(EngineParams.from_genesis(
            CHAIN_ID, chain.genesis.engine_params))

    def tx(self, voter: int, data: bytes, *, sent: bool = True) -> Any:
        """A signed call of the registry (`sent`: it takes the voter's next nonce)."""
        nonce = self.nonces[voter]
        self.nonces[voter] += sent
        return BUILDER.decode(BUILDER.new_unsigned_dynamic_fee_transaction(
            chain_id=CHAIN_ID, nonce=nonce, max_priority_fee_per_gas=GWEI,
            max_fee_per_gas=10 * GWEI, gas=200_000, to=REGISTRY_ADDRESS, value=0, data=data,
            access_list=()).as_signed_transaction(KEYS[voter]).encode())

    def preview(self, tx: Any) -> ComputationAPI:
        """`tx` executed in the next block, on a view (written nowhere)."""
        view = self.chain.view()
        header = view.create_header_from_parent(self.chain.head())
        return view.get_vm(header).state.apply_transaction(tx)

    def block(self, *txs: Any) -> ExecutedBlock:
        executed, left_out = self.chain.build_block(list(txs), timestamp=1_700_000_001,
                                                    coinbase=ADDRESSES[0])
        assert left_out == ()
        self.chain.commit(executed)
        return executed

    def vote(self, voter: int, subject: bytes, add: bool, epoch: int = 0) -> None:
        """A vote that must succeed, alone in its block."""
        executed = self.block(self.tx(voter, encode_vote(subject, add, epoch)))
        assert executed.receipts[0].state_root == b"\x01"

    def reason(self, tx: Any) -> str:
        computation = self.preview(tx)
        assert computation.is_error
        output = computation.output
        assert output[:4] == revert_data("")[:4]
        return output[68:68 + int.from_bytes(output[36:68], "big")].decode()

    def refused(self, voter: int, data: bytes) -> str:
        """The reason a call reverts; it is included, reverts, and changes no storage."""
        before = self.storage_root()
        reason = self.reason(self.tx(voter, data, sent=False))
        executed = self.block(self.tx(voter, data))
        assert executed.receipts[0].state_root == b""
        assert self.storage_root() == before
        return reason

    def storage(self) -> ContractStorage:
        return self.chain.system_storage(self.chain.head(), REGISTRY_ADDRESS)

    def storage_root(self) -> bytes:
        return self.chain.vm_at(self.chain.head()).state._account_db._get_storage_root(
            REGISTRY_ADDRESS)

    def schedule(self) -> EpochSchedule:
        return self.registry.schedule(self.storage())

    def live_votes(self) -> list[Vote]:
        """The votes that count in the next block."""
        return self.registry.live_votes(self.storage(), self.chain.head().block_number + 1)

    def tally(self) -> dict[bytes, tuple[bool, set[bytes]]]:
        next_block = self.chain.head().block_number + 1
        return {t.subject: (t.add, set(t.voters))
                for t in self.registry.pending(self.storage(), next_block)}


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    dbs: list[Database] = []

    def factory(validators: int = 4, **pbft: Any) -> Harness:
        db = Database(tmp_path / f"chain{len(dbs)}")
        dbs.append(db)
        g = genesis(validators, **pbft)
        return Harness(Blockchain(db, g, engine_contracts(g)))

    yield factory
    for db in dbs:
        db.close()


NEWCOMER = ADDRESSES[5]


def test_an_add_passes_at_floor_half_plus_one_and_is_scheduled_at_the_checkpoint(make) -> None:
    h = make(4)
    plain_root = h.chain.head().state_root
    h.vote(0, NEWCOMER, True)
    h.vote(0, NEWCOMER, True)  # the same voter again: replaced, counted once
    h.vote(1, NEWCOMER, True)
    assert h.tally() == {NEWCOMER: (True, {ADDRESSES[0], ADDRESSES[1]})}
    assert read_changes(h.storage()) == ()
    passed = h.block(h.tx(2, encode_vote(NEWCOMER, True, 0)))  # 3 of 4
    assert read_changes(h.storage()) == (Change((*ADDRESSES[:4], NEWCOMER), passed.number),)
    assert h.tally() == {}  # the votes about it are dropped
    epoch = h.schedule().epochs[1]
    c = handover_checkpoint(passed.number, 10, 2)
    assert (epoch.first, epoch.validators, epoch.passed_at) == (
        c + 1, (*ADDRESSES[:4], NEWCOMER), passed.number)
    assert h.chain.head().state_root != plain_root
    assert "is a validator already" in h.refused(3, encode_vote(NEWCOMER, True, 0))


def test_retract_deletes_a_vote_and_the_tally_follows(make) -> None:
    h = make(4)
    h.vote(0, NEWCOMER, True)
    h.vote(1, NEWCOMER, True)
    # a flip (remove what is not a member) reverts and leaves the add vote as it was
    assert "is not a validator (or its removal" in h.refused(0, encode_vote(NEWCOMER, False, 0))
    assert h.tally() == {NEWCOMER: (True, {ADDRESSES[0], ADDRESSES[1]})}
    h.block(h.tx(0, encode_retract(NEWCOMER, 0)))
    assert h.tally() == {NEWCOMER: (True, {ADDRESSES[1]})}
    assert "has no live vote about" in h.refused(0, encode_retract(NEWCOMER, 0))
    h.vote(2, NEWCOMER, True)
    h.vote(3, NEWCOMER, True)
    assert read_changes(h.storage())[0].validators[-1] == NEWCOMER


@pytest.mark.parametrize(("voter", "data", "reason"), [
    (OUTSIDER, encode_vote(NEWCOMER, True, 0), "is not a validator of epoch 0"),
    (0, encode_vote(NEWCOMER, True, 1), "the vote is for epoch 1, but block 1 is in epoch 0"),
    (0, encode_vote(ADDRESSES[1], True, 0), "is a validator already"),
    (0, encode_vote(NEWCOMER, False, 0), "is not a validator (or its removal"),
    (0, encode_vote(bytes(20), True, 0), "the zero address cannot be a validator"),
    (0, encode_vote(NEWCOMER, True, 0)[:-1], "malformed calldata for vote(address,bool,uint64)"),
    (0, VOTE + b"\x01" + encode_vote(NEWCOMER, True, 0)[5:], "argument 1 is not an address"),
    (0, encode_vote(NEWCOMER, True, 0)[:-64] + (2).to_bytes(32, "big") + bytes(32),
     "argument 2 is not a bool"),
    (0, encode_vote(NEWCOMER, True, 0)[:-32] + (1 << 64).to_bytes(32, "big"),
     "argument 3 is not a uint64"),
    (0, b"\x12\x34", "unknown function selector 0x1234"),
], ids=["non-member", "wrong-epoch", "add-member", "remove-non-member", "zero-address",
        "short", "address-padding", "bool", "uint64", "selector"])
def test_a_vote_breaking_a_rule_is_included_reverts_with_its_reason_and_changes_nothing(
        make, voter: int, data: bytes, reason: str) -> None:
    h = make(4)
    assert reason in h.refused(voter, data)


def test_min_validators_guard_refuses_a_removal_below_it(make) -> None:
    h = make(4)  # default floor min(4, 4)
    assert "would leave 3 validators, fewer than min_validators 4" in h.refused(
        0, encode_vote(ADDRESSES[3], False, 0))
    lower = make(4, min_validators=3)
    for voter in range(3):
        lower.vote(voter, ADDRESSES[3], False)
    assert read_changes(lower.storage())[0].validators == tuple(ADDRESSES[:3])
    assert "would leave 2 validators, fewer than min_validators 3" in lower.refused(
        0, encode_vote(ADDRESSES[2], False, 0))  # counted on the set after the scheduled one


def test_votes_expire_after_vote_ttl_blocks(make) -> None:
    h = make(4, vote_ttl=3)
    h.vote(0, NEWCOMER, True)  # block 1: counts in blocks 1..3
    h.vote(1, NEWCOMER, True)  # block 2
    h.block()  # block 3
    assert h.tally() == {NEWCOMER: (True, {ADDRESSES[1]})}  # as block 4 counts
    h.vote(2, NEWCOMER, True)  # block 4: 2 live votes, not 3
    assert read_changes(h.storage()) == ()
    tally = h.registry.pending(h.storage(), 4)  # as block 4 counted them: B's and C's
    assert [(t.threshold, t.expires_at, len(t.voters)) for t in tally] == [(3, 5, 2)]
    assert h.tally() == {NEWCOMER: (True, {ADDRESSES[2]})}  # as block 5 counts


def test_a_removed_validators_votes_stop_counting_and_it_cannot_vote_after_the_handover(
        make) -> None:
    h = make(4, checkpoint_interval=2, max_in_flight=1, min_validators=3)
    h.vote(3, NEWCOMER, True)  # D's vote, about another subject
    for voter in range(3):
        h.vote(voter, ADDRESSES[3], False)  # passes in block 4: c = 6
    assert h.schedule().epochs[1].first == 7
    assert h.tally() == {NEWCOMER: (True, {ADDRESSES[3]})}  # D still decides blocks up to 6
    h.block()
    h.block()  # block 6
    assert h.tally() == {}  # block 7 is decided by A, B, C
    assert "is not a validator of epoch 1" in h.refused(3, encode_vote(NEWCOMER, True, 1))
    assert "the vote is for epoch 0, but block 8 is in epoch 1" in h.refused(
        0, encode_vote(NEWCOMER, True, 0))
    h.vote(0, NEWCOMER, True, epoch=1)
    h.vote(1, NEWCOMER, True, epoch=1)  # 2 of 3 pass
    assert read_changes(h.storage())[1].validators == (*ADDRESSES[:3], NEWCOMER)


def test_changes_passing_in_one_epoch_queue_one_per_epoch(make) -> None:
    h = make(4, min_validators=1)
    for voter in range(3):
        h.vote(voter, NEWCOMER, True)  # passes in block 3: epoch 1 from c + 1 = 11
    for voter in range(3):
        h.vote(voter, ADDRESSES[6], True)  # passes in block 6: the next checkpoint, 20
    schedule = h.schedule()
    assert [(e.first, e.passed_at) for e in schedule.epochs] == [(1, None), (11, 3), (21, 6)]
    assert schedule.epochs[2].validators == (*ADDRESSES[:4], NEWCOMER, ADDRESSES[6])
    assert schedule.installed == 0  # installing is the replica's business


def test_a_voter_holds_at_most_n_live_votes(make) -> None:
    h = make(4)
    for subject in ADDRESSES[4:8]:
        h.vote(0, subject, True)
    assert "has 4 live votes, as many as there are validators" in h.refused(
        0, encode_vote(b"\x99" * 20, True, 0))
    h.vote(0, ADDRESSES[4], True)  # replacing one is not one more
    assert len(h.live_votes()) == 4


def test_get_validators_and_epoch_answer_for_the_block_they_run_in(make) -> None:
    h = make(4, checkpoint_interval=2, max_in_flight=1, min_validators=1)
    for voter in range(3):
        h.vote(voter, NEWCOMER, True)  # passes in block 3: epoch 1 from 5
    h.block()  # block 4: the next block (5) is in epoch 1
    validators = h.preview(h.tx(OUTSIDER, GET_VALIDATORS, sent=False)).output
    assert validators[32:64] == (5).to_bytes(32, "big")
    assert [validators[76 + 32 * i:96 + 32 * i] for i in range(5)] == [
        *ADDRESSES[:4], NEWCOMER]
    assert h.preview(h.tx(OUTSIDER, EPOCH, sent=False)).output == (1).to_bytes(32, "big")
    assert "malformed calldata for epoch()" in h.reason(h.tx(OUTSIDER, EPOCH + b"\0", sent=False))


def test_a_vote_costs_intrinsic_gas_plus_the_registry_s_fixed_cost(make) -> None:
    h = make(4)
    data = encode_vote(NEWCOMER, True, 0)
    executed = h.block(h.tx(0, data))
    calldata = sum(16 if byte else 4 for byte in data)
    assert executed.receipts[0].gas_used == 21_000 + calldata + REGISTRY_GAS


def test_the_genesis_state_root_is_the_same_as_without_a_registry(make, tmp_path: Path) -> None:
    h = make(4)
    with Database(tmp_path / "plain") as db:
        assert Blockchain(db, h.chain.genesis).head().state_root == h.chain.head().state_root
    assert schedule_from(h.storage(), h.registry.genesis_schedule).epochs == (
        h.registry.genesis_schedule.epochs)


@pytest.mark.parametrize(("k", "w", "b", "c"), [
    (10, 2, 3, 10), (10, 2, 8, 10), (10, 2, 9, 20), (10, 2, 10, 20), (5, 7, 10, 20),
    (3, 4, 3, 9), (1, 1, 5, 6),
], ids=["inside", "just-fits", "one-over", "b-at-checkpoint", "w-over-k", "w-over-k-2",
        "k-1"])
def test_the_handover_is_the_first_checkpoint_at_least_max_in_flight_after_b(
        k: int, w: int, b: int, c: int) -> None:
    """c = K * ceil((b + W) / K), computed from the registry's state (a pure storage)."""
    params = EngineParams(CHAIN_ID, tuple(ADDRESSES[:4]), checkpoint_interval=k,
                          log_multiplier=max(2, w), max_in_flight=w)
    registry, storage = ValidatorRegistry(params), ScratchStorage()
    for voter in range(3):
        registry.call(storage, ADDRESSES[voter], encode_vote(NEWCOMER, True, 0), b)
    assert registry.schedule(storage).epochs[1].first == c + 1


def test_a_revert_leaves_the_pure_storage_to_the_vm() -> None:
    """A refusal is raised before any write (the pure rules alone, without the VM's undo)."""
    registry = ValidatorRegistry(EngineParams(CHAIN_ID, tuple(ADDRESSES[:4])))
    storage = ScratchStorage()
    with pytest.raises(SystemContractRevert, match="not a validator of epoch 0"):
        registry.call(storage, ADDRESSES[OUTSIDER], encode_vote(NEWCOMER, True, 0), 1)
    assert storage.slots == {}


@pytest.mark.parametrize(("pbft", "message"), [
    ({"min_validators": 5}, "min_validators must be between 1 and the genesis set's size 4"),
    ({"min_validators": 0}, "min_validators must be a whole number of at least 1"),
    ({"vote_ttl": 0}, "vote_ttl must be a whole number of at least 1"),
    ({"vote_ttl": 1.5}, "vote_ttl must be a whole number"),
    ({"min_validators": True}, "min_validators must be a whole number"),
])
def test_genesis_min_validators_and_vote_ttl_are_checked(pbft: dict[str, Any],
                                                         message: str) -> None:
    config = {"validators": ["0x" + a.hex() for a in ADDRESSES[:4]], **pbft}
    with pytest.raises(ConfigError, match=message):
        EngineParams.from_genesis(CHAIN_ID, config)


def test_defaults_min_validators_is_min_of_4_and_the_genesis_set() -> None:
    for n, floor in ((1, 1), (3, 3), (4, 4), (7, 4)):
        params = EngineParams.from_genesis(
            CHAIN_ID, {"validators": ["0x" + a.hex() for a in ADDRESSES[:n]]})
        assert (params.min_validators, params.vote_ttl) == (floor, 30_000)


def test_the_state_audit_s_replay_executes_the_registry_as_the_node_does(tmp_path: Path) -> None:
    document = json.dumps({
        "config": {"chainId": CHAIN_ID, "pbft": {"validators": ["0x" + a.hex() for a in
                                                                ADDRESSES[:4]]}},
        "timestamp": hex(1_700_000_000),
        "alloc": {"0x" + a.hex(): {"balance": hex(10**24)} for a in ADDRESSES},
    }).encode()
    genesis = load_genesis_bytes(document, available_engines())
    with Database(tmp_path / "chain") as db:
        h = Harness(Blockchain(db, genesis, engine_contracts(genesis)))
        for voter in range(3):
            h.vote(voter, NEWCOMER, True)
        h.refused(OUTSIDER, encode_vote(NEWCOMER, True, 0))
        assert len(read_changes(h.storage())) == 1
        headers = [h.chain.header_by_number(n) for n in range(h.chain.head().block_number + 1)]
        blocks = [(header.block_number, rlp.encode(h.chain.block_by_header(header)))
                  for header in headers if header is not None]
    roots = dict(ChainStateReplay(document).state_roots(blocks))
    assert roots == {header.block_number: header.state_root for header in headers if header}
