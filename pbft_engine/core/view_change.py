"""VIEW-CHANGE / NEW-VIEW rules as pure functions: verification and the recomputation of O.

Prepared certificates in VIEW-CHANGE messages carry their signed PRE-PREPARE and PREPAREs, so
the new primary and every replica can pick, for each seqNo above the highest stable checkpoint
in V (min-s), the prepared block of the highest view (Castro & Liskov's signed variant; Fabric
v0.6's unsigned P/Q sets need the extra Q-set vote rules instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pbft_engine.core.epochs import Epoch, Membership, message_height
from pbft_engine.errors import CertificateError, MessageError
from pbft_engine.messages import (
    Checkpoint,
    NewView,
    Signed,
    ViewChange,
)


@dataclass(frozen=True)
class NewViewPlan:
    """What V implies: min-s, its checkpoint proof, and O as (seqNo, digest) sorted by seqNo."""

    min_s: int
    checkpoint_proof: tuple[Signed[Checkpoint], ...]
    entries: tuple[tuple[int, bytes], ...]


def verify_view_change(membership: Membership, signed: Signed[ViewChange],
                       log_size: int | None = None) -> None:
    """The P and Q sets' shape (in the window of `log_size` L above the checkpoint, when
    given: see `ViewChange.check_sets`) before any signature, then the signature, checkpoint
    proof C and every prepared certificate in P, each with the set of its own height's epoch
    (C of the checkpoint's: a handover checkpoint is the old set's); raises MessageError."""
    vc = signed.body
    if vc.view == 0:
        raise MessageError("view-change to view 0")
    vc.check_sets(log_size)
    membership.verify(signed)
    membership.verify_checkpoint_proof(vc.stable_seq_no, vc.checkpoint_proof)
    for proof in vc.pset:
        membership.verify_prepared_proof(proof)


def plan_new_view(view_changes: Sequence[ViewChange]) -> NewViewPlan:
    """Recompute O from V deterministically.

    min-s is the highest stable checkpoint in V. For each seqNo above it the prepared
    certificate of the highest view wins (ties: the larger digest, only reachable with more
    than f faults). O is contiguous from min-s + 1 and ends at the first seqNo nobody prepared:
    a block's parent is the block before it, so nothing above a gap can ever be valid; the new
    primary proposes fresh blocks from there (this is what the empty "null request" of
    Castro & Liskov does for a gap in an ordered log).
    """
    best = max(view_changes, key=lambda vc: vc.stable_seq_no)
    min_s = best.stable_seq_no
    # Ranked by epoch first: a certificate an override carries from the epoch before it
    # (`Membership.verify_prepared_proof`) never outranks one of the override's own set,
    # whatever its view (the carried blocks' attack review, finding 1).
    chosen: dict[int, tuple[int, int, bytes]] = {}
    for vc in view_changes:
        for proof in vc.pset:
            if proof.seq_no > min_s:
                candidate = (proof.pre_prepare.body.epoch, proof.view, proof.digest)
                chosen[proof.seq_no] = max(chosen.get(proof.seq_no, candidate), candidate)
    entries = []
    seq_no = min_s + 1
    while seq_no in chosen:
        entries.append((seq_no, chosen[seq_no][2]))
        seq_no += 1
    return NewViewPlan(min_s, best.checkpoint_proof, tuple(entries))


def select_view_changes(
    epoch: Epoch, view_changes: Sequence[Signed[ViewChange]]
) -> tuple[Signed[ViewChange], ...]:
    """The V a new primary sends: the N-f messages of the lowest replica indices among
    those of `epoch` (the installed one), which decides the heights above their checkpoints:
    a lagging replica's, whose checkpoint is below the epoch's first height, is another
    epoch's, and every replica refuses a NEW-VIEW that mixes them (`verify_new_view`)."""
    ordered = sorted((vc for vc in view_changes if message_height(vc.body) >= epoch.first),
                     key=lambda s: s.body.replica)
    return tuple(ordered[: epoch.view_change_quorum])


def verify_new_view(
    membership: Membership, log_size: int, signed: Signed[NewView]
) -> NewViewPlan:
    """Check a NEW-VIEW completely and return the plan it must follow; raises MessageError.

    Its epoch is that of the heights it decides (above min-s): the primary is that epoch's,
    and its N-f VIEW-CHANGEs must all be of that epoch (replica i of another epoch's set is
    another validator, and would count toward the wrong quorum)."""
    nv = signed.body
    epoch = membership.schedule.epoch_at(message_height(nv))
    if nv.replica != epoch.primary(nv.view):
        raise MessageError("new-view not from the primary of its view")
    membership.verify(signed)
    senders = {vc.body.replica for vc in nv.view_changes}
    if len(senders) != len(nv.view_changes) or len(senders) < epoch.view_change_quorum:
        raise CertificateError("new-view: too few distinct view-change messages")
    for vc in nv.view_changes:
        if vc.body.view != nv.view:
            raise MessageError("new-view: a view-change for another view")
        if membership.schedule.epoch_at(message_height(vc.body)) != epoch:
            raise MessageError("new-view: a view-change of another epoch")
        verify_view_change(membership, vc, log_size)
    for pp in nv.pre_prepares:
        if (pp.body.view, pp.body.replica) != (nv.view, nv.replica):
            raise MessageError("new-view: a pre-prepare for another view or primary")
        if membership.schedule.epoch_at(pp.body.seq_no) != epoch:
            raise MessageError("new-view: a pre-prepare for a height of another epoch")
    plan = plan_new_view([vc.body for vc in nv.view_changes])
    issued = tuple((pp.body.seq_no, pp.body.digest) for pp in nv.pre_prepares)
    if issued != plan.entries:
        raise MessageError("new-view: O differs from the recomputation from V")
    for pp in nv.pre_prepares:
        membership.verify(pp)
    return plan

