"""Message encoding, signatures, certificates and malformed input."""

from __future__ import annotations

import contextlib
import dataclasses
import time

import pytest
import rlp
from eth_hash.auto import keccak
from eth_keys.backends import CoinCurveECCBackend
from eth_keys.datatypes import Signature
from hypothesis import given, settings
from hypothesis import strategies as st

from pbft_engine import messages
from pbft_engine.core.epochs import Epoch, EpochSchedule, Membership
from pbft_engine.core.view_change import verify_view_change
from pbft_engine.errors import CertificateError, EpochMismatch, MessageError, SignatureError
from pbft_engine.messages import (
    Authenticator,
    Checkpoint,
    Commit,
    KeySigner,
    KeyVerifier,
    MessageLimits,
    MessageTooLarge,
    MessageType,
    NewView,
    Prepare,
    PreparedProof,
    PrePrepare,
    PrePreparedEntry,
    Signed,
    ViewChange,
    WireMessage,
    encode_commit_certificate,
    signing_hash,
    verify_commit_certificate,
)
from pbft_engine.quorum import max_faulty, quorum, view_change_quorum, weak_quorum

SIGNERS = [KeySigner(keccak(b"key %d" % i)) for i in range(4)]
VALIDATORS = tuple(s.address for s in SIGNERS)
AUTH = Authenticator(7, VALIDATORS, KeyVerifier())
DIGEST = keccak(b"block")
L = 40  # the default watermark window: checkpoint_interval 10 x log_multiplier 4
LIMITS = MessageLimits(len(VALIDATORS), L)


def commits(count: int, digest: bytes = DIGEST, seq_no: int = 5) -> list[Signed[Commit]]:
    return [AUTH.sign(Commit(0, seq_no, digest, i), SIGNERS[i]) for i in range(count)]


@pytest.mark.parametrize(
    ("n", "f", "q", "vc", "weak"),
    [(1, 0, 1, 1, 1), (2, 0, 2, 2, 1), (3, 0, 2, 3, 1), (4, 1, 3, 3, 2), (5, 1, 4, 4, 2),
     (6, 1, 4, 5, 2), (7, 2, 5, 5, 3), (10, 3, 7, 7, 4)],
)
def test_quorum_sizes(n: int, f: int, q: int, vc: int, weak: int) -> None:
    assert (max_faulty(n), quorum(n), view_change_quorum(n), weak_quorum(n)) == (f, q, vc, weak)
    assert 2 * quorum(n) - n >= max_faulty(n) + 1  # two quorums share a correct replica


def test_backend_is_coincurve() -> None:
    assert isinstance(messages._KEYS.backend, CoinCurveECCBackend)


def test_wire_round_trip_is_byte_identical() -> None:
    signed = AUTH.sign(PrePrepare(3, 9, DIGEST, 3), SIGNERS[3])
    data = WireMessage(signed, (b"block bytes",)).encode()
    decoded = WireMessage.decode(data)
    assert decoded == WireMessage(signed, (b"block bytes",))
    assert decoded.encode() == data
    AUTH.verify(decoded.signed)


def test_signature_binds_chain_id_and_type() -> None:
    prepare = Prepare(0, 1, DIGEST, 1)
    commit = Commit(0, 1, DIGEST, 1)
    assert signing_hash(prepare, 7) != signing_hash(prepare, 8)
    assert signing_hash(prepare, 7) != signing_hash(commit, 7)
    signed = AUTH.sign(prepare, SIGNERS[1])
    with pytest.raises(SignatureError):
        AUTH.verify(Signed(commit, signed.signature))  # same fields, other type
    with pytest.raises(SignatureError):
        Authenticator(8, VALIDATORS, KeyVerifier()).verify(signed)


def test_sender_mismatch_and_non_member_rejected() -> None:
    claims_two = AUTH.sign(Prepare(0, 1, DIGEST, 2), SIGNERS[1])
    with pytest.raises(SignatureError, match="claims replica 2"):
        AUTH.verify(claims_two)
    outsider = KeySigner(keccak(b"outsider"))
    with pytest.raises(SignatureError):
        AUTH.verify(AUTH.sign(Prepare(0, 1, DIGEST, 1), outsider))
    with pytest.raises(SignatureError, match="not in the validator set"):
        AUTH.verify(AUTH.sign(Prepare(0, 1, DIGEST, 9), outsider))


