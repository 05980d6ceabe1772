"""Attack review of 068fcc4 (issue 31), which fixed the first core review's findings 1 and 3
(`test_attack_review_core7`): `handover.takes_old_new_view` takes a NEW-VIEW of an epoch
before the installed one (a) for the view the replica asked for in that epoch and still
waits in, and (b) for ANY view above the replica's own, unless an override lies between that
epoch and the installed one; and each VIEW-CHANGE resend arms the wait for the old set's
NEW-VIEW again (`leave_old_epoch_view` in the VIEW_CHANGE_RESEND branch).

The attacker holds keys of an old set: the design's safety argument counts at most f_e
faulty members of V_e only "until the handover certificate exists", and rests on "old keys
cannot sign for s > c" (research/membership.md section 8.3: the residual risk it names is a
forgery of history at or below c). Validators removed by a vote are exactly the retired
servers and rotated keys that issue 31 makes routine, and nothing asks an operator to
destroy a retired key. (b) lets N_e - f_e keys of ANY earlier epoch, signing after its
handover, decide which view a member of the installed epoch is active in above c; a
NEW-VIEW of epoch 0 needs no CHECKPOINT at all (its VIEW-CHANGEs may stand on block 0 with an
empty proof). Each finding is a strict xfail naming the interleaving (it asserts the outcome
only, so it passes once fixed); each attack that held is a passing test.

All three are fixed (only the epoch just replaced, and not by an override, may move a replica
by its NEW-VIEW; a replica waiting in v that gets the old set's NEW-VIEW of v it cannot take
waits one new-view timeout, then asks for v + 1). They were:
1. FORK: epoch 0's NEW-VIEW, forged with two rotated-out keys and one byzantine
member's, makes two correct members of epoch 4 active in view 1 with no VIEW-CHANGE of
epoch 4 behind it; they commit at 41 a block other than the one a third member committed at
41 in view 0. 2. HALT: the same forgery for view 2**64 - 1 puts a member in a view it can
never leave (`Replica.step` raises OverflowError at its next view change, persisted across
restarts), and the member hands the forgery to every peer that asks it for a lower view.
3. HALT with one crashed member, no forgery (older than 068fcc4, the case beside (a) and
(b)): a replica whose VIEW-CHANGE for view v is the NEW epoch's drops the old set's NEW-VIEW
of v, which the others are active in, and with one member down nobody ever moves again.
The forgery spreads: a member holding it answers a VIEW-CHANGE for a lower view with it.
Held: the resend's re-arm never moves on a replica whose VIEW-CHANGE the installed epoch
counts; the old set's NEW-VIEW re-proposing heights up to c is agreed again but never voted on
or executed again by a replica that installed the new epoch before executing c.

Findings 1 and 2: a rotation of two of the four genesis keys (the issue's "rotate a validator
key"; docs/validators.md says nothing of what to do with a removed validator's key), one
change per epoch, each passing at 8 after the previous handover (K = 10, W = 2):
epoch 0 (A, B, C, D) -> 1 (+E) -> 2 (-A) -> 3 (+F) -> 4 (-B) = (C, D, E, F), first height 41.
The replica under test is E (index 2 in epoch 4); D is the one byzantine member of epoch 4
(f = 1); A and B are retired (removed by vote, not by override). Finding 3 and what held:
`test_attack_review_core7`'s setting (V0 -> ADDED, c = 10, the replica under test V0[2]).
"""

from __future__ import annotations

from eth_hash.auto import keccak

