"""pbft_engine.validator_rpc on a real node (its context, pool, chain over LevelDB; not
started, no network): votes signed with the node's key and admitted as
eth_sendRawTransaction admits them, committed in blocks the node's context builds, and the
reads answering from the registry's state at a block."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_keys import keys
from eth_utils import keccak

from chain.genesis import load_genesis_bytes
from chain.node import Node, NodeConfig, initialize_datadir
from chain.registry import available_engines
from chain.rpc.errors import INVALID_PARAMS, SERVER_ERROR, RpcError

KEYS = [keys.PrivateKey(bytes([i + 1]) * 32) for i in range(6)]
ADDRESSES = ["0x" + k.public_key.to_canonical_address().hex() for k in KEYS]
VALIDATORS, NEWCOMER, OUTSIDER = ADDRESSES[:4], ADDRESSES[4], 5


def start_node(datadir: Path, key: int) -> Node:
    document = {
        "config": {"chainId": 1337, "pbft": {"validators": VALIDATORS,
                                             "checkpoint_interval": 2, "max_in_flight": 1}},
        "alloc": {a: {"balance": hex(10**24)} for a in ADDRESSES},
        "gasLimit": hex(30_000_000), "baseFeePerGas": hex(10**9), "timestamp": "0x1",
    }
    initialize_datadir(datadir, load_genesis_bytes(json.dumps(document).encode(),
                                                   available_engines()))
    return Node(NodeConfig(datadir=datadir, validator_key=KEYS[key], http_enabled=False))


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    made = [start_node(tmp_path / f"node{key}", key) for key in (0, 1, 2, OUTSIDER)]
    yield made
    for node in made:
        node._executor.shutdown()
        node.db.close()


def call(node: Node, method: str, *params: Any) -> Any:
    return asyncio.run(node.engine.rpc_methods()[method](*params))


def error(node: Node, method: str, *params: Any) -> RpcError:
    with pytest.raises(RpcError) as caught:
        call(node, method, *params)
    return caught.value


def commit_pool(nodes: list[Node]) -> None:
    """Every node's pooled transactions in one block, committed on every node."""
    async def run() -> None:
        txs = [raw for node in nodes for raw in
               (tx.encode() for tx in node.pool.executable(
                   base_fee=node.next_base_fee(), gas_limit=30_000_000, max_count=100))]
        builder = nodes[0]
        for raw in txs:
            if builder.pool.get(keccak(raw)) is None:
                builder.submit_raw_transaction(raw)
        executed = await builder.context.build_block(coinbase=b"\x01" * 20)
        data = executed.encode()
        for node in nodes:
            await node.context.commit_block(
                executed if node is builder else await node.context.validate_block(data))

    asyncio.run(run())


