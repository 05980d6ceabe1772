"""PBFT wire messages: canonical RLP, domain-separated secp256k1 signatures, certificate checks.

Importable on its own: the audit ETL uses it to verify commit certificates. It depends only on
rlp, eth-hash, eth-keys (coincurve backend), `encoding` and pbft_engine's `errors` and `quorum`
modules. Why one module of ~750 lines: every message kind, its strict decoder and limits, the
signing rule and the certificate checks are the one wire contract the audit imports alone;
split, the ETL would load the pieces anyway.

Encoding (every integer is a canonical RLP big-endian integer, every hash 32 bytes):

    signed message  = [type, body, signature]          (nested inside VIEW-CHANGE / NEW-VIEW)
    wire message    = [type, body, signature, blocks]  (blocks: unsigned block bodies)
    signed bytes    = keccak256(DOMAIN || chain_id (8 bytes BE) || type (1 byte) || rlp(body))

The signature (65 bytes r || s || v) is never part of the signed bytes. A block travels next to
its PRE-PREPARE unsigned: the signed body carries the digest (block hash) and a copy is used
only if it hashes to it. VIEW-CHANGE and NEW-VIEW name blocks by digest and carry none (a
missing body is fetched by digest, pbft_engine.sync).

A peer's message is bounded by what its kind allows for N validators and the watermark window
L (`MessageLimits`): bytes, RLP items and nesting before pyrlp decodes it (pyrlp's time grows
with the square of a list's length), its entries before any signature is checked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cache
from typing import Any, ClassVar, Generic, Self, TypeVar, cast, overload

import rlp
from eth_hash.auto import keccak
from eth_keys import KeyAPI
from eth_keys.backends import CoinCurveECCBackend
from eth_keys.exceptions import BadSignature, ValidationError

from encoding import EncodingError
from encoding.rlp import (
    MAX_UINT64,
    RlpTooDeep,
    RlpTooManyItems,
    check_rlp_bounds,
    check_rlp_depth,
    decode_uint,
    encode_uint,
)
from pbft_engine.errors import CertificateError, EpochMismatch, MessageError, SignatureError
from pbft_engine.quorum import quorum

DOMAIN = b"pbft-chain/consensus/v1"
MAX_REPLICAS = 2**16
MAX_MESSAGE_DEPTH = 24  # NEW-VIEW, the deepest message, nests about a dozen lists
HASH_SIZE = 32
SIGNATURE_SIZE = 65
NULL_DIGEST = b"\x00" * HASH_SIZE

_KEYS = KeyAPI(CoinCurveECCBackend())
assert isinstance(_KEYS.backend, CoinCurveECCBackend), "eth-keys must use the coincurve backend"


class MessageType(IntEnum):
    PRE_PREPARE = 1
    PREPARE = 2
    COMMIT = 3
    CHECKPOINT = 4
    VIEW_CHANGE = 5
    NEW_VIEW = 6


# --- field codecs -------------------------------------------------------------------------


def _uint(item: object, bound: int = MAX_UINT64) -> int:
    try:
        return decode_uint(item, bound)
    except EncodingError as exc:
        raise MessageError(str(exc)) from None


def _replica(item: object) -> int:
    return _uint(item, MAX_REPLICAS - 1)


def _fixed(item: object, size: int) -> bytes:
    if not isinstance(item, bytes) or len(item) != size:
        raise MessageError(f"expected {size} bytes")
    return item


def _hash(item: object) -> bytes:
    return _fixed(item, HASH_SIZE)


def _list(item: object, length: int | None = None) -> list[Any]:
    if not isinstance(item, list):
        raise MessageError("expected a list")
    if length is not None and len(item) != length:
        raise MessageError(f"expected {length} items, got {len(item)}")
    return item


# --- message bodies -----------------------------------------------------------------------

# Every body ends with its epoch: the number of the validator set that counts it (DESIGN.md
# section 10), signed with the rest, so a signature made for one epoch never counts in
# another and a receiver tells "an epoch I do not know yet" from a forgery. Keyword-only,
# 0 (the genesis set) unless given: a chain that never changed its set never names another.


@dataclass(frozen=True)
class PhaseMessage:
    """The shape shared by PRE-PREPARE, PREPARE and COMMIT: (view, seqNo, digest, replica,
    epoch)."""

    TYPE: ClassVar[MessageType]
    view: int
    seq_no: int
    digest: bytes
    replica: int
    epoch: int = field(default=0, kw_only=True)

    def fields(self) -> list[Any]:
        return [encode_uint(self.view), encode_uint(self.seq_no), self.digest,
                encode_uint(self.replica), encode_uint(self.epoch)]

    @classmethod
    def from_fields(cls, items: object) -> Self:
        view, seq_no, digest, replica, epoch = _list(items, 5)
        return cls(_uint(view), _uint(seq_no), _hash(digest), _replica(replica),
                   epoch=_uint(epoch))


@dataclass(frozen=True)
class PrePrepare(PhaseMessage):
    TYPE: ClassVar[MessageType] = MessageType.PRE_PREPARE


@dataclass(frozen=True)
class Prepare(PhaseMessage):
    TYPE: ClassVar[MessageType] = MessageType.PREPARE


@dataclass(frozen=True)
class Commit(PhaseMessage):
    TYPE: ClassVar[MessageType] = MessageType.COMMIT


@dataclass(frozen=True)
class Checkpoint:
    TYPE: ClassVar[MessageType] = MessageType.CHECKPOINT
    seq_no: int
    block_hash: bytes
    state_root: bytes
    replica: int
    epoch: int = field(default=0, kw_only=True)

    @property
    def value(self) -> tuple[bytes, bytes]:
        """What replicas must agree on at this checkpoint."""
        return self.block_hash, self.state_root

    def fields(self) -> list[Any]:
        return [encode_uint(self.seq_no), self.block_hash, self.state_root,
                encode_uint(self.replica), encode_uint(self.epoch)]

    @classmethod
    def from_fields(cls, items: object) -> Checkpoint:
        seq_no, block_hash, state_root, replica, epoch = _list(items, 5)
        return cls(_uint(seq_no), _hash(block_hash), _hash(state_root), _replica(replica),
                   epoch=_uint(epoch))


@dataclass(frozen=True)
class PreparedProof:
    """A prepared certificate: the PRE-PREPARE and Q-1 matching PREPAREs of other replicas."""

    pre_prepare: Signed[PrePrepare]
    prepares: tuple[Signed[Prepare], ...]

    @property
    def seq_no(self) -> int:
        return self.pre_prepare.body.seq_no

    @property
    def view(self) -> int:
        return self.pre_prepare.body.view

    @property
    def digest(self) -> bytes:
        return self.pre_prepare.body.digest

    def fields(self) -> list[Any]:
        return [self.pre_prepare.to_rlp(), [p.to_rlp() for p in self.prepares]]

    @classmethod
    def from_fields(cls, items: object) -> PreparedProof:
        pre_prepare, prepares = _list(items, 2)
        return cls(
            decode_signed(pre_prepare, PrePrepare),
            tuple(decode_signed(p, Prepare) for p in _list(prepares)),
        )


@dataclass(frozen=True)
class PrePreparedEntry:
    """A Q-set entry: this replica accepted a PRE-PREPARE for (seq_no, digest) in `view`."""

    seq_no: int
    digest: bytes
    view: int

    def fields(self) -> list[Any]:
        return [encode_uint(self.seq_no), self.digest, encode_uint(self.view)]

    @classmethod
    def from_fields(cls, items: object) -> PrePreparedEntry:
        seq_no, digest, view = _list(items, 3)
        return cls(_uint(seq_no), _hash(digest), _uint(view))


@dataclass(frozen=True)
class ViewChange:
    """VIEW-CHANGE(v+1, n, C, P, Q, i): n is the sender's last stable checkpoint, C its proof."""

    TYPE: ClassVar[MessageType] = MessageType.VIEW_CHANGE
    view: int
    stable_seq_no: int
    checkpoint_proof: tuple[Signed[Checkpoint], ...]
    pset: tuple[PreparedProof, ...]
    qset: tuple[PrePreparedEntry, ...]
    replica: int
    epoch: int = field(default=0, kw_only=True)

    def fields(self) -> list[Any]:
        return [
            encode_uint(self.view),
            encode_uint(self.stable_seq_no),
            [c.to_rlp() for c in self.checkpoint_proof],
            [p.fields() for p in self.pset],
            [q.fields() for q in self.qset],
            encode_uint(self.replica),
            encode_uint(self.epoch),
        ]

    @classmethod
    def from_fields(cls, items: object) -> ViewChange:
        view, stable, cproof, pset, qset, replica, epoch = _list(items, 7)
        return cls(
            _uint(view),
            _uint(stable),
            tuple(decode_signed(c, Checkpoint) for c in _list(cproof)),
            tuple(PreparedProof.from_fields(p) for p in _list(pset)),
            tuple(PrePreparedEntry.from_fields(q) for q in _list(qset)),
            _replica(replica),
            epoch=_uint(epoch),
        )

    def check_sets(self, log_size: int | None) -> None:
        """P holds one certificate per seqNo and Q each (seqNo, digest) once, both sorted,
        from views below this one and inside the window above the checkpoint, (stable,
        stable + L], where a correct replica prepares and pre-prepares. `log_size` None: L
        is not known here (a message decoded with MessageLimits had its window checked)."""
        stable = self.stable_seq_no
        top = MAX_UINT64 if log_size is None else stable + log_size
        seq_nos = [p.seq_no for p in self.pset]
        if seq_nos != sorted(set(seq_nos)) or any(not stable < n <= top for n in seq_nos):
            raise MessageError("view-change P set not sorted, unique and in the window above "
                               "its checkpoint")
        if any(p.view >= self.view for p in self.pset):
            raise MessageError("view-change P entry from a view not below the new view")
        qkeys = [(q.seq_no, q.digest) for q in self.qset]
        if qkeys != sorted(set(qkeys)) or any(
            not stable < q.seq_no <= top or q.view >= self.view for q in self.qset
        ):
            raise MessageError("view-change Q set not sorted, unique, in the window above its "
                               "checkpoint and below its view")


