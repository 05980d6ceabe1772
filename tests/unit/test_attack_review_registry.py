"""Attack review of the validator registry (issue 31: chain/system_contracts.py, its hook in
chain/blockchain.py, pbft_engine/registry.py, pbft_engine/validator_rpc.py, cli/validators.py).

The attacker is a funded client with web3, a byzantine validator (one key of the set, any
transaction it likes) or a byzantine primary (what goes in a block, in which order). Each test
is an attack through real py-evm execution of signed transactions on Blockchains over LevelDB
(as tests/unit/test_registry.py), or through a real node's RPC context (as
tests/unit/test_validator_rpc.py). A finding that is fixed passes; one that needs a design
decision is a strict xfail naming it; the rest are attacks that held.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import rlp
from eth_utils import keccak

from chain.blockchain import Blockchain
from chain.genesis import Genesis, GenesisAccount
from chain.node import Node, NodeConfig, engine_contracts
from chain.rpc.dispatcher import check_arity
from chain.rpc.errors import INVALID_PARAMS, SERVER_ERROR, RpcError
from chain.system_contracts import (
    ContractStorage,
    ScratchStorage,
    StateStorage,
    SystemContractRevert,
)
from chain.txpool import PoolLimits
from cli.node import build_parser
from pbft_engine.core.params import EngineParams
from pbft_engine.registry import (
    GET_VALIDATORS,
    REGISTRY_ADDRESS,
    REGISTRY_GAS,
    ValidatorRegistry,
    Vote,
    encode_retract,
    encode_vote,
    read_changes,
    subject_base,
    voter_base,
    votes_about,
    votes_of,
)
from storage import Database
from tests.unit.test_registry import (
    ADDRESSES,
    BUILDER,
    CHAIN_ID,
    GWEI,
    KEYS,
    NEWCOMER,
    OUTSIDER,
    Harness,
    make,
)
from tests.unit.test_validator_rpc import call, error, nodes, start_node

__all__ = ["make", "nodes"]  # the fixtures, shared with the registry's and the RPC's tests

INTRINSIC = 21_000
A, B, C = 0, 1, 2
CALL, CALLCODE, DELEGATECALL, STATICCALL = 0xF1, 0xF2, 0xF4, 0xFA


def forwarder(opcode: int, *, value: int = 0, then_revert: bool = False) -> bytes:
    """Code that calls the registry with its own calldata by `opcode` (CALL and CALLCODE
    with `value`), stores the call's success in its slot 0, then stops (or reverts)."""
    value_arg = b"\x60" + bytes([value]) if opcode in (CALL, CALLCODE) else b""
    return (b"\x36\x60\x00\x60\x00\x37"  # memory[0:] = calldata
            + b"\x60\x00\x60\x00\x36\x60\x00" + value_arg  # out 0,0; in 0,calldatasize
            + b"\x73" + REGISTRY_ADDRESS + b"\x5a" + bytes([opcode])  # registry, all gas
            + b"\x60\x00\x55"  # slot 0 = success
            + (b"\x60\x00\x60\x00\xfd" if then_revert else b"\x00"))


# Contracts that are validators of the set (a genesis set may name any address), so the calls
# they forward pass the registry's rules and only the way of calling can refuse them.
FORWARDERS = {
    "call": (b"\xf1" * 20, forwarder(CALL)),
    "call-then-revert": (b"\xf0" * 20, forwarder(CALL, then_revert=True)),
    "call-with-value": (b"\xf3" * 20, forwarder(CALL, value=1)),
    "callcode": (b"\xf2" * 20, forwarder(CALLCODE)),
    "delegatecall": (b"\xf4" * 20, forwarder(DELEGATECALL)),
    "staticcall": (b"\xfa" * 20, forwarder(STATICCALL)),
}
STATIC_READER = b"\xfb" * 20  # reads getValidators() by STATICCALL (no validator)
SELFDESTRUCTOR = b"\xff" * 20  # gives its balance to the registry
DESTROYED_BALANCE = 12_345


