"""PBFT wire messages: canonical RLP, domain-separated secp256k1 signatures, certificate checks.

Importable on its own: the audit ETL uses it to verify commit certificates. It depends only on
rlp, eth-hash, eth-keys (coincurve backend), `encoding` and pbft_engine's `errors` and `quorum`
modules. Why one module of ~500 lines: every message kind, its strict decoder, the signing
rule and the certificate checks are the one wire contract the audit imports alone; split,
the ETL would load the pieces anyway.

Encoding (every integer is a canonical RLP big-endian integer, every hash 32 bytes):

    signed message  = [type, body, signature]          (nested inside VIEW-CHANGE / NEW-VIEW)
    wire message    = [type, body, signature, blocks]  (blocks: unsigned block bodies)
    signed bytes    = keccak256(DOMAIN || chain_id (8 bytes BE) || type (1 byte) || rlp(body))

The signature (65 bytes r || s || v) is never part of the signed bytes. A block travels next to
its PRE-PREPARE unsigned: the signed body carries the digest (block hash) and a copy is used
only if it hashes to it. VIEW-CHANGE and NEW-VIEW name blocks by digest and carry none (a
missing body is fetched by digest, pbft_engine.sync).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar, Generic, Self, TypeVar, cast, overload

import rlp
from eth_hash.auto import keccak
from eth_keys import KeyAPI
from eth_keys.backends import CoinCurveECCBackend
from eth_keys.exceptions import BadSignature, ValidationError

from encoding import EncodingError
from encoding.rlp import MAX_UINT64, RlpTooDeep, check_rlp_depth, decode_uint, encode_uint
from pbft_engine.errors import CertificateError, MessageError, SignatureError
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


@dataclass(frozen=True)
class PhaseMessage:
    """The shape shared by PRE-PREPARE, PREPARE and COMMIT: (view, seqNo, digest, replica)."""

    TYPE: ClassVar[MessageType]
    view: int
    seq_no: int
    digest: bytes
    replica: int

    def fields(self) -> list[Any]:
        return [encode_uint(self.view), encode_uint(self.seq_no), self.digest,
                encode_uint(self.replica)]

    @classmethod
    def from_fields(cls, items: object) -> Self:
        view, seq_no, digest, replica = _list(items, 4)
        return cls(_uint(view), _uint(seq_no), _hash(digest), _replica(replica))


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

    @property
    def value(self) -> tuple[bytes, bytes]:
        """What replicas must agree on at this checkpoint."""
        return self.block_hash, self.state_root

    def fields(self) -> list[Any]:
        return [encode_uint(self.seq_no), self.block_hash, self.state_root,
                encode_uint(self.replica)]

    @classmethod
    def from_fields(cls, items: object) -> Checkpoint:
        seq_no, block_hash, state_root, replica = _list(items, 4)
        return cls(_uint(seq_no), _hash(block_hash), _hash(state_root), _replica(replica))


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

    def fields(self) -> list[Any]:
        return [
            encode_uint(self.view),
            encode_uint(self.stable_seq_no),
            [c.to_rlp() for c in self.checkpoint_proof],
            [p.fields() for p in self.pset],
            [q.fields() for q in self.qset],
            encode_uint(self.replica),
        ]

    @classmethod
    def from_fields(cls, items: object) -> ViewChange:
        view, stable, cproof, pset, qset, replica = _list(items, 6)
        return cls(
            _uint(view),
            _uint(stable),
            tuple(decode_signed(c, Checkpoint) for c in _list(cproof)),
            tuple(PreparedProof.from_fields(p) for p in _list(pset)),
            tuple(PrePreparedEntry.from_fields(q) for q in _list(qset)),
            _replica(replica),
        )


@dataclass(frozen=True)
class NewView:
    """NEW-VIEW(v, V, O): V the N-f VIEW-CHANGE messages, O the re-issued PRE-PREPAREs by seqNo."""

    TYPE: ClassVar[MessageType] = MessageType.NEW_VIEW
    view: int
    view_changes: tuple[Signed[ViewChange], ...]
    pre_prepares: tuple[Signed[PrePrepare], ...]
    replica: int

    def fields(self) -> list[Any]:
        return [
            encode_uint(self.view),
            [v.to_rlp() for v in self.view_changes],
            [p.to_rlp() for p in self.pre_prepares],
            encode_uint(self.replica),
        ]

    @classmethod
    def from_fields(cls, items: object) -> NewView:
        view, view_changes, pre_prepares, replica = _list(items, 4)
        return cls(
            _uint(view),
            tuple(decode_signed(v, ViewChange) for v in _list(view_changes)),
            tuple(decode_signed(p, PrePrepare) for p in _list(pre_prepares)),
            _replica(replica),
        )


# PRE-PREPARE, PREPARE and COMMIT are PhaseMessages
Body = PhaseMessage | Checkpoint | ViewChange | NewView
B = TypeVar("B", bound=Body)
B_co = TypeVar("B_co", bound=Body, covariant=True)

BODY_TYPES: dict[MessageType, type[Body]] = {
    cls.TYPE: cls for cls in (PrePrepare, Prepare, Commit, Checkpoint, ViewChange, NewView)
}


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


def _rlp_decode(data: bytes) -> Any:
    if not isinstance(data, bytes):
        raise MessageError("a message must be bytes")
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
    def decode(data: bytes) -> WireMessage[Body]:
        try:
            item = _list(_rlp_decode(data), 4)
            blocks = _list(item[3])
            if not all(isinstance(block, bytes) for block in blocks):
                raise MessageError("blocks must be byte strings")
            return WireMessage(decode_signed(item[:3]), tuple(blocks))
        except RecursionError:
            raise MessageError("message nested too deeply") from None


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


class KeyVerifier(Verifier):
    """Public-key recovery with eth-keys (coincurve backend)."""

    def recover(self, message_hash: bytes, signature: bytes) -> bytes:
        try:
            public_key = _KEYS.Signature(signature).recover_public_key_from_msg_hash(message_hash)
        except (BadSignature, ValidationError) as exc:
            raise SignatureError(f"unrecoverable signature: {exc}") from None
        return public_key.to_canonical_address()


@dataclass(frozen=True)
class Authenticator:
    """Signs and checks messages for one chain and validator set."""

    chain_id: int
    validators: tuple[bytes, ...]
    verifier: Verifier

    def sign(self, body: B, signer: Signer) -> Signed[B]:
        return Signed(body, signer.sign_hash(signing_hash(body, self.chain_id)))

    def verify(self, signed: Signed[Body]) -> None:
        """The recovered signer must be a validator and the replica the body claims to be."""
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
    block_number: int,
    block_hash: bytes,
    verifier: Verifier | None = None,
) -> frozenset[int]:
    """Check that `certificate` holds Q valid COMMITs of distinct validators for this block.

    Returns the indices of the signing validators; raises MessageError (CertificateError,
    SignatureError) otherwise. All commits must be for one view, this seqNo and this hash.
    """
    commits = decode_commit_certificate(certificate)
    for commit in commits:
        if (commit.body.seq_no, commit.body.digest) != (block_number, block_hash):
            raise CertificateError("commit certificate: a commit is for another block")
    if len({c.body.view for c in commits}) > 1:
        raise CertificateError("commit certificate: commits from different views")
    auth = Authenticator(chain_id, tuple(validators), verifier or KeyVerifier())
    return auth.check_quorum(commits, "commit certificate")
