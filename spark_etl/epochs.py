"""Which validator set decides which height, proven from the genesis set over certified
headers only (DESIGN.md section 10; research/membership.md section 8.5, "Header-only
verification").

Block n's `extraData` commits to the set that decides n + 1: keccak256 of the RLP list of
its sorted 20-byte addresses (`validators_hash`). So from the genesis set alone an auditor
walks the epochs: the certificate of block c verifies with V(c); where the node says the set
changes after c, it is asked for V(c + 1), whose hash must be the certified extraData(c).
The walk visits the epoch boundaries only (two requests each), never every block. What a
node answers is then proven: the members by the hash; their order (which indexes the signers
of a certificate), if wrong, only makes later certificates fail. A lying node can make the
walk fail (an honest chain called uncertified), never pass on a set the chain did not
commit to.

A chain built before the commitment has extraData 0x at every block and no set change: a
node that claims a change there cannot prove it (no commitment), and the walk fails."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import rlp
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
from pbft_engine.quorum import max_faulty, quorum
from spark_etl.audit.context import validators_hash
from spark_etl.audit.signatures import VERIFIER
from spark_etl.audit.validators import ADDRESS
from spark_etl.errors import ExtractError
from spark_etl.hexcodec import from_hex, to_hex
from spark_etl.rows import block_parts
from spark_etl.rpc import JsonRpcClient, MethodNotFound

MAX_UINT64 = 2**64 - 1
# The largest signed COMMIT: every field at its bound. A certificate holds one per validator,
# so a longer one is refused before it is decoded.
MAX_COMMIT_BYTES = len(
    Signed(Commit(MAX_UINT64, MAX_UINT64, bytes(HASH_SIZE), MAX_REPLICAS - 1, epoch=MAX_UINT64),
           bytes(SIGNATURE_SIZE)).encode()
)
MAX_LIST_PREFIX = 9  # an RLP list's prefix: 1 byte and up to 8 of length
# A node's epochs, at most: every change is a vote and an epoch of at least K blocks, so a
# real chain has a handful; a node claiming epochs of one block up to a head of 2**63 must
# not cost the export 2**63 requests
MAX_EPOCHS = 10_000
EXTRA_DATA_FIELD = 12  # a header's fields: parentHash, ommersHash, coinbase, ..., extraData


class UnprovenEpoch(ExtractError):
    """A set change a node claims that the certified headers do not prove."""


@dataclass(frozen=True)
class Epoch:
    """Epoch `number`: `validators` (replica order, lower-case 0x addresses) decide blocks
    `first_block`..`last_block` (None: up to the highest height known)."""

    number: int
    first_block: int
    validators: tuple[str, ...]
    last_block: int | None = None

    @property
    def n(self) -> int:
        return len(self.validators)

    @property
    def f(self) -> int:
        return max_faulty(self.n)

    @property
    def quorum(self) -> int:
        return quorum(self.n)

    @property
    def validators_hash(self) -> str:
        return validators_hash(self.validators)

    def describe(self) -> str:
        """Whose certificates these are, for a message."""
        if self.number == 0:
            return "the genesis validators"
        return f"the validators of epoch {self.number} (from block {self.first_block})"


def _addresses(answer: Any, what: str) -> tuple[str, ...]:
    """A list of distinct 0x addresses, lower-cased; UnprovenEpoch otherwise."""
    if (not isinstance(answer, list) or not answer
            or not all(isinstance(a, str) and ADDRESS.match(a) for a in answer)
            or len({a.lower() for a in answer}) != len(answer)):
        raise UnprovenEpoch(f"{what}: not a list of distinct addresses")
    return tuple(a.lower() for a in answer)


def _last_block(answer: Any, epoch: Epoch) -> int | None:
    """pbft_getEpoch's `lastBlock` for the epoch from `epoch.first_block`: None while no
    change is scheduled after it."""
    last = answer.get("lastBlock") if isinstance(answer, dict) else None
    if last is None:
        return None
    try:
        number = int(str(last), 16)
    except ValueError:
        raise UnprovenEpoch(f"pbft_getEpoch's lastBlock {last!r} is not a quantity") from None
    if number < epoch.first_block:
        raise UnprovenEpoch(f"pbft_getEpoch says epoch {epoch.number} ends at block {number}, "
                            f"before its first block {epoch.first_block}")
    return number


def _certificate_bytes(answer: Any, epoch: Epoch) -> bytes:
    """The encoded certificate of pbft_getCommitCertificate's answer, within the size n
    COMMITs can have (decoding is work proportional to it); ExtractError otherwise."""
    if answer is None:
        raise ExtractError("no commit certificate served")
    encoded = answer.get("certificate") if isinstance(answer, dict) else None
    limit = MAX_LIST_PREFIX + epoch.n * MAX_COMMIT_BYTES
    if not isinstance(encoded, str) or len(encoded) > 2 + 2 * limit:
        raise ExtractError(f"the certificate served is not the hex of at most {limit} bytes")
    try:
        return from_hex(encoded)
    except ValueError:
        raise ExtractError("the certificate served is not hex") from None


def _raw_header(answer: Any, number: int) -> bytes:
    """The header of debug_getRawBlock's answer (the RLP block)."""
    if not isinstance(answer, str):
        raise ExtractError(f"no block served at {number}")
    try:
        raw_header, _ = block_parts(from_hex(answer))
    except ValueError:
        raise ExtractError(f"the block served at {number} is not hex") from None
    except ExtractError as exc:
        raise ExtractError(f"the block served at {number} is {exc}") from None
    return raw_header