def test_non_canonical_encodings_rejected() -> None:
    signed = AUTH.sign(Prepare(0, 1, DIGEST, 1), SIGNERS[1])
    good = rlp.decode(WireMessage(signed).encode())
    leading_zero = [good[0], [b"\x00", *good[1][1:]], good[2], good[3]]
    with pytest.raises(MessageError, match="leading zero"):
        WireMessage.decode(rlp.encode(leading_zero))
    with pytest.raises(MessageError):
        WireMessage.decode(WireMessage(signed).encode() + b"\x00")
    with pytest.raises(MessageError, match="unknown message type"):
        WireMessage.decode(rlp.encode([b"\x09", good[1], good[2], good[3]]))
    short_digest = [good[0], [*good[1][:2], b"\x01" * 31, *good[1][3:]], good[2], good[3]]
    with pytest.raises(MessageError, match="32 bytes"):
        WireMessage.decode(rlp.encode(short_digest))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzzed_bytes_never_crash_the_decoder(data: bytes) -> None:
    with contextlib.suppress(MessageError):
        WireMessage.decode(data)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.binary(max_size=40), lambda inner: st.lists(inner, max_size=6),
                    max_leaves=30))
def test_fuzzed_rlp_structures_never_crash_the_decoder(structure: object) -> None:
    with contextlib.suppress(MessageError):
        WireMessage.decode(rlp.encode(structure))


def test_deeply_nested_input_rejected() -> None:
    data = b"\xc0"
    for _ in range(5000):
        data = rlp.codec.length_prefix(len(data), 0xC0) + data
    with pytest.raises(MessageError):
        WireMessage.decode(data)


def test_commit_certificate_verifies_for_the_etl() -> None:
    certificate = encode_commit_certificate(commits(3))
    signers = verify_commit_certificate(certificate, validators=VALIDATORS, epoch=0, chain_id=7,
                                        block_number=5, block_hash=DIGEST)
    assert signers == {0, 1, 2}