def adversarial_genesis() -> Genesis:
    validators = [*ADDRESSES[:3], *(address for address, _ in FORWARDERS.values())]
    params = {"validators": ["0x" + v.hex() for v in validators], "min_validators": 4}
    alloc = {a: GenesisAccount(balance=10**24) for a in ADDRESSES}
    alloc.update({address: GenesisAccount(balance=10**18, code=code)
                  for address, code in FORWARDERS.values()})
    alloc[STATIC_READER] = GenesisAccount(code=forwarder(STATICCALL))
    alloc[SELFDESTRUCTOR] = GenesisAccount(balance=DESTROYED_BALANCE,
                                           code=b"\x73" + REGISTRY_ADDRESS + b"\xff")
    return Genesis(chain_id=CHAIN_ID, engine="pbft", engine_params=params, alloc=alloc,
                   timestamp=1_700_000_000, source=repr(params).encode())


def signed(h: Harness, sender: int, to: bytes, data: bytes, *, value: int = 0,
           gas: int = 1_000_000, access_list: tuple[Any, ...] = ()) -> Any:
    nonce = h.nonces[sender]
    h.nonces[sender] += 1
    return BUILDER.decode(BUILDER.new_unsigned_dynamic_fee_transaction(
        chain_id=CHAIN_ID, nonce=nonce, max_priority_fee_per_gas=GWEI,
        max_fee_per_gas=10 * GWEI, gas=gas, to=to, value=value, data=data,
        access_list=access_list).as_signed_transaction(KEYS[sender]).encode())


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[Harness, Blockchain]]:
    """A proposer's chain (a Harness) and a validator's, both with the engine's contracts."""
    dbs = [Database(tmp_path / name) for name in ("proposer", "validator")]
    chains = [Blockchain(db, adversarial_genesis(), engine_contracts(adversarial_genesis()))
              for db in dbs]
    yield Harness(chains[0]), chains[1]
    for db in dbs:
        db.close()


def calldata_gas(data: bytes) -> int:
    return sum(16 if byte else 4 for byte in data)


def test_every_way_to_reach_the_registry_in_one_block_executes_alike_on_two_nodes(
        two_nodes: tuple[Harness, Blockchain]) -> None:
    """Held: a CALL then a REVERT of the caller, CALL with value, CALLCODE, DELEGATECALL,
    STATICCALL (a vote and a read), SELFDESTRUCT giving ether to the registry, an access list
    naming its slots, too little gas for its fixed cost, 100 KB of calldata: one block, and a
    second node executing it reaches the same state root and receipts; only the plain CALL
    and the plain transactions vote."""
    h, validator = two_nodes
    vote = encode_vote(NEWCOMER, True, 0)
    forwarded = {name: signed(h, OUTSIDER, address, vote)
                 for name, (address, _) in FORWARDERS.items()}
    txs = [
        signed(h, A, REGISTRY_ADDRESS, vote),
        *forwarded.values(),
        signed(h, OUTSIDER, STATIC_READER, GET_VALIDATORS),
        signed(h, OUTSIDER, SELFDESTRUCTOR, b""),
        signed(h, B, REGISTRY_ADDRESS, vote, access_list=(
            (REGISTRY_ADDRESS, (voter_base(ADDRESSES[B]), subject_base(NEWCOMER) + 1)),)),
        signed(h, C, REGISTRY_ADDRESS, vote, gas=INTRINSIC + calldata_gas(vote) + REGISTRY_GAS - 1),
        signed(h, OUTSIDER, REGISTRY_ADDRESS, vote + b"\x01" * 100_000, gas=2_000_000),
    ]
    executed = h.block(*txs)
    statuses = [r.state_root for r in executed.receipts]
    names = ["A", *forwarded, "static-read", "selfdestruct", "access-list", "out-of-gas",
             "huge-calldata"]
    assert dict(zip(names, statuses, strict=True)) == {
        "A": b"\x01", "call": b"\x01", "call-then-revert": b"",
        "call-with-value": b"\x01", "callcode": b"\x01", "delegatecall": b"\x01",
        "staticcall": b"\x01", "static-read": b"\x01", "selfdestruct": b"\x01",
        "access-list": b"\x01", "out-of-gas": b"", "huge-calldata": b""}
    state = h.chain.vm_at(h.chain.head()).state
    # the forwarders' own record of whether the inner call succeeded
    inner = {name: state.get_storage(address, 0) for name, (address, _) in FORWARDERS.items()}
    assert inner == {"call": 1, "call-then-revert": 0, "call-with-value": 0, "callcode": 0,
                     "delegatecall": 0, "staticcall": 0}
    assert state.get_storage(STATIC_READER, 0) == 1  # a read by STATICCALL succeeds
    voters = {v.voter for v in h.live_votes()}
    assert voters == {ADDRESSES[A], FORWARDERS["call"][0], ADDRESSES[B]}
    assert (state.get_balance(REGISTRY_ADDRESS), state.get_nonce(REGISTRY_ADDRESS)) == (
        DESTROYED_BALANCE, 1)
    replayed = validator.execute_block(validator.decode_block(executed.encode()))
    assert replayed.state_root == executed.state_root
    assert [r.encode() for r in replayed.receipts] == [r.encode() for r in executed.receipts]


