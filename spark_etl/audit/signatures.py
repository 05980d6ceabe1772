"""Signature recovery, once per distinct signed message, in parallel partitions.

Every signed consensus message in the data set (the COMMITs of certificates, the CHECKPOINTs
of checkpoint proofs, the VIEW-CHANGE and NEW-VIEW messages with everything nested in them,
and the evidence) is decoded with `pbft_engine.messages`, its signing hash recomputed for the
chain id (domain-separated), and its signer recovered with libsecp256k1 (coincurve). The
result, `signatures`, has one row per distinct message:

    message, type, view, seq_no, digest, replica, height, signer (recovered), error,
    malformed, valid

`digest` is what two messages of one (signer, type, view, seqNo) must agree on: the block
hash of a phase message, block hash || state root of a CHECKPOINT, the keccak256 of the body
of a VIEW-CHANGE or NEW-VIEW (a VIEW-CHANGE's `seq_no` is the stable checkpoint it
names). `height` is the block whose validator set counts the message (`message_height`).
`valid` means the recovered signer is the validator at the claimed replica index of that
height's set; `malformed` that the bytes are not a signed message at all (not RLP,
not canonical, an unknown type, a signature of the wrong length): the `malformed-value` rule
reports those. `recovered` and `checked` join a table's message column to these rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pyarrow as pa
import rlp
from coincurve import PublicKey
from eth_hash.auto import keccak
from pyspark.accumulators import Accumulator
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)
from rlp.codec import consume_length_prefix

from pbft_engine.messages import (
    DOMAIN,
    Checkpoint,
    MessageError,
    NewView,
    PhaseMessage,
    SignatureError,
    Signed,
    Verifier,
    ViewChange,
    decode_signed_bytes,
)
from spark_etl.audit.context import Audit, Tables
from spark_etl.hexcodec import from_hex, to_hex
from spark_etl.tables import to_record_batch

TYPE_NAMES = {
    "PrePrepare": "pre-prepare",
    "Prepare": "prepare",
    "Commit": "commit",
    "Checkpoint": "checkpoint",
    "ViewChange": "view-change",
    "NewView": "new-view",
}

RECOVERED = StructType(
    [
        StructField("message", StringType()),
        StructField("type", StringType()),
        StructField("view", LongType()),
        StructField("seq_no", LongType()),
        StructField("digest", StringType()),
        StructField("replica", LongType()),
        StructField("height", LongType()),
        StructField("epoch", LongType()),
        StructField("signer", StringType()),
        StructField("error", StringType()),
        StructField("malformed", BooleanType()),
    ]
)


class CoincurveVerifier(Verifier):
    """Public-key recovery straight through libsecp256k1: the audit's hot loop."""

    def recover(self, message_hash: bytes, signature: bytes) -> bytes:
        if len(signature) != 65 or signature[64] > 1:
            raise SignatureError("signature must be 65 bytes r || s || v with v in {0, 1}")
        try:
            public_key = PublicKey.from_signature_and_message(signature, message_hash, hasher=None)
        except ValueError as exc:
            raise SignatureError(f"unrecoverable signature: {exc}") from None
        return keccak(public_key.format(compressed=False)[1:])[12:]


def _key(body: Any) -> tuple[int | None, int | None, bytes]:
    """(view, seqNo, digest) that identify what a message commits its signer to."""
    if isinstance(body, PhaseMessage):
        return body.view, body.seq_no, body.digest
    if isinstance(body, Checkpoint):
        return None, body.seq_no, body.block_hash + body.state_root
    # a VIEW-CHANGE's seqNo is its sender's stable checkpoint (no slot: the rules that key
    # messages by slot leave it out for view changes)
    seq_no = body.stable_seq_no if isinstance(body, ViewChange) else None
    return body.view, seq_no, keccak(rlp.encode(body.fields()))