def test_votes_are_signed_submitted_tallied_and_pass_into_the_schedule(
        nodes: list[Node], caplog: pytest.LogCaptureFixture) -> None:
    a, b, c, outsider = nodes
    assert call(a, "pbft_getEpoch", "latest") == {
        "epoch": "0x0", "firstBlock": "0x1", "validators": VALIDATORS, "n": "0x4",
        "f": "0x1", "quorum": "0x3", "lastBlock": None, "scheduled": None}
    tx_hash = call(a, "pbft_proposeValidatorVote", NEWCOMER, True)
    assert a.pool.get(bytes.fromhex(tx_hash[2:])) is not None
    assert [r.levelname for r in caplog.records if "not connected to this node" in r.message
            ] == ["WARNING"]  # a warning, not a refusal: the subject is no peer here
    assert a.context.pending_nonce(KEYS[0].public_key.to_canonical_address()) == 1
    call(b, "pbft_proposeValidatorVote", NEWCOMER, True)
    commit_pool(nodes)  # block 1
    tally = call(a, "pbft_getPendingVotes", "latest")
    assert tally == {NEWCOMER: {"add": True, "voters": VALIDATORS[:2], "threshold": "0x3",
                                "expiresAt": hex(1 + 30_000)}}
    assert call(a, "pbft_getPendingVotes", "earliest") == {}
    call(a, "pbft_discardValidatorVote", NEWCOMER)
    commit_pool(nodes)  # block 2
    assert call(c, "pbft_getPendingVotes")[NEWCOMER]["voters"] == [VALIDATORS[1]]
    for node in (a, c):
        call(node, "pbft_proposeValidatorVote", NEWCOMER, True)
    commit_pool(nodes)  # block 3: passes, c = 4
    assert call(a, "pbft_getPendingVotes") == {}
    epoch = call(a, "pbft_getEpoch", "latest")
    assert (epoch["lastBlock"], epoch["scheduled"]["epoch"], epoch["scheduled"]["firstBlock"],
            epoch["scheduled"]["validators"], epoch["scheduled"]["quorum"],
            epoch["scheduled"]["passedAt"]) == ("0x4", "0x1", "0x5", [*VALIDATORS, NEWCOMER],
                                                "0x4", "0x3")
    assert call(a, "pbft_getValidatorsByBlockNumber", "pending") == VALIDATORS
    commit_pool(nodes)  # block 4: the handover; block 5 is epoch 1's
    assert call(a, "pbft_getValidatorsByBlockNumber", "pending") == [*VALIDATORS, NEWCOMER]
    assert call(a, "pbft_getValidatorsByBlockNumber", "0x4") == VALIDATORS
    genesis_hash = "0x" + a.blockchain.genesis_hash.hex()
    assert call(a, "pbft_getValidatorsByBlockHash", genesis_hash) == VALIDATORS
    assert call(a, "pbft_getValidatorsByBlockHash", "0x" + "ab" * 32) is None
    assert call(a, "pbft_getValidatorsByBlockNumber", "0x9") is None
    assert call(a, "pbft_getEpoch", "pending")["epoch"] == "0x1"
    assert call(outsider, "pbft_getEpoch", "0x4")["scheduled"]["firstBlock"] == "0x5"


@pytest.mark.parametrize(("who", "params", "code", "message"), [
    (0, ["0x1234", True], INVALID_PARAMS, "invalid argument: address: expected 20 bytes"),
    (0, ["nonsense", True], INVALID_PARAMS, "is not 0x-prefixed hex bytes"),
    (0, [NEWCOMER, "yes"], INVALID_PARAMS, "add must be true or false"),
    (0, [VALIDATORS[1], True], SERVER_ERROR, "is a validator already"),
    (0, [NEWCOMER, False], SERVER_ERROR, "is not a validator (or its removal"),
    (0, [VALIDATORS[1], False], SERVER_ERROR,
     "would leave 3 validators, fewer than min_validators 4"),
    (3, [NEWCOMER, True], SERVER_ERROR, f"this node ({ADDRESSES[OUTSIDER]}) is not a "
                                        "validator of epoch 0"),
], ids=["short-address", "not-hex", "add-not-bool", "add-member", "remove-non-member",
        "min-validators", "not-a-validator"])
def test_a_bad_vote_is_refused_in_one_line_and_nothing_is_sent(
        nodes: list[Node], who: int, params: list[Any], code: int, message: str) -> None:
    refused = error(nodes[who], "pbft_proposeValidatorVote", *params)
    assert (refused.code, message in refused.message, "\n" in refused.message) == (
        code, True, False), refused.message
    assert len(nodes[who].pool) == 0


def test_bad_reads_are_invalid_params(nodes: list[Node]) -> None:
    a = nodes[0]
    for method, params in (("pbft_getEpoch", ["next"]), ("pbft_getPendingVotes", [7]),
                           ("pbft_getValidatorsByBlockNumber", ["0xzz"]),
                           ("pbft_getValidatorsByBlockHash", ["0x12"]),
                           ("pbft_discardValidatorVote", ["0x12"])):
        assert error(a, method, *params).code == INVALID_PARAMS
    assert "has no live vote about" in error(a, "pbft_discardValidatorVote", NEWCOMER).message