@dataclass(frozen=True)
class NewView:
    """NEW-VIEW(v, V, O): V the N-f VIEW-CHANGE messages, O the re-issued PRE-PREPAREs by seqNo."""

    TYPE: ClassVar[MessageType] = MessageType.NEW_VIEW
    view: int
    view_changes: tuple[Signed[ViewChange], ...]
    pre_prepares: tuple[Signed[PrePrepare], ...]
    replica: int
    epoch: int = field(default=0, kw_only=True)

    def fields(self) -> list[Any]:
        return [
            encode_uint(self.view),
            [v.to_rlp() for v in self.view_changes],
            [p.to_rlp() for p in self.pre_prepares],
            encode_uint(self.replica),
            encode_uint(self.epoch),
        ]

    @classmethod
    def from_fields(cls, items: object) -> NewView:
        view, view_changes, pre_prepares, replica, epoch = _list(items, 5)
        return cls(
            _uint(view),
            tuple(decode_signed(v, ViewChange) for v in _list(view_changes)),
            tuple(decode_signed(p, PrePrepare) for p in _list(pre_prepares)),
            _replica(replica),
            epoch=_uint(epoch),
        )


# PRE-PREPARE, PREPARE and COMMIT are PhaseMessages
Body = PhaseMessage | Checkpoint | ViewChange | NewView
B = TypeVar("B", bound=Body)
B_co = TypeVar("B_co", bound=Body, covariant=True)

