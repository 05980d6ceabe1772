"""The persistent model of a replica: store names, key formats and write operations.

The core never touches a database: it emits these operations inside a `Persist` action and
reads them back through a `RecordReader` on restore. Keys are fixed-width big-endian so
LevelDB's key order is seqNo order; values are canonical RLP (see pbft_engine.messages).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import assert_never

from pbft_engine.messages import Body, Checkpoint, NewView, PhaseMessage, ViewChange

# Signed VIEW-CHANGE / NEW-VIEW records use this seqNo so no watermark range ever deletes them.
VIEW_MESSAGE_SEQ_NO = 2**64 - 1


def message_slot(body: Body) -> tuple[int, int]:
    """The (view, seqNo) a message is signed for, as the signed and evidence keys take them:
    a CHECKPOINT has no view (0), a VIEW-CHANGE or NEW-VIEW no seqNo (VIEW_MESSAGE_SEQ_NO)."""
    match body:
        case PhaseMessage():
            return body.view, body.seq_no
        case Checkpoint():
            return 0, body.seq_no
        case ViewChange() | NewView():
            return body.view, VIEW_MESSAGE_SEQ_NO
        case _:
            assert_never(body)


class StoreName(Enum):
    """One keyspace each; the value is the keyspace prefix inside the node's LevelDB."""

    BLOCK_STORE = b"pbft/bs/"  # current view's pre-prepared blocks: seqNo -> [view, digest, block]
    OUTSTANDING_BLOCKS = b"pbft/ob/"  # built or received, not committed: seqNo||digest -> block
    CERT_STORE = b"pbft/cs/"  # seqNo||view||type||replica -> signed PRE-PREPARE/PREPARE/COMMIT
    PSET = b"pbft/ps/"  # seqNo -> prepared certificate (PreparedProof) of the highest view
    QSET = b"pbft/qs/"  # seqNo||digest -> highest view in which it was pre-prepared
    CHECKPOINTS = b"pbft/cp/"  # seqNo||replica -> signed CHECKPOINT
    META = b"pbft/mt/"  # b"state" -> [view, active, seqNo, h, stable seqNo, new-view timeout]
    SIGNED = b"pbft/sg/"  # seqNo||type||view -> the message this replica signed (last signed)
    COMMIT_CERTIFICATES = b"pbft/cc/"  # block number -> commit certificate (permanent)
    EVIDENCE = b"pbft/ev/"  # replica||type||view||seqNo -> [message, conflicting message]
    STABLE_CHECKPOINTS = b"pbft/sc/"  # seqNo -> the Q matching signed CHECKPOINTs (permanent)
    NEW_VIEWS = b"pbft/nv/"  # view -> the signed NEW-VIEW that installed it (permanent)


META_STATE = b"state"
META_NEW_VIEW = b"new_view"


@dataclass(frozen=True)
class Put:
    store: StoreName
    key: bytes
    value: bytes


@dataclass(frozen=True)
class Delete:
    store: StoreName
    key: bytes


@dataclass(frozen=True)
class DeleteRange:
    """Delete every key in [start, stop); None means unbounded."""

    store: StoreName
    start: bytes | None
    stop: bytes | None


StoreOp = Put | Delete | DeleteRange


class RecordReader(ABC):
    """Read access to the persisted records, in key order (pbft_engine.record_store has them)."""

    @abstractmethod
    def items(
        self, store: StoreName, start: bytes | None = None, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs with start <= key < stop."""

    def get(self, store: StoreName, key: bytes) -> bytes | None:
        for found, value in self.items(store, key, key + b"\x00"):
            if found == key:
                return value
        return None


def u64(value: int) -> bytes:
    return value.to_bytes(8, "big")


def u16(value: int) -> bytes:
    return value.to_bytes(2, "big")


def read_u64(key: bytes, offset: int = 0) -> int:
    return int.from_bytes(key[offset:offset + 8], "big")


def cert_key(seq_no: int, view: int, type_code: int, replica: int) -> bytes:
    return u64(seq_no) + u64(view) + bytes([type_code]) + u16(replica)


def signed_key(seq_no: int, type_code: int, view: int) -> bytes:
    return u64(seq_no) + bytes([type_code]) + u64(view)


def evidence_key(replica: int, type_code: int, view: int, seq_no: int) -> bytes:
    return u16(replica) + bytes([type_code]) + u64(view) + u64(seq_no)


def up_to(seq_no: int) -> bytes:
    """The exclusive range end that covers every seqNo-prefixed key <= seq_no."""
    return u64(seq_no + 1)
