"""Attack review of 8ae74de (session 11): a member that drops a VIEW-CHANGE of an older
epoch from a member of the installed set sends it the proof of its stable checkpoint
(`handover.offer_stable_proof`), and a replica whose stable checkpoint is below the installed
epoch keeps CHECKPOINTs below its low watermark and adopts Q matching ones
(`handover.adopt_offered_checkpoint`). At most f byzantine members (of the set that signs
the heights in question) and a network that delays, drops, duplicates or reorders. Each
finding was a strict xfail naming the interleaving (it asserts the outcome only); all
three are fixed in session 11 (the tests now hold):

- 1: offers are kept by the member that delivered them (`Replica.offers`), so a signer's
  forged CHECKPOINT, sent first over its own link, is not in an honest member's offer;
- 2: only a VIEW-CHANGE its signer delivered is answered, at most `OFFERS_PER_CHECKPOINT`
  times a member and stable checkpoint;
- 3: an offer contradicting the replica's own CHECKPOINT raises `checkpoint_conflict`.

1. The fix is undone by one byzantine member of the old set: a CHECKPOINT at c kept first
   from a signer pre-empts that signer's CHECKPOINT in the offered proof, so the stranded
   replica never holds Q matching and stays stranded, with no evidence recorded.
2. Traffic on another's command: a relayed (or replayed) old-epoch VIEW-CHANGE of an honest
   replica draws Q CHECKPOINTs to that replica per copy, with no bound, charged at the
   target to the honest member that sends them.
3. Defence in depth: a replica adopts an offered checkpoint whose state root contradicts
   its own signed CHECKPOINT at that height, where the same CHECKPOINTs in its window raise
   the `checkpoint_conflict` alarm.
"""

from __future__ import annotations

import pytest
from eth_hash.auto import keccak

from pbft_engine.core import (
    Alarm,
    Broadcast,
    FetchCompleted,
    MessageReceived,
    PeerCommitted,
    RequestReceived,
    SendTo,
    TimerFired,
    TimerKind,
)
from pbft_engine.messages import (
    Checkpoint,
    Commit,
    ViewChange,
    WireMessage,
    encode_commit_certificate,
)
from tests.unit.pbft.test_pbft_epochs import ADDED, REMOVED, V0, signed
from tests.unit.test_replica_handover import (
    C,
    Driven,
    backup,
    checkpoint_from,
    commit_through,
    digest,
    fetch_past_c,
    state,
    stranded_past_c,
)

# --- finding 1: a CHECKPOINT kept first pre-empts the offered proof's ----------------------


def forged_checkpoint(replica: int) -> Checkpoint:
    """A CHECKPOINT at c for another block than the chain's (signed in epoch 0)."""
    return Checkpoint(C, keccak(b"forged block"), keccak(b"forged state"), replica)


def stranded_after_a_removal(planter: int | None) -> Driven:
    """The seeds' own 4 -> 3 (simulator seeds 313 and 40: V0[0] removed, f = 0 in the new
    set): V0[2] asks for view 1 in epoch 0, then catches up by a fetch to 13, past c (the
    certificate of 13 is two of the three: Q = 2). Before the fetch, while c is still in its
    window, V0[planter] (byzantine: one of the old set's f = 1) sends it a CHECKPOINT at c
    for another block, which is kept (one of f + 1 raises no alarm)."""
    driven = backup(2, REMOVED)
    driven.step(RequestReceived(keccak(b"a transfer")))
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    assert driven.replica.view == 1 and not driven.replica.active
    if planter is not None:
        driven.receive(forged_checkpoint(planter), V0)  # its own link: b"" here, as any
    certificate = encode_commit_certificate(
        signed(Commit(0, 13, digest(13), i), REMOVED) for i in (0, 2))
    driven.step(PeerCommitted(13, digest(13), certificate))
    driven.step(FetchCompleted(13, digest(13), state(13), ()))
    replica = driven.replica
    assert replica.epochs.current.validators == REMOVED and replica.stable_checkpoint == 0
    assert replica.low_watermark == 13 and not replica.halted
    return driven


