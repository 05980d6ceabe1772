"""The pure PBFT core: `Replica.step(event) -> Ready` (what to persist, then the actions).
No I/O, no clock
(docs/ARCHITECTURE.md, section 4)."""

from pbft_engine.core.actions import (
    Action,
    Alarm,
    Broadcast,
    BuildBlock,
    CancelTimer,
    CommitBlock,
    FetchBlock,
    FetchCommitted,
    LeftValidatorSet,
    Persist,
    Ready,
    RelayRequests,
    SendTo,
    SetTimer,
    ValidateBlock,
)
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
from pbft_engine.core.params import EngineParams
from pbft_engine.core.records import Delete, DeleteRange, Put, RecordReader, StoreName, StoreOp
from pbft_engine.core.replica import Replica
from pbft_engine.core.status import ChainHead, Mode, ReplicaStatus

__all__ = [
    "Action", "Alarm", "BlockBuilt", "BlockCommitted", "BlockReceived", "BlockValidated",
    "Broadcast", "BuildBlock", "CancelTimer", "ChainHead", "CommitBlock", "CommitRefused",
    "Delete", "DeleteRange",
    "EngineParams", "Event", "FetchBlock", "FetchCommitted", "FetchCompleted", "FetchFailed",
    "FetchProgressed",
    "LeftValidatorSet", "MessageReceived", "Mode", "PeerCommitted", "Persist", "Put", "Ready",
    "RecordReader", "Refusal", "Replica", "ReplicaStatus", "RelayRequests",
    "RequestDropped", "RequestReceived", "ScheduleChange", "SendTo", "SetTimer", "StoreName",
    "StoreOp", "TimerFired", "TimerKind", "ValidateBlock",
]
