"""The adapter's half of issue 28: whatever a peer's bytes make py-evm raise is a refusal
with whose fault it is, never a dead task; catch-up tries every peer, blames the one that
lied, and reports how far it got when it fails part-way."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import rlp
from eth_hash.auto import keccak

from chain.blockchain import Blockchain
from chain.errors import BlockValidationError, FalseBodyError, StaleParentError
from chain.ordered_trie import ordered_trie_root_and_nodes
from pbft_engine.core import BlockValidated, FetchCompleted, FetchFailed, Refusal, ValidateBlock
from pbft_engine.engine import PbftEngine
from pbft_engine.sync import BlockSync
from pbft_engine.sync_messages import (
    MAX_BLOCKS_PER_REQUEST,
    Blocks,
    GetBlocks,
    decode_sync,
    encode_sync,
)
from storage import Database
from tests.unit.pbft.helpers import fixed_feed
from tests.unit.pbft.test_pbft_catch_up import VALIDATORS, _block_with_roots, _certificate
from tests.unit.test_blockchain import COINBASE, make_genesis, transfers

TRANSACTIONS_ROOT = 4


@pytest.fixture(scope="module")
def chains() -> Iterator[tuple[Blockchain, list]]:
    """A validator's chain and the fields of a valid block of three transfers."""
    with tempfile.TemporaryDirectory() as directory:
        dbs = [Database(Path(directory) / name) for name in ("proposer", "validator")]
        proposer, validator = (Blockchain(db, make_genesis()) for db in dbs)
        executed, _ = proposer.build_block(transfers(3), timestamp=1_700_000_001,
                                           coinbase=COINBASE)
        yield validator, rlp.decode(executed.encode())
        for db in dbs:
            db.close()


def reencoded(fields: list, transaction: bytes, *, fix_root: bool) -> bytes:
    """The block with its second transaction replaced, its header's root fixed or not."""
    header, transactions, *rest = fields
    transactions = [*transactions[:1], transaction, *transactions[2:]]
    header = list(header)
    if fix_root:
        header[TRANSACTIONS_ROOT] = ordered_trie_root_and_nodes(transactions)[0]
    return rlp.encode([header, transactions, *rest])


def poisoned(fields: list, how: str) -> bytes:
    """The block's second transaction (a dynamic-fee transfer) made undecodable."""
    typed = fields[1][1]
    if how == "unknown type":
        return b"\x7f" + typed[1:]
    payload = rlp.decode(typed[1:])  # ..., access list, y-parity, r, s
    if how == "y-parity":
        payload[9] = b"\x05"
    else:
        payload[10] = b"\xff" * 32  # above the curve order
    return typed[:1] + rlp.encode(payload)


@pytest.mark.parametrize("how", ["unknown type", "y-parity", "impossible r"])
def test_a_poisoned_transaction_is_the_proposers_fault(chains: tuple, how: str) -> None:
    """py-evm raises UnrecognizedTransactionType or BadSignature for these, outside
    BlockValidationError (the validation task used to die with them, and the slot stayed
    "validating" for ever on every backup). Their bytes are under the header's roots, so the
    refusal is the proposer's fault."""
    validator, fields = chains
    data = reencoded(fields, poisoned(fields, how), fix_root=True)
    with pytest.raises(BlockValidationError) as refused:
        validator.validate_encoded(data)
    assert not isinstance(refused.value, FalseBodyError)


def test_a_body_that_is_not_the_headers_is_a_false_copy(chains: tuple) -> None:
    validator, fields = chains
    data = reencoded(fields, poisoned(fields, "unknown type"), fix_root=False)
    with pytest.raises(FalseBodyError):
        validator.validate_encoded(data)
    with pytest.raises(FalseBodyError):
        validator.validate_encoded(rlp.encode(fields[:1]))  # a header alone
    assert validator.validate_encoded(rlp.encode(fields)).number == 1  # the genuine block


def validating_adapter(error: Exception) -> tuple[PbftEngine, list[object], list[str]]:
    stepped: list[object] = []
    refused: list[str] = []

    async def validate_block(data: bytes, parent: object = None) -> object:
        raise error

    engine = PbftEngine.__new__(PbftEngine)
    engine.context = SimpleNamespace(validate_block=validate_block,
                                     head=lambda: SimpleNamespace(hash=b"head"))
    engine._executed, engine.replica = {}, None
    engine.engine_params = SimpleNamespace(validators=(b"\x01" * 20,))
    engine.feed = fixed_feed((b"\x01" * 20,))
    engine.log = SimpleNamespace(info=lambda *a: None, warning=lambda *a: None,
                                 exception=lambda *a: None)
    engine.metrics = SimpleNamespace(block_refused=refused.append)
    engine._step = stepped.append  # type: ignore[method-assign]
    return engine, stepped, refused


@pytest.mark.parametrize(("error", "refusal"), [
    (BlockValidationError("bad state root"), Refusal.INVALID),
    (FalseBodyError("body"), Refusal.FALSE_COPY),
    (StaleParentError("moved"), Refusal.UNAVAILABLE),
    (RuntimeError("a bug, or an executor that broke"), Refusal.UNAVAILABLE),
])
def test_every_validation_outcome_reaches_the_core(error: Exception, refusal: Refusal) -> None:
    engine, stepped, refused = validating_adapter(error)
    asyncio.run(engine._validate(ValidateBlock(1, b"d" * 32, b"block", ())))
    assert stepped == [BlockValidated(1, b"d" * 32, False, refusal)]
    assert refused == [refusal.value]