def stranded_after_an_addition(planter: int | None) -> Driven:
    """`stranded_past_c` (4 -> 5, f = 1 in both sets); then V0[planter], a member of both
    sets, answers its epoch-0 VIEW-CHANGE first, with a CHECKPOINT at c for another block
    (below the low watermark now: kept by `adopt_offered_checkpoint`)."""
    driven = stranded_past_c()
    if planter is not None:
        driven.receive(forged_checkpoint(planter), V0)
    return driven


# (how the replica was stranded, the byzantine signer of the old set)
STRANDINGS = {"removal": (stranded_after_a_removal, 0),
              "addition": (stranded_after_an_addition, 3)}


@pytest.mark.parametrize("case", list(STRANDINGS))
def test_without_a_forgery_the_offered_proof_is_adopted(case: str) -> None:
    """The control: the same interleavings without the forged CHECKPOINT adopt c."""
    stranded, _ = STRANDINGS[case]
    driven = stranded(None)
    checkpoint_from(driven, (0, 1, 3))
    assert driven.replica.stable_checkpoint == C


def offer(driven: Driven, by: bytes) -> None:
    """An honest member's offer: the old set's Q CHECKPOINTs at c, delivered by `by`."""
    for i in (0, 1, 3):
        wire = WireMessage(signed(Checkpoint(C, digest(C), state(C), i), V0, 0))
        driven.step(MessageReceived(wire.encode(), by))


@pytest.mark.parametrize("case", list(STRANDINGS))
def test_a_forged_checkpoint_kept_first_cannot_keep_a_replica_stranded(case: str) -> None:
    """The proof every honest member offers at c is the old set's Q = 3 CHECKPOINTs of V0[0],
    V0[1] and V0[3] (the stranded V0[2] signed none: it fetched past c). One byzantine
    signer among them (the old set's f = 1), V0[0] (the one removed) or V0[3] (a member of
    both sets), sends the stranded replica a CHECKPOINT at c for another block
    before the offers arrive: in its window (kept, one vote raises no alarm), or below its
    low watermark (kept by `adopt_offered_checkpoint`); meanwhile it signs the genuine one
    for everybody else. `adopt_offered_checkpoint` keeps a signer's first CHECKPOINT only
    (`checkpoints.held`), so the genuine one in every offer is dropped: two matching of
    Q = 3, at every resend. The replica stays stranded as before 8ae74de (until a later
    checkpoint is stable here with its own CHECKPOINT, which needs the set to commit that far
    without a view change; in a set of three the next view change needs it: the seeds'
    halt), though two correct members and the forger signed the chain's block; and the
    forger's two signed CHECKPOINTs at c, which prove it faulty, are recorded nowhere (the
    window's path records such a pair as evidence: `Replica._on_checkpoint`)."""
    stranded, planter = STRANDINGS[case]
    driven = stranded(planter)
    if planter is not None:  # the forger's own link delivers a forged one at c, below h too
        driven.step(MessageReceived(WireMessage(signed(forged_checkpoint(planter), V0, 0))
                                    .encode(), V0[planter]))
    offer(driven, V0[1])  # an honest member's offer, after the forgeries
    assert driven.replica.stable_checkpoint == C, "stranded: two matching CHECKPOINTs of Q = 3"


# --- finding 2: a relayed old-epoch VIEW-CHANGE draws a proof per copy ---------------------


def offers_to(driven: Driven, since: int) -> list[SendTo]:
    return [a for a in driven.actions[since:] if isinstance(a, SendTo)
            and isinstance(WireMessage.decode(a.data).signed.body, Checkpoint)]