def test_a_vote_costs_the_same_gas_in_eth_call_as_in_its_block(make: Any) -> None:
    """Held: the fixed cost is charged before the rules run, so a preview (eth_call's
    execution) and the block agree, whether the vote counts or reverts."""
    h = make(4)
    counted, refused = encode_vote(NEWCOMER, True, 0), encode_vote(NEWCOMER, False, 0)
    previews = [INTRINSIC + calldata_gas(data) + h.preview(h.tx(A, data, sent=False)).get_gas_used()
                for data in (counted, refused)]
    executed = h.block(h.tx(A, counted), h.tx(A, refused))
    first, both = (r.gas_used for r in executed.receipts)
    assert [first, both - first] == previews


def test_a_change_to_a_set_already_scheduled_in_the_same_block_reverts(make: Any) -> None:
    """Finding 1 (fixed; low: needs a majority's votes in one block, any dev chain of one
    validator has it): add X, remove X, add X again passing in one block recorded a third
    change that `EpochSchedule.schedule` drops as a replay of the first (same set, same
    block), so the registry's history and the schedule every node runs disagreed, and the
    same vote could pass again and again, each time a record that changes nothing."""
    h = make(1)  # a development chain: its one validator passes any change alone
    executed = h.block(h.tx(A, encode_vote(NEWCOMER, True, 0)),
                       h.tx(A, encode_vote(NEWCOMER, False, 0)),
                       h.tx(A, encode_vote(NEWCOMER, True, 0)))
    assert [r.state_root for r in executed.receipts] == [b"\x01", b"\x01", b""]
    assert len(read_changes(h.storage())) == len(h.schedule().epochs) - 1 == 2
    with pytest.raises(SystemContractRevert, match="was scheduled already in block 1"):
        h.registry.call(ScratchStorage(h.storage()), ADDRESSES[A],
                        encode_vote(NEWCOMER, True, 0), executed.number)


def removed_and_readded(h: Harness, *, write_between: bool) -> None:
    """D votes to add NEWCOMER (block 1), is voted out (passes in block 4: epoch 1, without
    D, from block 7) and back in (block 5: epoch 2, with D, from block 9); `write_between`:
    one unrelated vote in epoch 1."""
    d = 3
    h.vote(d, NEWCOMER, True)
    for voter in (A, B, C):
        h.vote(voter, ADDRESSES[d], False)
    h.block(*(h.tx(voter, encode_vote(ADDRESSES[d], True, 0)) for voter in (A, B, C)))
    assert [e.first for e in h.schedule().epochs] == [1, 7, 9]
    h.block()  # block 6
    if write_between:
        h.vote(A, ADDRESSES[6], True, epoch=1)  # block 7
    else:
        h.block()
    h.block()  # block 8: block 9 is epoch 2's


