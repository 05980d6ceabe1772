"""Message encoding, signatures, certificates and malformed input."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import rlp
from eth_hash.auto import keccak
from eth_keys.backends import CoinCurveECCBackend
from hypothesis import given, settings
from hypothesis import strategies as st

from pbft_engine import messages
from pbft_engine.errors import CertificateError, MessageError, SignatureError
from pbft_engine.messages import (
    Authenticator,
    Checkpoint,
    Commit,
    KeySigner,
    KeyVerifier,
    Prepare,
    PrePrepare,
    Signed,
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
    short_digest = [good[0], [*good[1][:2], b"\x01" * 31, good[1][3]], good[2], good[3]]
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
    signers = verify_commit_certificate(certificate, validators=VALIDATORS, chain_id=7,
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
        verify_commit_certificate(certificate, validators=VALIDATORS, chain_id=7,
                                  block_number=5, block_hash=DIGEST)


def test_forged_commit_in_certificate_rejected() -> None:
    forged = commits(3)
    forged[2] = dataclasses.replace(forged[2], signature=forged[1].signature)
    with pytest.raises(SignatureError):
        verify_commit_certificate(encode_commit_certificate(forged), validators=VALIDATORS,
                                  chain_id=7, block_number=5, block_hash=DIGEST)


def test_checkpoint_proof_needs_quorum_of_matching_values() -> None:
    root = keccak(b"root")
    proof = [AUTH.sign(Checkpoint(8, DIGEST, root, i), SIGNERS[i]) for i in range(3)]
    assert AUTH.verify_checkpoint_proof(8, proof) == (DIGEST, root)
    with pytest.raises(CertificateError):
        AUTH.verify_checkpoint_proof(8, proof[:2])
    odd = AUTH.sign(Checkpoint(8, DIGEST, keccak(b"other"), 3), SIGNERS[3])
    with pytest.raises(CertificateError):
        AUTH.verify_checkpoint_proof(8, [*proof[:2], odd])
