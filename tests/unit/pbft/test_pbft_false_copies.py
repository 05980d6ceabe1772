"""A byzantine NON-primary must not get honest backups to blame an honest primary: found by an
attacker's review of the refusal kinds (issue 28), each test failed then.

The primary's header hashes to the digest it signed, and `check_body_matches_header` says
whether a copy's body is that header's. A legacy transaction is an RLP list in the block; the
same bytes sent as an RLP string are the same trie leaf, so they passed the roots check, then
failed to decode: the refusal was INVALID, evidence against the honest primary and a view
change at once. A byzantine replica could deliver that copy by relaying the primary's signed
PRE-PREPARE before the primary's own frame, or, with no race at all, after it into the
future-view buffer, which kept the newest copy; two backups each block: no block ever
prepared. Now such a copy is a false copy (fetched again), and the buffer keeps the first.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import rlp

from chain.blockchain import Blockchain, block_hash_of, check_body_matches_header
from chain.errors import FalseBodyError
from pbft_engine.core import (
    BlockValidated,
    ChainHead,
    Refusal,
    Replica,
    ValidateBlock,
)
from pbft_engine.engine import PbftEngine
from pbft_engine.messages import KeyVerifier, PrePrepare
from storage import Database
from tests.unit.pbft.helpers import PARAMS, SIGNERS, from_peer
from tests.unit.test_blockchain import BUILDER, COINBASE, GWEI, SENDER, make_genesis, transfers


@pytest.fixture(scope="module")
def blocks() -> Iterator[tuple[Blockchain, bytes, bytes]]:
    """A backup's chain, the honest primary's block 1 (a legacy transfer and a dynamic-fee
    one), and the byzantine replica's forged copy of it."""
    legacy = BUILDER.decode(BUILDER.create_unsigned_transaction(
        nonce=0, gas_price=10 * GWEI, gas=21_000, to=b"\x22" * 20, value=1, data=b"",
    ).as_signed_transaction(SENDER, chain_id=1337).encode())
    with tempfile.TemporaryDirectory() as directory:
        dbs = [Database(Path(directory) / name) for name in ("primary", "backup")]
        primary, backup = (Blockchain(db, make_genesis()) for db in dbs)
        executed, left_out = primary.build_block([legacy, *transfers(1, start_nonce=1)],
                                                 timestamp=1_700_000_001, coinbase=COINBASE)
        assert not left_out
        genuine = executed.encode()
        header, txs, *rest = rlp.decode(genuine)
        assert isinstance(txs[0], list)  # the legacy transaction: an RLP list
        forged = rlp.encode([header, [rlp.encode(txs[0]), *txs[1:]], *rest])
        yield backup, genuine, forged
        for db in dbs:
            db.close()


def test_a_legacy_transaction_sent_as_a_string_is_a_false_copy(blocks: tuple) -> None:
    backup, genuine, forged = blocks
    assert forged != genuine and block_hash_of(forged) == block_hash_of(genuine)
    check_body_matches_header(genuine)
    assert backup.validate_encoded(genuine).number == 1
    # A copy that is not the proposer's block must be a FalseBodyError (FALSE_COPY).
    with pytest.raises(FalseBodyError):
        backup.validate_encoded(forged)


def adapter_refusal(backup: Blockchain, action: ValidateBlock) -> BlockValidated:
    """What PbftEngine._validate reports for `action` on the real chain."""
    stepped: list[object] = []

    async def validate_block(data: bytes, parent: object = None) -> object:
        return backup.validate_encoded(data, parent)

    engine = PbftEngine.__new__(PbftEngine)
    engine.context = SimpleNamespace(validate_block=validate_block, head=backup.head)
    engine._executed, engine.replica = {}, None
    engine.engine_params = PARAMS
    engine.log = SimpleNamespace(info=lambda *a: None, warning=lambda *a: None,
                                 exception=lambda *a: None)
    engine.metrics = SimpleNamespace(block_refused=lambda reason: None)
    engine._step = stepped.append  # type: ignore[method-assign]
    asyncio.run(engine._validate(action))
    (answer,) = stepped
    assert isinstance(answer, BlockValidated)
    return answer


