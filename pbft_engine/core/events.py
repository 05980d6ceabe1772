"""Events: what the adapter feeds into `Replica.step` (messages, timers, block outcomes)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class TimerKind(Enum):
    REQUEST = "request"  # key: b""; known transactions waited a timeout with no progress
    NEW_VIEW = "new_view"  # key: view (8 bytes BE); no valid NEW-VIEW after N-f VIEW-CHANGEs
    VIEW_CHANGE_RESEND = "view_change_resend"  # key: view; resend our VIEW-CHANGE
    BLOCK_PERIOD = "block_period"  # key: b""; the primary may propose an empty block
    RELAY = "relay"  # key: b""; halfway through REQUEST: relay the oldest requests again
    # key: seqNo; a ValidateBlock not answered by then is given up (the adapter may hang)
    VALIDATION = "validation"
    RESEND = "resend"  # key: b""; our messages for slots still open a request timeout later
    TRAILING_BLOCK = "trailing_block"  # key: b""; an empty block after one with transactions
    FAIRNESS_MARK = "fairness_mark"  # key: b""; the oldest request has reached the primary


@dataclass(frozen=True)
class MessageReceived:
    """Bytes of a `WireMessage` from a peer (authenticated by its signature, not the link).
    `sender`: the member whose link delivered them (b"": not known), which is not its signer
    when a member relays another's message: such a copy is never held for later
    (`joining.relayed_copy`), nor answered with a checkpoint proof
    (`handover.offer_stable_proof`)."""

    data: bytes
    sender: bytes = b""


@dataclass(frozen=True)
class RequestReceived:
    """A transaction in the local pool became executable at the head: its nonce continues
    its sender's run from the account nonce, its fee cap covers the next base fee and its gas
    fits a block. Only such a transaction could be in the primary's next block, so only such
    a transaction may run the request timer (a gapped one is reported once its gap closes)."""

    tx_hash: bytes


@dataclass(frozen=True)
class RequestDropped:
    """A transaction reported by `RequestReceived` left the pool other than by being committed
    (replaced, evicted, expired, made invalid by a committed block) or stopped being
    executable (the base fee rose above its fee cap). Commits are reported by
    `BlockCommitted` and `FetchCompleted`."""

    tx_hash: bytes


@dataclass(frozen=True)
class TimerFired:
    kind: TimerKind
    key: bytes


@dataclass(frozen=True)
class BlockBuilt:
    """Reply to `BuildBlock`: the candidate block and the transactions in it (an empty
    `block`: none was built, its parent chain no longer extends the head)."""

    seq_no: int
    digest: bytes
    block: bytes
    tx_hashes: tuple[bytes, ...]


class Refusal(Enum):
    """Why a block was not validated (`BlockValidated.refusal`)."""

    # The proposer's block breaks the rules: its body matches the header the proposer signed
    # (by digest) and does not decode or execute. Every correct replica refuses it alike.
    INVALID = "invalid"
    # The copy held is not the proposer's: its header hashes to the digest, its body does not
    # match that header's roots (bodies travel unsigned). Another copy is fetched.
    FALSE_COPY = "false_copy"
    # It could not be checked here: the chain moved under it, or the executor failed. Says
    # nothing about the proposer.
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class BlockValidated:
    """Reply to `ValidateBlock`: ok iff the block hashes to digest and executes on the head;
    otherwise `refusal` says whose fault it was."""

    seq_no: int
    digest: bytes
    ok: bool
    refusal: Refusal | None = None


@dataclass(frozen=True)
class BlockCommitted:
    """Reply to `CommitBlock`: the block was imported as canonical."""

    seq_no: int
    block_hash: bytes
    state_root: bytes
    tx_hashes: tuple[bytes, ...]


@dataclass(frozen=True)
class CommitRefused:
    """Reply to `CommitBlock` when the copy held of the certified block does not execute.

    A quorum certified its digest, the hash of its header, so the body that came with that
    header is false: a fetched copy (bodies travel unsigned) whose transactions are not the
    ones the header's roots commit to. `false_copy` False: the body is the header's and the
    failure was this node's own (its executor raised): the copy is kept and tried again.
    """

    seq_no: int
    digest: bytes
    false_copy: bool = True


@dataclass(frozen=True)
class FetchCompleted:
    """Reply to `FetchCommitted`: certified blocks up to seq_no were verified and imported."""

    seq_no: int
    block_hash: bytes
    state_root: bytes
    tx_hashes: tuple[bytes, ...]


@dataclass(frozen=True)
class PeerCommitted:
    """A peer proved, with a verified commit certificate, that block seq_no is committed.

    The adapter reports it when this replica made no progress for a while, so a replica that
    missed blocks inside its window (or started empty) catches up on a quiet chain too. The
    certificate lets the replica commit the next block itself when it holds its body (or can
    fetch it from any peer by digest), whoever claimed it. A certificate in a later view than
    the replica's proves that view (`new_view.join_certified_view`): the adapter reports the
    certificate of the replica's own head too when the STATUS answer that brought it carries
    a NEW-VIEW above the replica's view (which it may not be able to take: another epoch's).
    """

    seq_no: int
    block_hash: bytes
    certificate: bytes


@dataclass(frozen=True)
class BlockReceived:
    """Reply to `FetchBlock`: a peer's copy of the block (the replica checks its digest)."""

    seq_no: int
    digest: bytes
    block: bytes


@dataclass(frozen=True)
class FetchFailed:
    """Reply to `FetchCommitted` when no peer could serve the target. A fetch commits a range
    at a time: `reached` is what it imported before it failed (None: nothing), so the
    replica's head never goes stale."""

    target_seq_no: int
    reached: FetchCompleted | None = None


@dataclass(frozen=True)
class FetchProgressed:
    """Block sync's news of the fetch of `target_seq_no` under way: it is `executing` an
    answer a peer served (its own work: the replica's request timeouts are excused
    meanwhile, as while it executes a block of its own), or, done with it, waits for
    peers again with its head at `seq_no` (progress if that head moved; a false answer is
    none). The replica excuses its request timeouts only while the fetch does not wait on
    peers long without progress (`catch_up.stalled`): a byzantine peer that holds the
    request ends the excuse, not block sync's 10 s per peer."""

    target_seq_no: int
    seq_no: int
    executing: bool


@dataclass(frozen=True)
class ScheduleChange:
    """A validator-set change passed in committed block `passed_at` (the registry's record,
    read from the state after that block by the adapter; on a restart the whole schedule is
    given to `Replica.restore` instead). It takes effect after the handover checkpoint
    (`core.epochs.handover_checkpoint`); a change already known changes nothing."""

    validators: tuple[bytes, ...]
    passed_at: int


Event = (
    MessageReceived
    | RequestReceived
    | RequestDropped
    | TimerFired
    | BlockBuilt
    | BlockValidated
    | BlockCommitted
    | CommitRefused
    | FetchCompleted
    | FetchFailed
    | FetchProgressed
    | PeerCommitted
    | BlockReceived
    | ScheduleChange
)