@pytest.mark.parametrize(
    ("certificate", "error"),
    [
        (encode_commit_certificate(commits(2)), CertificateError),  # below quorum
        (encode_commit_certificate(commits(3, keccak(b"other"))), CertificateError),
        (encode_commit_certificate(commits(3, seq_no=6)), CertificateError),
        (encode_commit_certificate([*commits(2), commits(2)[1]]), CertificateError),  # dup
        (b"\xc3\x01\x02\x03", MessageError),
    ],
)
def test_bad_commit_certificates_rejected(certificate: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        verify_commit_certificate(certificate, validators=VALIDATORS, epoch=0, chain_id=7,
                                  block_number=5, block_hash=DIGEST)


def test_forged_commit_in_certificate_rejected() -> None:
    forged = commits(3)
    forged[2] = dataclasses.replace(forged[2], signature=forged[1].signature)
    with pytest.raises(SignatureError):
        verify_commit_certificate(encode_commit_certificate(forged), validators=VALIDATORS,
                                  epoch=0, chain_id=7, block_number=5, block_hash=DIGEST)


def test_a_certificate_counts_only_in_the_epoch_its_commits_name() -> None:
    """The same keys signing for epoch 1 make no certificate of epoch 0, and the reverse: a
    signature is bound to the epoch it names (DESIGN.md section 10)."""
    epoch_1 = Authenticator(7, VALIDATORS, KeyVerifier(), epoch=1)
    later = [epoch_1.sign(Commit(0, 5, DIGEST, i, epoch=1), SIGNERS[i]) for i in range(3)]
    certificate = encode_commit_certificate(later)
    assert verify_commit_certificate(certificate, validators=VALIDATORS, epoch=1, chain_id=7,
                                     block_number=5, block_hash=DIGEST) == {0, 1, 2}
    with pytest.raises(EpochMismatch, match="names epoch 1, counted here only in epoch 0"):
        verify_commit_certificate(certificate, validators=VALIDATORS, epoch=0, chain_id=7,
                                  block_number=5, block_hash=DIGEST)
    with pytest.raises(EpochMismatch):
        verify_commit_certificate(encode_commit_certificate(commits(3)), validators=VALIDATORS,
                                  epoch=1, chain_id=7, block_number=5, block_hash=DIGEST)
    renamed = Signed(dataclasses.replace(later[0].body, epoch=0), later[0].signature)
    with pytest.raises(SignatureError):  # the epoch is signed: naming another breaks it
        AUTH.verify(renamed)


def test_a_replica_never_signs_for_an_epoch_it_does_not_count_in() -> None:
    with pytest.raises(EpochMismatch):
        AUTH.sign(Prepare(0, 1, DIGEST, 1, epoch=1), SIGNERS[1])


def test_checkpoint_proof_needs_quorum_of_matching_values() -> None:
    root = keccak(b"root")
    proof = [AUTH.sign(Checkpoint(8, DIGEST, root, i), SIGNERS[i]) for i in range(3)]
    assert AUTH.verify_checkpoint_proof(8, proof) == (DIGEST, root)
    with pytest.raises(CertificateError):
        AUTH.verify_checkpoint_proof(8, proof[:2])
    odd = AUTH.sign(Checkpoint(8, DIGEST, keccak(b"other"), 3), SIGNERS[3])
    with pytest.raises(CertificateError):
        AUTH.verify_checkpoint_proof(8, [*proof[:2], odd])


# --- what a peer's message may hold (issue 28's resource attacks) ----------------------------


def prepared(seq_no: int, view: int = 0) -> PreparedProof:
    """A prepared certificate of primary(view) = 0 and the two other prepares it needs."""
    pre_prepare = AUTH.sign(PrePrepare(view, seq_no, DIGEST, 0), SIGNERS[0])
    return PreparedProof(pre_prepare, tuple(AUTH.sign(Prepare(view, seq_no, DIGEST, i), SIGNERS[i])
                                            for i in (1, 2)))


def view_change(view: int = 1, pset: tuple[PreparedProof, ...] = (),
                qset: tuple[PrePreparedEntry, ...] = (), replica: int = 1) -> Signed[ViewChange]:
    return AUTH.sign(ViewChange(view, 0, (), pset, qset, replica), SIGNERS[replica])


def test_only_a_pre_prepare_carries_a_block_and_exactly_one() -> None:
    pre_prepare = AUTH.sign(PrePrepare(0, 1, DIGEST, 0), SIGNERS[0])
    prepare = AUTH.sign(Prepare(0, 1, DIGEST, 1), SIGNERS[1])
    for limits in (None, LIMITS):
        WireMessage.decode(WireMessage(pre_prepare, (b"block",)).encode(), limits)
        for refused in (WireMessage(pre_prepare), WireMessage(pre_prepare, (b"a", b"b")),
                        WireMessage(prepare, (b"block",))):
            with pytest.raises(MessageError):
                WireMessage.decode(refused.encode(), limits)


def test_votes_and_checkpoints_are_a_few_hundred_bytes() -> None:
    largest = Signed(Commit(2**64 - 1, 2**64 - 1, DIGEST, 3, epoch=2**64 - 1), b"\xff" * 65)
    data = WireMessage(largest).encode()
    assert WireMessage.decode(data, LIMITS).signed == largest
    for kind in (MessageType.PREPARE, MessageType.COMMIT, MessageType.CHECKPOINT):
        assert LIMITS.extent(kind).size < 200
    assert len(data) <= LIMITS.extent(MessageType.COMMIT).size <= len(data) + 2  # replica < 2**16
    padded = rlp.decode(data)
    padded[1][2] = DIGEST * 20  # a long digest: refused by its size before it is decoded
    with pytest.raises(MessageTooLarge):
        WireMessage.decode(rlp.encode(padded), LIMITS)


def test_an_item_heavy_frame_is_refused_before_it_is_decoded() -> None:
    """A 16 MiB PRE-PREPARE whose blocks list holds one-byte items: the walk stops after the
    ten items a PRE-PREPARE may hold (pyrlp alone needs hours for these 16 M items)."""
    signed = AUTH.sign(PrePrepare(0, 1, DIGEST, 0), SIGNERS[0])
    items = 16 * 2**20 - 200
    blocks = rlp.codec.length_prefix(items, 0xC0) + b"\x01" * items
    payload = b"".join(rlp.encode(field) for field in signed.to_rlp()) + blocks
    frame = rlp.codec.length_prefix(len(payload), 0xC0) + payload
    started = time.perf_counter()
    with pytest.raises(MessageTooLarge):
        WireMessage.decode(frame, LIMITS)
    assert time.perf_counter() - started < 0.2


def test_a_view_change_holds_its_window_above_the_checkpoint() -> None:
    """P and Q hold seqNos of (stable, stable + L] only: one certificate per seqNo in P, each
    (seqNo, digest) once in Q, at most 2L entries (a seqNo re-proposed after a view change
    has two); C at most N checkpoints. Refused at decoding and, before any signature, by
    verify_view_change."""
    in_window = tuple(PrePreparedEntry(n, DIGEST, 0) for n in range(1, L + 1))
    twice = tuple(sorted((*in_window, *(PrePreparedEntry(n, keccak(b"re-proposed"), 0)
                                          for n in range(1, L + 1))),
                         key=lambda q: (q.seq_no, q.digest)))
    accepted = [view_change(qset=in_window), view_change(qset=twice),
                view_change(pset=(prepared(1), prepared(L)))]
    for signed in accepted:
        assert WireMessage.decode(WireMessage(signed).encode(), LIMITS).signed == signed
        verify_view_change(members(KeyVerifier()), signed, L)
    beyond = PrePreparedEntry(L + 1, DIGEST, 0)
    refused = [
        view_change(qset=(*in_window, beyond)),  # L + 1 entries: one outside the window
        view_change(qset=(*twice[1:], PrePreparedEntry(1, keccak(b"third"), 0))),  # unsorted
        view_change(pset=(prepared(1), prepared(L + 1))),
        view_change(pset=(prepared(1), prepared(1))),
    ]
    for signed in refused:
        with pytest.raises(MessageError):
            WireMessage.decode(WireMessage(signed).encode(), LIMITS)
        with pytest.raises(MessageError):
            verify_view_change(members(UnusedVerifier()), signed, L)
    third = (*twice, PrePreparedEntry(L, b"\xff" * 32, 0))  # 2L + 1 entries
    with pytest.raises(MessageTooLarge):
        WireMessage.decode(WireMessage(view_change(qset=third)).encode(), LIMITS)
    checkpoint = AUTH.sign(Checkpoint(10, DIGEST, DIGEST, 0), SIGNERS[0])
    too_many = AUTH.sign(ViewChange(1, 10, (checkpoint,) * 5, (), (), 1), SIGNERS[1])
    with pytest.raises(MessageTooLarge):
        WireMessage.decode(WireMessage(too_many).encode(), LIMITS)


def members(verifier: messages.Verifier) -> Membership:
    """The four validators as the replica consults them: a fixed set, epoch 0."""
    return Membership(7, EpochSchedule(10, 2, (Epoch(0, 1, VALIDATORS),)), verifier)


class UnusedVerifier(messages.Verifier):
    def recover(self, message_hash: bytes, signature: bytes) -> bytes:
        raise AssertionError("a signature was checked")


def test_a_new_view_holds_at_most_n_view_changes_and_l_pre_prepares() -> None:
    votes = tuple(view_change(replica=i) for i in range(4))
    pre_prepares = tuple(AUTH.sign(PrePrepare(1, n, DIGEST, 1), SIGNERS[1])
                         for n in range(1, L + 2))
    for body in (NewView(1, (*votes, votes[0]), (), 1), NewView(1, votes, pre_prepares, 1)):
        with pytest.raises(MessageTooLarge):
            WireMessage.decode(WireMessage(AUTH.sign(body, SIGNERS[1])).encode(), LIMITS)
    fits = AUTH.sign(NewView(1, votes, pre_prepares[:L], 1), SIGNERS[1])
    assert WireMessage.decode(WireMessage(fits).encode(), LIMITS).signed == fits


def test_a_proof_sent_again_is_not_recovered_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A VIEW-CHANGE's certificates come again for every higher view (and in NEW-VIEWs): the
    verifier remembers what it recovered."""
    recovered: list[bytes] = []
    recover = Signature.recover_public_key_from_msg_hash

    def counting(self: Signature, message_hash: bytes) -> object:
        recovered.append(message_hash)
        return recover(self, message_hash)

    monkeypatch.setattr(Signature, "recover_public_key_from_msg_hash", counting)
    fixed_set = members(KeyVerifier())
    proofs = tuple(prepared(n) for n in range(1, 11))
    verify_view_change(fixed_set, view_change(1, proofs), L)
    assert len(recovered) == 1 + 3 * 10
    verify_view_change(fixed_set, view_change(1, proofs), L)
    verify_view_change(fixed_set, view_change(2, proofs), L)
    assert len(recovered) == 1 + 3 * 10 + 1  # only the new VIEW-CHANGE's own signature


def test_the_verifier_remembers_a_bounded_number_of_signatures() -> None:
    verifier = KeyVerifier(cache_size=2)
    first, second, third = (AUTH.sign(Prepare(0, n, DIGEST, 1), SIGNERS[1]) for n in (1, 2, 3))
    for signed in (first, second, first, third):  # `second` is the least recently used
        Authenticator(7, VALIDATORS, verifier).verify(signed)
    remembered = verifier._recovered
    assert len(remembered) == 2
    assert {key[1] for key in remembered} == {first.signature, third.signature}
