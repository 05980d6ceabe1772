"""A small real chain for the ETL tests, served as a node would serve it.

Blocks are built and executed by py-evm through `chain.blockchain` (legacy, access-list and
dynamic-fee transactions, a contract deployment, contract logs, a reverted call, empty
blocks) and formatted by the node's own JSON-RPC formatters. Four generated validator keys
sign what PBFT would keep: a commit certificate per block (view 0, then view 1 after a view
change), stable checkpoints every K blocks, and the VIEW-CHANGE / NEW-VIEW of view 1."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rlp
from eth._utils.address import generate_contract_address
from eth.vm.forks import PragueVM
from eth_abi import encode as abi_encode
from eth_hash.auto import keccak
from eth_keys import keys

from chain.blockchain import Blockchain
from chain.genesis import Genesis, GenesisAccount
from chain.rpc.served import ServedBlocks
from pbft_engine.messages import (
    Authenticator,
    Checkpoint,
    Commit,
    KeySigner,
    KeyVerifier,
    NewView,
    Signed,
    ViewChange,
    encode_commit_certificate,
)
from pbft_engine.quorum import quorum
from spark_etl.epochs import Epoch, epoch_row
from spark_etl.rows import BlockPayload
from tests.integration.conftest import load_contract

CHAIN_ID = 1337
GWEI = 10**9
CHECKPOINT_INTERVAL = 5
VIEW_CHANGE_AFTER = 6  # blocks 1..6 are certified in view 0, the rest in view 1
SENDER = keys.PrivateKey(b"\x07" * 32)
RECIPIENT = b"\x22" * 20
BUILDER = PragueVM.get_transaction_builder()
VALIDATOR_KEYS = tuple(bytes([i + 1]) * 32 for i in range(4))
OUTSIDER_KEY = b"\x66" * 32


def hexed(data: bytes) -> str:
    return "0x" + data.hex()


def call_data(signature: str, types: list[str], values: list[Any]) -> bytes:
    return keccak(signature.encode())[:4] + abi_encode(types, values)


class Transactions:
    """Signed transactions from SENDER with consecutive nonces, decoded as the pool does."""

    def __init__(self) -> None:
        self.nonce = 0

    def _signed(self, unsigned: Any) -> Any:
        self.nonce += 1
        signed = unsigned.as_signed_transaction(SENDER, chain_id=CHAIN_ID)
        return BUILDER.decode(signed.encode())

    def legacy(self, to: bytes, data: bytes = b"", value: int = 0, gas: int = 21_000) -> Any:
        return self._signed(
            BUILDER.create_unsigned_transaction(
                nonce=self.nonce, gas_price=5 * GWEI, gas=gas, to=to, value=value, data=data
            )
        )

    def access_list(self, to: bytes) -> Any:
        return self._signed(
            BUILDER.new_unsigned_access_list_transaction(
                chain_id=CHAIN_ID, nonce=self.nonce, gas_price=5 * GWEI, gas=30_000, to=to,
                value=3, data=b"", access_list=((to, (1, 2)),),
            )
        )

    def dynamic(self, to: bytes, data: bytes = b"", value: int = 0, gas: int = 21_000) -> Any:
        return self._signed(
            BUILDER.new_unsigned_dynamic_fee_transaction(
                chain_id=CHAIN_ID, nonce=self.nonce, max_priority_fee_per_gas=GWEI,
                max_fee_per_gas=10 * GWEI, gas=gas, to=to, value=value, data=data,
                access_list=(),
            )
        )


def block_batches() -> list[list[Any]]:
    """The transactions of blocks 1..10 (some empty)."""
    txs = Transactions()
    deploy = txs.legacy(b"", bytes.fromhex(load_contract("Events")["bytecode"][2:]),
                        gas=1_000_000)
    contract = generate_contract_address(SENDER.public_key.to_canonical_address(), 0)
    store = call_data("store(uint256,uint256)", ["uint256", "uint256"], [7, 70])
    note = call_data("note(string)", ["string"], ["hello"])
    fail = call_data("fail(string)", ["string"], ["no"])
    return [
        [deploy],
        [txs.dynamic(contract, store, gas=200_000), txs.dynamic(RECIPIENT, value=10**18)],
        [],
        [txs.legacy(contract, fail, gas=100_000), txs.dynamic(contract, note, gas=100_000),
         txs.access_list(RECIPIENT)],
        [txs.legacy(RECIPIENT, value=5)],
        [],
        [txs.dynamic(contract, store, gas=200_000)],
        [txs.dynamic(RECIPIENT, value=1), txs.dynamic(RECIPIENT, value=2)],
        [],
        [txs.legacy(RECIPIENT, value=9)],
    ]


@dataclass
class Validators:
    signers: list[KeySigner] = field(
        default_factory=lambda: [KeySigner(k) for k in VALIDATOR_KEYS]
    )
    epoch: int = 0  # the epoch these sign in: every message names it

    @property
    def addresses(self) -> list[str]:
        return [hexed(s.address) for s in self.signers]

    @property
    def auth(self) -> Authenticator:
        return Authenticator(CHAIN_ID, tuple(s.address for s in self.signers), KeyVerifier(),
                             self.epoch)

    def sign(self, body: Any, signer: KeySigner | None = None) -> Signed[Any]:
        return self.auth.sign(dataclasses.replace(body, epoch=self.epoch),
                              signer or self.signers[body.replica])


def certificate_json(validators: Validators, commits: list[Signed[Commit]]) -> dict[str, Any]:
    """pbft_getCommitCertificate's answer for these commits."""
    first = commits[0].body
    return {
        "blockNumber": hex(first.seq_no),
        "blockHash": hexed(first.digest),
        "view": hex(first.view),
        "signers": [validators.addresses[c.body.replica] for c in commits],
        "certificate": hexed(encode_commit_certificate(commits)),
    }


