"""Which validator set decided a block, as the validators that agreed on a receipt in it say
(DESIGN.md section 10: the header commits to the next set).

Block n's `extraData` is keccak256 of the RLP list of the sorted 20-byte addresses of the set
that decides n+1 (the chain's definition: `pbft_engine/epoch_feed.py`, `validators_hash`).
The f+1 validators that report one receipt hold at least one correct one, so what they all
answer alike about block b is true: the set `pbft_getValidatorsByBlockNumber(b)` and block
b-1's extraData; the set must hash to that commitment. Pure: the client asks, this judges."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import rlp
from eth_hash.auto import keccak
from eth_utils import is_hex_address, to_canonical_address, to_checksum_address

from bft_client.errors import BftClientError

NO_COMMITMENT = "0x"  # extraData of a chain built before the commitment (its set never changed)


def validators_hash(addresses: Sequence[str]) -> str:
    """keccak256(rlp(sorted 20-byte addresses)), 0x hex."""
    return "0x" + keccak(rlp.encode(sorted(to_canonical_address(a) for a in addresses))).hex()


@dataclass(frozen=True)
class BlockSet:
    """What one validator answered about the set of block `number`."""

    number: int
    validators: tuple[str, ...]  # checksummed, in replica order
    parent_extra_data: str  # block number-1's extraData, lower-case 0x hex


def block_set(number: int, validators: Any, parent: Any) -> BlockSet:
    """One validator's answers (pbft_getValidatorsByBlockNumber(number), and
    eth_getBlockByNumber(number-1)) as a BlockSet; BftClientError if malformed."""
    if (not isinstance(validators, list) or not validators
            or not all(isinstance(a, str) and is_hex_address(a) for a in validators)):
        raise BftClientError(f"the validators of block {number} are {validators!r}")
    extra = parent.get("extraData") if isinstance(parent, dict) else None
    if not isinstance(extra, str) or not extra.startswith("0x"):
        raise BftClientError(f"block {number - 1} has no extraData: {parent!r}")
    return BlockSet(number, tuple(to_checksum_address(a) for a in validators), extra.lower())


def proven_set(answers: dict[str, BlockSet], configured: Sequence[str]) -> tuple[str, ...]:
    """The set that decided the block, from the answers of validators that agreed on a receipt
    in it (at least one of them is correct): they must all answer alike, and the set must hash
    to the parent's commitment (a chain without one: the configured set, unchanged)."""
    distinct = set(answers.values())
    if len(distinct) != 1:
        raise BftClientError(
            "the validators that agree on the receipt disagree about the set that decided its "
            "block: " + "; ".join(f"{v}: {', '.join(a.validators)} (parent commits to "
                                  f"{a.parent_extra_data})" for v, a in answers.items()))
    [answer] = distinct
    committed = answer.parent_extra_data
    if committed == NO_COMMITMENT and set(answer.validators) == set(configured):
        return answer.validators
    if validators_hash(answer.validators) != committed:
        raise BftClientError(
            f"the validators of block {answer.number} ({', '.join(answer.validators)}) hash to "
            f"{validators_hash(answer.validators)}; block {answer.number - 1} commits to "
            f"{committed}")
    return answer.validators
