"""The second half of a view change (Castro & Liskov, section 4.4): collecting VIEW-CHANGEs
(f+1 to join a later view, N-f for the new primary's NEW-VIEW), the new-view timer, and
taking a NEW-VIEW: its checkpoint, and its O set re-proposed in the new view. Functions of
the replica (`core.replica` starts a view change and calls these; its state is the
replica's), as in `core.handover`. Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pbft_engine.core.actions import CancelTimer
from pbft_engine.core.events import PeerCommitted, TimerKind
from pbft_engine.core.handover import (
    adopt_view_change_checkpoint,
    before_installed,
    complete_proof,
    counts_toward_view,
    offer_stable_proof,
    retime_primary,
    takes_old_new_view,
    unexecuted_by_genesis,
)
from pbft_engine.core.records import META_NEW_VIEW, StoreName, u64
from pbft_engine.core.view_change import (
    NewViewPlan,
    plan_new_view,
    select_view_changes,
    verify_new_view,
    verify_view_change,
)
from pbft_engine.errors import MessageError
from pbft_engine.messages import (
    NewView,
    PrePrepare,
    Signed,
    ViewChange,
    WireMessage,
    decode_commit_certificate,
)

if TYPE_CHECKING:
    from pbft_engine.core.replica import Replica


def on_view_change(replica: Replica, wire: WireMessage[ViewChange],
                   delivered_by: bytes = b"") -> None:
    signed = wire.signed
    body = signed.body
    counts = counts_toward_view(replica.epochs, signed)
    if body.view < replica.view or (body.view == replica.view and replica.active):
        if replica.last_new_view is not None and counts:  # the sender missed our NEW-VIEW
            replica._send(new_view_wire(replica), to=body.replica)
        return
    if not adopt_view_change_checkpoint(replica, signed):
        replica._drop("view-change of another epoch")
        offer_stable_proof(replica, body, delivered_by)
        return
    sender = replica.epochs.current.validators[body.replica]  # (its signature verified)
    held = replica.view_changes.get(sender)
    if held is not None and held.signed.body.view >= body.view:
        if held.signed.body.view == body.view and held.signed.body != body:
            replica._record_evidence(held.signed, signed)
        else:
            replica._drop("duplicate")
        check_view_change_quorum(replica)  # a duplicate re-arms; it never re-sends
        return
    try:
        verify_view_change(replica.epochs, signed, replica.params.log_size)
    except MessageError as exc:
        replica._drop(f"view-change: {type(exc).__name__}")
        return
    complete_proof(replica, body.stable_seq_no, body.checkpoint_proof)
    replica.view_changes[sender] = wire
    check_view_change_quorum(replica)


def check_view_change_quorum(replica: Replica) -> None:
    # f+1 ask for later views: join the lowest (on a duplicate too: it may not have been able)
    higher = [w.signed.body.view for r, w in replica.view_changes.items()
              if r != replica.address and w.signed.body.view > replica.view]
    if len(higher) >= replica.epochs.current.weak_quorum and replica._may_view_change(min(higher)):
        replica._start_view_change(min(higher), "join")
        return
    if replica.active:
        return
    quorum = replica.epochs.current.view_change_quorum
    # (ours too only if of the installed epoch: its checkpoint at or past the handover)
    counted = [w.signed for w in replica.view_changes.values()
               if counts_toward_view(replica.epochs, w.signed)]
    votes = [vc for vc in counted if vc.body.view == replica.view]
    if replica.me == replica.primary and len(votes) >= quorum:
        send_new_view(replica, votes)
        return
    # N-f replicas want at least this view: wait for NEW-VIEW, then move on. Counting
    # replicas that already moved further keeps a split (some at v, some at v+1) live.
    at_least = sum(vc.body.view >= replica.view for vc in counted)
    if at_least >= quorum and not replica.new_view_timer_armed:
        replica._arm_new_view_timer()


def send_new_view(replica: Replica, votes: list[Signed[ViewChange]]) -> None:
    chosen = select_view_changes(replica.epochs.current, votes)
    plan = plan_new_view([vc.body for vc in chosen])
    pre_prepares = tuple(replica._sign(PrePrepare(replica.view, n, d, replica.me))
                         for n, d in plan.entries)
    new_view = replica._sign(NewView(replica.view, chosen, pre_prepares, replica.me))
    replica._broadcast(new_view)
    install_new_view(replica, new_view, plan)


def new_view_wire(replica: Replica) -> WireMessage[NewView]:
    assert replica.last_new_view is not None
    return WireMessage(replica.last_new_view)


def on_new_view(replica: Replica, wire: WireMessage[NewView]) -> None:
    signed = wire.signed
    body = signed.body
    if body.view < replica.view or (body.view == replica.view and replica.active) or (
            before_installed(replica.epochs, body)  # the old set's, for heights done here
            and not takes_old_new_view(replica, body)):
        if body.view == replica.view and not (replica.active or replica.new_view_timer_armed):
            # Members are active in this view, and leave it only for f + 1 VIEW-CHANGEs:
            # wait one new-view timeout, then ask for the next (with one member down,
            # nobody moved again otherwise: the attack review core8, finding 3).
            replica._arm_new_view_timer()
        replica._drop("stale new-view")
        return
    try:
        plan = verify_new_view(replica.epochs, replica.params.log_size, signed)
    except MessageError as exc:
        replica._drop(f"new-view: {type(exc).__name__}")
        return
    if unexecuted_by_genesis(replica, plan.min_s, plan.checkpoint_proof):
        replica._drop("new-view on an override not reached here")
        return
    if body.view > replica.view:  # we never asked for this view: the others moved on
        replica._count_view_change("new_view")
    replica.view = body.view
    install_new_view(replica, signed, plan)


def install_new_view(replica: Replica, new_view: Signed[NewView], plan: NewViewPlan) -> None:
    enter_view(replica)
    replica.last_new_view = new_view
    replica._put(StoreName.META, META_NEW_VIEW, new_view.encode())
    replica._put(StoreName.NEW_VIEWS, u64(new_view.body.view), new_view.encode())
    adopt_checkpoint(replica, plan)
    if replica.left:  # its checkpoint installed an epoch without this replica
        return
    # The NEW-VIEW names blocks by digest; the copies held here were checked against
    # theirs on arrival, and a body missing here is fetched when it is needed.
    kept = {(n, d): replica.log.block_for(n, d) for n, d in plan.entries}
    replica.log.clear_block_store()
    replica.log.forget_view_messages_below(replica.view)
    for pre_prepare in new_view.body.pre_prepares:
        body = pre_prepare.body
        adopt_pre_prepare(replica, pre_prepare, kept[(body.seq_no, body.digest)])
    go_on_in_view(replica, max((n for n, _ in plan.entries), default=0))


def join_certified_view(replica: Replica, event: PeerCommitted) -> None:
    """Views are monotonic across epochs, but a NEW-VIEW counts only in its own epoch (one of
    an epoch older than the one just replaced may be forged with retired keys: the attack
    review core8): a replica that missed a view change and caught up past later handovers
    would wait in its older view while the others go on in the newer one (chaos seed 4 at
    N = 7). A commit certificate of the installed epoch's set in view v, for a height it
    decides, proves that a quorum of that set was active in v: the replica goes there,
    active, unless it holds a block prepared above its head (the move carries no P set; a
    block committed below v had Q - f correct replicas prepare it, which hold it prepared
    until they execute it, so they move only by VIEW-CHANGE and NEW-VIEW, which carry it).
    docs/epochs.md, "A view proved by a commit certificate"."""
    epochs = replica.epochs
    if replica.left or epochs.schedule.epoch_at(event.seq_no) != epochs.current or (
            replica.log.prepared_above(replica.last_exec)):
        return
    try:
        view = decode_commit_certificate(event.certificate)[0].body.view
        if view < replica.view or (view == replica.view and replica.active):
            return
        epochs.verify_certificate(event.certificate, event.seq_no, event.block_hash)
    except (MessageError, IndexError):  # (IndexError: no COMMIT in it)
        return
    if view > replica.view:  # the others moved on without us, as with a NEW-VIEW not asked for
        replica._count_view_change("new_view")
    replica.view = view
    enter_view(replica)
    replica.log.forget_view_messages_below(view)
    go_on_in_view(replica, 0)


def enter_view(replica: Replica) -> None:
    """Active in `replica.view`: its view change's timers stop, and the primary builds anew
    (on O, if a NEW-VIEW brought it there)."""
    replica._out.append(CancelTimer(TimerKind.NEW_VIEW, u64(replica.view)))
    replica._out.append(CancelTimer(TimerKind.VIEW_CHANGE_RESEND, u64(replica.view)))
    replica.active, replica.new_view_timer_armed = True, False
    replica.proposed, replica.held = {}, None


def go_on_in_view(replica: Replica, top: int) -> None:
    """The rest of entering a view: the next seqNo follows the head and `top` (O's last),
    every waiting request is timed and relayed anew, and what was held for it is taken."""
    replica.seq_no = max(replica.low_watermark, replica.last_exec, top)
    replica._persist_meta()
    replica._check_recovered()
    replica._new_oldest()  # the new primary gets the whole bound again
    replica._arm_trailing_block()
    replica.relayed = set()  # and every waiting request
    retime_primary(replica)  # armed in the old view; a new primary times no one
    replica.future = {k: w for k, w in replica.future.items() if w.signed.body.view >= replica.view}
    replica._replay_future()
    replica._advance()


def adopt_checkpoint(replica: Replica, plan: NewViewPlan) -> None:
    """min-s is proven stable by V: move there, and fetch it if we have not executed it."""
    if plan.min_s <= replica.stable_checkpoint:
        complete_proof(replica, plan.min_s, plan.checkpoint_proof)
    else:
        replica._adopt_stable(plan.min_s, plan.checkpoint_proof)


def adopt_pre_prepare(replica: Replica, pre_prepare: Signed[PrePrepare],
                      block: bytes | None) -> None:
    body = pre_prepare.body
    if body.seq_no <= replica.low_watermark:
        return
    replica._accept_pre_prepare(pre_prepare, block)
    if body.seq_no <= replica.last_exec:  # already in the chain: agree again, never re-execute
        if replica.log.certified.get(body.seq_no, (body.digest,))[0] != body.digest:
            replica._alarm("new_view", f"new view re-proposes another block at {body.seq_no}")
            return
        replica._mark_validated(body.view, body.seq_no)