def message_height(body: Any) -> int:
    """The block whose set counts a message (DESIGN.md section 10; the engine's own rule:
    `pbft_engine.core.epochs.message_height`): a phase message's or CHECKPOINT's seqNo; for
    a VIEW-CHANGE the first block above its stable checkpoint; for a NEW-VIEW that of its
    highest VIEW-CHANGE."""
    if isinstance(body, ViewChange):
        return body.stable_seq_no + 1
    if isinstance(body, NewView):
        return max((vc.body.stable_seq_no for vc in body.view_changes), default=0) + 1
    return int(body.seq_no)


def encoded_signing_hash(encoded: bytes, body: Any, chain_id: int) -> bytes:
    """`messages.signing_hash(body, chain_id)` of a canonically encoded signed message
    [type, body, signature], hashing the body's RLP as it stands in `encoded` instead of
    encoding it again (the audit's hot loop; a test holds the two equal)."""
    _, _, _, position = consume_length_prefix(encoded, 0)  # into the message list
    _, _, length, start = consume_length_prefix(encoded, position)  # over the type
    position = start + length
    _, _, length, start = consume_length_prefix(encoded, position)  # the body
    domain = DOMAIN + chain_id.to_bytes(8, "big") + bytes([body.TYPE])
    return keccak(domain + encoded[position : start + length])


def recover(encoded: bytes, chain_id: int, verifier: Verifier) -> tuple[Any, ...]:
    """One row of RECOVERED for an encoded signed message."""
    message = to_hex(encoded)
    try:
        signed = decode_signed_bytes(encoded)  # canonical, or refused
    except (MessageError, ValueError) as exc:
        return (message, None, None, None, None, None, None, None, None,
                f"undecodable message: {exc}", True)
    body = signed.body
    view, seq_no, digest = _key(body)
    height = message_height(body)
    if max(view or 0, seq_no or 0, height, body.epoch) > MAX_LONG:  # a uint64 on the wire
        return (message, None, None, None, None, None, None, None, None,
                "a view, seqNo or epoch beyond the audit's 64-bit signed columns", True)
    head = (message, TYPE_NAMES[type(body).__name__], view, seq_no, to_hex(digest), body.replica,
            height, body.epoch)
    try:
        signer = verifier.recover(encoded_signing_hash(encoded, body, chain_id),
                                  signed.signature)
    except SignatureError as exc:
        return (*head, None, str(exc), False)
    return (*head, to_hex(signer), None, False)


MAX_LONG = 2**63 - 1  # Spark's LongType
VERIFIER = CoincurveVerifier()
RECOVERED_ARROW = to_arrow_schema(RECOVERED)
MESSAGES = StructType([StructField("message", StringType())])  # encoded, 0x hex