def test_a_relayed_old_epoch_view_change_draws_no_stream_of_proofs() -> None:
    """4 -> 5 (f = 1 in both sets). V0[2] is stranded past c (`stranded_past_c`) and
    broadcasts its VIEW-CHANGE of view 1 in epoch 0, which every member keeps (signed,
    replayable). V0[1], stable at c in the new epoch and active in view 0, answers each copy
    it gets with the 3 CHECKPOINTs of its stable checkpoint, sent to the signer, whoever
    delivered the copy (`on_view_change` does not know: only phase messages are told).
    V0[3], byzantine, relays that VIEW-CHANGE to every honest member over and over: each
    copy costs it 172 us of its budget at the member (decoding, one signature), and costs
    the member 3 x 75 us of its own budget at V0[2] (medians of `Replica.step`, this
    machine, the same copies each time, so every signature is in `KeyVerifier`'s cache on
    both sides: 1.3x; the proof is the old set's Q CHECKPOINTs at c, so the factor grows with
    the set: about 2.2x at N = 7, 9x at N = 31), 79 bytes in and 426 out. Spending its
    whole budget at each member (`peer_budget`: 0.2 s a second), the relayer keeps every
    honest member over its rate at V0[2], which spends 0.2 s a second on each one's copies,
    drops about 1 - 1/1.3 (a quarter) of everything else that member sends it (PREPAREs,
    COMMITs, VIEW-CHANGEs, block sync's answers alike) and counts the member as a fault;
    more than half at N = 7, nearly all at N = 31, where V0[2] is cut off: with it and the
    relayer out, f + 1 members of the set are lost. The copy stays a trigger as long
    as the members are in view <= 1 (active in view 0 for good on a healthy chain), even
    after V0[2] left view 1. After 8ae74de only: the old code answered none of them."""
    stranded = stranded_past_c()
    [view_change] = [a.data for a in stranded.actions if isinstance(a, Broadcast)
                     and isinstance(WireMessage.decode(a.data).signed.body, ViewChange)][:1]
    member = backup(1, ADDED)
    commit_through(member, C)
    checkpoint_from(member, (0, 3))
    assert member.replica.stable_checkpoint == C and member.replica.view == 0
    before = len(member.actions)
    for _ in range(10):  # relayed by V0[3], not sent by V0[2]
        member.step(MessageReceived(view_change, V0[3]))
    offered = offers_to(member, before)
    assert {a.replica for a in offered} <= {ADDED.index(V0[2])}
    assert len(offered) <= 3, f"{len(offered)} CHECKPOINTs sent to V0[2] for 10 relayed copies"


# --- finding 3: an offered checkpoint contradicting the replica's own is adopted, no alarm ---


def others_checkpoints_with_another_root(driven: Driven) -> None:
    """The old set's Q = 3 others vouch at c for the chain's block with a state root other
    than the one this replica computed (its executor diverged: nondeterminism, a bug)."""
    for i in (0, 1, 3):
        driven.receive(Checkpoint(C, digest(C), keccak(b"the others' state"), i), V0)


def conflict_alarms(driven: Driven) -> list[Alarm]:
    return [a for a in driven.actions if isinstance(a, Alarm) and a.kind == "checkpoint_conflict"]


def test_a_checkpoint_contradicting_its_own_in_the_window_raises_the_alarm() -> None:
    """The control: V0[2] executed c itself (its CHECKPOINT at c carries its state root);
    the others' CHECKPOINTs with another root arrive in its window: the alarm."""
    driven = backup(2, ADDED)
    commit_through(driven, C)
    others_checkpoints_with_another_root(driven)
    assert conflict_alarms(driven) and driven.replica.halted


def test_an_offered_checkpoint_contradicting_its_own_raises_the_alarm() -> None:
    """V0[2] executes c itself and signs its CHECKPOINT (its own state root); the others'
    CHECKPOINTs at c are delayed, its request timer runs out (view 1, epoch 0), and it then
    catches up by a fetch to 13: its stable checkpoint is epoch 0's. The others' CHECKPOINTs
    at c (a state root other than its own) now arrive below its low watermark, as offered
    proofs do: `adopt_offered_checkpoint` counts the most vouched-for value (3 of Q = 3)
    and makes c stable with it, though this replica signed another root there; it then
    asks for a view of the new epoch and goes on with a state the others never had, with
    no alarm. The same three CHECKPOINTs in its window raise `checkpoint_conflict` (the
    control above). Before 8ae74de they were dropped (stranded, no alarm either); the
    adoption now carries the divergent replica back into the protocol. Not reachable by a
    byzantine peer (Q matching need honest signers), only by this replica's own
    divergence: defence in depth, as the window's check is."""
    driven = backup(2, ADDED)
    driven.step(RequestReceived(keccak(b"a transfer")))
    commit_through(driven, C)
    assert driven.replica.checkpoints.mine(C) is not None
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    assert driven.replica.view == 1 and not driven.replica.active
    fetch_past_c(driven)
    assert driven.replica.low_watermark == 13 and driven.replica.stable_checkpoint == 0
    others_checkpoints_with_another_root(driven)
    assert conflict_alarms(driven), (
        f"stable at {driven.replica.stable_checkpoint} with a root its own CHECKPOINT denies")
