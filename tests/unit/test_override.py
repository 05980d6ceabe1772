"""Overrides of genesis (`config.pbft.transitions`, DESIGN.md section 10): from a block on, a
set decides without a vote, for when more than f validators are gone for good. Here two of
four genesis validators are gone after block 36 (not a checkpoint: the chain halted there);
the survivors restart with an override from block 37 and go on by themselves."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from eth_hash.auto import keccak

from pbft_engine.core import (
    BlockBuilt,
    BlockReceived,
    Broadcast,
    BuildBlock,
    ChainHead,
    CommitBlock,
    EngineParams,
    FetchBlock,
    MessageReceived,
    Replica,
)
from pbft_engine.core.epochs import Epoch, EpochSchedule, Membership
from pbft_engine.core.view_change import verify_view_change
from pbft_engine.errors import ConfigError, MessageError
from pbft_engine.messages import (
    Commit,
    KeyVerifier,
    NewView,
    Prepare,
    PrePrepare,
    ViewChange,
    WireMessage,
)
from pbft_engine.overrides import check_overrides
from pbft_engine.rpc_records import ConsensusRecords
from tests.unit.pbft.helpers import GENESIS, PARAMS
from tests.unit.pbft.test_pbft_epochs import ADDED, KEYS, POOL, V0, signed
from tests.unit.test_replica_handover import Driven, block, digest

T = 37  # the override's first block; 36, the last block the old set decided, is no checkpoint
SURVIVORS = V0[:2]  # n = 2: f = 0, Q = 2
OVERRIDE = dataclasses.replace(PARAMS, transitions=((T, SURVIVORS),))


def _hex(addresses: tuple[bytes, ...]) -> list[str]:
    return ["0x" + a.hex() for a in addresses]


def test_the_genesis_file_names_blocks_and_sets() -> None:
    config: dict[str, Any] = {"validators": _hex(V0),
                              "transitions": [{"block": T, "validators": _hex(SURVIVORS)}]}
    assert EngineParams.from_genesis(1, config).transitions == ((T, SURVIVORS),)
    for transitions, message in (
            ([{"block": 1, "validators": _hex(SURVIVORS)}], "2 or above"),
            ([{"block": 9, "validators": _hex(V0)}, {"block": 5, "validators": _hex(V0)}],
             "increasing"),
            ([{"block": 9, "validators": []}], "at least one"),
            ([{"block": 9, "validators": _hex((V0[0], V0[0]))}], "distinct"),
            ([{"block": 9}], "invalid config.pbft")):
        with pytest.raises(ConfigError, match=message):
            EngineParams.from_genesis(1, {**config, "transitions": transitions})


def test_the_override_decides_from_its_block_and_votes_around_it_keep_their_order() -> None:
    schedule = EpochSchedule.genesis(OVERRIDE)
    assert schedule.epoch_at(T - 1).number == 0
    assert schedule.epoch_at(T) == Epoch(1, T, SURVIVORS, override=True)
    assert [schedule.stable_by_genesis(n) for n in (0, 30, T - 1, T)] == [True, False, True,
                                                                          False]
    # a change passing in 20 takes effect after 30, before the override (renumbered)
    voted = schedule.schedule(ADDED, passed_at=20)
    assert [(e.number, e.first, e.override) for e in voted.epochs] == [
        (0, 1, False), (1, 31, False), (2, T, True)]
    # one passing in 30 would take effect after 40: the override took over before, void
    assert schedule.schedule(ADDED, passed_at=30) is schedule
    # after the override, a change is to its set
    assert schedule.after_changes(T) == SURVIVORS
    later = schedule.schedule((*SURVIVORS, POOL[4]), passed_at=40)
    assert later.epochs[-1].first == 51 and later.epochs[-1].number == 2


def survivor(index: int) -> Driven:
    """Genesis validator `index`, restarted at the head 36 with the override in genesis."""
    return Driven(Replica(OVERRIDE, None, KEYS[V0[index]], KeyVerifier(),
                          ChainHead(T - 1, GENESIS), block_digest=keccak,
                          schedule=EpochSchedule.genesis(OVERRIDE)))


def test_the_survivors_stand_on_the_block_before_it_and_commit_the_next_by_themselves() -> None:
    """Each survivor stands on 36 (stable by the genesis file), asks for view 1 of the new set
    (its first NEW-VIEW carries what the old set prepared above 36: nothing here), and the
    new primary, V0[1], proposes block 37, which the two commit."""
    survivors = [survivor(0), survivor(1)]
    for driven in survivors:
        replica = driven.replica
        assert replica.epochs.current.number == 1 and replica.me == V0.index(replica.address)
        assert (replica.stable_checkpoint, replica.low_watermark) == (T - 1, T - 1)
        [body] = driven.sent(ViewChange)
        assert (body.view, body.stable_seq_no, body.epoch, body.checkpoint_proof) == (
            1, T - 1, 1, ())
    backup, primary = survivors
    primary.step(MessageReceived(_broadcast(backup, ViewChange)))
    backup.step(MessageReceived(_broadcast(primary, NewView)))
    # the primary owes the first block of the new set: an empty one if need be
    assert any(isinstance(a, BuildBlock) and a.seq_no == T for a in primary.actions)
    primary.step(BlockBuilt(T, digest(T), block(T), ()))
    backup.step(MessageReceived(_broadcast(primary, PrePrepare)))
    assert Prepare(1, T, digest(T), 0, epoch=1) in backup.sent(Prepare)
    primary.step(MessageReceived(_broadcast(backup, Prepare)))
    backup.step(MessageReceived(_broadcast(primary, Commit)))
    assert any(isinstance(a, CommitBlock) and a.seq_no == T for a in backup.actions)


def test_the_old_set_s_new_view_for_a_later_view_does_not_move_a_survivor() -> None:
    """An old-epoch NEW-VIEW for a view above a replica's own is taken after a handover by
    vote (`handover.takes_old_new_view`: the others moved on while it crossed c by a fetch),
    never across an override: the old set's gone validators may have lost their keys, and
    three of its four keys would send every survivor to a view no one else is in."""
    driven = survivor(0)
    view_changes = tuple(signed(ViewChange(5, 0, (), (), (), i), V0) for i in (0, 2, 3))
    driven.step(MessageReceived(WireMessage(signed(NewView(5, view_changes, (), 1),
                                                   V0)).encode()))
    assert driven.replica.dropped["stale new-view"] == 1
    assert (driven.replica.view, driven.replica.active) == (1, False)


def test_a_view_change_from_the_block_before_it_needs_no_checkpoint_proof() -> None:
    """What makes the new set able to change view: its VIEW-CHANGEs carry the stable
    checkpoint 36 with no proof, and only where the genesis file says so."""
    with_override = Membership(OVERRIDE.chain_id, EpochSchedule.genesis(OVERRIDE),
                               KeyVerifier())
    view_change = signed(ViewChange(1, T - 1, (), (), (), 1), SURVIVORS, epoch=1)
    verify_view_change(with_override, view_change)
    without = Membership(PARAMS.chain_id, EpochSchedule.genesis(PARAMS), KeyVerifier())
    with pytest.raises(MessageError):
        verify_view_change(without, signed(ViewChange(1, T - 1, (), (), (), 1), V0))


def test_a_survivor_caught_in_a_view_change_asks_for_the_next_view_in_the_new_epoch() -> None:
    """The chain halted at 36 while validator 0 was changing to view 1 (its VIEW-CHANGE is
    the old epoch's: stable checkpoint 0). Restarted from its store with the override, it asks
    for view 2 with the checkpoint 36 and no proof; the other survivor counts it (f + 1 = 1),
    and the two complete view 2 (N - f = 2), whose primary is validator 0."""
    before = Driven(Replica(PARAMS, 0, KEYS[V0[0]], KeyVerifier(), ChainHead(T - 1, GENESIS),
                            block_digest=keccak))
    for gone in (2, 3):  # the last it heard: f + 1 asking for view 1, so it joined
        before.receive(ViewChange(1, 0, (), (), (), gone), V0)
    assert [(b.view, b.epoch) for b in before.sent(ViewChange)] == [(1, 0)]
    first = Driven(Replica.restore(
        OVERRIDE, None, KEYS[V0[0]], KeyVerifier(), ChainHead(T - 1, GENESIS), before.store,
        block_digest=keccak, schedule=EpochSchedule.genesis(OVERRIDE),
        signing_bound=before.replica.signing_bound))
    [body] = first.sent(ViewChange)
    assert (body.view, body.stable_seq_no, body.epoch, body.checkpoint_proof) == (
        2, T - 1, 1, ())
    second = survivor(1)
    second.step(MessageReceived(_broadcast(first, ViewChange)))
    assert second.replica.view == 2
    first.step(MessageReceived(_broadcast(second, ViewChange)))
    assert (first.replica.view, first.replica.active) == (2, True)
    assert NewView in {type(WireMessage.decode(a.data).signed.body)
                       for a in first.actions if isinstance(a, Broadcast)}


def _broadcast(driven: Driven, kind: type) -> bytes:
    """The last message of `kind` that `driven` broadcast, as sent."""
    return next(a.data for a in reversed(driven.actions) if isinstance(a, Broadcast)
                and isinstance(WireMessage.decode(a.data).signed.body, kind))


def test_a_node_that_committed_past_the_override_s_block_refuses_to_start() -> None:
    schedule = EpochSchedule.genesis(OVERRIDE)
    old_certificate = b"\xc0"  # whatever the old set signed: not the override set's
    lines = check_overrides(schedule, T - 1, 1, lambda n: None)
    assert lines and f"from block {T} on" in lines[0]
    with pytest.raises(ConfigError, match="does not fit the chain held here"):
        check_overrides(schedule, T + 1, 1, lambda n: old_certificate)


def test_a_block_the_old_set_prepared_above_it_is_proposed_again_by_the_new_set() -> None:
    """Before the halt, the old primary V0[0] proposed block 37 (X) and V0[2], V0[3] (now
    gone) prepared it with V0[1]: it may have been committed by the gone ones (their COMMITs
    never reached the survivors). Restarted with the override, the survivors carry V0[1]'s
    prepared certificate of the old epoch into the new set's first view (PBFT carries
    prepared requests across a view change), and commit X at 37, not a block of their own."""
    x = b"the old set's block 37"
    holder = Driven(Replica(PARAMS, 1, KEYS[V0[1]], KeyVerifier(), ChainHead(T - 1, GENESIS),
                            block_digest=keccak))
    holder.receive(PrePrepare(0, T, keccak(x), 0), V0, (x,))
    for gone in (2, 3):
        holder.receive(Prepare(0, T, keccak(x), gone), V0)
    assert Commit(0, T, keccak(x), 1) in holder.sent(Commit)  # prepared here
    other = Driven(Replica(PARAMS, 0, KEYS[V0[0]], KeyVerifier(), ChainHead(T - 1, GENESIS),
                           block_digest=keccak))
    survivors = [Driven(Replica.restore(
        OVERRIDE, None, KEYS[V0[i]], KeyVerifier(), ChainHead(T - 1, GENESIS), before.store,
        block_digest=keccak, schedule=EpochSchedule.genesis(OVERRIDE),
        signing_bound=before.replica.signing_bound)) for i, before in ((0, other), (1, holder))]
    for driven in survivors:  # each asks for view 1 of the new set at once
        [body] = driven.sent(ViewChange)
        assert (body.view, body.stable_seq_no, body.epoch) == (1, T - 1, 1)
    [carried] = survivors[1].sent(ViewChange)[0].pset
    assert (carried.seq_no, carried.digest, carried.pre_prepare.body.epoch) == (T, keccak(x), 0)
    primary = survivors[OVERRIDE_PRIMARY_OF_VIEW_1]
    backup = survivors[1 - OVERRIDE_PRIMARY_OF_VIEW_1]
    primary.step(MessageReceived(_broadcast(backup, ViewChange)))
    new_view = _broadcast(primary, NewView)
    assert [(p.body.seq_no, p.body.digest) for p in
            WireMessage.decode(new_view).signed.body.pre_prepares] == [(T, keccak(x))]
    backup.step(MessageReceived(new_view))
    assert FetchBlock(T, keccak(x)) in backup.actions  # it never had the old block: asks
    backup.step(BlockReceived(T, keccak(x), x))
    primary.step(MessageReceived(_broadcast(backup, Prepare)))
    backup.step(MessageReceived(_broadcast(primary, Commit)))
    primary.step(MessageReceived(_broadcast(backup, Commit)))
    for driven in survivors:
        assert any(isinstance(a, CommitBlock) and (a.seq_no, a.digest) == (T, keccak(x))
                   for a in driven.actions)


OVERRIDE_PRIMARY_OF_VIEW_1 = 1  # V_1[1 mod 2]


def test_the_block_before_it_is_no_checkpoint_record_for_the_rpc() -> None:
    """Stable by the genesis file, it has no CHECKPOINT to show: pbft_getCheckpoints (what
    the audit's export reads) lists the signed ones only (it failed on the empty proof,
    found by exporting an overridden chain)."""
    driven = survivor(0)
    assert driven.replica.stable_checkpoint == T - 1
    records = ConsensusRecords(driven.store, lambda: EpochSchedule.genesis(OVERRIDE))
    assert records.checkpoints(0, T + 10) == [] and records.checkpoint(T - 1) is None
