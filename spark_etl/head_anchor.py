"""A node's claimed head, anchored in the genesis validator set (`pbft-etl export --genesis`).

The export plans blocks up to the heads the nodes claim, and checks nothing of a block (the
audit does): a node that makes up well-formed blocks up to a claimed head of 2**63 would be
followed without end. Before planning past it, a node's claimed head must carry a commit
certificate of a quorum of the genesis validators (no node operator holds their keys), for
the header the node serves at that height: then the chain does reach that height. A node
whose head is not certified is left out of the export, with a one-line warning, by
`probe_all`: an honest node always holds its head's certificate (its engine stores the
certificate before it commits the block; catch-up stores it in the block's write batch), so
lowering the head to some height the same node certifies would trust it further for no
honest node's sake.

The check uses the genesis set, which holds while the validator set is fixed."""

from __future__ import annotations

from typing import Any

from eth_hash.auto import keccak

from pbft_engine.messages import (
    HASH_SIZE,
    MAX_REPLICAS,
    SIGNATURE_SIZE,
    Commit,
    MessageError,
    Signed,
    verify_commit_certificate,
)
from spark_etl.audit.context import ValidatorSet
from spark_etl.audit.signatures import VERIFIER
from spark_etl.errors import ExtractError
from spark_etl.hexcodec import from_hex
from spark_etl.rows import block_parts
from spark_etl.rpc import JsonRpcClient

MAX_UINT64 = 2**64 - 1
# The largest signed COMMIT: every field at its bound. A certificate holds one per validator,
# so a longer one is refused before it is decoded (decoding is work proportional to it).
MAX_COMMIT_BYTES = len(
    Signed(Commit(MAX_UINT64, MAX_UINT64, bytes(HASH_SIZE), MAX_REPLICAS - 1),
           bytes(SIGNATURE_SIZE)).encode()
)
MAX_LIST_PREFIX = 9  # an RLP list's prefix: 1 byte and up to 8 of length


class UncertifiedHead(ExtractError):
    """A node's claimed head has no valid commit certificate of the genesis validators."""


def _certificate_bytes(answer: Any, validators: ValidatorSet) -> bytes:
    """The encoded certificate of pbft_getCommitCertificate's answer, within the size N
    COMMITs can have; UncertifiedHead if there is none or it is not hex."""
    if answer is None:
        raise UncertifiedHead("no commit certificate served")
    encoded = answer.get("certificate") if isinstance(answer, dict) else None
    limit = MAX_LIST_PREFIX + validators.size * MAX_COMMIT_BYTES
    if not isinstance(encoded, str) or len(encoded) > 2 + 2 * limit:
        raise UncertifiedHead(f"the certificate served is not the hex of at most {limit} bytes")
    try:
        return from_hex(encoded)
    except ValueError:
        raise UncertifiedHead("the certificate served is not hex") from None


def _header_hash(answer: Any) -> bytes:
    """keccak256 of the header of debug_getRawBlock's answer (the RLP block)."""
    if not isinstance(answer, str):
        raise UncertifiedHead("no block served at its head")
    try:
        raw_header, _ = block_parts(from_hex(answer))
    except ValueError:
        raise UncertifiedHead("the block served at its head is not hex") from None
    except ExtractError as exc:
        raise UncertifiedHead(f"the block served at its head is {exc}") from None
    return keccak(raw_header)


def check_head(client: JsonRpcClient, head: int, validators: ValidatorSet) -> None:
    """UncertifiedHead unless block `head` of the node of `client` has a commit certificate
    of a quorum of `validators` (distinct, valid COMMITs of one view) for the hash of the
    header the node serves there. One request (certificate and block in a batch), at most N
    signature recoveries. Block 0 needs none: the audit checks it against the genesis."""
    if head == 0:
        return
    number = hex(head)
    certificate, raw_block = client.batch(
        [("pbft_getCommitCertificate", [number]), ("debug_getRawBlock", [number])]
    )
    try:
        verify_commit_certificate(
            _certificate_bytes(certificate, validators),
            validators=[from_hex(a) for a in validators.addresses],
            chain_id=validators.chain_id,
            block_number=head,
            block_hash=_header_hash(raw_block),
            verifier=VERIFIER,
        )
    except (UncertifiedHead, MessageError) as exc:
        raise UncertifiedHead(f"its head {head} is not certified by the genesis validators "
                              f"({exc})") from None
