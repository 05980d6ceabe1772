"""The block-sync messages of catch-up (`pbft_engine.sync`) and their strict decoding.

Wire format (canonical RLP lists, first item the kind):
  GET_STATUS  [0]
  STATUS      [1, head number, head hash, head's commit certificate, signed NEW-VIEW or b""]
  GET_BLOCKS  [2, request id, first number, count]
  BLOCKS      [3, request id, [[block, commit certificate], ...]]
  GET_BLOCK   [4, seqNo, digest]
  BLOCK       [5, seqNo, digest, block]
  COMMITTED   [6, number, block, commit certificate]   (a validator's push to its observers)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import rlp

from encoding import EncodingError
from encoding.rlp import RlpTooDeep, RlpTooManyItems, check_rlp_bounds, decode_uint
from pbft_engine.errors import MessageError

MAX_BLOCKS_PER_REQUEST = 32
MAX_SYNC_DEPTH = 4  # BLOCKS: [kind, id, [[block, certificate], ...]]
# Items a message may hold, walked before pyrlp decodes anything (its decoder is quadratic in
# a list's length): BLOCKS, the largest, holds 3 per block and 4 around them; blocks,
# certificates and NEW-VIEWs travel as byte strings, one item each.
MAX_SYNC_ITEMS = 4 + 3 * MAX_BLOCKS_PER_REQUEST
MAX_SYNC_LIST_ITEMS = MAX_BLOCKS_PER_REQUEST


class SyncKind(IntEnum):
    GET_STATUS = 0
    STATUS = 1
    GET_BLOCKS = 2
    BLOCKS = 3
    GET_BLOCK = 4
    BLOCK = 5
    COMMITTED = 6


@dataclass(frozen=True)
class GetStatus:
    def fields(self) -> list[Any]:
        return []


@dataclass(frozen=True)
class Status:
    head_number: int
    head_hash: bytes
    certificate: bytes  # empty for genesis
    new_view: bytes  # the signed NEW-VIEW of the sender's current view, or empty

    def fields(self) -> list[Any]:
        return [self.head_number, self.head_hash, self.certificate, self.new_view]


@dataclass(frozen=True)
class GetBlocks:
    request_id: int
    first: int
    count: int

    def fields(self) -> list[Any]:
        return [self.request_id, self.first, self.count]


@dataclass(frozen=True)
class Blocks:
    request_id: int
    blocks: tuple[tuple[bytes, bytes], ...]  # (encoded block, commit certificate)

    def fields(self) -> list[Any]:
        return [self.request_id, [list(pair) for pair in self.blocks]]


@dataclass(frozen=True)
class GetBlock:
    seq_no: int
    digest: bytes

    def fields(self) -> list[Any]:
        return [self.seq_no, self.digest]


@dataclass(frozen=True)
class Block:
    seq_no: int
    digest: bytes
    block: bytes

    def fields(self) -> list[Any]:
        return [self.seq_no, self.digest, self.block]


@dataclass(frozen=True)
class Committed:
    """A block as it committed, with its commit certificate: all an observer needs to import
    it without asking back."""

    number: int
    block: bytes
    certificate: bytes

    def fields(self) -> list[Any]:
        return [self.number, self.block, self.certificate]


SyncMessage = GetStatus | Status | GetBlocks | Blocks | GetBlock | Block | Committed
_KINDS: dict[type, SyncKind] = {
    GetStatus: SyncKind.GET_STATUS, Status: SyncKind.STATUS,
    GetBlocks: SyncKind.GET_BLOCKS, Blocks: SyncKind.BLOCKS,
    GetBlock: SyncKind.GET_BLOCK, Block: SyncKind.BLOCK, Committed: SyncKind.COMMITTED,
}


def encode_sync(message: SyncMessage) -> bytes:
    return rlp.encode([_KINDS[type(message)], *message.fields()])


def decode_sync(data: bytes) -> SyncMessage:
    """A block-sync message; MessageError for anything malformed."""
    try:
        check_rlp_bounds(data, max_depth=MAX_SYNC_DEPTH, max_items=MAX_SYNC_ITEMS,
                         max_list_items=MAX_SYNC_LIST_ITEMS)
        item = rlp.decode(data, strict=True)
    except (RlpTooDeep, RlpTooManyItems) as exc:
        raise MessageError(f"block sync: {exc}") from None
    except (rlp.exceptions.RLPException, RecursionError) as exc:
        raise MessageError(f"block sync: not RLP ({type(exc).__name__})") from None
    if not isinstance(item, list) or not item or not isinstance(item[0], bytes):
        raise MessageError("block sync: not a message")
    kind, fields = _uint(item[0]), item[1:]
    decoders: dict[int, Callable[[list[Any]], SyncMessage]] = {
        SyncKind.GET_STATUS: lambda f: GetStatus(),
        SyncKind.STATUS: _decode_status,
        SyncKind.GET_BLOCKS: lambda f: GetBlocks(*(_uint(x) for x in _exactly(f, 3))),
        SyncKind.BLOCKS: _decode_blocks,
        SyncKind.GET_BLOCK: _decode_get_block,
        SyncKind.BLOCK: _decode_block,
        SyncKind.COMMITTED: _decode_committed,
    }
    if kind not in decoders:
        raise MessageError(f"block sync: unknown message kind {kind}")
    return decoders[kind](fields)


def _exactly(fields: list[Any], count: int) -> list[Any]:
    if len(fields) != count:
        raise MessageError(f"block sync: expected {count} fields, got {len(fields)}")
    return fields


def _uint(item: Any) -> int:
    try:
        return decode_uint(item)
    except EncodingError:
        raise MessageError("block sync: not a canonical 64-bit integer") from None


def _bytes(item: Any) -> bytes:
    if not isinstance(item, bytes):
        raise MessageError("block sync: expected a byte string")
    return item


def _digest(item: Any) -> bytes:
    digest = _bytes(item)
    if len(digest) != 32:
        raise MessageError("block sync: a block hash has 32 bytes")
    return digest


def _decode_get_block(fields: list[Any]) -> GetBlock:
    seq_no, digest = _exactly(fields, 2)
    return GetBlock(_uint(seq_no), _digest(digest))


def _decode_block(fields: list[Any]) -> Block:
    seq_no, digest, block = _exactly(fields, 3)
    return Block(_uint(seq_no), _digest(digest), _bytes(block))


def _decode_committed(fields: list[Any]) -> Committed:
    number, block, certificate = _exactly(fields, 3)
    return Committed(_uint(number), _bytes(block), _bytes(certificate))


def _decode_status(fields: list[Any]) -> Status:
    number, head_hash, certificate, new_view = _exactly(fields, 4)
    return Status(_uint(number), _digest(head_hash), _bytes(certificate), _bytes(new_view))


def _decode_blocks(fields: list[Any]) -> Blocks:
    request_id, pairs = _exactly(fields, 2)
    if not isinstance(pairs, list) or len(pairs) > MAX_BLOCKS_PER_REQUEST:
        raise MessageError("block sync: too many blocks in one answer")
    blocks = []
    for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
            raise MessageError("block sync: a block comes with its certificate")
        blocks.append((_bytes(pair[0]), _bytes(pair[1])))
    return Blocks(_uint(request_id), tuple(blocks))