from encoding.rlp import MAX_UINT64
from pbft_engine.core import (
    Broadcast,
    ChainHead,
    CommitBlock,
    FetchCompleted,
    MessageReceived,
    Replica,
    RequestReceived,
    ScheduleChange,
    SendTo,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.messages import (
    Commit,
    KeyVerifier,
    NewView,
    Prepare,
    PreparedProof,
    PrePrepare,
    ViewChange,
    WireMessage,
)
from tests.unit.pbft.helpers import GENESIS, PARAMS
from tests.unit.pbft.test_pbft_epochs import ADDED, KEYS, POOL, V0, signed
from tests.unit.test_attack_review_core7 import ME, new_epoch_view_change, run_timers
from tests.unit.test_replica_handover import (
    PASSED_AT,
    C,
    Driven,
    block,
    checkpoint_from,
    commit_through,
    digest,
    state,
)

A, B, C_, D = V0
E, F = POOL[4], POOL[5]
SETS = ((A, B, C_, D, E), (B, C_, D, E), (B, C_, D, E, F), (C_, D, E, F))
E3, E4 = SETS[2], SETS[3]
HANDOVER = 40  # epoch 4's handover checkpoint
N = HANDOVER + 1  # epoch 4's first height
X, Y = block(N), b"another block %d" % N  # two blocks for height 41


def rotation() -> EpochSchedule:
    schedule = EpochSchedule.genesis(PARAMS)
    for i, validators in enumerate(SETS):
        schedule = schedule.schedule(validators, passed_at=10 * i + PASSED_AT)
    return schedule


def member_of_epoch_4() -> Driven:
    """E at block 39, epoch 3 installed: block 40 committed by epoch 3 (primary B), its
    CHECKPOINT stable with Q = 4 of epoch 3, which installs epoch 4; E is in view 0."""
    driven = Driven(Replica(PARAMS, None, KEYS[E], KeyVerifier(),
                            ChainHead(HANDOVER - 1, digest(HANDOVER - 1)),
                            block_digest=keccak, schedule=rotation()))
    commit_through(driven, HANDOVER, voters=range(5), epoch_set=E3)
    checkpoint_from(driven, (0, 1, 2, 4), HANDOVER, E3)
    replica = driven.replica
    assert (replica.epochs.current.number, replica.stable_checkpoint) == (4, HANDOVER)
    assert (replica.view, replica.active, replica.me) == (0, True, 2)
    return driven


def forged_new_view(view: int) -> MessageReceived:
    """Epoch 0's NEW-VIEW for `view`: VIEW-CHANGEs of A, B and D on block 0 (stable by
    genesis: no CHECKPOINT needed), signed by epoch 0's primary of `view` (A, B or D). The
    keys of A and B were retired with them; D is byzantine. No override lies between epoch 0
    and epoch 4, so `takes_old_new_view` (b) takes it for any view above the replica's."""
    assert view % 4 != 2, "C is correct: it signs nothing forged"
    view_changes = tuple(signed(ViewChange(view, 0, (), (), (), i), V0, 0) for i in (0, 1, 3))
    return MessageReceived(WireMessage(signed(NewView(view, view_changes, (), view % 4),
                                              V0, 0)).encode())


def committed_at_n(driven: Driven) -> list[bytes]:
    return [a.digest for a in driven.actions if isinstance(a, CommitBlock) and a.seq_no == N]


# --- finding 1: a fork by epoch 0's NEW-VIEW, forged with retired keys ----------------------


def prepared_x() -> Driven:
    """View 0 of epoch 4: C (its primary) proposes X at 41, E and F prepare it and send
    their COMMITs; C collects its own, E's and F's and commits X. E holds only C's COMMIT
    and its own: X is prepared here, not committed yet."""
    driven = member_of_epoch_4()
    driven.receive(PrePrepare(0, N, keccak(X), 0), E4, (X,))
    driven.receive(Prepare(0, N, keccak(X), 3), E4)
    driven.receive(Commit(0, N, keccak(X), 0), E4)
    assert [(c.view, c.digest) for c in driven.sent(Commit) if c.seq_no == N] == [  # type: ignore[attr-defined]
        (0, keccak(X))]
    assert committed_at_n(driven) == []
    return driven


def view_1_commits_y(driven: Driven) -> list[bytes]:
    """D, primary of view 1 in epoch 4, proposes Y at 41; F (fooled alike) prepares it and
    commits it with D: the blocks E commits at 41."""
    driven.receive(PrePrepare(1, N, keccak(Y), 1), E4, (Y,))
    driven.receive(Prepare(1, N, keccak(Y), 3), E4)
    driven.receive(Commit(1, N, keccak(Y), 1), E4)
    driven.receive(Commit(1, N, keccak(Y), 3), E4)
    return committed_at_n(driven)


def test_without_the_old_set_s_new_view_view_1_s_proposal_waits() -> None:
    """The control of finding 1: without the forged NEW-VIEW, D's PRE-PREPARE for view 1
    is held for a view E is not in, and nothing but X could ever be committed at 41 here."""
    assert view_1_commits_y(prepared_x()) == []


def test_a_new_view_of_a_retired_set_does_not_fork_the_installed_one() -> None:
    driven = prepared_x()
    driven.step(forged_new_view(1))
    assert view_1_commits_y(driven) == [], "Y committed at 41 where C committed X"


# --- finding 2: a halt by epoch 0's NEW-VIEW for the last view --------------------------------


def in_view(view: int) -> Driven:
    """E in view 0 of epoch 4 with a transaction waiting; epoch 0's forged NEW-VIEW for
    `view` reaches it."""
    driven = member_of_epoch_4()
    driven.step(RequestReceived(keccak(b"a transfer")))
    driven.step(forged_new_view(view))
    return driven


def changes_view(driven: Driven) -> bool:
    """Its primary is silent: when its request timer runs out, it asks for the next view
    with a VIEW-CHANGE its peers can decode (every view is a uint64 on the wire)."""
    before = driven.replica.view
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    return any(before < vc.view <= MAX_UINT64  # type: ignore[attr-defined]
               for vc in driven.sent(ViewChange))


def test_a_replica_in_a_high_view_still_asks_for_the_next() -> None:
    """The control of finding 2: the same forgery for a view below the last (taken today:
    the replica is in that view when its timer runs out)."""
    assert changes_view(in_view(MAX_UINT64 - 4))


def test_a_member_relays_no_new_view_of_a_retired_set() -> None:
    driven = in_view(MAX_UINT64)
    actions = driven.receive(
        ViewChange(1, HANDOVER, driven.replica.checkpoints.proof(HANDOVER), (), (), 3), E4)
    relayed = [b for a in actions if isinstance(a, SendTo) and a.replica == 3
               if isinstance(b := WireMessage.decode(a.data).signed.body, NewView)]
    assert all(b.epoch == 4 for b in relayed), [(b.view, b.epoch) for b in relayed]


def test_a_new_view_of_a_retired_set_for_the_last_view_does_not_halt_the_replica() -> None:
    assert changes_view(in_view(MAX_UINT64))


# --- finding 3 (next to (b)): the old set's NEW-VIEW for the view a replica asked for in the
# new epoch ------------------------------------------------------------------------------------


def asked_for_view_1_in_the_new_epoch() -> Driven:
    """V0[2] (ME) committed c = 10 and holds it stable (epoch 1, ADDED: N = 5, N - f = 4
    installed); its request timer ran out: VIEW-CHANGE(1) of epoch 1, on c."""
    driven = Driven(Replica(PARAMS, ME, KEYS[V0[ME]], KeyVerifier(),
                            ChainHead(PASSED_AT - 1, GENESIS), block_digest=keccak))
    commit_through(driven, PASSED_AT)
    driven.step(ScheduleChange(ADDED, PASSED_AT))
    commit_through(driven, C)
    checkpoint_from(driven, (0, 1))
    driven.step(RequestReceived(keccak(b"a transfer")))
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    assert [(vc.view, vc.stable_seq_no) for vc in driven.sent(ViewChange)] == [  # type: ignore[attr-defined]
        (1, C)]
    return driven


def old_set_s_new_view_of_view_1() -> MessageReceived:
    """Epoch 0's NEW-VIEW of view 1, by V0[1] (primary of view 1 in both sets) on the
    VIEW-CHANGEs that V0[0], V0[1] and V0[3] signed before c was stable there."""
    view_changes = tuple(signed(ViewChange(1, 0, (), (), (), i), V0) for i in (0, 1, 3))
    return MessageReceived(WireMessage(signed(NewView(1, view_changes, (), 1), V0)).encode())


def test_a_replica_that_asked_in_the_new_epoch_does_not_stay_out_of_the_old_set_s_view() -> None:
    driven = asked_for_view_1_in_the_new_epoch()
    driven.step(new_epoch_view_change(1, 4))  # the added validator
    driven.step(new_epoch_view_change(2, 3))  # V0[3], active in view 1, timed V0[1] out
    for _ in range(3):  # V0[1] answers each resend of ME's VIEW-CHANGE(1) with its NEW-VIEW
        driven.step(old_set_s_new_view_of_view_1())
        run_timers(driven, rounds=1)
    replica = driven.replica
    assert (replica.view, replica.active) == (1, True) or any(
        vc.view == 2 for vc in driven.sent(ViewChange)), (  # type: ignore[attr-defined]
        "waits in view 1 for good, while the others are active in it")


# --- what held ---------------------------------------------------------------------------------


def test_resends_never_move_on_a_replica_whose_view_change_the_installed_epoch_counts() -> None:
    """The re-arm of 068fcc4 (each VIEW_CHANGE_RESEND runs `leave_old_epoch_view`) never
    starts the one new-view timeout for a VIEW-CHANGE of the installed epoch: ME waits in
    view 1 for N - f however many times it sends its VIEW-CHANGE again (a storm of view
    changes otherwise, one per resend period), and still asks for view 2 once N - f want
    view 1 and the new-view timer runs out."""
    driven = asked_for_view_1_in_the_new_epoch()
    run_timers(driven, rounds=8)
    assert [vc.view for vc in driven.sent(ViewChange)] == [1] * 9  # type: ignore[attr-defined]
    for i in (0, 1, 3):
        driven.step(new_epoch_view_change(1, i))
    run_timers(driven, rounds=1)
    assert driven.replica.view == 2


def test_the_old_set_s_new_view_above_the_head_at_or_below_c_is_never_voted_again() -> None:
    """ME at block 8 learns from the new set's VIEW-CHANGE that c = 10 is stable (epoch 1
    installed, 9 and 10 not executed: fetched), then the old set's NEW-VIEW of view 1 (b)
    re-proposes 1 .. 10 (prepared in view 0 by V0[0], V0[1], V0[3]). ME takes view 1 (b)
    but signs nothing, validates and executes nothing for those heights (h = c): they come
    by the fetch, with their certificates."""
    driven = Driven(Replica(PARAMS, ME, KEYS[V0[ME]], KeyVerifier(),
                            ChainHead(PASSED_AT, GENESIS), block_digest=keccak))
    driven.step(ScheduleChange(ADDED, PASSED_AT))
    driven.step(new_epoch_view_change(1, 4))
    replica = driven.replica
    assert (replica.epochs.current.number, replica.stable_checkpoint, replica.fetching) == (
        1, C, C)
    pset = tuple(PreparedProof(signed(PrePrepare(0, n, digest(n), 0), V0),
                               tuple(signed(Prepare(0, n, digest(n), i), V0) for i in (1, 3)))
                 for n in range(1, C + 1))
    view_changes = tuple(signed(ViewChange(1, 0, (), pset, (), i), V0) for i in (0, 1, 3))
    o_set = tuple(signed(PrePrepare(1, n, digest(n), 1), V0) for n in range(1, C + 1))
    before = len(driven.actions)
    driven.step(MessageReceived(WireMessage(signed(NewView(1, view_changes, o_set, 1),
                                                   V0)).encode()))
    assert (replica.active, replica.halted) == (True, False)  # (in view 1 today, by (b))
    after = driven.actions[before:]
    assert not [a for a in after if isinstance(a, ValidateBlock | CommitBlock)]
    assert not [b for a in after if isinstance(a, Broadcast)
                if isinstance(b := WireMessage.decode(a.data).signed.body, Prepare | Commit)]
    driven.step(FetchCompleted(C, digest(C), state(C), ()))
    assert (replica.last_exec, replica.active) == (C, True)
