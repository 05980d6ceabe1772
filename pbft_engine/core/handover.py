"""The handover between epochs: the rules a replica follows while a validator-set change is
scheduled and when it takes effect (DESIGN.md section 10; research/membership.md sections
8.3 and 8.4, items R2 and R4).

A change that passed in committed block b takes effect after the handover checkpoint c
(`epochs.handover_checkpoint`). Until the checkpoint at c is stable with a quorum of the OLD
set, the high watermark stops at c: nothing above it is pre-prepared, prepared or committed,
and the messages for heights above it are held (in the replica's bounded buffer of messages
it cannot take yet) and taken once the new epoch is installed. The primary proposes blocks up
to c even with nothing to order, so the boundary is always reached (besu#7873: a Besu chain
with empty blocks off never reached the block at which its vote took effect). Each replica
is a member by its address; its index is its place in each epoch's set, so a removed
validator stops at c and an added one starts there (`Replica.join`). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from pbft_engine.core.actions import LeftValidatorSet, RelayRequests, SendTo
from pbft_engine.core.epochs import EpochSchedule, Membership, message_height
from pbft_engine.core.events import ScheduleChange
from pbft_engine.core.joining import relayed_copy
from pbft_engine.core.records import VIEW_MESSAGE_SEQ_NO, signed_key
from pbft_engine.core.signing_bound import SigningBound
from pbft_engine.core.view_change import verify_view_change
from pbft_engine.errors import ConfigError, MessageError
from pbft_engine.messages import (
    Body,
    Checkpoint,
    MessageType,
    NewView,
    PreparedProof,
    Signed,
    ViewChange,
    WireMessage,
)

if TYPE_CHECKING:
    from pbft_engine.core.replica import Replica

# How many times a member sends a stranded member the proof of one stable checkpoint
# (`offer_stable_proof`): one answer may be lost, and a faulty member draws no stream.
OFFERS_PER_CHECKPOINT = 3


def high_watermark(low_watermark: int, log_size: int, schedule: EpochSchedule) -> int:
    """H = h + L, stopped at the handover checkpoint c while a change is scheduled (R2)."""
    top, cap = low_watermark + log_size, schedule.high_watermark_cap()
    return top if cap is None else min(top, cap)


def beyond_handover(schedule: EpochSchedule, seq_no: int, window_top: int) -> bool:
    """A message for a height above c that the window h + L would hold without the cap:
    kept until the new epoch is installed (then taken as any other), not dropped."""
    cap = schedule.high_watermark_cap()
    return cap is not None and cap < seq_no <= window_top


def installed_by(schedule: EpochSchedule, stable_checkpoint: int, last_executed: int,
                 address: bytes) -> EpochSchedule:
    """What this replica's progress installs: a stable checkpoint at or above c (its own,
    or one a NEW-VIEW proves), or a block above c executed here (fetched or committed on a
    peer's certificate): a quorum of the new set committed that block, and a correct member
    of it votes above c only once the checkpoint at c was stable there. A removed validator
    leaves only on such a block: until then some member may still lack its CHECKPOINT at c,
    which it sends again (`awaiting_handover`; the handover needs Q of the OLD set, and
    Sawtooth PBFT warns against shutting a removed node down early)."""
    by_execution = schedule.install_executed(last_executed)
    installed = by_execution.install(stable_checkpoint)
    return installed if address in installed.current.validators else by_execution


def owes_block(schedule: EpochSchedule, top: int) -> bool:
    """While a change is scheduled, the primary proposes (empty if need be) every block up
    to c, whatever `empty_blocks` says: nothing else makes the boundary come (R4); and then
    the new set's first block, c + 1, which proves the handover to every replica that
    missed it (a block above c installs the new set) and lets a removed validator leave."""
    cap = schedule.high_watermark_cap()
    if cap is not None and schedule.epochs[schedule.installed + 1].override:
        return False  # an override is no handover: its block comes at the chain's pace
    end = cap if cap is not None else schedule.current.first if schedule.current.number else 0
    return top < end


def awaits_primary(replica: Replica) -> bool:
    """What a backup times the primary for with its request timer: requests waiting, or a
    block the primary owes to the handover (`owes_block`, from the head executed here).
    Without the latter, a primary that does not bring the boundary (faulty, or in a view
    change of its own) is never replaced, and the handover stalls for good (membership
    seed 202 at N = 4)."""
    return bool(replica.requests) or owes_block(replica.epochs.schedule, replica.last_exec)


def retime_primary(replica: Replica) -> None:
    """The request timer starts over (a new view, a committed block): armed again while
    the backup still waits on the primary (`awaits_primary`), cancelled otherwise."""
    replica._cancel_request_timer()
    if awaits_primary(replica):
        replica._arm_request_timer()


def forget_unproven(replica: Replica, first: int, keep_verified_prepared: bool = False) -> None:
    """What this replica verified and held for heights from `first` on while it counted
    them in the old epoch (the future buffer, the certStore's votes, CHECKPOINTs), checked
    again with the set that decides them now, and forgotten if it fails: a replica index
    names another member there, so a removed validator's early messages would otherwise be
    counted as a member's (the handover's attack review, finding 1). No correct replica
    sends a message for a height above the handover checkpoint before it knows the change
    (the primary proposes at most max_in_flight past its last commit, and c >= b +
    max_in_flight), so only such early messages are lost. The P and Q sets there go too:
    a prepared certificate counted with the old set proves nothing in the new epoch."""
    def proven(signed: Signed[Body]) -> bool:
        try:
            replica.epochs.verify(signed)
        except MessageError:
            return False
        return True

    def certifies(seq_no: int, digest: bytes, certificate: bytes) -> bool:
        try:
            replica.epochs.verify_certificate(certificate, seq_no, digest)
        except MessageError:
            return False
        return True

    def prepared(proof: PreparedProof) -> bool:
        try:
            replica.epochs.verify_prepared_proof(proof)
        except MessageError:
            return False
        return True

    replica.future = {k: w for k, w in replica.future.items()
                      if k[2] < first or proven(w.signed)}
    replica.log.forget_unproven(first, proven, certifies,
                                prepared if keep_verified_prepared else None)
    replica.checkpoints.forget_unproven(first, proven)


def joining_checkpoint(schedule: EpochSchedule, address: bytes, head: int) -> int:
    """The handover checkpoint at which a validator that followed the chain up to `head`
    joins: that of the epoch deciding head + 1, which must count `address` among its
    members (0 for the genesis set)."""
    epoch = schedule.epoch_at(head + 1)
    if epoch.index(address) is None:
        raise ConfigError(f"0x{address.hex()} is not in the set of epoch {epoch.number}, "
                          f"which decides block {head + 1}")
    return epoch.first - 1


def counts_toward_view(membership: Membership, signed: Signed[ViewChange]) -> bool:
    """A VIEW-CHANGE counts (toward f+1 to join, N-f to change view, and a NEW-VIEW's V)
    only if it is of the installed epoch: the heights above its checkpoint are decided by
    the installed set, so its signer is a member of it. A removed validator's, or a lagging
    replica's whose checkpoint is below c, belongs to the old epoch, and its replica index
    there names another member (or none) here (the attacker's review, findings 7 and 8)."""
    return membership.schedule.epoch_at(message_height(signed.body)) == membership.current


def before_installed(membership: Membership, body: Body) -> bool:
    """A message for heights of an epoch before the installed one (a NEW-VIEW of the old
    set's view changes): those heights are done here."""
    return membership.schedule.epoch_at(message_height(body)).number < membership.current.number


# --- the replica's steps at a handover ---------------------------------------------------
# Functions of the replica (`core.replica` calls them): its state is the replica's, the rules
# are here, beside the ones above.


def schedule_change(replica: Replica, event: ScheduleChange) -> None:
    """A change passed in a block committed here: scheduled (once), the watermark capped."""
    known = replica.epochs.schedule
    try:
        replica.epochs.schedule = known.schedule(event.validators, passed_at=event.passed_at)
    except ConfigError as exc:  # the adapter read another history than the one fed
        replica._alarm("schedule", str(exc))
        return
    if replica.epochs.schedule is not known:  # (it may come before an override: not last)
        change = (event.passed_at, tuple(event.validators))
        forget_unproven(replica, next(e.first for e in replica.epochs.schedule.epochs
                                      if (e.passed_at, e.validators) == change))
    install(replica)  # a catch-up may have executed past its handover already
    if replica.active and not replica.request_timer_armed:
        retime_primary(replica)  # the backups time the blocks it owes up to the handover
    replica._maybe_propose()  # the primary's blocks up to the handover


def take_installed(replica: Replica) -> bool:
    """Install what the stable checkpoint and the head install; who this replica is in
    the installed epoch. True if an epoch was installed."""
    schedule = installed_by(replica.epochs.schedule, replica.stable_checkpoint,
                            replica.last_exec, replica.address)
    installed, replica.epochs.schedule = schedule is not replica.epochs.schedule, schedule
    index = schedule.current.index(replica.address)
    replica.left, replica.me = index is None, -1 if index is None else index
    return installed


def install(replica: Replica) -> None:
    """A new epoch is installed here: its set decides everything above h, which moves
    to its handover checkpoint at least (the old epoch's heights are done here); the
    messages held for its heights are taken. A replica outside its set leaves. Called
    after every execution too, for a view change the install had to put off."""
    if not take_installed(replica):
        leave_old_epoch_view(replica)
        return
    # Messages to one replica name it by its index in the installed epoch as the step ends
    # (`SendTo`): those of this step went to members of the old one (relays to its primary,
    # a NEW-VIEW to a sender of its VIEW-CHANGE), which the new indices no longer name.
    replica._out = [a for a in replica._out if not isinstance(a, SendTo | RelayRequests)]
    if replica.left:
        replica._out.append(left_action(replica))
        return
    enter_epoch(replica)


def take_override(replica: Replica) -> bool:
    """A replica restarted in an override's epoch (`config.pbft.transitions`) with the block
    before it executed enters it (`stand_on_override`) and asks for the next view: the new
    set's first NEW-VIEW carries what the survivors prepared above it (see below); True if
    it did."""
    epoch = replica.epochs.current
    if not (epoch.override and replica.stable_checkpoint < epoch.first - 1 <= replica.last_exec):
        return False
    enter_epoch(replica)
    # (also from a view change of the old epoch: no quorum of the old set completes it now)
    replica._start_view_change(replica.view + 1, "override")
    return True


def check_restored(replica: Replica) -> None:
    """What a restarted replica read back from its store for the heights of epochs after
    genesis, checked again with the schedule it starts with: it may have been stored while
    the change that decides those heights was not known yet (killed between committing the
    block in which it passed and its step, or during a catch-up past it), so a removed
    validator's early messages would count as another member's (the wire's attack review,
    finding 3). Its prepared certificates that verify, and Q, stay."""
    epochs = replica.epochs.schedule.epochs
    if len(epochs) > 1:
        forget_unproven(replica, epochs[1].first, keep_verified_prepared=True)


def checkpoint_restored_head(replica: Replica) -> None:
    """Our CHECKPOINT at the head a replica starts at, if it is a checkpoint multiple above
    the stable checkpoint and none is held: the chain committed the block and the node
    crashed before its core heard of it (only `BlockCommitted` and `FetchCompleted` sign
    one). Elsewhere the next checkpoint makes up for it; at a handover checkpoint c the high
    watermark stops at c until Q of the old set hold it stable, and without this one the
    chain may stop there for good. The state root comes with the head (`ChainHead`); one
    signed before the crash is the same (`Replica._sign` keeps one CHECKPOINT per seqNo)."""
    head = replica.started_at
    if (head.state_root and head.seq_no % replica.params.checkpoint_interval == 0
            and head.seq_no > replica.stable_checkpoint
            and replica.checkpoints.mine(head.seq_no) is None):
        replica._send_checkpoint(head.seq_no, head.block_hash, head.state_root)


def stand_on_override(replica: Replica) -> None:
    """An override takes over after block c = its first height - 1, which no quorum of the
    old set may ever make stable (more than f of it are gone: what the override is for).
    Once c is executed here it is the stable checkpoint by the genesis file, as block 0 is:
    its proof is empty, and what the old set's messages held above it goes but P: a block
    the old set prepared above c may have been committed by validators now gone, and PBFT
    carries prepared blocks into the next view (Castro & Liskov, section 4.4): the survivors'
    VIEW-CHANGEs in the new set carry them (`Membership.verify_prepared_proof`: only at T ..
    T - 1 + max_in_flight, ranked below the new set's own), so the new set's first NEW-VIEW
    proposes them again. A block committed by the old set had a quorum of it prepare it;
    the N - f VIEW-CHANGEs of the new set are sure to include one of those only when the
    survivors outnumber f of the old set plus f of the new (docs/validators.md)."""
    epoch = replica.epochs.current
    c = epoch.first - 1
    if epoch.override and replica.stable_checkpoint < c <= replica.last_exec:
        forget_unproven(replica, epoch.first, keep_verified_prepared=True)
        replica.stable_checkpoint = c
        replica.checkpoints.stabilize(c)
        replica.log.truncate_view_change_sets(c)


def enter_epoch(replica: Replica) -> None:
    """The installed epoch's set decides everything above h, which moves to the epoch's
    first height - 1 at least; this replica's VIEW-CHANGE, if of the old epoch, is replaced
    by one for the next view; the messages held for the epoch's heights are taken."""
    replica.view_changes = {a: w for a, w in replica.view_changes.items()
                            if counts_toward_view(replica.epochs, w.signed)}
    replica.relayed = set()  # the primary of this view may be another member now
    stand_on_override(replica)
    replica._move_watermarks(max(replica.low_watermark, replica.epochs.current.first - 1))
    leave_old_epoch_view(replica)
    replica._restart_request_timer()
    if replica.active:
        replica._replay_future()
    replica._advance()


def leave_old_epoch_view(replica: Replica) -> None:
    """A replica in a view change whose VIEW-CHANGE is the old epoch's (the new set does
    not count it) waits one new-view timeout for the old set's NEW-VIEW of that view
    (`takes_old_new_view`: the others may complete the view in the old epoch, then
    take c stable and go on in it), then asks for the next view: it never signs two for
    one view. Asking at once left it alone in the next view while the others went on in
    this one (the wire review's finding 5). Without the timer, once fewer than N - f
    members are left to count in this view, none of them ever times out (the new-view timer
    waits for N - f VIEW-CHANGEs), and the new set stalls for good (membership seed 662 at
    N = 6). It may not ask yet at the install, when the handover checkpoint was proved
    stable before it executed it (`Replica._may_view_change`), so this runs again after
    each execution, and the timer is armed only once it may."""
    if replica.active or replica.left or replica.new_view_timer_armed:
        return  # (one that left signs nothing more)
    own = replica.view_changes.get(replica.address)  # (a resend puts it back after the install)
    if (own is None or not counts_toward_view(replica.epochs, own.signed)) and (
            replica._may_view_change(replica.view + 1)):
        replica._arm_new_view_timer()


def takes_old_new_view(replica: Replica, body: NewView) -> bool:
    """A NEW-VIEW of the epoch just replaced that this replica takes all the same (the
    heights it decides, at or below c, are done here: its entries are agreed again, never
    executed again):
    - for the view it asked for in that epoch and still waits in (`leave_old_epoch_view`):
      the others completed the view change it took part in, before the handover;
    - for a view above its own: the others moved on while it crossed the handover without
      them (a fetch past c, in view 0 with no stable checkpoint of the new epoch, so it
      could not ask for a view itself: membership seed 2462 at N = 4). It signed nothing in
      that view.
    Only the set just replaced, and not by an override: consecutive epochs differ by one
    member, so N - f keys of that set are never the installed set's f faulty members' and
    the removed one's (whose key may be anyone's once c is stable: research/membership.md
    8.3); an older set's may be (two rotated-out keys and one faulty member sign a NEW-VIEW
    of the genesis set), and an override's old set may have lost any number."""
    schedule, current = replica.epochs.schedule, replica.epochs.current
    epoch = schedule.epoch_at(message_height(body))
    if epoch.number != current.number - 1 or current.override:
        return False
    if body.view > replica.view:
        return True
    if replica.active or body.view != replica.view:
        return False
    own = replica.log.signed.get(signed_key(VIEW_MESSAGE_SEQ_NO, MessageType.VIEW_CHANGE,
                                            replica.view))
    return own is not None and schedule.epoch_at(message_height(own.body)) == epoch


def awaiting_handover(replica: Replica) -> Signed[Checkpoint] | None:
    """Our CHECKPOINT at the last handover checkpoint c while c is the last block executed
    here: sent again every request timeout (`Replica._arm_resend_timer`). Checkpoints are
    not retransmitted otherwise (the next one makes up for a lost one), but nothing comes
    after this one until Q of the old set hold it stable (a removed validator too: it
    leaves only once a block above c is committed)."""
    schedule = replica.epochs.schedule
    cap = schedule.high_watermark_cap()
    c = cap if cap is not None else schedule.current.first - 1
    return replica.checkpoints.mine(c) if c > 0 and replica.last_exec == c else None


def left_action(replica: Replica) -> LeftValidatorSet:
    return LeftValidatorSet(replica.epochs.current.number, replica.epochs.current.first)


def complete_proof(replica: Replica, seq_no: int, proof: tuple[Signed[Checkpoint], ...]) -> bool:
    """A replica that joined at c holds c stable without its proof (the old set's Q
    CHECKPOINTs, which its VIEW-CHANGE carries): it takes them as they come."""
    if not (seq_no == replica.stable_checkpoint > 0
            and replica.checkpoints.short_of_proof(seq_no)):
        return False
    replica.checkpoints.adopt(seq_no, proof)
    return True


def adopt_view_change_checkpoint(replica: Replica, signed: Signed[ViewChange]) -> bool:
    """Whether a VIEW-CHANGE counts here, once its checkpoint is adopted if this replica
    needs it: a VIEW-CHANGE proves its checkpoint stable (Q CHECKPOINTs), and a replica
    that missed the handover checkpoint (it was down, or behind), or whose own stable
    checkpoint is below the installed epoch (it caught up past c: its own VIEW-CHANGE
    would be the old epoch's) adopts a later one, which installs the epoch it is of."""
    body, epochs = signed.body, replica.epochs
    if unexecuted_by_genesis(replica, body.stable_seq_no, body.checkpoint_proof):
        return False
    behind = epochs.schedule.epoch_at(replica.stable_checkpoint + 1) != epochs.current
    if body.stable_seq_no > replica.stable_checkpoint and not before_installed(epochs, body) and (
            behind or not counts_toward_view(epochs, signed)):
        try:
            verify_view_change(epochs, signed, replica.params.log_size)
        except MessageError:
            return False
        replica._adopt_stable(body.stable_seq_no, body.checkpoint_proof)
    return not replica.left and counts_toward_view(epochs, signed)


def offer_stable_proof(replica: Replica, body: ViewChange, delivered_by: bytes) -> None:
    """A VIEW-CHANGE of an older epoch from a member of the installed set: its stable
    checkpoint is below c (it caught up past c by a fetch, which proves no checkpoint, and
    the others' CHECKPOINTs at c were below its new low watermark by then), so it may ask
    for no view of this epoch (`Replica._may_view_change`), nobody counts the one it sent,
    and alone in its view it is stranded for good: in a set of three (f = 0) the next
    request halts the set (simulator seeds 313 and 40 at N = 4 with the group-commit
    model). The proof of this replica's stable checkpoint, if it is of this epoch, is sent
    to it (`adopt_offered_checkpoint`): only for a copy its signer delivered (a relayed
    one would let any member draw Q CHECKPOINTs per copy: the attack review s11-offer,
    finding 2), and at most OFFERS_PER_CHECKPOINT times a member and stable checkpoint (its
    resends come every new-view timeout; an answer may be lost)."""
    epochs, stable = replica.epochs, replica.stable_checkpoint
    sender = epochs.address_of(body)
    current = epochs.current.validators
    if (sender is None or sender not in current or body.stable_seq_no >= stable
            or relayed_copy(delivered_by, sender)
            or epochs.schedule.epoch_at(stable + 1) != epochs.current):
        return
    at, times = replica.proofs_offered.get(sender, (stable, 0))
    times = times if at == stable else 0
    if times >= OFFERS_PER_CHECKPOINT:
        return
    replica.proofs_offered[sender] = (stable, times + 1)
    for checkpoint in replica.checkpoints.proof(stable):
        replica._send(WireMessage(checkpoint), to=current.index(sender))


def adopt_offered_checkpoint(replica: Replica, checkpoint: Signed[Checkpoint],
                             delivered_by: bytes) -> bool:
    """A CHECKPOINT (signature verified) at a height this replica executed without holding
    it stable, while its stable checkpoint is below the installed epoch's c
    (`offer_stable_proof`): kept with the others the same member delivered (one height a
    member, its latest: bounded), and once Q of them match, that checkpoint is stable
    here, as a VIEW-CHANGE's would be (`adopt_view_change_checkpoint`); then the replica
    may ask for the next view of this epoch (`leave_old_epoch_view`). By deliverer, so a
    faulty signer's forged CHECKPOINT sent first cannot displace its genuine one from an
    honest member's offer (the attack review s11-offer, finding 1). False: not such a
    CHECKPOINT."""
    epochs, seq_no = replica.epochs, checkpoint.body.seq_no
    stable = replica.stable_checkpoint
    if epochs.schedule.epoch_at(stable + 1) == epochs.current:
        replica.offers = {}
        return False
    if not (max(stable, replica.low_watermark - replica.params.log_size) < seq_no
            <= replica.last_exec and epochs.schedule.epoch_at(seq_no + 1) == epochs.current):
        return False
    offer = replica.offers.setdefault(delivered_by, {})
    if offer and next(iter(offer.values())).body.seq_no != seq_no:
        if next(iter(offer.values())).body.seq_no > seq_no:
            return True  # an older offer than the one this member is making
        offer.clear()
    offer.setdefault(checkpoint.body.replica, checkpoint)
    value, count = Counter(c.body.value for c in offer.values()).most_common(1)[0]
    if count >= epochs.quorum_at(seq_no):
        _adopt_offer(replica, seq_no, tuple(c for c in offer.values() if c.body.value == value))
    return True


def _adopt_offer(replica: Replica, seq_no: int, proof: tuple[Signed[Checkpoint], ...]) -> None:
    """Q matching CHECKPOINTs offered at seq_no: stable here, unless this replica signed
    another value there (its execution diverged: the alarm the window raises too, the
    attack review s11-offer, finding 3)."""
    replica.offers = {}
    own = replica.checkpoints.mine(seq_no)
    if own is not None and own.body.value != proof[0].body.value:
        replica._alarm("checkpoint_conflict",
                       f"checkpoint {seq_no}: replicas disagree on the block or state root")
        return
    replica._adopt_stable(seq_no, proof)
    leave_old_epoch_view(replica)


def unexecuted_by_genesis(replica: Replica, seq_no: int,
                          proof: tuple[Signed[Checkpoint], ...]) -> bool:
    """A checkpoint stable by the genesis file (the block before an override: no proof)
    that this replica has not executed: a VIEW-CHANGE or NEW-VIEW on it is not taken yet
    (nothing in it says which block that is: the replica catches up by certificates, and
    executing it installs the override; the attack review of the override, finding 1)."""
    return not proof and seq_no > replica.last_exec and replica.epochs.schedule.stable_by_genesis(
        seq_no)


def joined(replica: Replica, c: int, view: int, signing_bound: SigningBound | None) -> Replica:
    """`Replica.join`: a validator added by a change starts at the handover checkpoint c
    that installs its epoch, having followed the chain (as an observer) to c or past it:
    h and its stable checkpoint are c, its P and Q sets empty, its view `view` (that of c's
    commit certificate: views stay monotonic across epochs; a later one comes by NEW-VIEW or
    f+1 VIEW-CHANGEs, as for any replica). It votes from c + 1. The proof of its stable
    checkpoint (Q CHECKPOINTs of the old set at c) is taken from those CHECKPOINTs (the
    adapter feeds the ones it kept while it followed), or a VIEW-CHANGE or NEW-VIEW that
    holds it, as they reach it; until then it sends no VIEW-CHANGE (nobody would take it).
    `signing_bound`: the validator state file, if this address voted on this chain before
    (removed, then added again). Restarted later, it is restored (`Replica.restore`)."""
    replica.view, replica.stable_checkpoint, replica.joined = view, c, True
    replica.signing_bound = (signing_bound or SigningBound()).joined(SigningBound(view, c))
    replica._bound_raised = True
    return replica
