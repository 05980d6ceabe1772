"""An offline consistency check of a stopped validator's data directory.

The chain and the consensus stores must agree: blocks 1..head link by parent hash and each
has a commit certificate of Q valid COMMITs over its hash; every other stored certificate is
for a block above the head (certified, not yet executed); every stable checkpoint proof is Q
valid CHECKPOINTs for a block at or below the head, with its hash and state root; the low
watermark and the stable checkpoint are at or below the head; and the replica restores.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import rlp

from chain.blockchain import Blockchain, block_hash_of
from chain.node import load_datadir_genesis, open_database
from cli.keys import DEV_VALIDATOR_SEED, dev_private_key
from pbft_engine.core import ChainHead, EngineParams, Replica
from pbft_engine.core.records import StoreName, read_u64
from pbft_engine.messages import (
    Authenticator,
    Checkpoint,
    KeySigner,
    KeyVerifier,
    decode_commit_certificate,
    decode_signed_bytes,
    verify_commit_certificate,
)
from pbft_engine.record_store import LevelDBConsensusStore


@dataclass(frozen=True)
class DatadirState:
    head: int
    certified_above_head: int
    stable_checkpoint: int
    low_watermark: int


def check_datadir(datadir: Path, index: int) -> DatadirState:
    """Raise AssertionError naming the first disagreement; the state found otherwise."""
    with open_database(datadir) as db:
        genesis = load_datadir_genesis(db)
        blockchain = Blockchain(db, genesis)
        params = EngineParams.from_genesis(genesis.chain_id, genesis.engine_params)
        store = LevelDBConsensusStore(db)
        head = blockchain.head()
        hashes = _chain_hashes(blockchain, head.block_number)
        above = _check_certificates(store, params, hashes)
        _check_stable_checkpoints(store, params, blockchain, hashes)
        replica = Replica.restore(
            params, index, KeySigner(dev_private_key(index, DEV_VALIDATOR_SEED).to_bytes()),
            KeyVerifier(), ChainHead(head.block_number, head.hash), store,
            block_digest=block_hash_of)
        assert replica.low_watermark <= head.block_number, (
            f"low watermark {replica.low_watermark} above the head {head.block_number}")
        assert replica.stable_checkpoint <= head.block_number, (
            f"stable checkpoint {replica.stable_checkpoint} above the head")
        return DatadirState(head.block_number, above, replica.stable_checkpoint,
                            replica.low_watermark)


def _chain_hashes(blockchain: Blockchain, height: int) -> list[bytes]:
    """Canonical hashes 0..height, each block's parent the one before it."""
    hashes = []
    for number in range(height + 1):
        header = blockchain.header_by_number(number)
        assert header is not None, f"canonical block {number} missing below the head {height}"
        assert number == 0 or header.parent_hash == hashes[-1], f"block {number}: bad parent"
        hashes.append(header.hash)
    return hashes


def _check_certificates(
    store: LevelDBConsensusStore, params: EngineParams, hashes: list[bytes]
) -> int:
    head = len(hashes) - 1
    stored = {read_u64(k): v for k, v in store.items(StoreName.COMMIT_CERTIFICATES)}
    missing = [n for n in range(1, head + 1) if n not in stored]
    assert not missing, f"blocks without a commit certificate: {missing[:10]}"
    for number, certificate in stored.items():
        digest = hashes[number] if number <= head else (
            decode_commit_certificate(certificate)[0].body.digest)
        verify_commit_certificate(certificate, validators=params.validators, epoch=0,
                                  chain_id=params.chain_id, block_number=number,
                                  block_hash=digest)
    return len(stored) - head


def _check_stable_checkpoints(
    store: LevelDBConsensusStore, params: EngineParams, blockchain: Blockchain,
    hashes: list[bytes],
) -> None:
    auth = Authenticator(params.chain_id, params.validators, KeyVerifier())
    for key, value in store.items(StoreName.STABLE_CHECKPOINTS):
        seq_no = read_u64(key)
        assert seq_no < len(hashes), f"stable checkpoint {seq_no} above the head"
        proof = [decode_signed_bytes(c, Checkpoint) for c in rlp.decode(value)]
        block_hash, state_root = auth.verify_checkpoint_proof(seq_no, proof) or (b"", b"")
        header = blockchain.header_by_number(seq_no)
        assert header is not None
        assert (block_hash, state_root) == (hashes[seq_no], header.state_root), (
            f"stable checkpoint {seq_no} is for another block or state")