def certified_header(block: Any, certificate: Any, number: int, epoch: Epoch,
                     chain_id: int) -> bytes:
    """The RLP header of debug_getRawBlock's answer `block`, once pbft_getCommitCertificate's
    answer `certificate` proves that a quorum of `epoch`'s set (distinct, valid COMMITs of
    one view) committed it at `number`; ExtractError or MessageError otherwise. At most n
    signature recoveries."""
    encoded = _certificate_bytes(certificate, epoch)
    raw_header = _raw_header(block, number)
    verify_commit_certificate(
        encoded,
        validators=[from_hex(a) for a in epoch.validators], epoch=epoch.number,
        chain_id=chain_id, block_number=number, block_hash=keccak(raw_header),
        verifier=VERIFIER,
    )
    return raw_header


def epoch_at(epochs: list[Epoch], height: int) -> Epoch:
    """The epoch of `epochs` (a walk's) that decides `height` (1 and up)."""
    return next(e for e in reversed(epochs) if e.first_block <= height)


def extra_data(raw_header: bytes) -> str:
    """The header's extraData, 0x hex; ExtractError if it is no header."""
    try:
        fields = rlp.decode(raw_header)
        value = fields[EXTRA_DATA_FIELD]
    except (rlp.DecodingError, IndexError, TypeError):
        raise ExtractError("the header is not an RLP list of header fields") from None
    if not isinstance(value, bytes):
        raise ExtractError("the header's extraData is not a byte string")
    return to_hex(value)


def _next_epoch(client: JsonRpcClient, epoch: Epoch, boundary: int, chain_id: int,
                override: tuple[str, ...] | None = None) -> Epoch:
    """The epoch after `boundary`, proven: block `boundary` certified by `epoch`'s set, its
    extraData the hash of the set the node names for the next block; or, where the genesis
    file has an `override` from boundary + 1, that set (the block's commitment is the old
    schedule's)."""
    number = hex(boundary)
    block, certificate, following = client.batch([
        ("debug_getRawBlock", [number]), ("pbft_getCommitCertificate", [number]),
        ("pbft_getValidatorsByBlockNumber", [hex(boundary + 1)]),
    ])
    try:
        committed = extra_data(certified_header(block, certificate, boundary, epoch, chain_id))
    except (ExtractError, MessageError) as exc:
        raise UnprovenEpoch(f"block {boundary} is not certified by {epoch.describe()} "
                            f"({exc})") from None
    if override is not None:
        return Epoch(epoch.number + 1, boundary + 1, override)
    validators = _addresses(following, f"the validators of block {boundary + 1}")
    if committed == "0x":
        raise UnprovenEpoch(f"block {boundary} commits to no next validator set (extraData 0x)")
    if committed == epoch.validators_hash:
        raise UnprovenEpoch(f"block {boundary} commits to the same validator set: no change "
                            "follows it")
    if validators_hash(validators) != committed:
        raise UnprovenEpoch(f"the validators served for block {boundary + 1} hash to "
                            f"{validators_hash(validators)}; block {boundary} commits to "
                            f"{committed}")
    return Epoch(epoch.number + 1, boundary + 1, validators)


def epoch_row(node: str, epoch: Epoch) -> tuple[Any, ...]:
    """A row of the `epochs` table (`schemas.EPOCHS`, node last)."""
    return (epoch.number, epoch.first_block, epoch.last_block, list(epoch.validators),
            epoch.validators_hash, epoch.n, epoch.f, epoch.quorum, node)


def claimed_epochs(client: JsonRpcClient, last: int) -> list[Epoch]:
    """The epochs the node says decide blocks 1..`last` (pbft_getEpoch at each epoch's first
    block; one request per epoch), unproven: the audit checks them against the certified
    headers. None from a node without pbft_getEpoch (built before set changes)."""
    epochs: list[Epoch] = []
    first = 1
    while len(epochs) < MAX_EPOCHS:
        try:
            answer = client.call("pbft_getEpoch", hex(first))
        except MethodNotFound:
            return []
        claimed = answer.get("validators") if isinstance(answer, dict) else None
        epoch = Epoch(len(epochs), first, _addresses(claimed, f"pbft_getEpoch({first})"))
        end = _last_block(answer, epoch)
        epochs.append(replace(epoch, last_block=end))
        if end is None or end >= last:
            return epochs
        first = end + 1
    raise UnprovenEpoch(f"more than {MAX_EPOCHS} epochs claimed")


def walk_epochs(client: JsonRpcClient, genesis: tuple[str, ...], chain_id: int,
                height: int, overrides: dict[int, tuple[str, ...]] | None = None
                ) -> list[Epoch]:
    """The epochs from block 1 up to the one that decides `height`, each proven from the
    genesis set; the last one's `last_block` is None. Where the node says no change comes
    (or none before `height`), its word is checked by whoever reads the certified header
    at that height (its extraData commits to the set of the next).
    A node without pbft_getEpoch (one built before set changes) gets the genesis set for
    every height: if that is not its chain's, its certificates fail to verify."""
    overrides = overrides or {}
    epochs = [Epoch(0, 1, genesis)]
    while True:
        epoch = epochs[-1]
        try:
            answer = client.call("pbft_getEpoch", hex(epoch.first_block))
        except MethodNotFound:
            answer = None
        # the genesis file's next override ends the epoch whatever the node says
        ahead = [first for first in overrides if first > epoch.first_block]
        last = None if answer is None else _last_block(answer, epoch)
        if ahead and (last is None or last >= min(ahead)):
            last = min(ahead) - 1
        if last is None or last >= height:
            return epochs
        following = _next_epoch(client, epoch, last, chain_id, overrides.get(last + 1))
        epochs[-1] = replace(epoch, last_block=last)
        epochs.append(following)
