"""What a validator added by a change keeps of the consensus messages it hears while it
still follows the chain as an observer, for its replica once it joins at the handover
checkpoint c (`Replica.join`; DESIGN.md section 10, issue 31: "No view change caused by a
change itself").

The primary proposes c+1 as soon as c is stable, often before the joiner (which follows by
block sync) holds c and starts its replica. Dropped, that PRE-PREPARE comes again only with
the primary's resend, one to two request timeouts later, after the joiner's request timer
ran out: when the new quorum needs the joiner, a view change. So the follower keeps the
PRE-PREPAREs (with their blocks), PREPAREs and COMMITs for heights c+1 .. c+L (the window the
replica opens at c) and the CHECKPOINTs at c .. c+L (the old set's at c prove the replica's
stable checkpoint), and the adapter feeds them to the replica right after `Replica.join`, in
order of height and phase.

Each is verified as the replica will verify it: it names the epoch of its height and is
signed by the member of that epoch's set it claims to be, and a PRE-PREPARE comes from the
primary of its view there. Only the latest per sender, kind and height is kept (a higher view
replaces a lower one; otherwise the first copy stays), so what a member may hold is bounded by
the window: at most members x 4 kinds x (L + 1 + FOLLOWER_LAG) messages, and a non-member
nothing. Their bytes are bounded too (`EngineParams.future_block_bytes`, as the replica's own
buffer of messages it cannot take yet): over it, the sender holding the most bytes loses its
highest message (by height, then phase: the order `take` feeds them), whenever it came. A
message goes only while it is its sender's highest and that sender holds at least as much as
any other, all of them together more than the bound. So what a sender holds at or below a
height stays, whatever f byzantine members send and in whatever order, while it totals at most
(bound - what the other honest senders hold) / (f + 1); and whatever all others send, while
at most bound / s (s: the senders it keeps messages from). At the defaults (a 64 MiB bound)
the new primary's PRE-PREPARE of c+1, the message the joiner needs first, survives up to a
whole frame of the transport (16 MiB) for f <= 2 while the other honest members hold under
15 MiB (their votes: kilobytes). A flood costs the flooder its highest messages, not the
others' lowest (the attack review s8-joiner, finding 2: when the oldest of the heaviest
went, an honest primary with a few large blocks in flight was the heaviest, and lost c+1).
Per-sender quotas of bound / s would promise no more, and would leave a primary's blocks in
flight no more than bound / s when nobody floods. Only a sender's own copies are kept: the
copy of a message that another member delivered is not (`relayed_copy`; correct members do not
relay consensus messages, and a relayed copy's bytes, charged to the signer, let a relayer
with junk blocks make an honest primary the heaviest: the attack review s10, finding 2;
charged to the relayer, a validator voted out but still heard was one holder more than the
f the promise counts: the attack review s11, finding 1).

A follower that has not yet imported the block b in which the change passed (block sync lags
the validators, which send to the new set from b on) knows neither c nor the new set, nor
how many changes are queued before it. One change per epoch, and an add appends its subject
(`pbft_engine.registry`), so its c is no lower than the one a change passing in its next
block would have, and the members of the sets after the last one it knows are that set's
(plus the nodes added, which it may not know). Until it imports b, it keeps the CHECKPOINTs
that verify with the schedule it knows (the old set's at c), and the messages that name a
later epoch than it knows if their signer is a member of the last set it knows: their
replica index means nothing yet, and the replica checks it when they are fed, dropping what
does not verify. The real c is higher by as much as the follower lags the validators, so
the window then reaches FOLLOWER_LAG heights further.

A validator voted out keeps a buffer too while its replica still votes (up to its c): voted
in again by the next change, it joins at that change's c as soon as it left, and the new
primary's messages may reach it before (its replica takes none of them: it leaves at c, and
they may name an epoch it does not know yet). So the adapter offers the buffer every message
a node hears; for a member of the last set known, with no join ahead, the schedule alone
says nothing is kept, before anything is decoded. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from pbft_engine.core.epochs import EpochSchedule, Membership
from pbft_engine.core.params import EngineParams
from pbft_engine.errors import MessageError
from pbft_engine.messages import (
    Body,
    Checkpoint,
    PhaseMessage,
    PrePrepare,
    Signed,
    Verifier,
    WireMessage,
    signing_hash,
)

# (sender address, message type, seqNo): one message kept for each
KeptKey = tuple[bytes, int, int]
# How far behind the validators a follower may be when the primary proposes c+1 (block sync's
# range, `sync_messages.MAX_BLOCKS_PER_REQUEST`): before it imports the block in which the
# change passed, the real c may be so far above the lowest one it expects.
FOLLOWER_LAG = 32


class _Kept(NamedTuple):
    view: int  # a CHECKPOINT's is 0
    data: bytes


def relayed_copy(delivered_by: bytes, signer: bytes | None) -> bool:
    """Whether a message was delivered by another member than its signer (b"": by whom is
    not known, as for a NEW-VIEW block sync hands over): such a copy is never held for
    later, in the join buffer or the replica's `future`."""
    return bool(delivered_by) and delivered_by != signer