def backup_replica(backup: Blockchain) -> Replica:
    replica = Replica(PARAMS, 2, SIGNERS[2], KeyVerifier(),
                      ChainHead(0, backup.genesis_hash), block_digest=block_hash_of)
    replica.start()
    return replica


def test_a_byzantine_relay_of_the_primarys_pre_prepare_replaces_the_honest_primary(
        blocks: tuple) -> None:
    """Replica 3 (byzantine) relays primary 0's signed PRE-PREPARE for block 1 with the
    forged body; it reaches backup 2 before the primary's own frame. Backup 2 must fetch
    another copy (FALSE_COPY) and stay in view 0; it blames primary 0 and leaves."""
    backup, genuine, forged = blocks
    digest = block_hash_of(genuine)
    replica = backup_replica(backup)
    pre_prepare = PrePrepare(0, 1, digest, 0)
    actions = replica.step(from_peer(pre_prepare, (forged,))).actions  # relayed by replica 3
    (validate,) = [a for a in actions if isinstance(a, ValidateBlock)]
    assert validate.block == forged
    replica.step(from_peer(pre_prepare, (genuine,)))  # the primary's own: "duplicate"
    answer = adapter_refusal(backup, validate)
    replica.step(answer)
    assert answer.refusal is not Refusal.INVALID, "an honest primary's block judged invalid"
    assert replica.view == 0 and replica.active and not replica.view_change_reasons
    assert not replica.evidence


def test_no_race_needed_a_buffered_pre_prepare_is_replaced_by_a_forged_relay(
        blocks: tuple) -> None:
    """The primary's PRE-PREPARE for a view this backup has not entered yet is buffered;
    the byzantine replica's relay of it, sent afterwards, replaces it (the buffer keeps the
    newest per (replica, type, seqNo)). When the backup enters the view it validates the
    forged copy."""
    backup, genuine, forged = blocks
    digest = block_hash_of(genuine)
    replica = backup_replica(backup)
    # View 1's primary (replica 1) proposes; the backup is still in view 0.
    pre_prepare = PrePrepare(1, 1, digest, 1)
    replica.step(from_peer(pre_prepare, (genuine,)))  # the primary's own, first
    replica.step(from_peer(pre_prepare, (forged,), relayed_by=3))  # the byzantine relay, after
    held = [w for w in replica.future.values() if w.signed.body == pre_prepare]
    assert held and held[0].blocks == (genuine,), "the genuine copy was replaced by a relay"


def test_no_race_needed_end_to_end_the_new_primary_is_blamed(blocks: tuple) -> None:
    """As above, then the NEW-VIEW for view 1 arrives: the backup replays the buffered
    PRE-PREPARE (the forged copy), the adapter says INVALID, and the backup leaves view 1
    at once, blaming its honest primary."""
    from pbft_engine.messages import NewView, ViewChange
    from tests.unit.pbft.helpers import AUTH

    backup, genuine, forged = blocks
    digest = block_hash_of(genuine)
    replica = backup_replica(backup)
    pre_prepare = PrePrepare(1, 1, digest, 1)
    replica.step(from_peer(pre_prepare, (genuine,)))
    replica.step(from_peer(pre_prepare, (forged,), relayed_by=3))
    votes = tuple(AUTH.sign(ViewChange(1, 0, (), (), (), r), SIGNERS[r]) for r in (0, 1, 3))
    actions = replica.step(from_peer(NewView(1, votes, (), 1))).actions
    assert replica.view == 1 and replica.active
    (validate,) = [a for a in actions if isinstance(a, ValidateBlock)]
    replica.step(adapter_refusal(backup, validate))
    assert replica.view == 1 and replica.active, (
        f"honest primary 1 blamed: view {replica.view}, {dict(replica.view_change_reasons)}")