def commits_for(validators: Validators, number: int, digest: bytes) -> list[Signed[Commit]]:
    view = 0 if number <= VIEW_CHANGE_AFTER else 1
    replicas: Iterable[int] = (
        (0, 1, 2, 3) if number % 3 == 0 else (0, 1, 2) if view == 0 else (1, 2, 3))
    if len(validators.signers) != 4:  # a set voted in: every member
        replicas = range(len(validators.signers))
    return [validators.sign(Commit(view, number, digest, r)) for r in replicas]


def checkpoint_proof(validators: Validators, number: int, block_hash: bytes,
                     state_root: bytes) -> list[Signed[Checkpoint]]:
    return [validators.sign(Checkpoint(number, block_hash, state_root, r))
            for r in range(quorum(len(validators.signers)))]


def checkpoint_json(number: int, block_hash: bytes, state_root: bytes,
                    proof: list[Signed[Checkpoint]]) -> dict[str, Any]:
    return {
        "seqNo": hex(number),
        "blockHash": hexed(block_hash),
        "stateRoot": hexed(state_root),
        "stable": True,
        "proof": [hexed(p.encode()) for p in proof],
    }


def view_change_json(validators: Validators, proof: list[Signed[Checkpoint]]) -> dict[str, Any]:
    """The installation of view 1: VIEW-CHANGEs of replicas 1..3 and replica 1's NEW-VIEW."""
    votes = [
        validators.sign(ViewChange(1, CHECKPOINT_INTERVAL, tuple(proof), (), (), r))
        for r in (1, 2, 3)
    ]
    new_view = validators.sign(NewView(1, tuple(votes), (), 1))
    return {
        "view": hex(1),
        "primary": validators.addresses[1],
        "newView": hexed(new_view.encode()),
        "viewChanges": [
            {"signer": validators.addresses[v.body.replica], "view": hex(1),
             "stableSeqNo": hex(CHECKPOINT_INTERVAL), "message": hexed(v.encode())}
            for v in votes
        ],
    }


Schedule = list[tuple[int, Validators]]  # (first block, set) of each epoch, genesis first