def test_a_removed_validators_vote_does_not_come_back_when_it_is_voted_in_again(
        make: Any) -> None:
    """Finding 2 (fixed; low): votes of a voter who left the set were only pruned when some
    later vote rewrote the list, so a vote D cast before it was voted out counted again once
    it was voted back in, or not, depending on whether anybody voted while it was out: two
    histories with the same votes about NEWCOMER, two tallies. A vote now counts only while
    its voter has been in every set since it was cast."""
    tallies = []
    for write_between in (False, True):
        h = make(4, checkpoint_interval=2, max_in_flight=1, min_validators=3)
        removed_and_readded(h, write_between=write_between)
        tallies.append({s: t for s, t in h.tally().items() if s == NEWCOMER})
    assert tallies == [{}, {}]


MALFORMED = [
    ("pbft_getEpoch", ["0x01"]), ("pbft_getEpoch", ["0x1" + "0" * 16]),
    ("pbft_getEpoch", [None]), ("pbft_getEpoch", [{"blockNumber": "0x1"}]),
    ("pbft_getEpoch", [True]), ("pbft_getEpoch", ["x" * 100_000]),
    ("pbft_getPendingVotes", ["-0x1"]), ("pbft_getPendingVotes", [["latest"]]),
    ("pbft_getValidatorsByBlockNumber", [1.5]), ("pbft_getValidatorsByBlockNumber", ["0x"]),
    ("pbft_getValidatorsByBlockHash", [None]), ("pbft_getValidatorsByBlockHash", ["latest"]),
    ("pbft_getValidatorsByBlockHash", ["0x" + "ab" * 33]),
    ("pbft_proposeValidatorVote", [None, True]), ("pbft_proposeValidatorVote", [7, True]),
    ("pbft_proposeValidatorVote", ["0x" + "ab" * 20, None]),
    ("pbft_proposeValidatorVote", ["0x" + "ab" * 20, 1]),
    ("pbft_proposeValidatorVote", ["0x" + "ab" * 100_000, True]),
    ("pbft_discardValidatorVote", [{}]), ("pbft_discardValidatorVote", ["0x" + "ab" * 19]),
]


@pytest.mark.parametrize(("method", "params"), MALFORMED,
                         ids=[f"{m}-{i}" for i, (m, _) in enumerate(MALFORMED)])
def test_every_malformed_argument_is_invalid_params_in_one_short_line(
        nodes: list[Node], method: str, params: list[Any]) -> None:
    """Held, but for finding 3 (fixed; low): a malformed argument is -32602 with one line,
    never a traceback or -32603; a block tag (or `add`) of 100 KB was echoed back whole in
    the message, now it is cut short. Nothing is sent."""
    refused = error(nodes[0], method, *params)
    assert (refused.code, "\n" in refused.message, len(refused.message) < 300) == (
        INVALID_PARAMS, False, True), refused.message
    assert len(nodes[0].pool) == 0


@pytest.mark.parametrize(("method", "params"), [
    ("pbft_proposeValidatorVote", ["0x" + "ab" * 20]), ("pbft_discardValidatorVote", []),
    ("pbft_getEpoch", ["latest", "latest"]), ("pbft_getValidatorsByBlockHash", []),
])
def test_a_wrong_number_of_arguments_is_invalid_params(nodes: list[Node], method: str,
                                                       params: list[Any]) -> None:
    """Held: the dispatcher checks each method's arity before calling it."""
    with pytest.raises(RpcError) as refused:
        check_arity(nodes[0].engine.rpc_methods()[method], params)
    assert refused.value.code == INVALID_PARAMS


def test_two_votes_at_once_take_two_nonces(nodes: list[Node]) -> None:
    """Held: each vote's nonce is read and the vote admitted on the loop in one step (after
    the dry run on the registry's worker), so votes sent together never share a nonce."""
    a = nodes[0]

    async def both() -> list[Any]:
        methods = a.engine.rpc_methods()
        return list(await asyncio.gather(
            methods["pbft_proposeValidatorVote"]("0x" + "ab" * 20, True),
            methods["pbft_proposeValidatorVote"]("0x" + "cd" * 20, True)))

    hashes = asyncio.run(both())
    sent = [a.pool.get(bytes.fromhex(h[2:])) for h in hashes]
    assert sorted(entry.tx.nonce for entry in sent if entry is not None) == [0, 1]


