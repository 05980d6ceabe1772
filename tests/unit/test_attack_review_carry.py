"""Attack review of the blocks an override carries (commits a3342f7, 0cd4472 and f260fcb;
issue 31): a survivor keeps its prepared certificates (P) of the old epoch above T - 1, and a
VIEW-CHANGE at an override's heights may carry them, counted with the old set
(`Membership.verify_prepared_proof`). Each finding was a strict xfail naming its interleaving;
all four are fixed: 1. a carried certificate outranked the new set's by view (a fork):
`plan_new_view` ranks by epoch first; 2. old-epoch certificates counted at every height of the
override's epoch (stolen keys of gone validators could fork it): only at T .. T - 1 +
max_in_flight; 3. a carried block failed the extraData rule (a halt): it may commit to the
old set's next set (`EpochFeed.carried_set_hash`, and the audit's extra-data rule); 4. a
change passing in an override's first blocks took effect at T - 1 + K, no checkpoint (a
halt): a handover is always a multiple of K (`EpochSchedule._interval_after`). Each rule that
held is a passing test.

One replica driven event by event (the helpers of `test_replica_handover`), its peers'
messages signed by hand as a correct peer would sign them: four genesis validators V0
(K = 10, W = 2, L = 20); the override at T = 37 of `test_attack_review_override`
(`WITH_NEW_KEYS`: the two gone replaced by two new keys, REPLACED = V0[0], V0[1], POOL[4],
POOL[5]: n = 4, f = 1, Q = 3), the setup docs/validators.md's step 2 allows.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from eth_hash.auto import keccak

from chain.errors import BlockValidationError
from pbft_engine.core import (
    Action,
    BlockBuilt,
    BlockReceived,
    BlockValidated,
    Broadcast,
    BuildBlock,
    ChainHead,
    CommitBlock,
    EngineParams,
    Event,
    FetchBlock,
    MessageReceived,
    Refusal,
    Replica,
    ScheduleChange,
)
from pbft_engine.core.epochs import EpochSchedule, Membership
from pbft_engine.core.view_change import (
    plan_new_view,
    select_view_changes,
    verify_view_change,
)
from pbft_engine.engine import PbftEngine
from pbft_engine.epoch_feed import EpochFeed
from pbft_engine.errors import MessageError
from pbft_engine.messages import (
    Checkpoint,
    Commit,
    KeyVerifier,
    NewView,
    Prepare,
    PreparedProof,
    PrePrepare,
    Signed,
    ViewChange,
    WireMessage,
    encode_commit_certificate,
    signed_as,
)
from tests.unit.pbft.helpers import GENESIS, PARAMS
from tests.unit.pbft.test_pbft_epochs import KEYS, POOL, V0, signed
from tests.unit.test_attack_review_override import REPLACED, WITH_NEW_KEYS, replica_at
from tests.unit.test_override import OVERRIDE, SURVIVORS, T
from tests.unit.test_replica_handover import Driven, block, digest, state

X = b"the old set's block 37, prepared in its view 5"
Y = b"the new set's block 37, committed in its view 2"


def started(params: EngineParams, address: bytes) -> Driven:
    """Validator `address` started at T - 1 with `params`' genesis file, nothing in its
    records above 36 (its view 0)."""
    return Driven(Replica(params, None, KEYS[address], KeyVerifier(), ChainHead(T - 1, GENESIS),
                          block_digest=keccak, schedule=EpochSchedule.genesis(params)))


M = TypeVar("M", Prepare, Commit, ViewChange, NewView)


def _own(driven: Driven, kind: type[M], view: int) -> Signed[M]:
    """The message of `kind` for `view` that `driven` signed (as it went out)."""
    for action in driven.actions:
        if isinstance(action, Broadcast):
            message = signed_as(WireMessage.decode(action.data).signed, kind)
            if message is not None and message.body.view == view:
                return message
    raise AssertionError(f"no {kind.__name__} for view {view}")


def _old_set_prepared_x() -> PreparedProof:
    """What V0[1] holds at the halt: the old set had changed to view 5 (V0[0], its primary of
    view 0, was down, then restarted and caught up to 36 by block sync: its view is 0);
    V0[1], primary of view 5, proposed X at 37, V0[2] and V0[3] prepared it (and committed
    it: the gone ones may have told clients)."""
    pre_prepare = signed(PrePrepare(5, T, keccak(X), 1), V0, epoch=0)
    return PreparedProof(pre_prepare, tuple(signed(Prepare(5, T, keccak(X), i), V0, epoch=0)
                                            for i in (2, 3)))


def _carried_over_the_new_set_s_decision(victim: Driven, holder: int, carried: PreparedProof,
                                         first_view: int, late_view: int) -> Driven:
    """The override's set (n, f, Q) after the restart, the victim a correct member at view 0,
    `holder` a correct one whose restart VIEW-CHANGE(late_view) carries the old epoch's
    `carried` X, and is slow. The N - f lowest members but the holder form `first_view`; its
    primary proposes Y at 37, they all prepare it, the primary commits it (their COMMITs
    reach it; the others' are late). Before the checkpoint at 40 is stable, `late_view` is
    asked for by the holder and those N - f (after failed views while the victim was cut
    off); the victim joins (f + 1). Its primary takes V = the N - f lowest indices
    (`select_view_changes`, which holds the holder) and O = `plan_new_view`'s, which every
    replica recomputes; those of V that did not execute Y (all but the first primary)
    prepare and commit what O says. Returns the victim."""
    epoch = victim.replica.epochs.current
    members, me = epoch.validators, victim.replica.me

    def sign(body: Any) -> Signed[Any]:
        return signed(body, members, epoch.number)

    first = [i for i in range(epoch.n) if i != holder][:epoch.view_change_quorum]
    first_primary, late_primary = epoch.primary(first_view), epoch.primary(late_view)
    assert me in first and me not in (first_primary, late_primary)
    for i in first:
        if i != me:
            victim.receive(ViewChange(first_view, T - 1, (), (), (), i), members)
    view_changes = [_own(victim, ViewChange, first_view) if i == me else
                    sign(ViewChange(first_view, T - 1, (), (), (), i)) for i in first]
    victim.receive(NewView(first_view, tuple(view_changes), (), first_primary), members)
    victim.receive(PrePrepare(first_view, T, keccak(Y), first_primary), members, (Y,))
    preparers = [i for i in first if i not in (me, first_primary)]
    for i in preparers:
        victim.receive(Prepare(first_view, T, keccak(Y), i), members)
    # the first primary commits Y with the COMMITs of `first`: Y is decided at 37
    decided = encode_commit_certificate(
        _own(victim, Commit, first_view) if i == me else
        sign(Commit(first_view, T, keccak(Y), i)) for i in first)
    victim.replica.epochs.verify_certificate(decided, T, keccak(Y))
    prepared_y = PreparedProof(
        sign(PrePrepare(first_view, T, keccak(Y), first_primary)),
        tuple(_own(victim, Prepare, first_view) if i == me else
              sign(Prepare(first_view, T, keccak(Y), i))
              for i in sorted((*preparers, me))))
    late = {i: sign(ViewChange(late_view, T - 1, (), (carried if i == holder else prepared_y,),
                               (), i)) for i in sorted((holder, *first)) if i != me}
    for message in late.values():
        victim.step(MessageReceived(WireMessage(message).encode()))
    chosen = select_view_changes(epoch, [*late.values(), _own(victim, ViewChange, late_view)])
    plan = plan_new_view([vc.body for vc in chosen])  # what the late primary computes
    o = tuple(sign(PrePrepare(late_view, n, d, late_primary)) for n, d in plan.entries)
    victim.receive(NewView(late_view, chosen, o, late_primary), members)
    if FetchBlock(T, keccak(X)) in victim.actions:
        victim.step(BlockReceived(T, keccak(X), X))
    voters = [vc.body.replica for vc in chosen if vc.body.replica not in (me, first_primary)]
    for i in voters:
        if i != late_primary:
            victim.receive(Prepare(late_view, T, keccak(X), i), members)
    for i in voters:
        victim.receive(Commit(late_view, T, keccak(X), i), members)
    return victim


def _committed_x(victim: Driven) -> bool:
    return any(isinstance(a, CommitBlock) and a.seq_no == T and a.digest == keccak(X)
               for a in victim.actions)


# --- finding 1: an old-epoch certificate outranks the new set's own by its view number -------


# Fixed (finding 1, see the module's doc).
def test_a_block_the_new_set_committed_is_never_proposed_again_as_another() -> None:
    """The restart with the gone replaced by new keys: V0[0] (view 0), POOL[4] and POOL[5]
    (new, view 0) ask for view 1, V0[1] (view 5, holding X prepared in the old view 5) for
    view 6, and its VIEW-CHANGE is slow. View 1's primary is V0[1]: the others time out
    into view 2 (POOL[4] leads it) with V = V0[0], POOL[4], POOL[5] and no P: POOL[4]
    proposes Y at 37, all three prepare it, POOL[4] commits it (Q = 3 COMMITs); the others'
    COMMITs are late. Before the checkpoint at 40 is stable, V0[0] and V0[1] ask for view 6
    (V0[1]'s restart VIEW-CHANGE; V0[0] after views 3 to 5 failed while POOL[5] was cut
    off): POOL[5] joins (f + 1). POOL[4], view 6's primary, takes V = V0[0], V0[1] and
    itself: V0[0]'s and its own carry Y prepared in view 2 of epoch 1, V0[1]'s X prepared
    in view 5 of epoch 0; `plan_new_view` ranks by view alone, so O re-proposes X at 37.
    POOL[5], V0[0] and V0[1], all correct, commit X at 37; POOL[4] holds Y there (it
    alarms). A fork with no faulty member in the override's set. A prepared certificate of
    an earlier epoch must rank below every one of a later epoch (rank by (epoch, view)):
    the new set's views come after every old view, whatever their numbers."""
    victim = started(WITH_NEW_KEYS, POOL[5])  # replica 3 of REPLACED
    _own(victim, ViewChange, 1)  # it asked for view 1 at the start
    _carried_over_the_new_set_s_decision(victim, 1, _old_set_prepared_x(), 2, 6)
    assert not _committed_x(victim), "committed X at 37, where Y was decided"


G10 = POOL[:10]  # ten genesis validators: f = 3, Q = 7
GONE_SIX = dataclasses.replace(PARAMS, validators=G10, transitions=((T, G10[:4]),))


# Fixed (finding 1, see the module's doc).
def test_the_survivors_alone_never_propose_again_a_block_they_decided() -> None:
    """docs/validators.md: "The quorum arithmetic holds when the override's set is the
    survivors". Ten validators, six gone for good, the override's set the four survivors
    (n = 4, f = 1, Q = 3). The old set had moved to view 5 without G10[1..3] (slow, f of
    the old set may be); G10[5], its primary, proposed X at 37 and G10[0] prepared it with
    five gone ones (Q = 7). At the restart G10[0] asks for view 6 and is slow; G10[1..3]
    form view 1, commit Y at 37 in it, and later take G10[0]'s VIEW-CHANGE into view 6:
    X (view 5) outranks Y (view 1), and G10[3] commits X with G10[0] and G10[2]. The
    survivors' N - f VIEW-CHANGEs are sure to hold a block the old set committed only
    when s > f_old + f_new (here 4 = 3 + 1); where they need not, the same fork."""
    carried = PreparedProof(signed(PrePrepare(5, T, keccak(X), 5), G10, epoch=0),
                            tuple(signed(Prepare(5, T, keccak(X), i), G10, epoch=0)
                                  for i in (0, 4, 6, 7, 8, 9)))
    victim = started(GONE_SIX, G10[3])
    _carried_over_the_new_set_s_decision(victim, 0, carried, 1, 6)
    assert not _committed_x(victim), "committed X at 37, where Y was decided"


# --- finding 2: old-epoch certificates are taken at any height, in any later view change -----

STOLEN = b"the attacker's block 41"
HONEST = b"the new set's block 41, committed in its view 6"


def _checkpoint_40() -> tuple[Signed[Checkpoint], ...]:
    """The new set's checkpoint at 40 (Q = 3 of REPLACED): the override is long in force."""
    return tuple(signed(Checkpoint(40, digest(40), state(40), i), REPLACED) for i in (0, 1, 2))


# Fixed (finding 2, see the module's doc).
def test_the_gone_validators_keys_forge_nothing_once_the_override_is_in_force() -> None:
    """The override exists for validators gone for good, lost keys among them; an override
    member may be faulty (REPLACED has f = 1). V0[0], faulty, holds the gone V0[2]'s and
    V0[3]'s keys. Long after the override (stable checkpoint 40), the new set committed
    block 41 in its view 6 (POOL[4] leads it) at some members, and a view change to 8
    follows. V0[0]'s VIEW-CHANGE(8) carries a prepared certificate of epoch 0 at 41 in view
    7 (V0[3], primary of epoch 0's view 7, and V0[0], V0[2] preparing, all keys it holds):
    `verify_view_change` counts it with the old set, and `plan_new_view` ranks it above the
    new set's certificate of view 6, so the NEW-VIEW re-proposes the attacker's block at a
    height the new set decided: a fork with one faulty member. No correct replica prepares
    anything in the old epoch after it restarted on the override, so an old-epoch
    certificate is meaningful only in a VIEW-CHANGE on T - 1 (the override's first view
    change), at the heights the old set could reach from there."""
    members = Membership.of(WITH_NEW_KEYS, KeyVerifier())
    stolen = PreparedProof(signed(PrePrepare(7, 41, keccak(STOLEN), 3), V0, epoch=0),
                           tuple(signed(Prepare(7, 41, keccak(STOLEN), i), V0, epoch=0)
                                 for i in (0, 2)))
    forged = signed(ViewChange(8, 40, _checkpoint_40(), (stolen,), (), 0), REPLACED)
    honest = PreparedProof(signed(PrePrepare(6, 41, keccak(HONEST), 2), REPLACED),
                           tuple(signed(Prepare(6, 41, keccak(HONEST), i), REPLACED)
                                 for i in (1, 3)))
    others = [signed(ViewChange(8, 40, _checkpoint_40(), (honest,), (), i), REPLACED)
              for i in (1, 2)]
    for vc in others:
        verify_view_change(members, vc, WITH_NEW_KEYS.log_size)
    try:
        verify_view_change(members, forged, WITH_NEW_KEYS.log_size)
    except MessageError:
        return
    plan = plan_new_view([vc.body for vc in (forged, *others)])
    assert plan.entries == ((41, keccak(HONEST)),), "the NEW-VIEW re-proposes the forged 41"


def test_an_old_epoch_certificate_of_another_set_is_refused_at_the_override() -> None:
    """What held: the carried certificate is counted with the old set and only that one: a
    certificate naming epoch 0 but signed by new keys, or naming an epoch before the one
    just before the override, does not verify."""
    members = Membership.of(WITH_NEW_KEYS, KeyVerifier())
    by_new_keys = PreparedProof(signed(PrePrepare(1, T, keccak(X), 1), REPLACED, epoch=0),
                                tuple(signed(Prepare(1, T, keccak(X), i), REPLACED, epoch=0)
                                      for i in (2, 3)))
    with pytest.raises(MessageError):
        members.verify_prepared_proof(by_new_keys)


# --- finding 3: the carried block breaks the extraData rule: every view proposes it again ----


def _extra_data_check(params: EngineParams, extra_data: bytes) -> Refusal | None:
    """What a node running `params`' genesis file at head 36 says of a block 37 carrying
    `extra_data` (`PbftEngine._check_extra_data`, the rule `_validate` applies)."""
    engine = PbftEngine.__new__(PbftEngine)
    schedule = EpochSchedule.genesis(params)
    engine.feed = EpochFeed(schedule, lambda h: schedule)
    engine.feed.refresh(T - 1, digest(T - 1))
    executed = SimpleNamespace(number=T, block=SimpleNamespace(
        header=SimpleNamespace(extra_data=extra_data)))
    try:
        engine._check_extra_data(executed)  # type: ignore[arg-type]
    except BlockValidationError:
        return Refusal.INVALID
    return None


def _old_primary_s_extra_data() -> bytes:
    """Block 37's extraData as the old primary built it before the halt (no override known):
    the hash of the set deciding 38 then, V0."""
    old = EpochFeed(EpochSchedule.genesis(PARAMS), lambda h: EpochSchedule.genesis(PARAMS))
    old.refresh(T - 1, digest(T - 1))
    committed = old.next_set_hash(T)
    assert committed is not None and _extra_data_check(PARAMS, committed) is None
    return committed


CARRIED = b"the old set's block 37, prepared in its view 0"


class Validating(Driven):
    """A survivor whose adapter answers the carried block as the real one does."""

    def __init__(self, replica: Replica, refusal: Refusal | None) -> None:
        self.refusal = refusal
        super().__init__(replica)

    def step(self, event: Event) -> list[Action]:
        if isinstance(event, BlockValidated) and event.digest == keccak(CARRIED) and self.refusal:
            event = BlockValidated(event.seq_no, event.digest, False, self.refusal)
        return super().step(event)


def _survivors_carrying() -> list[Validating]:
    """The setup of `test_override`'s carried block: V0[1] prepared the old primary's block
    37 (with the gone V0[2] and V0[3]), then both survivors restarted on the override."""
    before = []
    for i in (0, 1):
        before.append(Driven(Replica(PARAMS, i, KEYS[V0[i]], KeyVerifier(),
                                     ChainHead(T - 1, GENESIS), block_digest=keccak)))
    holder = before[1]
    holder.receive(PrePrepare(0, T, keccak(CARRIED), 0), V0, (CARRIED,))
    for gone in (2, 3):
        holder.receive(Prepare(0, T, keccak(CARRIED), gone), V0)
    assert Commit(0, T, keccak(CARRIED), 1) in holder.sent(Commit)
    refusal = _extra_data_check(OVERRIDE, _old_primary_s_extra_data())
    return [Validating(Replica.restore(
        OVERRIDE, None, KEYS[V0[i]], KeyVerifier(), ChainHead(T - 1, GENESIS), b.store,
        block_digest=keccak, schedule=EpochSchedule.genesis(OVERRIDE),
        signing_bound=b.replica.signing_bound), refusal) for i, b in enumerate(before)]


def _deliver(source: Driven, target: Driven, kind: type[M], view: int) -> None:
    """`source`'s message of `kind` for `view` to `target`, and the carried block's body if
    it asks for it."""
    actions = target.step(MessageReceived(WireMessage(_own(source, kind, view)).encode()))
    if FetchBlock(T, keccak(CARRIED)) in actions:
        target.step(BlockReceived(T, keccak(CARRIED), CARRIED))


# Fixed (finding 3, see the module's doc).
def test_the_survivors_commit_block_37_after_carrying_the_old_set_s() -> None:
    """`test_override`'s carried block with the adapter's validation: the old primary built
    it with extraData = hash(V0), the set deciding 38 before anyone knew of the override;
    under the override the set deciding 38 is the survivors', so `_validate` refuses it as
    invalid (the primary is faulty, says the core: evidence, view change). The next
    NEW-VIEW is computed from VIEW-CHANGEs whose P still hold it (nobody prepared anything
    else at 37), so it proposes it again, refused again, and so on: the override halts
    for good, with "invalid block" evidence against every member. The block the override
    exists to carry can never be committed; docs/validators.md tells the operator to choose
    T = the highest head + 1, exactly where blocks are in flight."""
    survivors = _survivors_carrying()
    assert all(s.refusal is None for s in survivors)  # the real rule's answer: carried
    primary, backup = survivors[1], survivors[0]  # each asks for view 1; V0[1] leads it
    _deliver(backup, primary, ViewChange, 1)
    _deliver(primary, backup, NewView, 1)
    _deliver(backup, primary, Prepare, 1)
    _deliver(primary, backup, Commit, 1)
    _deliver(backup, primary, Commit, 1)
    for driven in survivors:
        assert any(isinstance(a, CommitBlock) and (a.seq_no, a.digest) == (T, keccak(CARRIED))
                   for a in driven.actions), "the carried block 37 is not committed"


# --- finding 4: a vote right after an override waits for a checkpoint nobody takes -----------

JOINING = (*SURVIVORS, POOL[4])  # "add members by vote afterwards" (docs/validators.md)


def _run(survivors: list[Driven], passed_at: int, last: int) -> None:
    """The survivors exchange every message they broadcast, the primary's blocks are built as
    asked, and the change to JOINING passes in block `passed_at` (the adapter feeds it once
    that block is committed): until nothing more happens or block `last` is executed."""
    seen = [0, 0]
    for _ in range(10 * last):  # (a bound, not a delay: each round delivers what is new)
        moved = False
        for i, driven in enumerate(survivors):
            new, seen[i] = driven.actions[seen[i]:], len(driven.actions)
            for action in new:
                moved = True
                if isinstance(action, Broadcast):
                    survivors[1 - i].step(MessageReceived(action.data))
                elif isinstance(action, BuildBlock):
                    driven.step(BlockBuilt(action.seq_no, digest(action.seq_no),
                                           block(action.seq_no), ()))
                elif isinstance(action, FetchBlock):
                    driven.step(BlockReceived(action.seq_no, action.digest,
                                              block(action.seq_no)))
                elif isinstance(action, CommitBlock) and action.seq_no == passed_at:
                    driven.step(ScheduleChange(JOINING, passed_at))
        if not moved or all(d.replica.last_exec >= last for d in survivors):
            return


def _installed(override_at: int) -> list[tuple[int, tuple[bytes, ...]]]:
    """Two of four genesis validators gone, the survivors restarted on an override at
    `override_at` (their heads at the block before it) vote a third member in at once (the
    vote passes in the override's first block): the set each has installed once nothing
    more happens (the new member's own votes are not driven here), and its head."""
    params = dataclasses.replace(PARAMS, transitions=((override_at, SURVIVORS),))
    survivors = [replica_at(i, override_at - 1, params) for i in (0, 1)]
    _run(survivors, override_at, 60)
    return [(d.replica.last_exec, d.replica.epochs.current.validators) for d in survivors]


# Fixed (finding 4, see the module's doc).
def test_a_member_voted_in_right_after_the_override_joins() -> None:
    """The two survivors of `test_override` (T = 37, K = 10) restart and vote a third member
    in at once: the vote passes in block 37. `EpochSchedule.schedule` puts its handover at
    max(40, T - 1 + K) = 46 (one change per K heights after the override's first), not a
    multiple of K; replicas send CHECKPOINTs only at multiples of K, so 46 never becomes
    stable, the high watermark stays capped at 46, and nothing above it is ever proposed:
    the chain halts for good at 46 (a change passing in 37 or 38 does this; the docs say
    "add members by vote afterwards")."""
    outcome = _installed(T)
    assert [validators for _, validators in outcome] == [JOINING, JOINING], (
        f"halted at {[head for head, _ in outcome]} without the new set")


def test_a_member_voted_in_right_after_an_override_on_a_checkpoint_joins() -> None:
    """The control: the same with the override at 41 (40 is a checkpoint): the handover is
    50, the survivors' CHECKPOINTs make it stable and install the new set (n = 3, Q = 2:
    the two commit its first block, 51)."""
    outcome = _installed(41)
    assert [validators for _, validators in outcome] == [JOINING, JOINING]
    assert all(head > 50 for head, _ in outcome)  # (the new set's first block, owed)