@dataclass
class ServedChain:
    """What a node of this chain serves: per block, and its consensus records. `validators`
    is the genesis set; `schedule` every epoch's (set changes voted in)."""

    validators: Validators
    payloads: list[BlockPayload]
    view_changes: list[dict[str, Any]]
    evidence: list[dict[str, Any]] = field(default_factory=list)
    schedule: Schedule = field(default_factory=list)

    def set_at(self, number: int) -> Validators:
        return [v for first, v in self.schedule or [(1, self.validators)]
                if first <= max(number, 1)][-1]

    def epoch_of(self, number: int) -> dict[str, Any]:
        """pbft_getEpoch's answer for block `number` (the fields the ETL reads)."""
        schedule = self.schedule or [(1, self.validators)]
        index = max(i for i, (first, _) in enumerate(schedule) if first <= max(number, 1))
        later = schedule[index + 1:]
        return {"epoch": hex(index), "firstBlock": hex(schedule[index][0]),
                "validators": schedule[index][1].addresses,
                "lastBlock": hex(later[0][0] - 1) if later else None}

    @property
    def head(self) -> int:
        return len(self.payloads) - 1

    @property
    def genesis_hash(self) -> str:
        return self.payloads[0].block["hash"]


def epoch_rows(chain: ServedChain, node: str) -> list[tuple[Any, ...]]:
    """The epochs table's rows of `node` of a chain with a schedule (none without one: a
    node built before set changes does not serve pbft_getEpoch)."""
    return [epoch_row(node, Epoch(i, first, tuple(v.addresses),
                                  later[0][0] - 1 if (later := chain.schedule[i + 1:]) else None))
            for i, (first, v) in enumerate(chain.schedule)]


def commitment(validators: Validators) -> bytes:
    """What block n's extraData holds for the set that decides n+1 (pbft_engine.epoch_feed)."""
    return keccak(rlp.encode(sorted(s.address for s in validators.signers)))


def build_chain(directory: Path, schedule: Schedule | None = None,
                empty_blocks: int = 0) -> ServedChain:
    """The chain of `block_batches` and `empty_blocks` more, certified by the genesis set or,
    with a `schedule`, by each height's set, every block's extraData committing to the next
    height's (without one: 0x, a chain built before the commitment)."""
    from storage import Database

    validators = schedule[0][1] if schedule else Validators()
    served_chain = ServedChain(validators, [], [], schedule=schedule or [])
    genesis = Genesis(
        chain_id=CHAIN_ID,
        engine="dev",
        engine_params={},
        alloc={SENDER.public_key.to_canonical_address(): GenesisAccount(balance=10**24)},
        timestamp=1_700_000_000,
    )
    with Database(directory / "chaindata") as db:
        chain = Blockchain(db, genesis)
        for number, batch in enumerate(block_batches() + [[]] * empty_blocks, start=1):
            proposer = validators.signers[(number - 1) % 4].address
            extra = commitment(served_chain.set_at(number + 1)) if schedule else b""
            executed, left_out = chain.build_block(
                batch, timestamp=1_700_000_000 + number, coinbase=proposer, extra_data=extra
            )
            assert not left_out
            chain.commit(executed)
        blocks = [chain.block_by_header(chain.header_by_number(n))
                  for n in range(chain.head().block_number + 1)]
        served = ServedBlocks(chain)
        served_blocks = [served.block(b.header) for b in blocks]
    payloads, view_changes = served_chain.payloads, served_chain.view_changes
    for block, served_block in zip(blocks, served_blocks, strict=True):
        number, header = block.number, block.header
        signers = served_chain.set_at(number)
        certificate = (
            certificate_json(signers, commits_for(signers, number, block.hash))
            if number else None
        )
        checkpoints = []
        if number and number % CHECKPOINT_INTERVAL == 0:
            proof = checkpoint_proof(signers, number, block.hash, header.state_root)
            checkpoints.append(checkpoint_json(number, block.hash, header.state_root, proof))
            if number == CHECKPOINT_INTERVAL:
                view_changes.append(view_change_json(validators, proof))
        payloads.append(
            BlockPayload(
                block=served_block.json(True),
                receipts=served_block.receipts,
                raw_block=hexed(rlp.encode(block)),
                certificate=certificate,
                checkpoints=checkpoints,
            )
        )
    return served_chain