def reopened(datadir: Path, **config: Any) -> Node:
    """The node of `datadir` (made by `start_node`) opened again with `config`."""
    first = start_node(datadir, A)
    first._executor.shutdown()
    first.db.close()
    return Node(NodeConfig(datadir=datadir, http_enabled=False, **config))


def test_a_node_without_a_validator_key_refuses_to_vote_in_one_line(tmp_path: Path) -> None:
    """Held: an observer (no validator key) answers a vote with why, and sends nothing."""
    observer = reopened(tmp_path / "observer")
    try:
        refused = error(observer, "pbft_proposeValidatorVote", "0x" + "ab" * 20, True)
        assert (refused.code, refused.message) == (
            SERVER_ERROR, "this node has no validator key: only a validator votes")
        assert len(observer.pool) == 0
    finally:
        observer._executor.shutdown()
        observer.db.close()


def test_a_vote_is_admitted_when_txpool_pricelimit_is_above_twice_the_base_fee(
        tmp_path: Path) -> None:
    """An operator who sets --txpool.pricelimit (geth's users often set 1 gwei) on a chain
    whose base fee fell while idle (EIP-1559: down to 7 wei) cannot vote through
    pbft_proposeValidatorVote: its own pool refuses the node's vote as underpriced."""
    node = reopened(tmp_path / "node", validator_key=KEYS[A],
                    pool_limits=PoolLimits(price_limit=10 * GWEI))
    try:
        tx_hash = call(node, "pbft_proposeValidatorVote", "0x" + "ab" * 20, True)
        assert node.pool.get(bytes.fromhex(tx_hash[2:])) is not None
    finally:
        node._executor.shutdown()
        node.db.close()


class CountingWords:
    """Counts the registry's storage words read and written during real execution
    (instrumentation: the reads and writes still happen)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        read, write = StateStorage.get, StateStorage.set

        def counted_read(storage: StateStorage, slot: int) -> int:
            self.count += 1
            return read(storage, slot)

        def counted_write(storage: StateStorage, slot: int, value: int) -> None:
            self.count += 1
            write(storage, slot, value)

        monkeypatch.setattr(StateStorage, "get", counted_read)
        monkeypatch.setattr(StateStorage, "set", counted_write)

    def of(self, run: Callable[[], object]) -> int:
        """The words `run` touches."""
        self.count = 0
        run()
        return self.count


def test_a_votes_work_does_not_grow_with_the_other_validators_live_votes(
        make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 4 (fixed; medium): every vote read and rewrote one blob of every live vote,
    for the same fixed gas. Byzantine validators filled it (n live votes each: f*n) and then
    filled blocks with votes replacing their own: measured with n = 31 and f = 10 (310 live
    votes), a block of 480 such votes (30M gas) took 10.2 s to build and 9.5 s to validate,
    against 0.14 s for 480 transfers; every validator must execute a byzantine primary's
    block in full. Now a vote is a word in its voter's list and one in its subject's: it
    reads those two lists (at most about n words each) and writes the words that change,
    whatever the other validators hold. The same vote, alone and beside the other voters' 16,
    touches the same words: 7 (on the one blob: 8 against 52; with n = 31 and 310 others,
    1,760 words against 14, and the block of 480 votes builds in about twice the time of 480
    transfers, not ten times)."""
    h = make(8, min_validators=4)
    outsider = b"\x99" * 20
    words = CountingWords(monkeypatch)
    h.vote(A, outsider, True)
    alone = words.of(lambda: h.vote(A, outsider, True))  # replacing it, alone
    for byzantine in (B, C):
        for subject in range(8):
            h.vote(byzantine, bytes([0xAA, byzantine, subject]) + bytes(17), True)
    assert len(h.live_votes()) == 17
    assert words.of(lambda: h.vote(A, outsider, True)) == alone  # the same, beside 16 others


