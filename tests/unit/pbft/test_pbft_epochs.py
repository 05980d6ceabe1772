"""The epoch schedule (core.epochs, DESIGN.md section 10): which set decides which height, the
handover checkpoint, and that a message or certificate counts only with its own height's set
and quorum (the anchors' recurring bug: research/membership.md, section 1 item 3)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from eth_hash.auto import keccak
from hypothesis import given, settings
from hypothesis import strategies as st

from pbft_engine.core import ChainHead, FetchCommitted, MessageReceived, PeerCommitted, Replica
from pbft_engine.core.epochs import (
    Epoch,
    EpochSchedule,
    Membership,
    handover_checkpoint,
    message_height,
)
from pbft_engine.core.log import CheckpointTracker, StoreWriter
from pbft_engine.core.view_change import verify_new_view, verify_view_change
from pbft_engine.errors import (
    CertificateError,
    ConfigError,
    EpochMismatch,
    MessageError,
    SignatureError,
)
from pbft_engine.messages import (
    Authenticator,
    Checkpoint,
    Commit,
    KeySigner,
    KeyVerifier,
    NewView,
    Prepare,
    PrePrepare,
    Signed,
    ViewChange,
    WireMessage,
    encode_commit_certificate,
    signing_hash,
)
from pbft_engine.quorum import max_faulty, quorum
from tests.unit.pbft.helpers import GENESIS, PARAMS, SIGNERS

K, W = PARAMS.checkpoint_interval, PARAMS.max_in_flight  # 10, 2
KEYS = {s.address: s for s in SIGNERS} | {
    s.address: s for s in (KeySigner(keccak(b"newcomer %d" % i)) for i in range(8))}
POOL = tuple(KEYS)  # 12 addresses: the four genesis validators first
V0 = PARAMS.validators
ADDED = (*V0, POOL[4])  # 4 -> 5
REMOVED = V0[1:]  # 4 -> 3: every member's index moves down by one
DIGEST = keccak(b"block")
MEMBERS = Membership(PARAMS.chain_id, EpochSchedule.genesis(PARAMS), KeyVerifier())


def signed(body: Any, epoch_set: tuple[bytes, ...], epoch: int | None = None) -> Signed[Any]:
    """`body` signed by the validator its replica index names in `epoch_set`, naming `epoch`
    (by default: 0 for the genesis set, 1 for any other)."""
    number = (0 if epoch_set == V0 else 1) if epoch is None else epoch
    auth = Authenticator(PARAMS.chain_id, epoch_set, KeyVerifier(), number)
    return auth.sign(dataclasses.replace(body, epoch=number), KEYS[epoch_set[body.replica]])


def scheduled(validators: tuple[bytes, ...], passed_at: int = 8) -> EpochSchedule:
    return EpochSchedule.genesis(PARAMS).schedule(validators, passed_at=passed_at)


# --- the schedule's arithmetic ----------------------------------------------------------------


def test_the_genesis_set_decides_every_height_of_a_fixed_chain() -> None:
    schedule = EpochSchedule.genesis(PARAMS)
    for height in (0, 1, 9, 10, 11, 10**9):
        assert schedule.epoch_at(height) == schedule.current
        assert schedule.set_at(height) == V0
        assert (schedule.f_at(height), schedule.quorum_at(height)) == (1, 3)
    assert [schedule.primary(v, 5) for v in range(6)] == [0, 1, 2, 3, 0, 1]
    assert schedule.handover is None and schedule.high_watermark_cap() is None
    assert schedule.install(10**6) is schedule


def test_adding_a_fifth_validator_keeps_f_and_raises_the_quorum() -> None:
    """The arithmetic that surprises operators (besu#8425): 4 -> 5 keeps f = 1 and raises Q
    from 3 to 4, so the new member must be up before the handover completes."""
    schedule = scheduled(ADDED, passed_at=8)
    assert schedule.handover == 10 == schedule.high_watermark_cap()
    assert [schedule.quorum_at(n) for n in (9, 10, 11)] == [3, 3, 4]
    assert [schedule.f_at(n) for n in (9, 10, 11)] == [1, 1, 1]
    assert schedule.set_at(10) == V0 and schedule.set_at(11) == ADDED
    assert schedule.current.number == 0  # scheduled, not installed: the old set is in force
    installed = schedule.install(10)
    assert installed.current.validators == ADDED and installed.handover is None
    assert installed.set_at(10) == V0  # block 10's certificate stays the old set's


def test_the_handover_is_the_first_checkpoint_past_the_blocks_in_flight() -> None:
    """c = the first multiple of K with c >= b + W (membership.md 8.8 item 3): b a multiple
    of K, just below one, and W larger than K."""
    assert handover_checkpoint(8, 10, 2) == 10
    assert handover_checkpoint(9, 10, 2) == 20
    assert handover_checkpoint(10, 10, 2) == 20
    assert handover_checkpoint(20, 10, 25) == 50
    assert handover_checkpoint(1, 1, 1) == 2


@given(b=st.integers(1, 10**6), k=st.integers(1, 100), w=st.integers(1, 400))
def test_the_handover_is_the_smallest_checkpoint_at_or_past_b_plus_w(b: int, k: int,
                                                                    w: int) -> None:
    c = handover_checkpoint(b, k, w)
    assert c % k == 0 and c >= b + w > c - k


@given(n=st.integers(1, 10))
def test_quorums_of_one_set_intersect_in_a_correct_replica(n: int) -> None:
    """For N from 1 to 10: two quorums share f + 1 replicas (one correct), and the N - f
    correct ones form a quorum by themselves."""
    epoch = Epoch(0, 1, POOL[:n])
    assert epoch.f == max_faulty(n) == (n - 1) // 3 and epoch.quorum == quorum(n)
    assert 2 * epoch.quorum - n >= epoch.f + 1
    assert epoch.quorum <= n - epoch.f == epoch.view_change_quorum
    assert epoch.weak_quorum == epoch.f + 1


changes = st.lists(
    st.tuples(st.lists(st.sampled_from(POOL), min_size=1, max_size=10, unique=True),
              st.integers(1, 25)),
    min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(changes=changes, k=st.integers(1, 12), w=st.integers(1, 30))
def test_every_height_has_exactly_one_set_and_that_set_s_quorum(
        changes: list[tuple[list[bytes], int]], k: int, w: int) -> None:
    """Random adds and removes (N from 1 to 10), each passing some blocks after the last:
    every epoch begins after a checkpoint at or past its change's b + W, at least K after
    the one before (one change per epoch), and every height is decided by exactly one set,
    counted with that set's own f and Q."""
    schedule = EpochSchedule(k, w, (Epoch(0, 1, V0),))
    passed_at = 0
    for validators, gap in changes:
        passed_at += gap
        if tuple(validators) != schedule.epochs[-1].validators:
            schedule = schedule.schedule(validators, passed_at=passed_at)
    epochs = schedule.epochs
    for before, epoch in zip(epochs, epochs[1:], strict=False):
        c = epoch.first - 1
        assert epoch.passed_at is not None
        assert c % k == 0 and c >= epoch.passed_at + w and c >= before.first - 1 + k
    for height in range(epochs[-1].first + 2):
        owners = [e for e, after in zip(epochs, [*epochs[1:], None], strict=True)
                  if e.first <= max(height, 1) and (after is None or height < after.first)]
        assert owners == [schedule.epoch_at(height)]
        assert schedule.quorum_at(height) == quorum(len(schedule.set_at(height)))
    installed = schedule
    for epoch in epochs[1:]:
        assert installed.high_watermark_cap() == epoch.first - 1
        assert installed.install(epoch.first - 2).current == installed.current  # not yet
        installed = installed.install(epoch.first - 1)
        assert installed.current == epoch
    assert installed.high_watermark_cap() is None


def test_a_change_passing_while_another_waits_takes_the_next_boundary() -> None:
    first = scheduled(ADDED, passed_at=8)
    both = first.schedule(REMOVED, passed_at=9)  # b + W = 11: would be 20 anyway
    assert [e.first for e in both.epochs] == [1, 11, 21]
    queued = first.schedule(REMOVED, passed_at=8)  # in the same block: b + W = 10 is taken
    assert queued.epochs[-1].first == 21
    installed = both.install(10)
    assert installed.high_watermark_cap() == 20 and installed.current.validators == ADDED
    assert both.install(25).current.validators == REMOVED  # a later stable checkpoint: both


def test_a_change_fed_again_changes_nothing_and_bad_changes_are_refused() -> None:
    schedule = scheduled(ADDED, passed_at=8)
    assert schedule.schedule(ADDED, passed_at=8) is schedule  # a restart replaying the state
    refused = [
        ((), 9, "at least one address"),
        ((*V0, V0[0]), 9, "twice"),
        ((*V0, b"\x01" * 19), 9, "20-byte"),
        (ADDED, 9, "as it is"),
        (REMOVED, 7, "comes after"),
    ]
    for validators, passed_at, message in refused:
        with pytest.raises(ConfigError, match=message):
            schedule.schedule(validators, passed_at=passed_at)
    with pytest.raises(ConfigError, match="committed block"):
        EpochSchedule.genesis(PARAMS).schedule(ADDED, passed_at=0)
    with pytest.raises(ConfigError, match="genesis set at block 1"):
        EpochSchedule(K, W, (Epoch(0, 2, V0),))
    with pytest.raises(ConfigError, match="numbered"):
        EpochSchedule(K, W, (Epoch(0, 1, V0), Epoch(2, 11, ADDED)))
    with pytest.raises(ConfigError, match="installed"):
        dataclasses.replace(schedule, installed=2)


# --- a message counts only with its own height's set (the attacker's view) --------------------


def membership(validators: tuple[bytes, ...]) -> Membership:
    return Membership(PARAMS.chain_id, scheduled(validators), KeyVerifier())


def test_a_vote_counts_only_from_a_member_of_its_height_s_epoch() -> None:
    """The newcomer (replica 4 of the new set) votes for block 11, not for block 10; the
    removed validator votes for block 10, not for 11, even under the index it had."""
    added = membership(ADDED)
    added.verify(signed(Prepare(0, 11, DIGEST, 4), ADDED))
    with pytest.raises(EpochMismatch):  # block 10 is epoch 0's
        added.verify(signed(Prepare(0, 10, DIGEST, 4), ADDED))
    with pytest.raises(SignatureError, match="not in the validator set"):  # naming epoch 0
        added.verify(signed(Prepare(0, 10, DIGEST, 4), ADDED, epoch=0))
    removed = membership(REMOVED)
    removed.verify(signed(Prepare(0, 10, DIGEST, 0), V0))  # V0[0] still decides block 10
    with pytest.raises(EpochMismatch):  # block 11 is epoch 1's
        removed.verify(signed(Prepare(0, 11, DIGEST, 0), V0))
    with pytest.raises(SignatureError):  # naming epoch 1: index 0 of block 11 is V0[1]
        removed.verify(signed(Prepare(0, 11, DIGEST, 0), V0, epoch=1))
    removed.verify(signed(Prepare(0, 11, DIGEST, 0), REMOVED))
    with pytest.raises(SignatureError):  # V0[1] under its old index, above the handover
        removed.verify(signed(Prepare(0, 11, DIGEST, 1), V0, epoch=1))


def certificate(height: int, epoch_set: tuple[bytes, ...], replicas: range | tuple[int, ...]
                ) -> bytes:
    return encode_commit_certificate(
        signed(Commit(0, height, DIGEST, i), epoch_set) for i in replicas)


def test_a_commit_certificate_needs_the_quorum_of_its_height_s_set() -> None:
    """polygon-edge#1127 ("validators.Len:5 numSeals:3 quorumSize:4") and Sawtooth e7da88d:
    three signatures certify block 10 (four validators), not block 11 (five)."""
    added = membership(ADDED)
    added.verify_certificate(certificate(10, V0, range(3)), 10, DIGEST)
    with pytest.raises(CertificateError, match="quorum is 4"):
        added.verify_certificate(certificate(11, ADDED, range(3)), 11, DIGEST)
    added.verify_certificate(certificate(11, ADDED, (0, 1, 2, 4)), 11, DIGEST)
    with pytest.raises(EpochMismatch):  # the new set's certificate for a block of the old
        added.verify_certificate(certificate(10, ADDED, (0, 1, 4)), 10, DIGEST)


def test_checkpoints_are_counted_with_their_own_height_s_quorum() -> None:
    """The handover checkpoint is stable with Q of the OLD set (3 of 4); the next one needs
    Q of the new set (4 of 5)."""
    added = membership(ADDED)
    added.schedule = added.schedule.install(10)
    tracker = CheckpointTracker(added, V0[0], StoreWriter())
    for height, epoch_set in ((10, V0), (20, ADDED)):
        for replica in range(3):
            tracker.add(signed(Checkpoint(height, DIGEST, DIGEST, replica), epoch_set))
    assert tracker.stable(10) and not tracker.stable(20)
    tracker.add(signed(Checkpoint(20, DIGEST, DIGEST, 4), ADDED))
    assert tracker.stable(20)


def view_change(view: int, stable: int, replica: int, proof_set: tuple[bytes, ...],
                epoch_set: tuple[bytes, ...]) -> Signed[Any]:
    proof = tuple(signed(Checkpoint(stable, DIGEST, DIGEST, i), proof_set) for i in range(3))
    return signed(ViewChange(view, stable, proof if stable else (), (), (), replica), epoch_set)


def test_a_view_change_after_the_handover_is_the_new_set_s_with_the_old_set_s_proof() -> None:
    """Just after c: VIEW-CHANGE(stable = c) is sent by a member of the new set and carries
    the handover checkpoint, signed by the old set (membership.md 8.4)."""
    added = membership(ADDED)
    assert message_height(view_change(1, 10, 4, V0, ADDED).body) == 11
    verify_view_change(added, view_change(1, 10, 4, V0, ADDED))
    with pytest.raises(MessageError):  # the handover proof signed by the new set's indices
        verify_view_change(added, view_change(1, 10, 4, ADDED[1:], ADDED))
    with pytest.raises(EpochMismatch):  # before the handover the newcomer is no member
        verify_view_change(added, view_change(1, 0, 4, V0, ADDED))


def test_a_new_view_counts_only_view_changes_of_its_epoch() -> None:
    """N - f of the new set (4 of 5) from view changes after the handover; a lagging
    replica's VIEW-CHANGE of the old epoch makes up no part of them, even where its index
    names a member of the new set."""
    added = membership(ADDED)
    added.schedule = added.schedule.install(10)
    primary = added.primary(1, 11)
    fresh = tuple(view_change(1, 10, i, V0, ADDED) for i in (0, 1, 2, 4))
    new_view = NewView(1, fresh, (), primary)
    assert verify_new_view(added, 40, signed(new_view, ADDED)).min_s == 10
    lagging = (*fresh[:3], view_change(1, 0, 3, V0, V0))
    with pytest.raises(MessageError, match="another epoch"):
        verify_new_view(added, 40, signed(NewView(1, lagging, (), primary), ADDED))
    with pytest.raises(CertificateError, match="too few"):
        verify_new_view(added, 40, signed(NewView(1, fresh[:3], (), primary), ADDED))
    with pytest.raises(MessageError, match="another epoch"):  # O reaching into the next one
        early = tuple(view_change(1, 0, i, V0, V0) for i in range(3))
        above = signed(PrePrepare(1, 11, DIGEST, 1), V0)
        verify_new_view(added, 40, signed(NewView(1, early, (above,), 1), V0))


def test_the_replica_certifies_a_peer_s_block_only_with_its_height_s_quorum() -> None:
    """A replica past the handover (epoch 1 installed, five validators) adopts a peer's
    certificate for block 11 only with four signatures: with three it fetches instead of
    committing on it."""
    schedule = scheduled(ADDED).install(10)
    replica = Replica(PARAMS, 2, SIGNERS[2], KeyVerifier(), ChainHead(10, GENESIS),
                      block_digest=keccak, schedule=schedule)
    replica.start()
    actions = replica.step(PeerCommitted(11, DIGEST, certificate(11, ADDED, (0, 1, 3)))).actions
    assert 11 not in replica.log.certified
    assert any(isinstance(a, FetchCommitted) for a in actions)
    replica = Replica(PARAMS, 2, SIGNERS[2], KeyVerifier(), ChainHead(10, GENESIS),
                      block_digest=keccak, schedule=schedule)
    replica.start()
    replica.step(PeerCommitted(11, DIGEST, certificate(11, ADDED, (0, 1, 3, 4))))
    assert replica.log.certified[11][0] == DIGEST



def test_the_replica_drops_a_vote_signed_by_a_member_of_another_epoch() -> None:
    """After the handover to the set without V0[0] (genesis replica 2 is replica 1 there), a
    PREPARE for block 11 counts from the member its index names in the new set, never from
    the removed validator, whichever index it claims."""
    replica = Replica(PARAMS, 1, SIGNERS[2], KeyVerifier(), ChainHead(10, GENESIS),
                      block_digest=keccak, schedule=scheduled(REMOVED).install(10))
    replica.start()
    removed = SIGNERS[0]
    for index in (0, 2):  # its old index, and the index of another member in the new set
        replica.step(MessageReceived(WireMessage(
            MEMBERS.sign(Prepare(0, 11, DIGEST, index), removed)).encode()))  # epoch 0's
        body = Prepare(0, 11, DIGEST, index, epoch=1)
        replica.step(MessageReceived(WireMessage(Signed(body, removed.sign_hash(
            signing_hash(body, PARAMS.chain_id)))).encode()))  # naming epoch 1
    dropped = (replica.dropped["EpochMismatch"], replica.dropped["SignatureError"])
    assert (dropped, replica.received["prepare"]) == ((2, 2), 0)
    replica.step(MessageReceived(WireMessage(signed(Prepare(0, 11, DIGEST, 2), REMOVED)).encode()))
    assert replica.received["prepare"] == 1