BODY_TYPES: dict[MessageType, type[Body]] = {
    cls.TYPE: cls for cls in (PrePrepare, Prepare, Commit, Checkpoint, ViewChange, NewView)
}


# --- what each message kind may hold --------------------------------------------------------


class MessageTooLarge(MessageError):
    """A message holds more bytes, items, entries or blocks than its kind allows."""


# Q reports each (seqNo, digest) a replica pre-prepared, with its latest view, so a seqNo
# re-proposed with another block after a view change holds several: Q may hold this many
# entries per seqNo of the window. The simulator's honest replicas (1,300 chaos seeds, N = 2
# to 10, with and without a replica that lost its store): up to three at one seqNo, Q at most
# 1.1 x L.
PRE_PREPARED_PER_SEQ_NO = 2


@dataclass(frozen=True)
class RlpExtent:
    """The most an RLP item may take: its encoded bytes, its items (strings and lists, itself
    included) and how deeply its lists nest."""

    size: int
    items: int
    depth: int


def _header(length: int) -> int:
    return 1 if length < 56 else 1 + (length.bit_length() + 7) // 8


def _string(length: int) -> RlpExtent:
    """A byte string of at most `length` bytes."""
    return RlpExtent(_header(length) + length, 1, 0)


def _integer(bound: int) -> RlpExtent:
    """A canonical integer of at most `bound`."""
    return RlpExtent(1, 1, 0) if bound < 0x80 else _string((bound.bit_length() + 7) // 8)


def _rlp_list(*parts: RlpExtent) -> RlpExtent:
    payload = sum(p.size for p in parts)
    return RlpExtent(_header(payload) + payload, 1 + sum(p.items for p in parts),
                     1 + max((p.depth for p in parts), default=0))


def _repeated(part: RlpExtent, count: int) -> RlpExtent:
    """`count` items of one kind side by side, inside a list."""
    return RlpExtent(part.size * count, part.items * count, part.depth if count else 0)


_TYPE = _integer(max(MessageType))
_U64 = _integer(MAX_UINT64)
_HASH = _string(HASH_SIZE)
_SIGNATURE = _string(SIGNATURE_SIZE)
_BLOCK = RlpExtent(0, 1, 0)  # its size is the transport's frame cap's business
_WIDEST_BODY = 7  # a VIEW-CHANGE's fields


def _signed(body: RlpExtent) -> RlpExtent:
    return _rlp_list(_TYPE, body, _SIGNATURE)


def _wire(body: RlpExtent, blocks: int = 0) -> RlpExtent:
    return _rlp_list(_TYPE, body, _SIGNATURE, _rlp_list(_repeated(_BLOCK, blocks)))


@cache
def _largest_wire_messages(replicas: int, log_size: int) -> dict[MessageType, RlpExtent]:
    """Each kind's largest wire message: every integer at its largest; a VIEW-CHANGE with C
    of N checkpoints, P of L prepared certificates (a PRE-PREPARE and N-1 PREPAREs each) and
    Q of PRE_PREPARED_PER_SEQ_NO x L entries; a NEW-VIEW with N VIEW-CHANGEs (N-f are
    needed) and L PRE-PREPAREs."""
    replica = _integer(replicas - 1)
    phase = _rlp_list(_U64, _U64, _HASH, replica, _U64)
    checkpoint = _rlp_list(_U64, _HASH, _HASH, replica, _U64)
    prepared_proof = _rlp_list(_signed(phase), _rlp_list(_repeated(_signed(phase), replicas - 1)))
    view_change = _rlp_list(
        _U64, _U64,
        _rlp_list(_repeated(_signed(checkpoint), replicas)),
        _rlp_list(_repeated(prepared_proof, log_size)),
        _rlp_list(_repeated(_rlp_list(_U64, _HASH, _U64), PRE_PREPARED_PER_SEQ_NO * log_size)),
        replica, _U64,
    )
    new_view = _rlp_list(_U64, _rlp_list(_repeated(_signed(view_change), replicas)),
                         _rlp_list(_repeated(_signed(phase), log_size)), replica, _U64)
    return {
        MessageType.PRE_PREPARE: _wire(phase, blocks=1),
        MessageType.PREPARE: _wire(phase),
        MessageType.COMMIT: _wire(phase),
        MessageType.CHECKPOINT: _wire(checkpoint),
        MessageType.VIEW_CHANGE: _wire(view_change),
        MessageType.NEW_VIEW: _wire(new_view),
    }


@dataclass(frozen=True)
class MessageLimits:
    """What a peer's message of each kind may hold, for N validators and a watermark window
    of L seqNos: bytes, RLP items and nesting (checked before pyrlp decodes anything), then
    its entries (checked before any signature is). A PRE-PREPARE carries exactly one block
    and nothing else does; votes and checkpoints are a few hundred bytes; a VIEW-CHANGE's P
    and Q sets hold the window above its checkpoint and its C proof at most N checkpoints;
    a NEW-VIEW holds at most N VIEW-CHANGEs and L PRE-PREPAREs."""

    replicas: int  # N
    log_size: int  # L

    @property
    def max_pre_prepared(self) -> int:
        """Q entries in a VIEW-CHANGE."""
        return PRE_PREPARED_PER_SEQ_NO * self.log_size

    def extent(self, kind: MessageType) -> RlpExtent:
        """The largest wire message of this kind (a PRE-PREPARE's without its block's bytes)."""
        return _largest_wire_messages(self.replicas, self.log_size)[kind]

    def max_list_items(self, kind: MessageType) -> int:
        if kind in (MessageType.VIEW_CHANGE, MessageType.NEW_VIEW):
            return max(_WIDEST_BODY, self.replicas, self.max_pre_prepared)
        return 5  # [type, body, signature, blocks] and bodies of five fields

    def check_bytes(self, data: bytes) -> None:
        """Size, items and nesting of a wire message, before it is decoded."""
        kind = _peek_type(data)
        extent = self.extent(kind)
        if kind is not MessageType.PRE_PREPARE and len(data) > extent.size:
            raise MessageTooLarge(f"{kind.name} of {len(data)} bytes, at most {extent.size}")
        try:
            check_rlp_bounds(data, max_depth=extent.depth, max_items=extent.items,
                             max_list_items=self.max_list_items(kind))
        except RlpTooManyItems as exc:
            raise MessageTooLarge(f"{kind.name}: {exc}") from None
        except RlpTooDeep as exc:
            raise MessageError(f"{kind.name}: {exc}") from None

    def check_entries(self, body: Body) -> None:
        """The entries of a decoded VIEW-CHANGE or NEW-VIEW, before any signature is checked."""
        if isinstance(body, ViewChange):
            self._check_view_change(body)
        elif isinstance(body, NewView):
            if len(body.view_changes) > self.replicas or len(body.pre_prepares) > self.log_size:
                raise MessageTooLarge("new-view with more than N view-changes or L pre-prepares")
            for view_change in body.view_changes:
                self._check_view_change(view_change.body)

    def _check_view_change(self, vc: ViewChange) -> None:
        if len(vc.checkpoint_proof) > self.replicas or len(vc.qset) > self.max_pre_prepared:
            raise MessageTooLarge("view-change with more than N checkpoints or too large a Q set")
        if any(len(proof.prepares) >= self.replicas for proof in vc.pset):
            raise MessageTooLarge("view-change with a prepared certificate of N prepares")
        vc.check_sets(self.log_size)


def _peek_type(data: bytes) -> MessageType:
    """The kind of a wire message from its first bytes, so its bounds apply before decoding."""
    if not data or data[0] < 0xC0:
        raise MessageError("a message must be an RLP list")
    header = 1 if data[0] < 0xF8 else 1 + data[0] - 0xF7
    try:
        return MessageType(data[header])
    except (IndexError, ValueError):
        raise MessageError("unknown message type") from None


@dataclass(frozen=True)
class Signed(Generic[B_co]):
    """A message body and the signature of its sender over `signing_hash(body, chain_id)`."""

    body: B_co
    signature: bytes

    def to_rlp(self) -> list[Any]:
        return [encode_uint(self.body.TYPE), self.body.fields(), self.signature]

    def encode(self) -> bytes:
        return rlp.encode(self.to_rlp())


@overload
def decode_signed(item: object, expected: type[B]) -> Signed[B]: ...
@overload
def decode_signed(item: object, expected: None = None) -> Signed[Body]: ...
def decode_signed(item: object, expected: type[Any] | None = None) -> Signed[Any]:
    """A signed message from its decoded RLP structure (no signature check); `expected`
    names the one kind allowed, and types the result."""
    type_code, fields, signature = _list(item, 3)
    try:
        body_type = BODY_TYPES[MessageType(_uint(type_code))]
    except ValueError:
        raise MessageError("unknown message type") from None
    if expected is not None and body_type is not expected:
        raise MessageError(f"expected {expected.__name__}, got {body_type.__name__}")
    return Signed(body_type.from_fields(fields), _fixed(signature, SIGNATURE_SIZE))


def _rlp_decode(data: bytes, limits: MessageLimits | None = None) -> Any:
    """pyrlp's decoding of `data`, which must be canonical, once a linear walk bounded it: by
    what its kind allows (`limits`: a peer's message), or only in depth."""
    if not isinstance(data, bytes):
        raise MessageError("a message must be bytes")
    if limits is not None:
        limits.check_bytes(data)
    else:
        try:
            check_rlp_depth(data, MAX_MESSAGE_DEPTH)
        except RlpTooDeep as exc:
            raise MessageError(str(exc)) from None
    try:
        item = rlp.decode(data, strict=True)
    except (rlp.exceptions.RLPException, RecursionError) as exc:
        raise MessageError(f"not canonical RLP: {type(exc).__name__}") from None
    if rlp.encode(item) != data:
        raise MessageError("not canonical RLP")
    return item


@overload
def decode_signed_bytes(data: bytes, expected: type[B]) -> Signed[B]: ...
@overload
def decode_signed_bytes(data: bytes, expected: None = None) -> Signed[Body]: ...
def decode_signed_bytes(data: bytes, expected: type[Any] | None = None) -> Signed[Any]:
    """A signed message from `Signed.encode()` bytes (as kept in stores and certificates)."""
    try:
        return decode_signed(_rlp_decode(data), expected)
    except RecursionError:
        raise MessageError("message nested too deeply") from None


def signed_as(signed: Signed[Body], kind: type[B]) -> Signed[B] | None:
    """`signed`, typed by its body's kind; None when the body is of another kind."""
    return cast("Signed[B]", signed) if isinstance(signed.body, kind) else None


@dataclass(frozen=True)
class WireMessage(Generic[B_co]):
    """What travels between validators: a signed message and the unsigned blocks it refers to."""

    signed: Signed[B_co]
    blocks: tuple[bytes, ...] = ()

    def encode(self) -> bytes:
        return rlp.encode([*self.signed.to_rlp(), list(self.blocks)])

    @staticmethod
    def decode(data: bytes, limits: MessageLimits | None = None) -> WireMessage[Body]:
        """A wire message; `limits` bound a peer's (None: what this node sent or stored)."""
        try:
            item = _list(_rlp_decode(data, limits), 4)
            blocks = _list(item[3])
            if not all(isinstance(block, bytes) for block in blocks):
                raise MessageError("blocks must be byte strings")
            signed = decode_signed(item[:3])
        except RecursionError:
            raise MessageError("message nested too deeply") from None
        if len(blocks) != (signed.body.TYPE is MessageType.PRE_PREPARE):
            raise MessageError("a PRE-PREPARE carries exactly one block, other messages none")
        if limits is not None:
            limits.check_entries(signed.body)
        return WireMessage(signed, tuple(blocks))


def wire_as(wire: WireMessage[Body], kind: type[B]) -> WireMessage[B] | None:
    """`wire`, typed by its message's kind; None when the message is of another kind."""
    return cast("WireMessage[B]", wire) if isinstance(wire.signed.body, kind) else None


# --- signing ------------------------------------------------------------------------------


def signing_hash(body: Body, chain_id: int) -> bytes:
    """keccak256(DOMAIN || chain id || message type || rlp(body)): what a validator signs."""
    return keccak(
        DOMAIN + chain_id.to_bytes(8, "big") + bytes([body.TYPE]) + rlp.encode(body.fields())
    )


class Signer(ABC):
    """Signs message hashes with one validator key."""

    @property
    @abstractmethod
    def address(self) -> bytes:
        """The 20-byte address of the key."""

    @abstractmethod
    def sign_hash(self, message_hash: bytes) -> bytes:
        """A 65-byte recoverable signature (r || s || v) over a 32-byte hash."""


class Verifier(ABC):
    """Recovers the signer address of a signature."""

    @abstractmethod
    def recover(self, message_hash: bytes, signature: bytes) -> bytes:
        """The 20-byte address that produced `signature`; raises SignatureError otherwise."""


class KeySigner(Signer):
    """A secp256k1 private key (eth-keys, coincurve backend)."""

    def __init__(self, private_key: bytes) -> None:
        self._key = _KEYS.PrivateKey(private_key)
        self._address = self._key.public_key.to_canonical_address()

    @property
    def address(self) -> bytes:
        return self._address

    def sign_hash(self, message_hash: bytes) -> bytes:
        return _KEYS.ecdsa_sign(message_hash, self._key).to_bytes()


# Signatures recovered lately, kept so that what arrives again (a VIEW-CHANGE's proofs, sent
# for every higher view and echoed in NEW-VIEWs) costs a lookup: room for the N-f largest
# VIEW-CHANGEs of 16 validators and the default window (about 7,000 signatures) and the
# votes meanwhile; 5.6 MiB.
SIGNATURE_CACHE_SIZE = 2**14


class KeyVerifier(Verifier):
    """Public-key recovery with eth-keys (coincurve backend), the last `cache_size` recovered
    signatures remembered (least recently used dropped first)."""

    def __init__(self, cache_size: int = SIGNATURE_CACHE_SIZE) -> None:
        self._cache_size = cache_size
        self._recovered: OrderedDict[tuple[bytes, bytes], bytes] = OrderedDict()

    def recover(self, message_hash: bytes, signature: bytes) -> bytes:
        key = (message_hash, signature)
        address = self._recovered.get(key)
        if address is not None:
            self._recovered.move_to_end(key)
            return address
        try:
            public_key = _KEYS.Signature(signature).recover_public_key_from_msg_hash(message_hash)
        except (BadSignature, ValidationError) as exc:
            raise SignatureError(f"unrecoverable signature: {exc}") from None
        address = public_key.to_canonical_address()
        self._recovered[key] = address
        if len(self._recovered) > self._cache_size:
            self._recovered.popitem(last=False)
        return address


@dataclass(frozen=True)
class Authenticator:
    """Signs and checks messages for one chain and one epoch's validator set."""

    chain_id: int
    validators: tuple[bytes, ...]
    verifier: Verifier
    epoch: int = 0

    def sign(self, body: B, signer: Signer) -> Signed[B]:
        if body.epoch != self.epoch:
            raise EpochMismatch(f"signing a message of epoch {body.epoch} with epoch "
                                f"{self.epoch}'s set")
        return Signed(body, signer.sign_hash(signing_hash(body, self.chain_id)))

    def verify(self, signed: Signed[Body]) -> None:
        """The message names this epoch, and the recovered signer is the validator the body
        claims to be in its set."""
        if signed.body.epoch != self.epoch:
            raise EpochMismatch(f"a {signed.body.TYPE.name} names epoch {signed.body.epoch}, "
                                f"counted here only in epoch {self.epoch}")
        replica = signed.body.replica
        if replica >= len(self.validators):
            raise SignatureError(f"replica index {replica} is not in the validator set")
        signer = self.verifier.recover(signing_hash(signed.body, self.chain_id), signed.signature)
        if signer != self.validators[replica]:
            raise SignatureError(f"message claims replica {replica} but is signed by another key")

    @property
    def quorum(self) -> int:
        return quorum(len(self.validators))

    def check_quorum(self, messages: Sequence[Signed[Body]], what: str) -> frozenset[int]:
        """Every message valid, from distinct replicas, and at least Q of them."""
        replicas = [m.body.replica for m in messages]
        if len(set(replicas)) != len(replicas):
            raise CertificateError(f"{what}: a replica appears twice")
        for message in messages:
            self.verify(message)
        if len(replicas) < self.quorum:
            raise CertificateError(f"{what}: {len(replicas)} signatures, quorum is {self.quorum}")
        return frozenset(replicas)

    def verify_checkpoint_proof(
        self, seq_no: int, proof: Sequence[Signed[Checkpoint]]
    ) -> tuple[bytes, bytes] | None:
        """Q matching CHECKPOINTs for seq_no; returns their (block hash, state root).

        seqNo 0 (genesis) is stable by definition and needs no proof (returns None).
        """
        if seq_no == 0 and not proof:
            return None
        values = {(c.body.seq_no, c.body.value) for c in proof}
        if len(values) != 1 or next(iter(values))[0] != seq_no:
            raise CertificateError(f"checkpoint proof for {seq_no} does not match")
        self.check_quorum(proof, "checkpoint proof")
        return next(iter(values))[1]

    def verify_prepared_proof(self, proof: PreparedProof) -> None:
        """A PRE-PREPARE from primary(v) and Q-1 matching PREPAREs from other replicas."""
        pre_prepare = proof.pre_prepare.body
        primary = pre_prepare.view % len(self.validators)
        if pre_prepare.replica != primary:
            raise CertificateError("prepared proof: pre-prepare not from the view's primary")
        for prepare in proof.prepares:
            body = prepare.body
            if (body.view, body.seq_no, body.digest) != (
                pre_prepare.view, pre_prepare.seq_no, pre_prepare.digest
            ) or body.replica == primary:
                raise CertificateError("prepared proof: a prepare does not match")
        self.verify(proof.pre_prepare)
        replicas = {p.body.replica for p in proof.prepares}
        if len(replicas) != len(proof.prepares) or len(replicas) < self.quorum - 1:
            raise CertificateError("prepared proof: too few distinct prepares")
        for prepare in proof.prepares:
            self.verify(prepare)


# --- commit certificates (the ETL's entry point) ------------------------------------------


def encode_commit_certificate(commits: Iterable[Signed[Commit]]) -> bytes:
    """The permanent commit certificate of a block: its COMMITs sorted by replica."""
    ordered = sorted(commits, key=lambda c: c.body.replica)
    return rlp.encode([c.to_rlp() for c in ordered])


def decode_commit_certificate(data: bytes) -> tuple[Signed[Commit], ...]:
    try:
        return tuple(decode_signed(item, Commit) for item in _list(_rlp_decode(data)))
    except RecursionError:
        raise MessageError("certificate nested too deeply") from None


def verify_commit_certificate(
    certificate: bytes,
    *,
    validators: Sequence[bytes],
    chain_id: int,
    epoch: int,
    block_number: int,
    block_hash: bytes,
    verifier: Verifier | None = None,
) -> frozenset[int]:
    """Check that `certificate` holds Q valid COMMITs of distinct validators of `validators`,
    the set of epoch `epoch`, for this block.

    Returns the indices of the signing validators; raises MessageError (CertificateError,
    SignatureError, EpochMismatch) otherwise. All commits must be for one view, this seqNo,
    this hash and this epoch.
    """
    commits = decode_commit_certificate(certificate)
    for commit in commits:
        if (commit.body.seq_no, commit.body.digest) != (block_number, block_hash):
            raise CertificateError("commit certificate: a commit is for another block")
    if len({c.body.view for c in commits}) > 1:
        raise CertificateError("commit certificate: commits from different views")
    auth = Authenticator(chain_id, tuple(validators), verifier or KeyVerifier(), epoch)
    return auth.check_quorum(commits, "commit certificate")