@dataclass
class ServingPeers:
    """The node as catch-up sees it: a chain of `head` blocks, three peers that answer
    GET_BLOCKS from their own ranges, and what each peer served."""

    served: dict[bytes, int]  # peer -> the highest block it can serve
    liar: bytes | None = None  # serves certified headers with false bodies
    chain_id: int = 7
    height: int = 0
    committed: list[int] = field(default_factory=list)
    sync: BlockSync | None = None

    def peers(self) -> frozenset[bytes]:
        return frozenset(self.served)

    def head(self) -> SimpleNamespace:
        return SimpleNamespace(block_number=self.height, hash=keccak(b"%d" % self.height),
                               state_root=b"root")

    def send_sync(self, peer: bytes, payload: bytes) -> None:
        request = decode_sync(payload)
        if not isinstance(request, GetBlocks):
            return
        last = min(self.served[peer], request.first + request.count - 1)
        blocks = tuple(self.block(n, false=peer == self.liar)
                       for n in range(request.first, last + 1))
        assert self.sync is not None
        asyncio.get_running_loop().call_soon(
            self.sync.on_message, peer, encode_sync(Blocks(request.request_id, blocks)))

    @staticmethod
    def block(number: int, *, false: bool) -> tuple[bytes, bytes]:
        header = [b"\x01" * 32, b"", b"", b"", b"", b"", b"", b"", number, 30_000_000]
        body = [b"a false transaction"] if false else []
        block_hash = keccak(rlp.encode(header))
        return rlp.encode([header, body, []]), _certificate(number, block_hash, range(3))

    async def validate_block(self, data: bytes, parent: object = None) -> SimpleNamespace:
        header, body = rlp.decode(data)[:2]
        if body:
            raise BlockValidationError("invalid block 1: UnrecognizedTransactionType")
        return SimpleNamespace(hash=keccak(rlp.encode(header)), tx_hashes=(),
                               number=int.from_bytes(header[8], "big"))

    async def commit_blocks(self, blocks: list) -> None:
        self.committed += [executed.number for executed, _ in blocks]
        self.height = self.committed[-1]


def catch_up(peers: ServingPeers, target: int) -> tuple[object, list[tuple[bytes, str]]]:
    faults: list[tuple[bytes, str]] = []
    sync = BlockSync(peers, SimpleNamespace(write=lambda batch, ops: None), fixed_feed(VALIDATORS),  # type: ignore[arg-type]
                     deliver=lambda event: None, replica_status=lambda: None,  # type: ignore[arg-type,return-value]
                     held_block=lambda n, d: None, chain_lock=asyncio.Lock(),
                     poll_interval=1.0, on_peer_fault=lambda p, k: faults.append((p, k)))
    peers.sync = sync
    outcome = asyncio.run(sync.fetch(target, keccak(b"target")))
    return outcome, faults


def test_a_lying_catch_up_peer_is_blamed_and_the_others_serve() -> None:
    """The first peer in turn serves certified headers whose bodies make execution raise:
    it is blamed, and the next peer serves the range (a raise used to abort the whole
    fetch, and the fixed order made every retry fail alike)."""
    liar = b"a" * 20
    peers = ServingPeers({liar: 10, b"b" * 20: 10, b"c" * 20: 10}, liar=liar)
    outcome, faults = catch_up(peers, 5)
    assert isinstance(outcome, FetchCompleted) and outcome.seq_no == 5
    assert faults == [(liar, "invalid_block")] and peers.committed == [1, 2, 3, 4, 5]


def test_a_fetch_that_fails_part_way_says_how_far_it_got() -> None:
    """Every peer serves the first range and none the second: the first range is
    committed, and the failure carries the head it reached."""
    first_range = MAX_BLOCKS_PER_REQUEST
    peers = ServingPeers({b"a" * 20: first_range, b"b" * 20: first_range})
    outcome, faults = catch_up(peers, first_range + 5)
    assert isinstance(outcome, FetchFailed) and outcome.target_seq_no == first_range + 5
    assert outcome.reached is not None and outcome.reached.seq_no == first_range
    assert faults == []


@dataclass
class CommittingMeanwhile(ServingPeers):
    """Blocks whose headers commit to their (empty) bodies; once the first range is
    imported, the replica has committed every block up to `meanwhile` through consensus."""

    meanwhile: int = 0

    @staticmethod
    def block(number: int, *, false: bool) -> tuple[bytes, bytes]:
        return _block_with_roots(number, false_body=false)

    async def validate_block(self, data: bytes, parent: object = None) -> SimpleNamespace:
        await asyncio.sleep(0)  # executed off the loop: the answers in flight arrive meanwhile
        return await super().validate_block(data, parent)

    async def commit_blocks(self, blocks: list) -> None:
        await super().commit_blocks(blocks)
        if self.height == MAX_BLOCKS_PER_REQUEST:
            self.height = self.meanwhile


def test_a_prefetched_range_the_fetch_no_longer_needs_is_judged_all_the_same() -> None:
    """The next range is asked for while one is imported (of the peer whose turn it is: the
    liar here, which serves true headers over false bodies); the replica commits it through
    consensus meanwhile, so the fetch ends without importing it. The answer, already here,
    is judged all the same (certificates, bodies against the certified roots): it used to
    be dropped unread, and the liar went unrecorded. The honest answer costs no request."""
    first_range, target = MAX_BLOCKS_PER_REQUEST, MAX_BLOCKS_PER_REQUEST + 8
    liar = b"b" * 20  # the turn of the range from 33 (`BlockSync._peers_for`)
    peers = CommittingMeanwhile({b"a" * 20: target, liar: target, b"c" * 20: target},
                                liar=liar, meanwhile=target)
    outcome, faults = catch_up(peers, target)
    assert isinstance(outcome, FetchCompleted) and outcome.seq_no == target
    assert peers.committed == list(range(1, first_range + 1))
    assert faults == [(liar, "false_copy")]
