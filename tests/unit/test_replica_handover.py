"""The replica's handover between epochs (core.handover; DESIGN.md section 10,
research/membership.md 8.3-8.4, the replica rules of 8.8 items 7-12): the high watermark stops
at the handover checkpoint c, the primary proposes (empty) blocks up to it, messages above it
wait for the install, the stable checkpoint at c (or a block above it executed here) installs
the new set, a removed validator leaves, an added one joins at c, and views go on.

One replica driven event by event, its peers' messages signed by hand: four validators
(K = 10, W = 2); a change passed in block 8, so c = 10.
"""

from __future__ import annotations

from collections.abc import Sequence

from eth_hash.auto import keccak

from pbft_engine.core import (
    Action,
    BlockBuilt,
    BlockCommitted,
    BlockReceived,
    BlockValidated,
    Broadcast,
    BuildBlock,
    ChainHead,
    CommitBlock,
    Event,
    FetchCommitted,
    FetchCompleted,
    LeftValidatorSet,
    MessageReceived,
    Mode,
    PeerCommitted,
    Replica,
    RequestReceived,
    ScheduleChange,
    SendTo,
    SetTimer,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.core.epochs import EpochSchedule, Membership, message_height
from pbft_engine.core.view_change import verify_view_change
from pbft_engine.messages import (
    Body,
    Checkpoint,
    Commit,
    KeyVerifier,
    Prepare,
    PrePrepare,
    ViewChange,
    WireMessage,
    encode_commit_certificate,
)
from pbft_engine.record_store import MemoryConsensusStore
from tests.unit.pbft.helpers import GENESIS, PARAMS
from tests.unit.pbft.test_pbft_epochs import ADDED, KEYS, REMOVED, V0, scheduled, signed

PASSED_AT, C = 8, 10


def block(n: int) -> bytes:
    return b"block %d" % n


def digest(n: int) -> bytes:
    return keccak(block(n))


def state(n: int) -> bytes:
    return keccak(b"state %d" % n)


class Driven:
    """A replica whose adapter answers at once: every validation succeeds, every commit is
    imported, every store batch is written (so it can be restored)."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.store = MemoryConsensusStore()
        self.actions: list[Action] = []
        self._take(replica.start())

    def _take(self, ready: object) -> list[Action]:
        from pbft_engine.core import Ready
        assert isinstance(ready, Ready)
        if ready.persist is not None:
            self.store.apply(ready.persist.ops)
        actions = list(ready.actions)
        self.actions += actions
        for action in actions:
            if isinstance(action, ValidateBlock):
                actions += self.step(BlockValidated(action.seq_no, action.digest, True))
            elif isinstance(action, CommitBlock):
                actions += self.step(BlockCommitted(action.seq_no, action.digest,
                                                    state(action.seq_no), ()))
        return actions

    def step(self, event: Event) -> list[Action]:
        return self._take(self.replica.step(event))

    def receive(self, body: Body, epoch_set: tuple[bytes, ...],
                blocks: tuple[bytes, ...] = (), epoch: int | None = None) -> list[Action]:
        """`body` signed by the member its index names in `epoch_set`, naming `epoch` (by
        default the epoch this replica counts the message's height in)."""
        if epoch is None:
            epoch = self.replica.epochs.epoch_number_at(message_height(body))
        wire = WireMessage(signed(body, epoch_set, epoch), blocks)
        return self.step(MessageReceived(wire.encode()))

    def sent(self, kind: type) -> list[object]:
        """Bodies of the messages this replica sent of one kind."""
        bodies = []
        for action in self.actions:
            if isinstance(action, Broadcast):
                body = WireMessage.decode(action.data).signed.body
                if isinstance(body, kind):
                    bodies.append(body)
        return bodies


def backup(index: int, validators: tuple[bytes, ...], head: int = PASSED_AT) -> Driven:
    """Validator V0[index] at `head`, told of the change to `validators` passed at 8."""
    driven = Driven(Replica(PARAMS, index, KEYS[V0[index]], KeyVerifier(),
                            ChainHead(head, GENESIS), block_digest=keccak))
    driven.step(ScheduleChange(validators, PASSED_AT))
    return driven


def commit_through(driven: Driven, last: int, primary: int = 0,
                   voters: Sequence[int] = (0, 1, 2, 3),
                   epoch_set: tuple[bytes, ...] = V0) -> None:
    """The primary proposes, and the members vote for, every block up to `last`."""
    me = driven.replica.me
    for n in range(driven.replica.last_exec + 1, last + 1):
        if me != primary:
            driven.receive(PrePrepare(0, n, digest(n), primary), epoch_set, (block(n),))
        for i in voters:
            if i not in (me, primary):
                driven.receive(Prepare(0, n, digest(n), i), epoch_set)
        for i in voters:
            if i != me:
                driven.receive(Commit(0, n, digest(n), i), epoch_set)
    assert driven.replica.last_exec == last


def checkpoint_from(driven: Driven, replicas: Sequence[int], seq_no: int = C,
                    epoch_set: tuple[bytes, ...] = V0) -> list[Action]:
    actions = []
    for i in replicas:
        actions += driven.receive(Checkpoint(seq_no, digest(seq_no), state(seq_no), i),
                                  epoch_set)
    return actions


# --- step 1: the change is scheduled, the watermark stops at c, the checkpoint installs ------


def test_a_change_fed_twice_is_scheduled_once_and_caps_the_high_watermark() -> None:
    driven = backup(2, ADDED)
    schedule = driven.replica.epochs.schedule
    driven.step(ScheduleChange(ADDED, PASSED_AT))
    assert driven.replica.epochs.schedule is schedule
    assert schedule.handover == C and driven.replica.high_watermark == C
    assert driven.replica.epochs.current.number == 0


def test_the_primary_proposes_empty_blocks_up_to_c_and_nothing_above_it() -> None:
    """besu#7873: with no transaction waiting, the primary still builds blocks 9 and 10
    (allowed empty) so the boundary comes; block 11 waits for the handover (R2, R4)."""
    driven = Driven(Replica(PARAMS, 0, KEYS[V0[0]], KeyVerifier(), ChainHead(PASSED_AT, GENESIS),
                            block_digest=keccak))
    assert not any(isinstance(a, BuildBlock) for a in driven.actions)  # an idle chain idles
    for n in (9, 10):
        builds = [a for a in driven.step(ScheduleChange(ADDED, PASSED_AT)) + driven.actions
                  if isinstance(a, BuildBlock) and a.seq_no == n]
        assert builds and builds[-1].allow_empty, f"no empty block {n} built for the handover"
        driven.step(BlockBuilt(n, digest(n), block(n), ()))
        for i in (1, 2):
            driven.receive(Prepare(0, n, digest(n), i), V0)
        for i in (1, 2):
            driven.receive(Commit(0, n, digest(n), i), V0)
    assert driven.replica.last_exec == C
    driven.step(RequestReceived(keccak(b"a transfer")))
    assert not any(isinstance(a, BuildBlock) and a.seq_no > C for a in driven.actions)
    checkpoint_from(driven, (1, 2))
    assert driven.replica.epochs.current.validators == ADDED
    assert any(isinstance(a, BuildBlock) and a.seq_no == C + 1 for a in driven.actions)


def test_a_primary_that_owes_blocks_up_to_c_and_proposes_none_is_replaced() -> None:
    """No request waits, but the primary owes every block up to c and then c + 1
    (`owes_block`): the backups time it with the request timer from the moment the change
    is scheduled, restart it on each block committed, and change view when it fires
    (membership seed 202 at N = 4: otherwise nothing replaces a primary that does not bring
    the boundary, and the handover stalls for good). Once c + 1 is committed nothing is
    owed, and the timer firing changes nothing."""
    def timed(driven: Driven, since: int) -> int:
        return sum(isinstance(a, SetTimer) and a.kind is TimerKind.REQUEST
                   for a in driven.actions[since:])

    stalled = backup(2, ADDED)
    assert not stalled.replica.requests and timed(stalled, 0) == 1
    committed = len(stalled.actions)
    commit_through(stalled, PASSED_AT + 1)
    assert timed(stalled, committed) >= 1
    stalled.step(TimerFired(TimerKind.REQUEST, b""))
    assert [vc.view for vc in stalled.sent(ViewChange)] == [1]

    served = backup(2, ADDED)
    commit_through(served, C)
    checkpoint_from(served, (0, 1))
    commit_through(served, C + 1, voters=(0, 1, 2, 4), epoch_set=ADDED)
    served.step(TimerFired(TimerKind.REQUEST, b""))
    assert served.sent(ViewChange) == []


def test_a_request_that_arrives_while_an_owed_block_is_timed_is_timed_from_its_commit() -> None:
    """The new set's first block c + 1 is proposed empty (nothing waits; it is owed) and
    the backup's request timer times it. A transfer arrives while that block waits for
    its quorum: the timer runs on, and the primary can put it only in c + 2, built once
    c + 1 is prepared. The commit of the owed block is the primary's progress, as a
    committed request is, so the timer starts again for what still waits (Castro & Liskov,
    section 4.5.2). Until then it ran from c + 1's proposal, and the transfer was given
    what was left of it (honest seed 236 at N = 5: c + 1 waited ~700 ms for a quorum, the
    timers of two backups ran out before c + 2 was built, and they replaced a correct
    primary)."""
    driven = backup(2, ADDED)
    commit_through(driven, C)
    checkpoint_from(driven, (0, 1))
    owed = C + 1
    driven.receive(PrePrepare(0, owed, digest(owed), 0), ADDED, (block(owed),))
    for i in (1, 4):
        driven.receive(Prepare(0, owed, digest(owed), i), ADDED)
    driven.step(RequestReceived(keccak(b"a transfer")))
    assert driven.replica.request_timer_armed
    since = len(driven.actions)
    for i in (0, 1, 4):
        driven.receive(Commit(0, owed, digest(owed), i), ADDED)
    assert driven.replica.last_exec == owed and driven.replica.requests
    assert any(isinstance(a, SetTimer) and a.kind is TimerKind.REQUEST
               for a in driven.actions[since:])


def test_the_new_set_s_messages_wait_for_the_handover_and_count_after_it() -> None:
    """A PRE-PREPARE and PREPAREs for block 11 (the new set's: the newcomer is replica 4)
    arrive before the checkpoint at 10 is stable here: held, not voted on; the stable
    checkpoint (Q = 3 of the OLD set) installs the new set and they are taken."""
    driven = backup(2, ADDED)
    commit_through(driven, C)
    driven.receive(PrePrepare(0, 11, digest(11), 0), ADDED, (block(11),))
    for i in (1, 4):
        driven.receive(Prepare(0, 11, digest(11), i), ADDED)
    assert not [p for p in driven.sent(Prepare) if p.seq_no == 11]  # type: ignore[attr-defined]
    assert (0, 11) not in driven.replica.log.certs
    assert driven.replica.dropped["outside the watermarks"] == 0
    checkpoint_from(driven, (0,))
    assert driven.replica.epochs.current.number == 0  # own + 1: short of Q = 3
    checkpoint_from(driven, (1,))
    assert driven.replica.epochs.current.number == 1 and driven.replica.stable_checkpoint == C
    assert driven.replica.low_watermark == C and driven.replica.high_watermark == C + 40
    slot = driven.replica.log.certs[(0, 11)]
    assert set(slot.prepares) == {1, 2, 4}  # its own PREPARE, and the two held
    assert Prepare(0, 11, digest(11), 2, epoch=1) in driven.sent(Prepare)  # the new epoch


def test_a_catch_up_past_the_handover_installs_the_new_set() -> None:
    """A replica that was behind imports blocks up to 13 (the certificate of 13 is four of
    the five): the handover is behind it, the new set decides its window."""
    driven = backup(2, ADDED)
    certificate = encode_commit_certificate(
        signed(Commit(0, 13, digest(13), i), ADDED) for i in (0, 1, 3, 4))
    actions = driven.step(PeerCommitted(13, digest(13), certificate))
    assert any(isinstance(a, FetchCommitted) and a.target_seq_no == 13 for a in actions)
    driven.step(FetchCompleted(13, digest(13), state(13), ()))
    replica = driven.replica
    assert replica.epochs.current.validators == ADDED and replica.low_watermark == 13
    assert replica.high_watermark == 13 + 40


# --- step 2: identity by address; a removed validator leaves, an added one joins ------------


def removed_primary_through_c() -> Driven:
    """V0[0], view 0's primary, removed by the change that passed at PASSED_AT: it proposes
    and commits blocks 9 and 10 (c) with validators 1 and 2."""
    driven = Driven(Replica(PARAMS, 0, KEYS[V0[0]], KeyVerifier(), ChainHead(PASSED_AT, GENESIS),
                            block_digest=keccak))
    driven.step(ScheduleChange(REMOVED, PASSED_AT))
    for n in (9, 10):
        driven.step(BlockBuilt(n, digest(n), block(n), ()))
        for i in (1, 2):
            driven.receive(Prepare(0, n, digest(n), i), V0)
            driven.receive(Commit(0, n, digest(n), i), V0)
    return driven


def test_a_removed_validator_votes_up_to_c_then_leaves() -> None:
    """V0[0], the primary of view 0, is removed: it proposes and votes up to block 10, its
    CHECKPOINT at 10 counts toward the handover, it sends it again to a member that asks
    every request timeout until a block above c is committed here (a member that lost it
    would wait for ever: nothing but the handover comes after c); then it tells the adapter
    it left and takes no further step (research 8.4, 8.8 item 12)."""
    driven = removed_primary_through_c()
    own = Checkpoint(C, digest(C), state(C), 0)
    assert own in driven.sent(Checkpoint)
    checkpoint_from(driven, (1, 2))
    assert driven.replica.stable_checkpoint == C and driven.replica.mode is not Mode.LEFT
    driven.step(TimerFired(TimerKind.RESEND, b""))
    assert driven.sent(Checkpoint) == [own, own]
    certificate = encode_commit_certificate(
        signed(Commit(0, 11, digest(11), i), REMOVED) for i in range(3))
    driven.step(PeerCommitted(11, digest(11), certificate))
    assert LeftValidatorSet(1, C + 1) not in driven.actions  # (the body is fetched first)
    driven.step(BlockReceived(11, digest(11), block(11)))
    assert LeftValidatorSet(1, C + 1) in driven.actions
    assert driven.replica.mode is Mode.LEFT
    assert driven.step(RequestReceived(keccak(b"a transfer"))) == []
    restored = Replica.restore(PARAMS, None, KEYS[V0[0]], KeyVerifier(),
                               ChainHead(11, digest(11)), driven.store, block_digest=keccak,
                               schedule=scheduled(REMOVED),
                               signing_bound=driven.replica.signing_bound)
    assert restored.start().actions == [LeftValidatorSet(1, C + 1)]


def test_the_handover_checkpoint_is_sent_again_until_the_new_set_commits_a_block() -> None:
    """A CHECKPOINT lost at c would stop the chain (nothing comes after c until it is
    stable), so each member sends its own again every request timeout, stable here or not,
    until a block above c is executed; the new primary proposes that block (empty if need
    be) at once (`test_the_primary_after_a_removal...`), which proves the handover to
    whoever missed it."""
    driven = backup(2, ADDED)
    commit_through(driven, C)
    own = Checkpoint(C, digest(C), state(C), 2)
    assert driven.sent(Checkpoint) == [own]
    driven.step(TimerFired(TimerKind.RESEND, b""))
    assert driven.sent(Checkpoint) == [own, own]
    checkpoint_from(driven, (0, 1))
    driven.step(TimerFired(TimerKind.RESEND, b""))
    assert driven.sent(Checkpoint) == [own, own, own]
    commit_through(driven, C + 1, voters=(0, 1, 2, 4), epoch_set=ADDED)
    driven.step(TimerFired(TimerKind.RESEND, b""))
    assert driven.sent(Checkpoint) == [own, own, own]


def test_the_primary_after_a_removal_is_the_new_set_s_and_views_go_on() -> None:
    """V0[0] removed: V0[1] is replica 0 of the new set, the primary of view 0 there; no
    view change is needed (the views stay monotonic, research 8.4), and it proposes the
    first block of the new epoch (empty: nothing waits) at once."""
    driven = backup(1, REMOVED)
    commit_through(driven, C)
    assert driven.replica.me == 1
    checkpoint_from(driven, (0, 2))
    assert driven.replica.me == 0 and driven.replica.primary == 0 and driven.replica.view == 0
    builds = [a for a in driven.actions if isinstance(a, BuildBlock) and a.seq_no == C + 1]
    assert builds and builds[0].allow_empty


def test_a_view_change_just_after_the_handover_is_the_new_set_s() -> None:
    """C = the handover checkpoint (the old set's proof), P empty, the next primary from the
    new set (research 8.8 item 11)."""
    driven = backup(2, ADDED)
    commit_through(driven, C)
    checkpoint_from(driven, (0, 1))
    driven.step(RequestReceived(keccak(b"a transfer")))
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    [view_change] = driven.sent(ViewChange)
    assert view_change.stable_seq_no == C and view_change.pset == ()  # type: ignore[attr-defined]
    proof = view_change.checkpoint_proof  # type: ignore[attr-defined]
    assert {c.body.replica for c in proof} == {0, 1, 2}
    installed = Membership(PARAMS.chain_id, scheduled(ADDED).install(C), KeyVerifier())
    verify_view_change(installed, signed(view_change, ADDED), 40)
    assert installed.current.validators[installed.primary(1, C + 1)] == ADDED[1]


def test_a_lagging_replica_adopts_the_handover_from_a_view_change_of_the_new_set() -> None:
    """It missed the old set's CHECKPOINTs at c (it was down): the new set's VIEW-CHANGEs,
    whose checkpoint proof is Q of the old set at c, install the new set here, and then
    count (a removed validator's, or this replica's old-epoch ones, never would)."""
    driven = backup(2, ADDED)
    commit_through(driven, C)
    proof = tuple(signed(Checkpoint(C, digest(C), state(C), i), V0) for i in (0, 1, 3))
    for i in (0, 4):
        driven.receive(ViewChange(1, C, proof, (), (), i), ADDED)
    assert driven.replica.epochs.current.validators == ADDED
    assert driven.replica.stable_checkpoint == C
    assert driven.replica.view == 1  # f + 1 = 2 VIEW-CHANGEs of the installed set: it joins


def test_an_added_validator_joins_at_c_votes_from_c_plus_1_and_collects_its_proof() -> None:
    """The newcomer followed the chain to block 10 as an observer; it joins there as replica
    4 of the new set, votes for block 11, sends no VIEW-CHANGE while it lacks the proof of
    its stable checkpoint, takes the old set's CHECKPOINTs at 10 as that proof, and its
    VIEW-CHANGE then verifies."""
    newcomer = KEYS[ADDED[4]]
    replica = Replica.join(PARAMS, newcomer, KeyVerifier(), ChainHead(C, digest(C)),
                           block_digest=keccak, schedule=scheduled(ADDED), view=0)
    driven = Driven(replica)
    assert (replica.me, replica.stable_checkpoint, replica.low_watermark) == (4, C, C)
    assert replica.signing_bound.seq_no >= C
    driven.receive(PrePrepare(0, 11, digest(11), 0), ADDED, (block(11),))
    assert Prepare(0, 11, digest(11), 4, epoch=1) in driven.sent(Prepare)
    driven.step(RequestReceived(keccak(b"a transfer")))
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    assert driven.sent(ViewChange) == [] and replica.view == 0
    checkpoint_from(driven, (0, 1, 2))
    assert len(replica.checkpoints.proof(C)) == 3
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    [view_change] = driven.sent(ViewChange)
    installed = Membership(PARAMS.chain_id, scheduled(ADDED).install(C), KeyVerifier())
    verify_view_change(installed, signed(view_change, ADDED), 40)
    restored = Replica.restore(PARAMS, None, newcomer, KeyVerifier(), ChainHead(C, digest(C)),
                               driven.store, block_digest=keccak, schedule=scheduled(ADDED),
                               signing_bound=replica.signing_bound)
    assert (restored.me, restored.stable_checkpoint, restored.amnesia) == (4, C, None)


def test_a_replica_restored_after_the_handover_installs_from_its_stable_checkpoint() -> None:
    """On a restart the adapter rebuilds the schedule from state with nothing installed; the
    stable checkpoint read back installs the new set, and the index is the new set's."""
    driven = backup(1, REMOVED)
    commit_through(driven, C)
    checkpoint_from(driven, (0, 2))
    restored = Replica.restore(PARAMS, None, KEYS[V0[1]], KeyVerifier(), ChainHead(C, digest(C)),
                               driven.store, block_digest=keccak,
                               schedule=EpochSchedule.genesis(PARAMS).schedule(
                                   REMOVED, passed_at=PASSED_AT),
                               signing_bound=driven.replica.signing_bound)
    assert restored.epochs.current.validators == REMOVED and restored.me == 0
    assert restored.amnesia is None


def test_an_added_validator_that_missed_the_checkpoints_at_c_takes_its_proof_from_view_changes(
        ) -> None:
    """It joins after c+1 was committed, so nobody sends the CHECKPOINTs at 10 again; then
    the primary crashes. Of the new set's five (Q = 4) only four are left, the newcomer one
    of them: it needs the proof of its stable checkpoint to send its VIEW-CHANGE, and takes
    it from the others' (each carries the old set's Q CHECKPOINTs at 10)."""
    newcomer = KEYS[ADDED[4]]
    replica = Replica.join(PARAMS, newcomer, KeyVerifier(), ChainHead(C, digest(C)),
                           block_digest=keccak, schedule=scheduled(ADDED), view=0)
    driven = Driven(replica)
    assert replica.checkpoints.short_of_proof(C)
    proof = tuple(signed(Checkpoint(C, digest(C), state(C), i), V0) for i in (0, 1, 3))
    for i in (1, 2):  # f + 1 of the installed set ask for view 1
        driven.receive(ViewChange(1, C, proof, (), (), i), ADDED)
    assert not replica.checkpoints.short_of_proof(C)
    [view_change] = driven.sent(ViewChange)
    assert (view_change.view, view_change.stable_seq_no) == (1, C)
    installed = Membership(PARAMS.chain_id, scheduled(ADDED).install(C), KeyVerifier())
    verify_view_change(installed, signed(view_change, ADDED), 40)


# --- a replica stranded in an old epoch's view change past c (session 11) -------------------


def stranded_past_c() -> Driven:
    """V0[2] asks for view 1 in epoch 0 (its request timer ran out at head 8), then catches
    up by a fetch to 13, past c: it holds no stable checkpoint of the new epoch, so it may
    ask for none of its views, and the new set counts no VIEW-CHANGE of epoch 0."""
    driven = backup(2, ADDED)
    driven.step(RequestReceived(keccak(b"a transfer")))
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    assert driven.replica.view == 1 and not driven.replica.active
    fetch_past_c(driven)
    replica = driven.replica
    assert replica.epochs.current.validators == ADDED and replica.stable_checkpoint == 0
    return driven


def fetch_past_c(driven: Driven) -> None:
    """A catch-up to 13 by the certificate of the set V0 + the newcomer (four of five)."""
    certificate = encode_commit_certificate(
        signed(Commit(0, 13, digest(13), i), ADDED) for i in (0, 1, 3, 4))
    driven.step(PeerCommitted(13, digest(13), certificate))
    driven.step(FetchCompleted(13, digest(13), state(13), ()))


def test_a_replica_stranded_past_c_adopts_an_offered_proof_and_asks_for_a_view_again() -> None:
    """Simulator seeds 313 and 40 at N = 4 (group-commit model): the others, active in view
    0, drop its epoch-0 VIEW-CHANGE and never change view; it was stranded for good. Q
    CHECKPOINTs of the old set at c, below its low watermark (13), now make c stable here
    (`adopt_offered_checkpoint`), and its new-view timer then asks for view 2 of the new
    epoch, which the new set counts."""
    driven = stranded_past_c()
    checkpoint_from(driven, (0, 1))
    assert driven.replica.stable_checkpoint == 0  # two of the old set's Q = 3: not yet
    before = len(driven.actions)
    checkpoint_from(driven, (3,))
    replica = driven.replica
    assert replica.stable_checkpoint == C and replica.low_watermark == 13
    [timer] = [a for a in driven.actions[before:]
               if isinstance(a, SetTimer) and a.kind is TimerKind.NEW_VIEW]
    driven.step(TimerFired(TimerKind.NEW_VIEW, timer.key))
    view_change = driven.sent(ViewChange)[-1]
    assert view_change.view == 2 and view_change.stable_seq_no == C  # type: ignore[attr-defined]
    assert replica.epochs.schedule.epoch_at(message_height(view_change)) == replica.epochs.current  # type: ignore[arg-type]


def test_a_replica_stable_in_its_epoch_takes_no_offer() -> None:
    """The offer is taken only while the stable checkpoint is below the installed epoch:
    once c is stable here, a CHECKPOINT below the low watermark is dropped, as before."""
    driven = stranded_past_c()
    checkpoint_from(driven, (0, 1, 3))
    assert driven.replica.stable_checkpoint == C
    assert driven.replica.dropped["checkpoint below the low watermark"] == 0
    checkpoint_from(driven, (0,))
    assert driven.replica.dropped["checkpoint below the low watermark"] == 1


def test_a_member_answers_an_old_epoch_view_change_with_its_stable_checkpoint_proof() -> None:
    """The other side: V0[1], stable at c in the new epoch, drops V0[2]'s VIEW-CHANGE of
    epoch 0 and sends it the Q CHECKPOINTs proving c (`offer_stable_proof`); a removed
    validator's, or one from a replica as far as this one, gets nothing."""
    def offers(driven: Driven, since: int) -> list[tuple[int, Checkpoint]]:
        return [(a.replica, WireMessage.decode(a.data).signed.body)
                for a in driven.actions[since:] if isinstance(a, SendTo)
                and isinstance(WireMessage.decode(a.data).signed.body, Checkpoint)]

    driven = backup(1, REMOVED)
    commit_through(driven, C)
    checkpoint_from(driven, (0, 2))
    assert driven.replica.stable_checkpoint == C
    assert driven.replica.epochs.current.validators == REMOVED
    before = len(driven.actions)
    driven.receive(ViewChange(1, 0, (), (), (), 2), V0, epoch=0)
    sent = offers(driven, before)
    assert sorted(body.replica for _, body in sent) == [0, 1, 2]
    assert {to for to, _ in sent} == {REMOVED.index(V0[2])}
    assert all(body.seq_no == C for _, body in sent)
    before = len(driven.actions)
    driven.receive(ViewChange(1, 0, (), (), (), 0), V0, epoch=0)  # V0[0] was removed
    assert offers(driven, before) == []