def test_a_votes_words_are_its_voters_and_its_subjects_lists_only(make: Any) -> None:
    """The layout behind finding 4's fix: a vote is one word in its voter's list and one in
    its subject's, and a replaced vote keeps its place (one word rewritten in each). Nothing
    else is written but the changes; a change that passes empties its subject's list and
    drops it from its voters' lists, so both views agree after every step."""
    h = make(4, min_validators=1)
    h.vote(A, NEWCOMER, True)
    h.vote(B, ADDRESSES[6], True)
    h.vote(A, ADDRESSES[6], True)
    h.vote(A, NEWCOMER, True)  # replaced in place
    storage = h.storage()
    assert [v.subject for v in votes_of(storage, ADDRESSES[A])] == [NEWCOMER, ADDRESSES[6]]
    assert [v.voter for v in votes_about(storage, ADDRESSES[6])] == [ADDRESSES[B], ADDRESSES[A]]
    h.vote(C, ADDRESSES[6], True)  # 3 of 4: passes
    storage = h.storage()
    assert votes_about(storage, ADDRESSES[6]) == []
    assert [v.subject for v in votes_of(storage, ADDRESSES[A])] == [NEWCOMER]
    assert (votes_of(storage, ADDRESSES[B]), votes_of(storage, ADDRESSES[C])) == ([], [])
    assert h.tally() == {NEWCOMER: (True, {ADDRESSES[A]})}


def test_dead_votes_leave_storage_when_their_voter_votes_again(make: Any) -> None:
    """The fix keeps storage bounded: an expired vote leaves its voter's list, and its
    subject's, when that voter's list is next written (the blob dropped every dead vote at
    every write); a retraction of the last vote leaves the storage as it was before."""
    h = make(4, vote_ttl=2)
    root = h.storage_root()
    h.vote(A, NEWCOMER, True)  # block 1: counts in blocks 1..2
    h.block()
    h.block()
    h.vote(A, ADDRESSES[6], True)  # block 4
    storage = h.storage()
    assert [v.subject for v in votes_of(storage, ADDRESSES[A])] == [ADDRESSES[6]]
    assert votes_about(storage, NEWCOMER) == []
    h.block(h.tx(A, encode_retract(ADDRESSES[6], 0)))
    assert h.storage_root() == root


def authorization(signer: int, delegate: bytes, nonce: int) -> dict[str, Any]:
    """An EIP-7702 authorization: `signer`'s account runs `delegate`'s code."""
    digest = keccak(b"\x05" + rlp.encode([CHAIN_ID, delegate, nonce]))
    signature = KEYS[signer].sign_msg_hash(digest)
    return {"chain_id": CHAIN_ID, "address": delegate, "nonce": nonce,
            "y_parity": signature.v, "r": signature.r, "s": signature.s}


def test_a_validator_account_delegated_by_eip_7702_votes_through_its_delegate(
        two_nodes: tuple[Harness, Blockchain]) -> None:
    """Held, and documented: a call from a validator's account is its vote, whoever made the
    account call. A validator that delegates its account (EIP-7702) to forwarding code lets
    anyone vote as it (as anyone could spend its ether); nodes agree on it. Delegating to the
    registry's address itself runs nothing (a delegation to a precompile executes no code)."""
    h, validator = two_nodes
    vote = encode_vote(NEWCOMER, True, 0)
    nonce = h.nonces[OUTSIDER]
    h.nonces[OUTSIDER] += 1
    delegated = BUILDER.decode(BUILDER.new_unsigned_set_code_transaction(
        chain_id=CHAIN_ID, nonce=nonce, max_priority_fee_per_gas=GWEI,
        max_fee_per_gas=10 * GWEI, gas=1_000_000, to=ADDRESSES[A], value=0, data=vote,
        access_list=(), authorization_list=(
            authorization(A, FORWARDERS["call"][0], h.nonces[A]),
            authorization(B, REGISTRY_ADDRESS, h.nonces[B]),
        )).as_signed_transaction(KEYS[OUTSIDER]).encode())
    executed = h.block(delegated, signed(h, OUTSIDER, ADDRESSES[B], vote))
    assert [r.state_root for r in executed.receipts] == [b"\x01", b"\x01"]
    assert [(v.voter, v.subject) for v in h.live_votes()] == [
        (ADDRESSES[A], NEWCOMER)]  # B's account ran nothing
    replayed = validator.execute_block(validator.decode_block(executed.encode()))
    assert replayed.state_root == executed.state_root