def handover_to_join(schedule: EpochSchedule, address: bytes, head: int) -> int | None:
    """The handover checkpoint c of the first epoch after `head` that adds `address` to the
    set (None: no change known adds it). An observer imports up to c and joins there."""
    epochs = schedule.epochs
    return next((e.first - 1 for before, e in zip(epochs, epochs[1:], strict=False)
                 if e.first > head and address in e.validators
                 and address not in before.validators), None)


def lowest_handover(schedule: EpochSchedule, address: bytes, head: int) -> int | None:
    """The lowest handover checkpoint at which a change not known yet could add `address`:
    one passing in the block after `head`, appending it to the set such a change would
    change (None: it is a member of that set, or an override takes over first). Not the
    last epoch's set: an override may be last, and a change to the set before it that
    adds back what the override removed would change nothing (the attack review s8-joiner,
    finding 1)."""
    changed = schedule.after_changes(head + 1)
    if address in changed:
        return None
    added = schedule.schedule((*changed, address), passed_at=head + 1)
    return None if added is schedule else handover_to_join(added, address, head)


class JoinBuffer:
    """The consensus messages a node keeps for the epoch it is to join (see the module's
    doc): `keep` each one it receives, `take` them all once its replica has joined."""

    def __init__(self, params: EngineParams, verifier: Verifier, address: bytes) -> None:
        self.params, self.address, self._verifier = params, address, verifier
        self._membership = Membership.of(params, verifier)  # the schedule its head says
        self._for: tuple[EpochSchedule, int] | None = None  # (schedule, head) of the window
        self._c: int | None = None  # the handover checkpoint it joins at (the lowest, guessing)
        self._top = 0  # the highest height kept
        self._guessing = False  # no change known adds it yet (see the module's doc)
        self._kept: dict[KeptKey, _Kept] = {}
        self._bytes: Counter[bytes] = Counter()  # kept bytes, by sender

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def kept_bytes(self) -> int:
        return self._bytes.total()

    def keep(self, data: bytes, schedule: EpochSchedule, head: int,
             delivered_by: bytes = b"") -> bool:
        """Keep a peer's wire message if it is one the replica this node starts at c will
        take (`schedule`: the one its committed head says; `head`: that head;
        `delivered_by`: the member whose link delivered it, b"": not known); True if kept.
        A copy another member relayed is not kept (`relayed_copy`)."""
        self._expect(schedule, head)
        if self._c is None:
            return False
        try:
            wire = WireMessage.decode(data, self._membership.limits(self.params.log_size))
        except MessageError:
            return False
        key = self._key(wire)
        if key is None or relayed_copy(delivered_by, key[0]):
            return False
        view = wire.signed.body.view if isinstance(wire.signed.body, PhaseMessage) else 0
        held = self._kept.get(key)
        if held is not None and held.view >= view:
            return False  # the first copy stays: a relay sent after it must not replace it
        self._drop(key)
        self._kept[key] = _Kept(view, data)
        self._bytes[key[0]] += len(data)
        self._bound()
        return True

    def take(self) -> list[bytes]:
        """Every message kept, by height, then phase (a CHECKPOINT after a height's votes);
        the buffer is emptied."""
        ordered = [self._kept[key].data for key in sorted(self._kept, key=_feed_order)]
        self._kept, self._bytes = {}, Counter()
        return ordered

    def _expect(self, schedule: EpochSchedule, head: int) -> None:
        """The window for this schedule and head: what falls outside it now goes."""
        if self._for == (schedule, head):
            return
        self._for, self._membership.schedule = (schedule, head), schedule
        self._c = handover_to_join(schedule, self.address, head)
        self._guessing = self._c is None
        if self._guessing:
            self._c = lowest_handover(schedule, self.address, head)
        if self._c is not None:
            self._top = self._c + self.params.log_size + (FOLLOWER_LAG if self._guessing else 0)
        for key in [k for k in self._kept if not self._in_window(k[1], k[2])]:
            self._drop(key)

    def _in_window(self, kind: int, seq_no: int) -> bool:
        """CHECKPOINTs at c .. c+L, the phases' messages at c+1 .. c+L (while guessing, up
        to FOLLOWER_LAG higher)."""
        if self._c is None:
            return False
        first = self._c if kind == Checkpoint.TYPE else self._c + 1
        return first <= seq_no <= self._top

    def _key(self, wire: WireMessage[Body]) -> KeptKey | None:
        """Where a message is kept, if it is to be: within the window, and from a sender it
        verifies for (None: not kept)."""
        body = wire.signed.body
        if not isinstance(body, PhaseMessage | Checkpoint) or not self._in_window(
                body.TYPE, body.seq_no):
            return None
        sender = self._sender(wire.signed)
        if sender is None or sender == self.address:
            return None
        return sender, body.TYPE, body.seq_no

    def _sender(self, signed: Signed[Body]) -> bytes | None:
        """Who sent a message, if it verifies as the replica will verify it (with the set of
        its height's epoch; a PRE-PREPARE from that view's primary). Guessing: a CHECKPOINT
        so, and a message naming a later epoch than the last known by its signer, a member
        of the last set known (see the module's doc). None: it does not verify."""
        body, membership = signed.body, self._membership
        last = membership.schedule.epochs[-1]
        try:
            if self._guessing and body.epoch > last.number:
                signer = self._verifier.recover(signing_hash(body, membership.chain_id),
                                                signed.signature)
                return signer if signer in last.validators else None
            if self._guessing and not isinstance(body, Checkpoint):
                return None  # (the old set's votes above the lowest c: not the joiner's)
            membership.verify(signed)
        except MessageError:
            return None
        if isinstance(body, PrePrepare) and body.replica != membership.primary(body.view,
                                                                               body.seq_no):
            return None
        return membership.address_of(body)

    def _drop(self, key: KeptKey) -> None:
        held = self._kept.pop(key, None)
        if held is not None:
            self._bytes[key[0]] -= len(held.data)

    def _bound(self) -> None:
        """Over the byte bound: the highest of the sender holding the most bytes goes first
        (see the module's doc for what that keeps)."""
        while self._bytes.total() > self.params.future_block_bytes:
            [(heaviest, _)] = self._bytes.most_common(1)
            self._drop(max((k for k in self._kept if k[0] == heaviest), key=_feed_order))


def _feed_order(key: KeptKey) -> tuple[int, int]:
    """By height, then phase (a CHECKPOINT after a height's votes)."""
    _, kind, seq_no = key
    return seq_no, kind
