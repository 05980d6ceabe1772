"""Signature recovery as the audit does it, without Spark: the signing hash taken from the
encoded message equals pbft_engine.messages.signing_hash for every message type, and a bad
message or signature gives an error row instead of a signer."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pbft_engine.core.epochs import message_height as engine_message_height
from pbft_engine.messages import (
    Checkpoint,
    Commit,
    NewView,
    Prepare,
    PreparedProof,
    PrePrepare,
    Signed,
    ViewChange,
    signing_hash,
)
from spark_etl.audit.signatures import (
    VERIFIER,
    encoded_signing_hash,
    message_height,
    nested_messages,
    recover,
)
from spark_etl.hexcodec import to_hex
from tests.etl.chain_factory import CHAIN_ID, Validators

DIGEST = bytes(range(32))


def messages(validators: Validators) -> list[Signed[Any]]:
    checkpoint = validators.sign(Checkpoint(8, DIGEST, DIGEST[::-1], 1))
    pre_prepare = validators.sign(PrePrepare(3, 9, DIGEST, 3))
    prepares = tuple(validators.sign(Prepare(3, 9, DIGEST, r)) for r in (0, 1))
    view_change = validators.sign(
        ViewChange(4, 8, (checkpoint,), (PreparedProof(pre_prepare, prepares),), (), 2)
    )
    return [
        validators.sign(Commit(3, 9, DIGEST, 0)),
        checkpoint,
        pre_prepare,
        *prepares,
        view_change,
        validators.sign(NewView(4, (view_change,), (pre_prepare,), 0)),
    ]


@pytest.mark.parametrize("index", range(7))
def test_signing_hash_of_the_encoding_is_the_protocols(index: int) -> None:
    signed = messages(Validators())[index]
    assert encoded_signing_hash(signed.encode(), signed.body, CHAIN_ID) == signing_hash(
        signed.body, CHAIN_ID
    )


@pytest.mark.parametrize("index", range(7))
def test_the_height_whose_set_counts_a_message_is_the_engine_s(index: int) -> None:
    body = messages(Validators())[index].body
    assert message_height(body) == engine_message_height(body)


def test_recover_names_the_signer_or_the_problem() -> None:
    validators = Validators()
    commit = validators.sign(Commit(3, 9, DIGEST, 2))
    row = recover(commit.encode(), CHAIN_ID, VERIFIER)
    assert row[1:] == ("commit", 3, 9, to_hex(DIGEST), 2, 9, 0, validators.addresses[2], None,
                       False)
    later = dataclasses.replace(validators, epoch=7).sign(Commit(3, 9, DIGEST, 2))
    assert recover(later.encode(), CHAIN_ID, VERIFIER)[7:9] == (7, validators.addresses[2])
    other_chain = recover(commit.encode(), CHAIN_ID + 1, VERIFIER)
    assert other_chain[8] != validators.addresses[2]  # the domain binds the chain id
    bad_v = Signed(commit.body, commit.signature[:64] + b"\x05")
    assert "v in {0, 1}" in recover(bad_v.encode(), CHAIN_ID, VERIFIER)[9]
    assert recover(bad_v.encode(), CHAIN_ID, VERIFIER)[10] is False  # decodes: a bad signature
    undecodable = recover(b"\xc0", CHAIN_ID, VERIFIER)
    assert "undecodable" in undecodable[9] and undecodable[10]  # malformed, not a bad one


def test_nested_messages_reach_every_signed_message_inside() -> None:
    all_messages = messages(Validators())
    new_view = all_messages[-1]
    found = nested_messages(to_hex(new_view.encode()))
    assert set(found) == {to_hex(m.encode()) for m in all_messages[1:] if m is not all_messages[0]}
