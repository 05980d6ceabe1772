"""The PBFT replica: a pure state machine. `step(event)` returns the actions to perform.

One replica of the geth-pbft port of Fabric v0.6's pbftCore, with blocks as request batches:
normal case (PRE-PREPARE / PREPARE / COMMIT), checkpoints and watermarks, falling behind,
view change with signed P sets, and restore from the persisted stores. No I/O, no clock.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import assert_never, cast

import rlp

from encoding.rlp import encode_uint
from pbft_engine.core.actions import (
    Action,
    Alarm,
    Broadcast,
    BuildBlock,
    CancelTimer,
    CommitBlock,
    FetchBlock,
    Persist,
    Ready,
    RelayRequests,
    SendTo,
    SetTimer,
    ValidateBlock,
)
from pbft_engine.core.catch_up import (
    check_high_checkpoints,
    excuse,
    fall_behind,
    lagging,
    on_fetch_completed,
    on_fetch_failed,
    on_fetch_progressed,
    on_peer_committed,
)
from pbft_engine.core.epochs import EpochSchedule, Membership
from pbft_engine.core.events import (
    BlockBuilt,
    BlockCommitted,
    BlockReceived,
    BlockValidated,
    CommitRefused,
    Event,
    FetchCompleted,
    FetchFailed,
    FetchProgressed,
    MessageReceived,
    PeerCommitted,
    Refusal,
    RequestDropped,
    RequestReceived,
    ScheduleChange,
    TimerFired,
    TimerKind,
)
from pbft_engine.core.handover import (
    adopt_offered_checkpoint,
    awaiting_handover,
    awaits_primary,
    beyond_handover,
    check_restored,
    checkpoint_restored_head,
    complete_proof,
    high_watermark,
    install,
    joined,
    joining_checkpoint,
    leave_old_epoch_view,
    left_action,
    owes_block,
    retime_primary,
    schedule_change,
    take_installed,
    take_override,
)
from pbft_engine.core.joining import relayed_copy
from pbft_engine.core.log import (
    CheckpointTracker,
    MessageLog,
    Slot,
    StoreWriter,
    V,
    hold_future,
)
from pbft_engine.core.new_view import (
    check_view_change_quorum,
    on_new_view,
    on_view_change,
)
from pbft_engine.core.params import MAX_DOUBLINGS, EngineParams
from pbft_engine.core.records import (
    META_NEW_VIEW,
    META_STATE,
    VIEW_MESSAGE_SEQ_NO,
    RecordReader,
    StoreName,
    evidence_key,
    message_slot,
    read_u64,
    signed_key,
    u64,
)
from pbft_engine.core.signing_bound import SigningBound, restored_bound
from pbft_engine.core.status import (
    FAIR_BLOCK_TRANSACTIONS,
    MAX_PASSED_OVER,
    MAX_RELAY_SEND,
    RELAYED_REQUESTS,
    BlockDigest,
    ChainHead,
    Mode,
    ReplicaStatus,
)
from pbft_engine.errors import (
    ConfigError,
    MessageError,
    SafetyError,
    StoreError,
)
from pbft_engine.messages import (
    B,
    Body,
    Checkpoint,
    Commit,
    MessageType,
    NewView,
    PhaseMessage,
    Prepare,
    PreparedProof,
    PrePrepare,
    Signed,
    Signer,
    Verifier,
    ViewChange,
    WireMessage,
    decode_signed_bytes,
    encode_commit_certificate,
    signed_as,
    wire_as,
)


class Replica:
    """One PBFT replica. Construct it fresh, with `restore` or (an added validator) with
    `join`, call `start()`, then `step()`."""

    def __init__(
        self,
        params: EngineParams,
        replica: int | None,  # the index in the installed epoch, checked (None: not checked)
        signer: Signer,
        verifier: Verifier,
        head: ChainHead,
        *,
        block_digest: BlockDigest,
        schedule: EpochSchedule | None = None,  # (default: the genesis set, nothing scheduled)
    ) -> None:
        self.epochs = Membership.of(params, verifier, schedule)  # every set, quorum, primary
        # The identity is the address; the replica index is its place in the installed
        # epoch's set (`me`; -1 and `left` while it is no member: `take_installed`).
        self.params, self.signer, self.address = params, signer, signer.address
        self.me, self.left, self.joined = -1, False, False
        self.block_digest = block_digest
        self.view = 0
        self.active = True  # False while changing to `self.view`
        self.seq_no = head.seq_no
        self.low_watermark = head.seq_no - head.seq_no % params.checkpoint_interval
        self.stable_checkpoint = 0
        self.last_exec = head.seq_no
        take_installed(self)
        if (replica is not None and replica != self.me) or not any(
                self.address in e.validators for e in self.epochs.schedule.epochs):
            raise ConfigError(f"the signing key is not validator {replica}")
        # View changes since the last commit: each doubles the request timeout, and each
        # after the first the new-view timeout (Castro & Liskov, section 4.5.2); a commit
        # resets it.
        self.views_without_commit = 0
        self.last_exec_hash = head.block_hash
        self.executing: int | None = None
        self.building: int | None = None
        self.building_on = b""  # the parent the block being built goes on
        self.proposed: dict[int, int] = {}  # this primary's blocks in flight: transactions
        self.arrived_while_building = False  # a request came in during the build
        self.waiting_at_build = 0  # requests not in a block in flight when the build began
        # The last block built held fewer: it was cut by its time budget or size cap, so the
        # pool has a backlog and the next block is built before its parent locks (`held`).
        self.backlogged = False
        # A block built before its parent locked here: its PRE-PREPARE waits (`_propose_held`).
        self.held: tuple[BlockBuilt, bytes] | None = None
        self.fetching: int | None = None
        self.fetch_excused = False  # the fetch under way excused a request timeout (`excuse`)
        # Request timeouts the fetch under way excused while it waited on peers with nothing
        # new since its last progress (`catch_up.stalled`), and whether it is executing
        # what it holds (`FetchProgressed`): its own work, which excuses as `busy` does.
        self.fetch_stalled = 0
        self.fetch_executing = False
        self.fetch_reached = 0  # the head block sync last reported the fetch at
        # The highest head a peer proved with its certificate (block sync's STATUS answers):
        # kept, since one that arrives while this replica is busy is fetched afterwards.
        self.peer_head: tuple[int, bytes] = (head.seq_no, head.block_hash)
        self.started_at = head  # (restored: it may owe the head's CHECKPOINT, `_resume`)
        # (head, fetches in a row that excused a request timeout and imported nothing at
        # that head: `catch_up.missed_fetch`)
        self.missed_fetches = (-1, 0)
        # (head, request timeouts in a row its lag excused at that head: `catch_up.excuse`)
        self.excused = (-1, 0)
        self.block_due = False
        self.trailing_owed = False  # the last block executed here held transactions
        self.view_change_sends = 0  # our VIEW-CHANGE for this view, sent so many times
        self.halted = False
        self.new_view_timer_armed = False
        self.request_timer_armed = False
        # This view's slots above the last executed block that held our messages when the
        # RESEND timer was last armed: still open when it fires, they are sent again.
        self.resend_armed = False
        self.resend_open: frozenset[int] = frozenset()
        self.writer = StoreWriter()  # this step's store operations, in order
        self.log = MessageLog(self.epochs, self.address, self.writer)
        self.checkpoints = CheckpointTracker(self.epochs, self.address, self.writer)
        self.wanted: set[tuple[int, bytes]] = set()  # bodies asked of the peers (FetchBlock)
        self.view_changes: dict[bytes, WireMessage[ViewChange]] = {}  # latest per member
        # Stable checkpoint proofs offered to this replica stranded below the installed
        # epoch, by the member that delivered them, and the proofs it offered others (by
        # member: its stable checkpoint then, how many times): `handover.offer_stable_proof`.
        self.offers: dict[bytes, dict[int, Signed[Checkpoint]]] = {}
        self.proofs_offered: dict[bytes, tuple[int, int]] = {}
        self.last_new_view: Signed[NewView] | None = None
        # (replica, type, seqNo)
        self.future: dict[tuple[int, int, int], WireMessage[PhaseMessage]] = {}
        self.evidence: set[bytes] = set()
        self.requests: dict[bytes, int] = {}  # executable transactions waiting, oldest first
        self.passed_over = 0  # commits passing over the oldest request, since the mark
        self.arrivals = 0  # requests received so far (each one's index: its value in requests)
        self.fair_mark: int | None = None  # arrivals at the oldest request's fairness mark
        self.backlog_grace = 0  # commits of the backlog from before the mark it may still take
        self.relayed: set[bytes] = set()  # requests relayed to this view's primary
        self.view_change_reasons: Counter[str] = Counter()  # view changes here, by reason
        self.dropped: Counter[str] = Counter()
        self.received: Counter[str] = Counter()  # verified messages in, by type (metrics)
        self.sent: Counter[str] = Counter()  # messages out, by type; a broadcast counts once
        self.largest_sent: Counter[str] = Counter()  # bytes of the largest one, by type
        self.signing_bound = SigningBound()  # as last written outside the store
        self._bound_raised = False  # this step raised it: write it before anything leaves
        self.amnesia: SigningBound | None = None  # records lost: sign only beyond this
        self._out: list[Action] = []

    # --- construction from the stores -------------------------------------------------

    @classmethod
    def restore(
        cls,
        params: EngineParams,
        replica: int | None,
        signer: Signer,
        verifier: Verifier,
        head: ChainHead,
        records: RecordReader,
        *,
        block_digest: BlockDigest,
        signing_bound: SigningBound | None = None,
        fresh_validator: bool = False,
        schedule: EpochSchedule | None = None,
    ) -> Replica:
        """A replica restarted from its data directory (first start: nothing persisted).

        `signing_bound` is what the validator state file outside the store says (None: no
        file); `fresh_validator` is the operator's word that this validator never voted.
        `schedule`: every epoch state knows, none installed (what is read back installs
        them: `replica` None); one removed meanwhile restores as one that left (`start`)."""
        self = cls(params, replica, signer, verifier, head, block_digest=block_digest,
                   schedule=schedule)
        try:
            stored = self._load(records)
        except (MessageError, ValueError, IndexError, rlp.exceptions.RLPException) as exc:
            raise StoreError(f"cannot restore the consensus state ({exc}): damaged, or from "
                             "before messages named their epoch (start a new testnet)") from None
        # (the store's bound: its view and window, written in the same step as the file)
        known = SigningBound(self.view, self.low_watermark + params.log_size) if stored else None
        self.signing_bound, self.amnesia = restored_bound(
            signing_bound, known, fresh=fresh_validator, chain_height=self.last_exec,
            amnesia=self.amnesia)
        self._bound_raised = self.signing_bound != signing_bound  # (None: write it now)
        take_installed(self)
        return self

    @classmethod
    def join(cls, params: EngineParams, signer: Signer, verifier: Verifier, head: ChainHead,
             *, block_digest: BlockDigest, schedule: EpochSchedule, view: int = 0,
             signing_bound: SigningBound | None = None) -> Replica:
        """An added validator's replica, at its epoch's handover (`core.handover.joined`)."""
        c = joining_checkpoint(schedule, signer.address, head.seq_no)
        return joined(cls(params, None, signer, verifier, head, block_digest=block_digest,
                          schedule=schedule.install(c)), c, view, signing_bound)

    def _load(self, records: RecordReader) -> bool:
        """Read the stores back; False if there was nothing to read (no consensus state)."""
        state = records.get(StoreName.META, META_STATE)
        if state is not None:
            fields = [int.from_bytes(x, "big") for x in rlp.decode(state)]
            view, active, _, h, stable, views_without_commit = fields[:6]
            self.view, self.active, self.stable_checkpoint = view, bool(active), stable
            self.low_watermark = h
            # Stores written before the escalation rule held the new-view timeout (ms) here.
            self.views_without_commit = 0 if views_without_commit > MAX_DOUBLINGS else (
                views_without_commit)
            if len(fields) == 9 and fields[6]:  # stores written before amnesia have six
                self.amnesia = SigningBound(fields[7], fields[8])
        new_view = records.get(StoreName.META, META_NEW_VIEW)
        if new_view is not None:
            self.last_new_view = decode_signed_bytes(new_view, NewView)
        self.log.load(records, self.low_watermark)
        self.checkpoints.load(records)
        for key, _ in records.items(StoreName.EVIDENCE):
            self.evidence.add(key)
        # The view also follows from what was pre-prepared (qset), as in restoreState; the
        # seqNo only from what this replica signed itself in that view (a PRE-PREPARE it
        # merely accepted must not stop it from proposing once it is primary).
        self.view = max([self.view, *self.log.qset.values()])
        own = [s.body.seq_no for s in self.log.signed.values()
               if isinstance(s.body, PhaseMessage) and s.body.view == self.view]
        self.seq_no = max([self.last_exec, self.low_watermark, *own])
        return state is not None

    # --- the step interface -----------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return high_watermark(self.low_watermark, self.params.log_size, self.epochs.schedule)

    @property
    def primary(self) -> int:
        return self.epochs.current.primary(self.view)

    def status(self) -> ReplicaStatus:
        return ReplicaStatus(
            self.view, self.active, self.seq_no, self.low_watermark, self.high_watermark,
            self.primary, self.stable_checkpoint, self.last_exec, self.fetching,
            self.mode,
        )

    @property
    def mode(self) -> Mode:
        if self.left:
            return Mode.LEFT
        if self.halted:
            return Mode.HALTED
        if self.amnesia is not None:
            return Mode.FOLLOWING
        if self.fetching is not None:
            return Mode.CATCHING_UP
        return Mode.NORMAL if self.active else Mode.VIEW_CHANGE

    def start(self) -> Ready:
        """The first step after construction or restore: re-arm timers, resend, resume."""
        if self.left:
            return Ready(None, [left_action(self)])
        return self._run(self._resume)

    def step(self, event: Event) -> Ready:
        return self._run(lambda: self._handle(event))

    def _handle(self, event: Event) -> None:
        match event:
            case MessageReceived():
                self._on_message(event)
            case RequestReceived():
                self._on_request(event)
            case RequestDropped():
                self._on_request_dropped(event)
            case TimerFired():
                self._on_timer(event)
            case BlockBuilt():
                self._on_block_built(event)
            case BlockValidated():
                self._on_block_validated(event)
            case BlockCommitted():
                self._on_block_committed(event)
            case CommitRefused():
                self._on_commit_refused(event)
            case FetchCompleted():
                on_fetch_completed(self, event)
            case FetchFailed():
                on_fetch_failed(self, event)
            case FetchProgressed():
                on_fetch_progressed(self, event)
            case PeerCommitted():
                on_peer_committed(self, event)
            case BlockReceived():
                self._on_block_received(event)
            case ScheduleChange():
                schedule_change(self, event)
            case _:
                assert_never(event)

    def _run(self, work: Callable[[], None]) -> Ready:
        self.writer.take()
        self._out = []
        if not (self.halted or self.left):
            try:
                work()
            except SafetyError as exc:
                self._alarm("safety", str(exc))
        ops, out, raised = self.writer.take(), self._out, self._bound_raised
        self._out, self._bound_raised = [], False
        if not (ops or raised):
            return Ready(None, out)
        return Ready(Persist(tuple(ops), self.signing_bound if raised else None), out)

    # --- small helpers ----------------------------------------------------------------

    def _put(self, store: StoreName, key: bytes, value: bytes) -> None:
        self.writer.put(store, key, value)

    def _drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def _alarm(self, kind: str, detail: str) -> None:
        self.halted = True
        self._out.append(Alarm(kind, detail))

    def _broadcast(self, signed: Signed[Body], blocks: tuple[bytes, ...] = ()) -> None:
        self._send(WireMessage(signed, blocks))

    def _send(self, wire: WireMessage[Body], to: int | None = None) -> None:
        kind = wire.signed.body.TYPE.name.lower()
        data = wire.encode()
        self.sent[kind] += 1
        self.largest_sent[kind] = max(self.largest_sent[kind], len(data))
        self._out.append(Broadcast(data) if to is None else SendTo(to, data))

    def _in_window(self, seq_no: int) -> bool:
        return self.low_watermark < seq_no <= self.high_watermark

    def _vote_limit(self) -> int:
        """The highest seqNo this replica signs a PRE-PREPARE, PREPARE or COMMIT for: L above
        its stable checkpoint. A VIEW-CHANGE reports what it prepared above its stable
        checkpoint and the others take at most L of that; a catch-up to a head that is no
        stable checkpoint here moves h past the stable checkpoint, and voting up to h + L
        then made its next VIEW-CHANGE one nobody accepted (with f silent validators, no
        NEW-VIEW ever formed: found by an attacker's review). Above the limit it still takes
        the others' messages, and commits on their certificates."""
        return min(self.high_watermark, self.stable_checkpoint + self.params.log_size)

    def _persist_meta(self) -> None:
        amnesia = self.amnesia or SigningBound()
        fields = [self.view, int(self.active), self.seq_no, self.low_watermark,
                  self.stable_checkpoint, self.views_without_commit,
                  int(self.amnesia is not None), amnesia.view, amnesia.seq_no]
        self._put(StoreName.META, META_STATE, rlp.encode([encode_uint(x) for x in fields]))

    def _sign(self, body: B) -> Signed[B]:
        """Sign `body` in its height's epoch, never two different bodies for one (type, view,
        seqNo), across restarts."""
        body = self.epochs.with_epoch(body)
        view, seq_no = message_slot(body)
        key = signed_key(seq_no, body.TYPE, view)
        existing = self.log.own(key)
        if existing is not None:
            if existing.body != body:
                raise SafetyError(f"refusing to sign a second {body.TYPE.name} for {key.hex()}")
            return cast("Signed[B]", existing)  # an equal body: the same kind
        self._cover(view, 0 if seq_no == VIEW_MESSAGE_SEQ_NO else seq_no)
        signed = self.epochs.sign(body, self.signer)
        self.log.record_own(key, signed)
        return signed

    def _cover(self, view: int, seq_no: int) -> None:
        """Raise the signing bound over what is about to be signed, a watermark window at a
        time (the state file is rewritten about once a checkpoint interval, not per vote)."""
        if not self.signing_bound.covers(view, seq_no):
            self.signing_bound = self.signing_bound.joined(
                SigningBound(view, max(seq_no, self.high_watermark)))
            self._bound_raised = True

    def _may_vote(self, view: int, seq_no: int) -> bool:
        """Within the vote limit, in the installed epoch (a member's heights) at a height whose
        epoch the executed head fixes (`EpochSchedule.horizon`), and beyond what it may have
        signed before it lost its records."""
        schedule = self.epochs.schedule
        if seq_no > min(self._vote_limit(), schedule.horizon(self.last_exec)) or self.left or (
                schedule.epoch_at(seq_no) != self.epochs.current):
            return False
        return self.amnesia is None or self.amnesia.may_vote(view, seq_no)

    def _may_view_change(self, view: int) -> bool:
        """Not for a view it may have signed one for (one removed and added again joins in
        the others' view), nor while it lacks the proof of its stable checkpoint (it joined
        there) or has not executed it (only then is the set above it known), nor of another
        epoch than the installed one: nobody would take it, and it would wait alone."""
        stable = self.stable_checkpoint
        if view <= self.signing_bound.view or self.last_exec < stable or (
                stable and self.checkpoints.short_of_proof(stable)) or (
                self.epochs.schedule.epoch_at(stable + 1) != self.epochs.current):
            return False
        return self.amnesia is None or self.amnesia.may_view_change(view, stable)

    def _check_recovered(self) -> None:
        """Amnesia ends once nothing it may have signed can be contradicted any more."""
        if self.amnesia is not None and self.amnesia.passed(self.view, self.stable_checkpoint):
            self.amnesia = None
            self._persist_meta()

    def _set_timer(self, kind: TimerKind, key: bytes, duration_ms: int) -> None:
        self._out.append(SetTimer(kind, key, duration_ms))

    def _record_evidence(self, first: Signed[Body], second: Signed[Body] | None,
                         fault: str = "equivocation") -> None:
        body = first.body
        view, seq_no = message_slot(body)
        key = evidence_key(body.replica, body.TYPE, view, seq_no)
        self._drop(fault)
        if key not in self.evidence:
            self.evidence.add(key)
            pair = [first.encode(), second.encode() if second else b""]
            self._put(StoreName.EVIDENCE, key, rlp.encode(pair))

    # --- requests and timers ------------------------------------------------------------

    def _on_request(self, event: RequestReceived) -> None:
        if event.tx_hash in self.requests:
            return
        self.arrived_while_building |= self.building is not None
        self.arrivals += 1
        self.requests[event.tx_hash] = self.arrivals
        if len(self.requests) == 1:
            self._new_oldest()
        if self.active and not self.request_timer_armed:
            self._arm_request_timer()
        self._maybe_propose()

    def _on_request_dropped(self, event: RequestDropped) -> None:
        oldest = self._oldest_request()
        self.requests.pop(event.tx_hash, None)
        if oldest == event.tx_hash:
            self._new_oldest()
        if not awaits_primary(self):
            self._cancel_request_timer()

    def _oldest_request(self) -> bytes | None:
        return next(iter(self.requests), None)

    def _new_oldest(self) -> None:
        """Another request is the oldest (or a new primary times it): nothing passed it
        over yet, and its fairness mark is a quarter of the request timeout away. A fetch
        under way that excused a timeout excused it for the count started afresh here (an
        old view's primary's, too): its failure is not this count's until a timeout of this
        one relies on it (`catch_up.excuse` marks it again); the timeouts it excused while
        stalled were the old count's too, so its stall (`catch_up.stalled`) starts afresh."""
        self.passed_over, self.fair_mark, self.backlog_grace = 0, None, 0
        self.fetch_excused, self.fetch_stalled = False, 0
        if self.requests:
            self._set_timer(TimerKind.FAIRNESS_MARK, b"",
                            max(1, self.params.request_timeout_ms // 4))

    def _forget_requests(self, committed: tuple[bytes, ...], owed: bool = False) -> None:
        """Requests were committed: progress, which restarts the timer while others wait
        (Fabric v0.6's rule, so a long queue the primary works through is not mistaken for a
        faulty primary), unless the commits keep passing over the oldest waiting request.
        A block `owed` to the handover is progress too, empty or not: the timer timed it
        (`awaits_primary`), and requests that arrived meanwhile could not be in it (honest
        seed 236 at N = 5: they were given what was left of its timer)."""
        self.views_without_commit = 0
        oldest, before = self._oldest_request(), len(self.requests)
        mark = self.fair_mark
        backlog = bool(committed) and mark is not None and all(
            0 < self.requests.get(h, 0) <= mark for h in committed)
        for tx_hash in committed:
            self.requests.pop(tx_hash, None)
        if not self.requests:
            retime_primary(self)  # a block committed: progress on one owed to the handover
            return
        if oldest not in self.requests:
            self._new_oldest()
        elif backlog and self.backlog_grace > 0:
            self.backlog_grace -= 1
        elif mark is not None:
            self.passed_over += 1
        if len(self.requests) < before or owed:
            self._restart_request_timer()

    def _restart_request_timer(self) -> None:
        """The primary made progress: it proposed the next block, or this replica finished
        validating it, or a block committed. The timer then only bounds what the primary is
        responsible for (the build, the messages, the others' votes), never this replica's
        own execution, and it stops restarting once commits keep passing over the oldest
        waiting request."""
        if awaits_primary(self) and self.active and self.passed_over <= MAX_PASSED_OVER:
            self._arm_request_timer()

    def _arm_request_timer(self) -> None:
        if self.me == self.primary:
            return  # as in the paper, backups time the primary; it does not time itself
        self.request_timer_armed = True
        timeout = self.params.escalated(self.params.request_timeout_ms, self.views_without_commit)
        self._set_timer(TimerKind.REQUEST, b"", timeout)
        self._set_timer(TimerKind.RELAY, b"", timeout // 2)
        self._relay_oldest_requests(again=False)

    def _relay_oldest_requests(self, *, again: bool) -> None:
        """What the timer waits for goes to the primary too (4.1): a request gossip never
        delivered there would otherwise cost a view change. Each one is relayed when the
        timer starts waiting for it, and the oldest again halfway (`again`), in case that
        relay was lost (a link down at the time)."""
        self.relayed &= self.requests.keys()
        oldest = tuple(itertools.islice(self.requests, RELAYED_REQUESTS))
        chosen = oldest if again else tuple(h for h in oldest if h not in self.relayed)
        if chosen:
            self.relayed.update(chosen)
            self._out.append(RelayRequests(self.primary, chosen))

    def _cancel_request_timer(self) -> None:
        if self.request_timer_armed:
            self.request_timer_armed = False
            self._out.append(CancelTimer(TimerKind.REQUEST, b""))
            self._out.append(CancelTimer(TimerKind.RELAY, b""))

    def _on_timer(self, event: TimerFired) -> None:
        if event.kind is TimerKind.REQUEST:
            self.request_timer_armed = False
            if awaits_primary(self) and self.active and lagging(self):
                # The lag is ours, not the primary's, and the peers may well have committed
                # these requests already. A lone VIEW-CHANGE here would leave this replica
                # waiting in view v+1 until the others change view.
                self._arm_request_timer()
                excuse(self)
            elif awaits_primary(self) and self.active and self.me != self.primary:
                self._start_view_change(self.view + 1, "request_timeout")
        elif event.kind is TimerKind.RELAY:
            if self.request_timer_armed and self.requests and self.active:
                self._relay_oldest_requests(again=True)
        elif event.kind is TimerKind.VALIDATION:
            self._on_validation_deadline(read_u64(event.key))
        elif event.kind is TimerKind.FAIRNESS_MARK:
            self.fair_mark = self.arrivals
            self.backlog_grace = -(-(len(self.requests) - 1) // FAIR_BLOCK_TRANSACTIONS)
        elif event.kind is TimerKind.RESEND:
            self._on_resend_timer()
        elif event.kind is TimerKind.BLOCK_PERIOD:
            self.block_due = True
            self._set_timer(TimerKind.BLOCK_PERIOD, b"", self.params.block_period_ms)
            self._maybe_propose()
        elif event.kind is TimerKind.TRAILING_BLOCK:
            # (a block still in flight re-arms the timer when it commits, if it is busy)
            self.block_due = (self.me == self.primary and self.trailing_owed
                              and self.seq_no <= self.last_exec)
            self._maybe_propose()
        elif read_u64(event.key) == self.view and not self.active:
            if event.kind is TimerKind.NEW_VIEW:
                self.new_view_timer_armed = False  # (armed again by what still waits)
                self._start_view_change(self.view + 1, "new_view_timeout")
            else:
                self._resend_view_change()
                leave_old_epoch_view(self)  # (its wait is not persisted: a restart loses it)

    def _resume(self) -> None:
        check_restored(self)  # (in a step: what it forgets is written)
        checkpoint_restored_head(self)
        if self.joined:  # (`join`: h, the stable checkpoint and the view, before any vote)
            self._persist_meta()
        if self.params.empty_blocks:
            self._set_timer(TimerKind.BLOCK_PERIOD, b"", self.params.block_period_ms)
        if take_override(self):  # restarted with an override of genesis reached
            return
        if not self.active:
            self._resend_view_change()
            self._advance()  # certified blocks held here are executed in any view
            return
        for (view, seq_no), slot in sorted(self.log.certs.items()):
            if view == self.view and seq_no not in self.log.certified:
                self._resend_own(slot)
        self._arm_resend_timer()  # (the timer died with the process; these may be lost too)
        self._advance()

    def _open_own_slots(self) -> frozenset[int]:
        """This view's seqNos above the last executed block, not certified here (a peer
        that lacks such a block's certificate learns its head from block sync), in which
        we sent a message."""
        return frozenset(
            seq_no for (view, seq_no), slot in self.log.certs.items()
            if view == self.view and seq_no > self.last_exec
            and seq_no not in self.log.certified and (
                self.me in slot.prepares or self.me in slot.commits or (
                    slot.pre_prepare is not None and slot.pre_prepare.body.replica == self.me)))

    def _arm_resend_timer(self) -> None:
        """Messages can be lost (a link down, a peer restarting while they travel), and a
        replica whose pool never held the block's transactions times nothing: the primary
        included. So what we sent for a slot that stays open a whole request timeout is sent
        again (the retransmission of Castro and Liskov's implementation, section 5.2)."""
        if self.resend_armed:
            return
        self.resend_open = self._open_own_slots() if self.active else frozenset()
        if self.resend_open or awaiting_handover(self) is not None:
            self.resend_armed = True
            self._set_timer(TimerKind.RESEND, b"", self.params.escalated(
                self.params.request_timeout_ms, self.views_without_commit))

    def _on_resend_timer(self) -> None:
        self.resend_armed = False
        if self.active:
            for seq_no in sorted(self.resend_open & self._open_own_slots()):
                self._resend_own(self.log.certs[(self.view, seq_no)])
        own = awaiting_handover(self)
        if own is not None:
            self._broadcast(own)
        self._arm_resend_timer()

    def _resend_own(self, slot: Slot) -> None:
        """Our messages for this slot again. Our PRE-PREPARE only with its block: a new
        primary's re-proposal whose body it never held travelled in its NEW-VIEW, and a
        PRE-PREPARE without a block is refused by every peer's decoder."""
        if slot.pre_prepare is not None and slot.pre_prepare.body.replica == self.me:
            block = self.log.block_for(slot.pre_prepare.body.seq_no, slot.pre_prepare.body.digest)
            if block is not None:
                self._broadcast(slot.pre_prepare, (block,))
        for votes in (slot.prepares, slot.commits):
            if self.me in votes:
                self._broadcast(votes[self.me])

    # --- normal case --------------------------------------------------------------------

    def _maybe_propose(self) -> None:
        """The primary builds the next block on the newest one validated here, while fewer
        than max_in_flight of its blocks wait to be executed (concurrent consensus). It
        builds once that parent is locked here (`_locked_digest`), so the block goes out as
        soon as it is built, with every transaction that arrived until then; under a backlog
        it builds at once, overlapping its build with the replicas' validation of the
        parent, and holds the block until the parent locks."""
        if not (self.active and self.me == self.primary) or self.fetching is not None:
            return
        if self.building is not None or self.held is not None:
            return
        top = max(self.seq_no, self.last_exec)
        if top - self.last_exec >= self.params.max_in_flight:
            return
        waiting = len(self.requests) - self._in_flight_requests()
        self.block_due |= owes_block(self.epochs.schedule, top)  # up to the handover
        if not (self.block_due or waiting > 0):
            return  # nothing waits that the blocks in flight do not hold
        if top + 1 > self._vote_limit():
            self._drop("primary at the high watermark")
            return
        if not self._may_vote(self.view, top + 1):
            return  # it may have proposed this seqNo in this view before it lost its records
        chain = self._chain_to(top)
        if chain is None or not (self.backlogged or self._locked_digest(top) == chain[0]):
            return
        self.building, self.building_on = top + 1, chain[0]
        self.arrived_while_building, self.waiting_at_build = False, waiting
        self._out.append(BuildBlock(self.building, chain[0], self.block_due,
                                    self.params.block_time_budget_ms, chain[1]))

    def _in_flight_requests(self) -> int:
        """Transactions in this primary's blocks proposed and not executed yet."""
        self.proposed = {n: count for n, count in self.proposed.items() if n > self.last_exec}
        return sum(self.proposed.values())

    def _on_block_built(self, event: BlockBuilt) -> None:
        if self.building != event.seq_no:
            return
        self.building = None
        if not event.block:  # the chain it was to go on is gone, or the build failed
            self._maybe_propose()  # on the chain as it is now
            return
        due = self.block_due or owes_block(self.epochs.schedule, event.seq_no - 1)
        if not event.tx_hashes and not due:  # (owed to a handover whatever a timer said since)
            if self.arrived_while_building:  # the build missed it: build again, once per arrival
                self._maybe_propose()
            return
        self.backlogged = len(event.tx_hashes) < self.waiting_at_build
        self.held = (event, self.building_on)
        self._propose_held()

    def _propose_held(self) -> None:
        """PRE-PREPARE the built block once its parent is locked here: a block is proposed
        on a parent that f+1 correct replicas hold prepared, so any view change's O keeps
        that parent at its seqNo (`_locked_digest`). A block whose chain moved on meanwhile
        is dropped, and the next one is built on the chain as it is."""
        if self.held is None:
            return
        event, parent = self.held
        if self._locked_digest(event.seq_no - 1) != parent:
            return  # released by `_release_votes` when the parent locks
        self.held = None
        if self._still_proposable(event.seq_no, parent):
            self.block_due = False
            pre_prepare = self._sign(PrePrepare(self.view, event.seq_no, event.digest, self.me))
            self._accept_pre_prepare(pre_prepare, event.block)
            slot = self.log.certs[(self.view, event.seq_no)]
            slot.validated, slot.parent = True, parent
            self.proposed[event.seq_no] = len(event.tx_hashes)
            self._broadcast(pre_prepare, (event.block,))
            self._arm_resend_timer()
            self._check_prepared(self.view, event.seq_no)
        self._maybe_propose()

    def _still_proposable(self, seq_no: int, parent: bytes) -> bool:
        """This replica is the active primary, seq_no is its next and within the window, and
        the chain up to seq_no - 1 still ends in `parent` (a catch-up may have replaced it)."""
        if not (self.active and self.me == self.primary and self._in_window(seq_no)):
            return False
        if max(self.seq_no, self.last_exec) + 1 != seq_no:
            return False
        chain = self._chain_to(seq_no - 1)
        return chain is not None and chain[0] == parent

    def _chain_to(self, seq_no: int) -> tuple[bytes, tuple[bytes, ...]] | None:
        """The digest of the block at seq_no that this replica builds or validates on, and
        the uncommitted blocks from the head up to it (oldest first): each validated here in
        this view on the one before. None if they are not (yet)."""
        digest, ancestors = self.last_exec_hash, []
        for n in range(self.last_exec + 1, seq_no + 1):
            slot = self.log.certs.get((self.view, n))
            if slot is None or not slot.validated or slot.parent not in (None, digest):
                return None
            assert slot.digest is not None  # validated: the slot has its pre-prepare
            block = self.log.block_for(n, slot.digest)
            if block is None:
                self._want(n, slot.digest)
                return None
            digest = slot.digest
            ancestors.append(block)
        return digest, tuple(ancestors)

    def _locked_digest(self, seq_no: int) -> bytes | None:
        """The block at seq_no that no view change can replace, as far as this replica knows:
        executed, certified, or prepared here in this view (its own COMMIT sent). A replica
        votes for block n (PREPARE, or the primary's PRE-PREPARE) only once its parent is
        locked here, so a prepared block n had f+1 correct voters holding n-1 prepared or
        committed, and the N-f VIEW-CHANGEs of any later view include one of them: O keeps
        n's parent wherever it keeps n (one block in flight gave this for free)."""
        if seq_no == self.last_exec:
            return self.last_exec_hash
        certified = self.log.certified.get(seq_no)
        if certified is not None:
            return certified[0]
        slot = self.log.certs.get((self.view, seq_no))
        if slot is not None and self.me in slot.commits:
            return slot.digest
        return None

    def _accept_pre_prepare(self, pre_prepare: Signed[PrePrepare], block: bytes | None) -> None:
        body = pre_prepare.body
        self.log.accept_pre_prepare(pre_prepare, block)
        if body.seq_no > self.seq_no:
            self.seq_no = body.seq_no
        self._persist_meta()

    def _on_message(self, event: MessageReceived) -> None:
        try:
            wire = WireMessage.decode(event.data, self.epochs.limits(self.params.log_size))
            self.epochs.verify(wire.signed)
        except MessageError as exc:
            self._drop(type(exc).__name__)
            return
        if self.epochs.address_of(wire.signed.body) == self.address:
            self._drop("own message")
            return
        self.received[wire.signed.body.TYPE.name.lower()] += 1
        self._dispatch(wire, event.sender)

    def _dispatch(self, wire: WireMessage[Body], delivered_by: bytes) -> None:
        """`delivered_by`: the member whose link delivered it (b"": not known)."""
        if (phase := wire_as(wire, PhaseMessage)) is not None:
            self._on_phase_message(phase, delivered_by)
        elif (checkpoint := signed_as(wire.signed, Checkpoint)) is not None:
            self._on_checkpoint(checkpoint, delivered_by)
        elif (view_change := wire_as(wire, ViewChange)) is not None:
            on_view_change(self, view_change, delivered_by)
        elif (new_view := wire_as(wire, NewView)) is not None:
            on_new_view(self, new_view)

    def _on_phase_message(self, wire: WireMessage[PhaseMessage], delivered_by: bytes) -> None:
        body = wire.signed.body
        if beyond_handover(self.epochs.schedule, body.seq_no,
                           self.low_watermark + self.params.log_size):
            self._buffer_future(wire, delivered_by)  # the new set's: taken once installed
        elif not self._in_window(body.seq_no):
            self._drop("outside the watermarks")
        elif body.view > self.view or (body.view == self.view and not self.active):
            self._buffer_future(wire, delivered_by)
        elif body.view < self.view:
            self._drop("old view")
        elif (pre_prepare := wire_as(wire, PrePrepare)) is not None:
            self._on_pre_prepare(pre_prepare, delivered_by)
        elif (prepare := signed_as(wire.signed, Prepare)) is not None:
            if body.replica == self.epochs.primary(body.view, body.seq_no):
                self._record_evidence(prepare, None)  # a primary never prepares
                self._start_view_change(self.view + 1, "evidence")
            else:
                self._on_vote(prepare, self.log.slot(body.view, body.seq_no).prepares)
        elif (commit := signed_as(wire.signed, Commit)) is not None:
            self._on_vote(commit, self.log.slot(body.view, body.seq_no).commits)

    def _buffer_future(self, wire: WireMessage[PhaseMessage], delivered_by: bytes) -> None:
        if relayed_copy(delivered_by, self.epochs.address_of(wire.signed.body)):
            self._drop("relayed copy of a message for later")
            return
        for _ in range(hold_future(self.future, wire, self.params.future_block_bytes)):
            self._drop("future blocks over their bound")

    def _on_pre_prepare(self, wire: WireMessage[PrePrepare], delivered_by: bytes) -> None:
        pre_prepare = wire.signed
        body = pre_prepare.body
        if body.replica != self.epochs.primary(body.view, body.seq_no) or len(wire.blocks) != 1:
            self._drop("pre-prepare not from the primary or without its block")
            return
        if body.seq_no <= self.last_exec:
            self._drop("pre-prepare at an executed seqNo")
            return
        if body.seq_no > self._pipeline_end():
            self._buffer_future(wire, delivered_by)  # further ahead than the primary may be
            return
        slot = self.log.slot(body.view, body.seq_no)
        if slot.pre_prepare is not None:
            if slot.pre_prepare.body != body:
                self._record_evidence(slot.pre_prepare, pre_prepare)
                self._start_view_change(self.view + 1, "evidence")
            else:
                self._drop("duplicate")
            return
        block: bytes | None = wire.blocks[0]
        if not self._matches(wire.blocks[0], body.digest):
            # The primary's signed digest stands (and is evidence if it conflicts later); the
            # copy is false, so the body is fetched from the peers by that digest.
            self._drop("pre-prepared block does not match its digest")
            block = None
        self._accept_pre_prepare(pre_prepare, block)
        self._restart_request_timer()
        self._advance()

    def _pipeline_end(self) -> int:
        """The highest seqNo a correct primary may have proposed as far as this replica
        knows: max_in_flight beyond its last certified block (those certified here are
        executed next)."""
        return self._certified_run_end() + self.params.max_in_flight

    def _certified_run_end(self) -> int:
        """The last of the certified blocks that follow the head without a gap."""
        top = self.last_exec
        while top + 1 in self.log.certified:
            top += 1
        return top

    def _replay_future(self) -> None:
        """Messages held for the current view (or for a parent that is now certified)."""
        replay = sorted((w for w in self.future.values() if w.signed.body.view == self.view),
                        key=lambda w: (w.signed.body.seq_no, w.signed.body.TYPE))
        self.future = {k: w for k, w in self.future.items() if w.signed.body.view != self.view}
        for wire in replay:
            self._dispatch(wire, b"")  # (its signer's own: `joining.relayed_copy`)

    def _on_vote(self, vote: Signed[V], votes: dict[int, Signed[V]]) -> None:
        """A PREPARE or COMMIT, into its slot's `votes` (prepares or commits)."""
        body = vote.body
        held = votes.get(body.replica)
        if held is not None:
            if held.body != body:
                self._record_evidence(held, vote)
            else:
                self._drop("duplicate")
            return
        self.log.add_vote(vote, votes)
        self._check_prepared(body.view, body.seq_no)

    def _validate_next(self) -> None:
        """Validate the first pre-prepared block not validated yet, on top of the chain head
        and the blocks validated before it (one validation at a time, in seqNo order)."""
        if any(slot.validating for (view, _), slot in self.log.certs.items()
               if view == self.view):
            return
        seq_no = self.last_exec + 1
        while (slot := self.log.certs.get((self.view, seq_no))) is not None and slot.validated:
            seq_no += 1
        if slot is None or slot.pre_prepare is None or slot.refused:
            return
        chain = self._chain_to(seq_no - 1)
        if chain is None:
            return
        digest = slot.pre_prepare.body.digest
        block = self.log.block_for(seq_no, digest)
        if block is None:
            self._want(seq_no, digest)
            return
        slot.validating, slot.parent = True, chain[0]
        self._out.append(ValidateBlock(seq_no, digest, block, chain[1],
                                       slot.pre_prepare.body.replica))
        self._set_timer(TimerKind.VALIDATION, u64(seq_no), self._validation_deadline_ms())

    def _validation_deadline_ms(self) -> int:
        """How long a validation may take before it is given up: twice the request timeout,
        escalated like it (a primary's block takes a fifth of one to build)."""
        return 2 * self.params.escalated(self.params.request_timeout_ms,
                                         self.views_without_commit)

    def _on_validation_deadline(self, seq_no: int) -> None:
        """The adapter never answered. The first time, the block is validated again at
        once: the others may need this vote (N = 2, f replicas down, or this replica is the
        primary of a re-proposal) and a lost answer is this executor's fault, not the
        primary's. The second time it is given up: not voted for here (the others may
        still commit it, and this replica then executes it on their certificate), and
        "busy" stops holding back a view change or a catch-up. At most two validations of
        one block are ever outstanding in a view."""
        slot = self.log.certs.get((self.view, seq_no))
        if slot is None or not slot.validating:
            return
        slot.validating = False
        self._drop("validation deadline")
        if slot.timed_out:
            slot.refused = True
            check_high_checkpoints(self)
        slot.timed_out = True
        self._advance()

    def _on_block_validated(self, event: BlockValidated) -> None:
        slot = self.log.certs.get((self.view, event.seq_no))
        current = slot is not None and slot.validating and slot.digest == event.digest
        for (_, seq_no), other in self.log.certs.items():  # an older view's, if the view moved
            if seq_no == event.seq_no and other.digest == event.digest:
                if other.validating and other.pre_prepare is not None and (
                        event.refusal is Refusal.INVALID):
                    # Against the primary that proposed it, whichever view this replica is in
                    # now (faster replicas may have taken it to the next view meanwhile).
                    self._record_evidence(other.pre_prepare, None, "invalid block")
                other.validating = False
        if current:
            self._out.append(CancelTimer(TimerKind.VALIDATION, u64(event.seq_no)))
        if current and event.refusal is Refusal.INVALID:
            # The body matches the header the primary signed: every correct replica refuses
            # it alike, so the primary is faulty; no timer needs to run out to say so.
            assert slot is not None
            slot.refused = True
            self._start_view_change(self.view + 1, "invalid_block")
            return
        if current and not event.ok:
            self._drop("block copy not validated")
            self.log.discard_block(event.seq_no, event.digest)
        elif current:
            self._restart_request_timer()  # our own execution time is not the primary's delay
            self._mark_validated(self.view, event.seq_no)
        check_high_checkpoints(self)
        self._advance()

    def _mark_validated(self, view: int, seq_no: int) -> None:
        slot = self.log.certs[(view, seq_no)]
        slot.validated = True
        self._vote_prepare(view, seq_no, slot)
        self._check_prepared(view, seq_no)

    def _vote_prepare(self, view: int, seq_no: int, slot: Slot) -> None:
        """PREPARE a validated block once its parent is locked here (`_locked_digest`)."""
        digest = slot.digest  # validated: the slot has its pre-prepare
        primary = self.epochs.primary(view, seq_no)
        if digest is None or self.me == primary or self.me in slot.prepares:
            return
        if not self._may_vote(view, seq_no):
            return
        if seq_no > self.last_exec and self._locked_digest(seq_no - 1) != slot.parent:
            return  # released by `_release_votes` when the parent locks
        self._cast_vote(slot.prepares, Prepare(view, seq_no, digest, self.me))

    def _release_votes(self) -> None:
        """The votes that waited for their parent to lock here: the PREPAREs, and the
        primary's next block."""
        if not self.active:
            return
        self._propose_held()
        for seq_no in range(self.last_exec + 1, self.seq_no + 1):
            slot = self.log.certs.get((self.view, seq_no))
            if slot is not None and slot.validated and self.me not in slot.prepares:
                self._vote_prepare(self.view, seq_no, slot)
                self._check_prepared(self.view, seq_no)
        self._maybe_propose()

    def _cast_vote(self, votes: dict[int, Signed[V]], body: V) -> None:
        """Sign our PREPARE or COMMIT, keep it in its slot and the certStore, send it."""
        vote = self._sign(body)
        self.log.add_vote(vote, votes)
        self._broadcast(vote)
        self._arm_resend_timer()

    def _check_prepared(self, view: int, seq_no: int) -> None:
        """Prepared: our validated pre-prepare and Q-1 matching prepares -> COMMIT."""
        slot = self.log.certs[(view, seq_no)]
        if slot.pre_prepare is None or not slot.validated:
            return
        if self.me not in slot.commits and self._may_vote(view, seq_no):
            prepares = slot.matching(slot.prepares, exclude=self.epochs.primary(view, seq_no))
            if len(prepares) < self.epochs.quorum_at(seq_no) - 1:
                return
            self.log.add_prepared(PreparedProof(slot.pre_prepare, tuple(prepares)))
            self._cast_vote(slot.commits, Commit(view, seq_no, slot.pre_prepare.body.digest,
                                                 self.me))
            self._release_votes()  # its successor's vote may wait for this lock
        self._check_committed(slot, seq_no)

    def _check_committed(self, slot: Slot, seq_no: int) -> None:
        commits = slot.matching(slot.commits)  # none match a slot without its pre-prepare
        digest, quorum = slot.digest, self.epochs.quorum_at(seq_no)
        if digest is None or len(commits) < quorum or seq_no in self.log.certified:
            return
        self.log.certify(seq_no, digest, encode_commit_certificate(commits))
        self._advance()
        if self.active:
            self._replay_future()  # a PRE-PREPARE held beyond the pipeline's end

    def _advance(self) -> None:
        """Execute the next certified block, validate the next pre-prepared one, propose."""
        if self.fetching is not None:
            return
        seq_no = self.last_exec + 1
        if self.executing is None and seq_no in self.log.certified:
            digest, certificate = self.log.certified[seq_no]
            block = self.log.block_for(seq_no, digest)
            if block is None:
                self._want(seq_no, digest)
            else:
                self.executing = seq_no
                self._out.append(CommitBlock(seq_no, digest, block, certificate))
        if self.active:
            self._validate_next()
            self._release_votes()
        self._maybe_propose()

    def _want(self, seq_no: int, digest: bytes) -> None:
        """Ask the peers for a body this replica needs (once, until a copy arrives)."""
        if (seq_no, digest) not in self.wanted:
            self.wanted.add((seq_no, digest))
            self._out.append(FetchBlock(seq_no, digest))

    def _on_block_received(self, event: BlockReceived) -> None:
        entry = (event.seq_no, event.digest)
        if entry not in self.wanted or not self._matches(event.block, event.digest):
            self._drop("unwanted or false block copy")
            return
        self.wanted.discard(entry)
        self.log.keep_outstanding(event.seq_no, event.digest, event.block)
        self._advance()

    def block_for(self, seq_no: int, digest: bytes) -> bytes | None:
        """The copy of a block this replica holds, for a peer that asks (`FetchBlock`)."""
        return self.log.block_for(seq_no, digest)

    def _on_block_committed(self, event: BlockCommitted) -> None:
        if self.executing != event.seq_no:
            return
        self.executing = None
        if self.log.certified.get(event.seq_no, (event.block_hash,))[0] != event.block_hash:
            self._alarm("commit", f"block {event.seq_no} imported with another hash")
            return
        self.last_exec, self.last_exec_hash = event.seq_no, event.block_hash
        self._forget_requests(event.tx_hashes,
                              owed=owes_block(self.epochs.schedule, event.seq_no - 1))
        self.trailing_owed = bool(event.tx_hashes)
        self._arm_trailing_block()
        self.log.forget_outstanding(event.seq_no)
        self.wanted = {k for k in self.wanted if k[0] > event.seq_no}
        if event.seq_no % self.params.checkpoint_interval == 0:
            self._send_checkpoint(event.seq_no, event.block_hash, event.state_root)
        self._after_execution()

    def _arm_trailing_block(self) -> None:
        """A block with transactions committed (`trailing_owed`): one empty block follows it
        unless another block does first (restarted by each block with transactions; armed
        again by a new view, whose primary may not be the one that owed it). A client that read no
        receipt at block n and then waits for the next head (web3 1.x subscribes to
        newHeads) would otherwise wait for ever on an idle chain; one block per busy block at
        most, so an idle chain stays idle (Besu's `emptyblockperiodseconds` and CometBFT's
        `create_empty_blocks_interval` answer the same need with periodic blocks)."""
        if self.trailing_owed and self.params.trailing_block_ms and not self.params.empty_blocks:
            self._set_timer(TimerKind.TRAILING_BLOCK, b"", self.params.trailing_block_ms)

    def _on_commit_refused(self, event: CommitRefused) -> None:
        """The held copy of a certified block did not execute. The quorum certified its
        header, so the body was false (bodies travel unsigned): forget it and fetch the block
        again by digest, from the other peers first (block sync asks its server last)."""
        if self.executing != event.seq_no:
            return
        self.executing = None
        if event.false_copy:
            self._drop("false copy of a certified block")
            self.log.discard_block(event.seq_no, event.digest)
        else:  # the only copy may be this one (a lone validator's): keep it, try again
            self._drop("certified block not executed here")
        self._advance()

    def _after_execution(self) -> None:
        """The head moved: take the PRE-PREPAREs held for it, go on, and fetch if peers
        proved we fell behind while we were busy."""
        install(self)  # executed past a handover checkpoint
        if self.active:
            self._replay_future()
        self._advance()
        check_high_checkpoints(self)

    # --- checkpoints, watermarks, falling behind --------------------------------------

    def _send_checkpoint(self, seq_no: int, block_hash: bytes, state_root: bytes) -> None:
        index = self.epochs.index_at(seq_no, self.address)  # (a joiner's c is the old set's)
        if index is None:
            return
        checkpoint = self._sign(Checkpoint(seq_no, block_hash, state_root, index))
        self._broadcast(checkpoint)
        self._store_checkpoint(checkpoint)
        self._arm_resend_timer()  # (a lost CHECKPOINT at a handover would stop the chain)

    def _on_checkpoint(self, checkpoint: Signed[Checkpoint], delivered_by: bytes = b"") -> None:
        seq_no = checkpoint.body.seq_no
        # One at h still counts while h is not stable (a catch-up moved h to a checkpoint
        # this replica executed, whose proof it collects only now).
        if seq_no < self.low_watermark or seq_no <= self.stable_checkpoint:
            if not (complete_proof(self, seq_no, (checkpoint,))
                    or adopt_offered_checkpoint(self, checkpoint, delivered_by)):
                self._drop("checkpoint below the low watermark")
        elif seq_no > self.high_watermark:
            self._note_high_checkpoint(checkpoint)
        else:
            held = self.checkpoints.held(seq_no, checkpoint.body.replica)
            if held is None:
                self._store_checkpoint(checkpoint)
            elif held.body != checkpoint.body:
                self._record_evidence(held, checkpoint)
            else:
                self._drop("duplicate")

    def _store_checkpoint(self, checkpoint: Signed[Checkpoint]) -> None:
        self.checkpoints.add(checkpoint)
        self._check_stable(checkpoint.body.seq_no)

    def _check_stable(self, seq_no: int) -> None:
        if self.checkpoints.conflicting(seq_no):
            self._alarm("checkpoint_conflict",
                        f"checkpoint {seq_no}: replicas disagree on the block or state root")
        elif self.checkpoints.stable(seq_no) and seq_no > self.stable_checkpoint:
            self._mark_stable(seq_no)

    def _mark_stable(self, seq_no: int) -> None:
        self.stable_checkpoint = seq_no
        self.checkpoints.stabilize(seq_no)
        self.log.truncate_view_change_sets(seq_no)
        if seq_no > self.low_watermark:
            self._move_watermarks(seq_no)
        else:
            self._persist_meta()
        self._check_recovered()
        install(self)

    def _move_watermarks(self, seq_no: int) -> None:
        """moveWatermarks: h = seq_no; forget the log at and below it, in memory and on disk.

        pset/qset/checkpoints follow the stable checkpoint (`_mark_stable`) instead, so a
        VIEW-CHANGE can always prove everything above its checkpoint.
        """
        self.low_watermark = seq_no
        self.seq_no = max(self.seq_no, seq_no)
        self.log.truncate(seq_no)
        self.wanted = {k for k in self.wanted if k[0] > seq_no}
        self.future = {k: w for k, w in self.future.items() if k[2] > seq_no}
        self._persist_meta()
        for checkpoint in self.checkpoints.take_inside(self.high_watermark):
            self._on_checkpoint(checkpoint)
        self._maybe_propose()

    def _note_high_checkpoint(self, checkpoint: Signed[Checkpoint]) -> None:
        """Checkpoints above H are kept one per replica; f+1 matching mean we fell behind."""
        self.checkpoints.note_above_window(checkpoint)
        check_high_checkpoints(self)

    # --- view change ------------------------------------------------------------------

    def _start_view_change(self, view: int, reason: str) -> None:
        """Leave the current view and send VIEW-CHANGE(view)."""
        if view <= self.view or not self._may_view_change(view):
            return
        self._cancel_request_timer()
        self._count_view_change(reason)
        self.view, self.active = view, False
        self.new_view_timer_armed = False
        self.view_change_sends = 0
        self.building, self.proposed, self.held, self.backlogged = None, {}, None, False
        self.future = {k: w for k, w in self.future.items() if w.signed.body.view >= view}
        self._persist_meta()
        stable = self.stable_checkpoint
        proof = self.checkpoints.proof(stable) if stable else ()
        # Q: what it accepted, up to where it may have voted (Q builds no part of O).
        pre_prepared = tuple(entry for entry in self.log.pre_prepared_above(stable)
                             if entry.seq_no <= self._vote_limit())
        self._sign(ViewChange(view, stable, proof, self.log.prepared_above(stable),
                              pre_prepared, self.me))
        self._resend_view_change()
        check_view_change_quorum(self)

    def _count_view_change(self, reason: str) -> None:
        self.view_change_reasons[reason] += 1
        self.views_without_commit += 1

    def _arm_new_view_timer(self) -> None:
        self.new_view_timer_armed = True
        self._set_timer(TimerKind.NEW_VIEW, u64(self.view), self.params.escalated(
            self.params.new_view_timeout_ms, self.views_without_commit - 1))

    def _own_view_change(self) -> WireMessage[ViewChange]:
        """VIEW-CHANGE and NEW-VIEW carry digests, not blocks (as in the paper): their size
        does not grow with the blocks, so they always fit a frame; bodies are fetched."""
        own = signed_as(self.log.signed[signed_key(VIEW_MESSAGE_SEQ_NO, MessageType.VIEW_CHANGE,
                                               self.view)], ViewChange)
        assert own is not None  # the key is a VIEW-CHANGE's
        return WireMessage(own)

    def _resend_view_change(self) -> None:
        """Our VIEW-CHANGE again, and the oldest waiting requests to every peer: a replica
        that asked alone (cut off when its timer ran out) may hold transactions whose gossip
        never reached the others, who stay in their view and would never commit them."""
        wire = self._own_view_change()
        self.view_changes[self.address] = wire
        self._send(wire)
        self.view_change_sends += 1
        oldest = tuple(itertools.islice(self.requests, RELAYED_REQUESTS))
        sends = self.view_change_sends
        if oldest and sends <= MAX_RELAY_SEND and sends & (sends - 1) == 0:
            # the 1st, 2nd, 4th ... 128th send: eight relays at most, over minutes
            self._out.extend(RelayRequests(peer, oldest)
                             for peer in range(self.epochs.current.n) if peer != self.me)
        self._set_timer(TimerKind.VIEW_CHANGE_RESEND, u64(self.view),
                        self.params.new_view_timeout_ms)

    def _matches(self, block: bytes, digest: bytes) -> bool:
        return bool(block) and self.block_digest(block) == digest

    def _adopt_stable(self, seq_no: int, proof: tuple[Signed[Checkpoint], ...]) -> None:
        self.checkpoints.adopt(seq_no, proof)
        self._mark_stable(seq_no)
        if self.last_exec < seq_no and self.fetching is None:
            block_hash, state_root = proof[0].body.value
            fall_behind(self, seq_no, block_hash, state_root)

