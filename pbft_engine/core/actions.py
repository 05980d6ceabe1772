"""Actions: what `Replica.step` asks the adapter to do, as one `Ready`.

Contract for the adapter (etcd's `Ready`: HardState before Messages): write the step's
`persist`, if any, in ONE synced WriteBatch (then its signing bound, outside the database),
then perform its `actions` in order (every message sent depends on the write). Block actions
are answered with the matching event (`BuildBlock` -> `BlockBuilt`, `ValidateBlock` ->
`BlockValidated`, `CommitBlock` -> `BlockCommitted` | `CommitRefused`, `FetchCommitted` ->
`FetchCompleted` | `FetchFailed`, `FetchBlock` -> `BlockReceived`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pbft_engine.core.events import TimerKind
from pbft_engine.core.records import StoreOp
from pbft_engine.core.signing_bound import SigningBound


@dataclass(frozen=True)
class Persist:
    """Write `ops` in one synced batch, then `signing_bound`, if given, durably outside the
    database (it must survive a wiped store: `core.signing_bound`)."""

    ops: tuple[StoreOp, ...]
    signing_bound: SigningBound | None = None


@dataclass(frozen=True)
class Broadcast:
    """Send `data` (an encoded WireMessage) to every other validator: the members of the
    installed epoch and of every scheduled one (an added validator needs the old set's
    CHECKPOINTs at its handover checkpoint, `Replica.join`)."""

    data: bytes


@dataclass(frozen=True)
class SendTo:
    """Send `data` to replica `replica` of the installed epoch as the step ends
    (`Replica.epochs.current`: route by its address there)."""

    replica: int
    data: bytes


@dataclass(frozen=True)
class RelayRequests:
    """Send these waiting transactions from the pool to `replica` (of the installed epoch,
    as `SendTo`), the primary this backup times (skipping any the pool no longer holds),
    when it starts timing and halfway. Gossip delivers a transaction once; one it did not
    deliver to the primary (a link down, a full queue) would otherwise cost a view change,
    or several: a backup relays what it waits for, as a PBFT backup relays a client's
    request to the primary (Castro & Liskov, 4.1)."""

    replica: int
    tx_hashes: tuple[bytes, ...]


@dataclass(frozen=True)
class SetTimer:
    """(Re)arm the timer (kind, key) to fire `TimerFired(kind, key)` after duration_ms."""

    kind: TimerKind
    key: bytes
    duration_ms: int


@dataclass(frozen=True)
class CancelTimer:
    kind: TimerKind
    key: bytes


@dataclass(frozen=True)
class BuildBlock:
    """Build block seq_no on parent_hash from the pool (empty only if allow_empty), adding
    transactions only while the block's execution time stays within time_budget_ms.

    `ancestors` are the blocks between the chain head and the parent, oldest first (the
    parent last; none when the parent is the head): validated here but not committed yet.
    The block is built on their executed state, with the pool's transactions they hold left
    out; an ancestor the adapter no longer holds executed is executed again from its bytes.
    """

    seq_no: int
    parent_hash: bytes
    allow_empty: bool
    time_budget_ms: int
    ancestors: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class ValidateBlock:
    """Check that `block` hashes to digest, is block number seq_no and executes on the head
    extended by `ancestors` (as in `BuildBlock`: uncommitted blocks, oldest first)."""

    seq_no: int
    digest: bytes
    block: bytes
    ancestors: tuple[bytes, ...] = ()
    proposer: int = 0  # the replica whose PRE-PREPARE it is (named in a refusal's log line)


@dataclass(frozen=True)
class CommitBlock:
    """Import `block` as canonical with its commit certificate (encoded COMMITs)."""

    seq_no: int
    digest: bytes
    block: bytes
    certificate: bytes


@dataclass(frozen=True)
class FetchCommitted:
    """This replica fell behind: fetch and import certified blocks up to target_seq_no.

    block_hash is the target's hash; state_root is empty when the target came from a commit
    certificate (`PeerCommitted`) rather than from a weak certificate of checkpoints.
    """

    target_seq_no: int
    block_hash: bytes
    state_root: bytes


@dataclass(frozen=True)
class FetchBlock:
    """The body of block `digest` at seq_no is needed and not here (VIEW-CHANGE and NEW-VIEW
    carry digests only): ask the peers, and answer with each copy as `BlockReceived` until
    the replica stops asking (it asks again, once, if a copy proves false)."""

    seq_no: int
    digest: bytes


@dataclass(frozen=True)
class Alarm:
    """Something an operator must look at (e.g. conflicting checkpoints); the replica halts."""

    kind: str
    detail: str


@dataclass(frozen=True)
class LeftValidatorSet:
    """This replica's address is not in the set of epoch `epoch`, which decides the heights
    from `first_height` on: it voted up to the handover checkpoint first_height - 1 and sends
    no consensus message any more (it takes no further step). The adapter follows the chain
    as an observer from here (DESIGN.md section 10)."""

    epoch: int
    first_height: int


Action = (
    Broadcast
    | SendTo
    | RelayRequests
    | SetTimer
    | CancelTimer
    | BuildBlock
    | ValidateBlock
    | CommitBlock
    | FetchCommitted
    | FetchBlock
    | Alarm
    | LeftValidatorSet
)


@dataclass(frozen=True)
class Ready:
    """One step's outcome, persist-before-send as a type: `persist` is written before any of
    `actions` is performed."""

    persist: Persist | None = None
    actions: list[Action] = field(default_factory=list)