def _recover_batches(batches: Iterator[pa.RecordBatch], chain_id: int,
                     cpu_seconds: Accumulator[float]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        started = time.thread_time()  # this thread's: on the driver, others run beside it
        rows = [recover(m, chain_id, VERIFIER) for m in batch.column(0).to_pylist()]
        cpu_seconds.add(time.thread_time() - started)
        yield to_record_batch(rows, RECOVERED_ARROW)


def _children(signed: Signed[Any]) -> list[Signed[Any]]:
    body = signed.body
    if isinstance(body, ViewChange):
        proofs = [m for p in body.pset for m in (p.pre_prepare, *p.prepares)]
        return [*body.checkpoint_proof, *proofs]
    if isinstance(body, NewView):
        return [*body.view_changes, *body.pre_prepares]
    return []


def nested_messages(message: str | None) -> list[str]:
    """`message` and every signed message nested in it (VIEW-CHANGE, NEW-VIEW), encoded."""
    if message is None:
        return []
    found = [message]
    pending = [message]
    while pending:
        try:
            signed = decode_signed_bytes(from_hex(pending.pop()))
        except (MessageError, ValueError):
            continue  # recovery reports it
        children = [to_hex(child.encode()) for child in _children(signed)]
        found.extend(children)
        pending.extend(children)
    return found


def _nested_rows(row: dict[str, Any]) -> list[tuple[str]]:
    return [(message,) for message in nested_messages(row["message"])]


def signed_messages(tables: Tables) -> DataFrame:
    """Every distinct signed message in the data set, as bytes (one column, `encoded`)."""
    data = tables.data
    flat = [
        data.commit_certificates.select("message"),
        data.checkpoints.select("message"),
    ]
    containers = tables.union(
        data.view_changes.select("message"),
        data.view_changes.select(F.col("new_view").alias("message")),
        data.evidence.select(F.col("first").alias("message")),
        data.evidence.select(F.col("second").alias("message")),
    ).distinct()
    nested = tables.flat_map_rows(containers, _nested_rows, MESSAGES)
    union = tables.union(*flat, nested).where(F.col("message").isNotNull())
    # a message that is not hex has no bytes to recover (malformed-value reports it)
    encoded = union.select(F.expr("unhex(substr(message, 3))").alias("encoded"))
    return encoded.where(F.col("encoded").isNotNull()).distinct()


def signatures(audit: Audit) -> DataFrame:
    """RECOVERED for every distinct signed message, plus `valid`; computed once per audit."""

    def build(tables: Tables) -> DataFrame:
        # a large export's messages are in the partitions of their `distinct`, a few a core
        # (`context.PARALLEL`)
        messages = signed_messages(tables)
        recovered = tables.map_in_arrow(
            messages,
            partial(_recover_batches, chain_id=audit.validators.chain_id,
                    cpu_seconds=audit.recovery_cpu_seconds),
            RECOVERED,
        )
        # valid: signed by the member it claims to be, in the epoch of its height, which it
        # names (a signature for another epoch never counts: DESIGN.md section 10)
        height = F.col("height")
        claimed = audit.validators.address_of(F.col("replica"), height)
        named = F.col("epoch") == audit.validators.epoch_at(height)
        return recovered.withColumn(
            "valid", F.coalesce((F.col("signer") == claimed) & named, F.lit(False))
        )

    return audit.cached("signatures", build)


def recovered(audit: Audit, prefix: str, key: str = "message") -> DataFrame:
    """The signatures table with its columns renamed `prefix`_column, and its message column
    named `key` (the column of the table it is joined to)."""
    sig = signatures(audit)
    return sig.select(
        F.col("message").alias(key),
        *(F.col(c).alias(f"{prefix}_{c}") for c in sig.columns if c != "message"),
    )


def signature_problem(audit: Audit, prefix: str, expected_type: str) -> Column:
    """Why a signed message is not a valid `expected_type` signed by the validator whose
    replica index it claims (null when it is, or when there is no recovered row)."""
    signer, replica = F.col(f"{prefix}_signer"), F.col(f"{prefix}_replica")
    return (
        F.when(F.col(f"{prefix}_error").isNotNull(), F.col(f"{prefix}_error"))
        .when(
            F.col(f"{prefix}_type") != expected_type,
            F.format_string("a %s message where a %s belongs", f"{prefix}_type",
                            F.lit(expected_type)),
        )
        .when(
            ~audit.validators.contains(signer, F.col(f"{prefix}_height")),
            F.format_string("the signature recovers to %s, not a validator", signer),
        )
        .when(
            F.col(f"{prefix}_epoch") != audit.validators.epoch_at(F.col(f"{prefix}_height")),
            F.format_string("names epoch %d, but block %d is decided by epoch %d",
                            F.col(f"{prefix}_epoch"), F.col(f"{prefix}_height"),
                            audit.validators.epoch_at(F.col(f"{prefix}_height"))),
        )
        .when(
            ~F.col(f"{prefix}_valid"),
            F.format_string("claims replica %d but is signed by validator %s", replica, signer),
        )
    )


def checked(audit: Audit, frame: DataFrame, prefix: str, expected_type: str,
            *problems: Column) -> DataFrame:
    """`frame` joined to the recovered signature of its `message` (columns `prefix`_*), with
    `problem`: why the message is not a valid `expected_type` signed by the validator it
    claims, or the first of `problems` that holds; null when none does (or no message)."""
    return frame.join(recovered(audit, prefix), "message", "left").withColumn(
        "problem", F.coalesce(signature_problem(audit, prefix, expected_type), *problems)
    )
