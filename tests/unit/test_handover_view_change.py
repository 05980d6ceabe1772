"""A view change under way across the handover (core.handover; docs/epochs.md, "Views stay
monotonic across epochs"): a replica whose VIEW-CHANGE is the old epoch's asks for the next
view one new-view timeout after the new epoch is installed (unless the old set's NEW-VIEW of
its view comes first), also when it could not yet at the install.

Membership seed 662 at N = 6 (6 -> 5, K = 4, c = 12): two members of the new set missed
block 12's commits, timed the primary out and signed VIEW-CHANGE(1) with their stable
checkpoint at 8 (the old epoch's: the new set does not count it). A new-set VIEW-CHANGE(1)
then proved c stable to them and installed the new epoch before they had executed c, so
their VIEW-CHANGE(2) was refused (`Replica._may_view_change`: a replica signs none above
a checkpoint it has not executed); the fetch of c completed a moment later, installed
nothing new, and nothing asked again. The other three waited in view 1 for a fourth
VIEW-CHANGE of their epoch (N - f = 4 of 5), the two for N - f counted ones: for ever.

Same fixture as test_replica_handover.py: four validators, K = 10, a change (4 -> 5)
passed in block 8, so c = 10.
"""

from __future__ import annotations

from pbft_engine.core import FetchCommitted, FetchCompleted, SetTimer, TimerFired, TimerKind
from pbft_engine.core.epochs import Membership
from pbft_engine.core.handover import counts_toward_view
from pbft_engine.core.view_change import verify_view_change
from pbft_engine.messages import Checkpoint, KeyVerifier, ViewChange
from tests.unit.pbft.helpers import PARAMS
from tests.unit.pbft.test_pbft_epochs import ADDED, V0, scheduled, signed
from tests.unit.test_replica_handover import C, backup, digest, state


def test_a_view_change_of_the_old_epoch_moves_on_once_the_handover_checkpoint_executes() -> None:
    driven = backup(2, ADDED, head=C - 1)  # c not committed here: it times the primary
    driven.step(TimerFired(TimerKind.REQUEST, b""))
    [old] = driven.sent(ViewChange)
    assert (old.view, old.stable_seq_no) == (1, 0)  # type: ignore[attr-defined]

    proof = tuple(signed(Checkpoint(C, digest(C), state(C), i), V0) for i in (0, 1, 3))
    fetch = driven.receive(ViewChange(1, C, proof, (), (), 4), ADDED)
    assert driven.replica.epochs.current.validators == ADDED  # c adopted: the new set
    assert FetchCommitted(C, digest(C), state(C)) in fetch
    assert driven.sent(ViewChange) == [old]  # c not executed here: no VIEW-CHANGE above it

    waiting = driven.step(FetchCompleted(C, digest(C), state(C), ()))
    # c executed: it waits one new-view timeout for the old set's NEW-VIEW of view 1 (the
    # others may complete it before the handover: test_attack_review_wire, finding 5) ...
    assert driven.sent(ViewChange) == [old]
    [timer] = [a for a in waiting if isinstance(a, SetTimer) and a.kind is TimerKind.NEW_VIEW]
    driven.step(TimerFired(TimerKind.NEW_VIEW, timer.key))  # ... which never comes here
    new = driven.sent(ViewChange)[-1]
    assert (new.view, new.stable_seq_no) == (2, C), (  # type: ignore[attr-defined]
        "its VIEW-CHANGE(1) is the old epoch's, which the new set never counts")
    installed = Membership(PARAMS.chain_id, scheduled(ADDED).install(C), KeyVerifier())
    verify_view_change(installed, signed(new, ADDED), PARAMS.log_size)
    assert counts_toward_view(installed, signed(new, ADDED))  # the new set counts this one