def test_a_member_whose_addition_is_scheduled_cannot_vote_before_its_epoch(make: Any) -> None:
    """Held: NEWCOMER is voted in (block 3: epoch 1 from block 11); until then it is no
    member of the set deciding the block, so its vote and retraction revert."""
    h = make(4, min_validators=1)
    for voter in (A, B, C):
        h.vote(voter, NEWCOMER, True)
    newcomer = ADDRESSES.index(NEWCOMER)
    assert "is not a validator of epoch 0" in h.refused(newcomer, encode_vote(ADDRESSES[6],
                                                                               True, 0))
    assert "is not a validator of epoch 0" in h.refused(newcomer, encode_retract(NEWCOMER, 1))


def live_in(read: Callable[[ContractStorage, bytes], list[Vote]], registry: ValidatorRegistry,
            storage: ContractStorage, addresses: list[bytes], block: int) -> set[Vote]:
    """The votes that count in `block` in the lists `read` gives (voters' or subjects')."""
    schedule = registry.schedule(storage)
    return {v for a in addresses for v in read(storage, a)
            if registry.counts(v, block, schedule)}


def test_random_calls_raise_nothing_but_a_revert_and_keep_history_and_schedule_equal() -> None:
    """Held: 800 random votes and retractions (members and not, right and wrong epochs, sets
    of 1 to 7, floors, TTLs, checkpoint intervals): nothing but SystemContractRevert escapes
    the registry (anything else would escape py-evm's computation and fail the block on
    every node), every recorded change is in the schedule every node rebuilds, and the live
    votes in the voters' lists are those in the subjects' lists (finding 4's layout)."""
    rng = random.Random(31)
    addresses = [bytes([i + 1]) * 20 for i in range(8)] + [bytes(20)]
    changes = 0
    for _ in range(20):
        n = rng.randint(1, 7)
        registry = ValidatorRegistry(EngineParams(
            CHAIN_ID, tuple(addresses[:n]), checkpoint_interval=rng.choice([1, 2, 5]),
            log_multiplier=2, max_in_flight=1, min_validators=rng.randint(1, n),
            vote_ttl=rng.choice([1, 3, 100])))
        storage, block = ScratchStorage(), 1
        for _ in range(40):
            block += rng.choice([0, 1, 3])
            epoch = registry.schedule(storage).epoch_at(block).number + rng.choice([0, 0, 0, 1])
            subject = rng.choice(addresses[max(0, n - 2):n + 2])  # a few members, a few not
            data = (encode_vote(subject, rng.random() < 0.6, epoch) if rng.random() < 0.8
                    else encode_retract(subject, epoch))
            before = dict(storage.slots)
            try:
                registry.call(storage, rng.choice(addresses[:n + 1]), data, block)
            except SystemContractRevert:
                storage.slots = before  # the VM's undo
            assert live_in(votes_of, registry, storage, addresses, block) == live_in(
                votes_about, registry, storage, addresses, block)
        changes += len(read_changes(storage))
        assert len(read_changes(storage)) == len(registry.schedule(storage).epochs) - 1
    assert changes >= 10  # the calls did pass changes, not only revert


@pytest.mark.parametrize("block", ["-5", "1_000", "\u0663", " 7", "0x", "0x-1"])
def test_the_cli_refuses_a_block_that_is_not_a_plain_number_or_tag(
        block: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Finding 6 (fixed; low): `--block -5` went to the node as "-0x5" (int() took it, as it
    takes "1_000" and other scripts' digits), to be refused there; now the CLI refuses it
    itself as a usage error (exit 2: the usage line and one error line), before any
    request."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["validators", "list", "--block", block])
    err = capsys.readouterr().err
    assert (exited.value.code, err.count("\n"), "want a block number" in err) == (2, 2, True)
