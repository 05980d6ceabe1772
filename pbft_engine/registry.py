"""The validator registry: votes on the validator set are transactions, tallied in state
(DESIGN.md section 10; research/membership.md 8.2).

A native system contract at REGISTRY_ADDRESS (`chain.system_contracts`): its storage is in
the state trie, so the state root, hence every CHECKPOINT, commits to the votes and the
changes. ABI-encoded calldata, so any wallet can build a vote:

- `vote(address subject, bool add, uint64 epoch)`: one live vote per (voter, subject), a new
  one replaces it;
- `retract(address subject, uint64 epoch)`: deletes it;
- `getValidators() returns (address[])`, `epoch() returns (uint64)`: the set and the epoch
  of the block the call executes in (through eth_call: the next block's).

Rules, in block b: the sender is in V(b), the set that decides b; the epoch argument is b's
epoch (a vote cannot be replayed in another); add: the subject is not in the set after every
scheduled change; remove: it is. A proposal passes with floor(n/2)+1 live votes of V(b)'s
members (n = |V(b)|: byzantine members alone, f < n/2, cannot pass one; the honest, n - f,
always can). On passing: the `min_validators` guard, the new set = the set after every
scheduled change +/- the subject (an added one at the END, so the others keep their indices),
the votes about the subject dropped, and the change recorded as (validators, passed_at=b).
When it takes effect is `EpochSchedule.schedule`'s (FIFO, one change per epoch); the schedule
is rebuilt from the recorded changes (`schedule_from`). A vote that breaks a rule is included
and reverts with its reason. Votes expire `vote_ttl` blocks after they were cast, and count
only while their voter has been in every set since (voted out, its votes are void for good).
The same set cannot be scheduled twice by changes passing in one block (the schedule would
take the second for a replay of the first).

Storage: slot 0 counts the changes; change i is an RLP blob at keccak("change", i); the live
votes are one RLP blob at keccak("votes"), bounded (n live votes per voter, so n*n). Empty
storage is "no change, no vote": the genesis state root is the same as without a registry.
Pure: no I/O besides the ContractStorage it is handed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import rlp
from eth_utils import keccak, to_checksum_address

from chain.system_contracts import (
    WORD,
    ContractStorage,
    SystemContract,
    SystemContractRevert,
    read_blob,
    write_blob,
)
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.core.params import ADDRESS_SIZE, EngineParams

REGISTRY_ADDRESS = bytes.fromhex("000000000000000000000000000000000000bf70")
# Gas beyond the intrinsic 21,000 and calldata: what about two fresh SSTOREs cost in the EVM
# (EIP-2929's 22,100 each), so a vote costs what a contract keeping it would; fixed, so a
# wallet's estimate never falls short.
REGISTRY_GAS = 40_000

VOTE_SIGNATURE = "vote(address,bool,uint64)"
RETRACT_SIGNATURE = "retract(address,uint64)"
GET_VALIDATORS_SIGNATURE = "getValidators()"
EPOCH_SIGNATURE = "epoch()"


def selector(signature: str) -> bytes:
    return keccak(signature.encode())[:4]


VOTE, RETRACT = selector(VOTE_SIGNATURE), selector(RETRACT_SIGNATURE)
GET_VALIDATORS, EPOCH = selector(GET_VALIDATORS_SIGNATURE), selector(EPOCH_SIGNATURE)

CHANGES_SLOT = 0


def _slot(*parts: bytes) -> int:
    return int.from_bytes(keccak(b"pbft.registry." + b".".join(parts)), "big")


VOTES_BASE = _slot(b"votes")


def change_base(index: int) -> int:
    return _slot(b"change", index.to_bytes(8, "big"))


@dataclass(frozen=True)
class Vote:
    voter: bytes
    subject: bytes
    add: bool
    cast_at: int  # the block it was cast in

    def expires_at(self, ttl: int) -> int:
        """The first block in which it no longer counts."""
        return self.cast_at + ttl


@dataclass(frozen=True)
class Change:
    """A change that passed: the set after it, and the block it passed in."""

    validators: tuple[bytes, ...]
    passed_at: int


@dataclass(frozen=True)
class Tally:
    """The live votes about one subject, as counted in a block."""

    subject: bytes
    add: bool
    voters: tuple[bytes, ...]
    threshold: int  # votes of the deciding set it takes to pass
    expires_at: int  # the first block in which the oldest of them no longer counts


def read_votes(storage: ContractStorage) -> tuple[Vote, ...]:
    blob = read_blob(storage, VOTES_BASE)
    if not blob:
        return ()
    return tuple(Vote(voter, subject, add == b"\x01", int.from_bytes(cast_at, "big"))
                 for voter, subject, add, cast_at in rlp.decode(blob))


def _write_votes(storage: ContractStorage, votes: Sequence[Vote]) -> None:
    items = [[v.voter, v.subject, b"\x01" if v.add else b"", v.cast_at] for v in votes]
    write_blob(storage, VOTES_BASE, rlp.encode(items) if items else b"")


def read_changes(storage: ContractStorage) -> tuple[Change, ...]:
    """Every change that passed, in order."""
    changes = []
    for index in range(storage.get(CHANGES_SLOT)):
        validators, passed_at = rlp.decode(read_blob(storage, change_base(index)))
        changes.append(Change(tuple(validators), int.from_bytes(passed_at, "big")))
    return tuple(changes)


def _record_change(storage: ContractStorage, change: Change) -> None:
    index = storage.get(CHANGES_SLOT)
    write_blob(storage, change_base(index),
               rlp.encode([list(change.validators), change.passed_at]))
    storage.set(CHANGES_SLOT, index + 1)


def schedule_from(storage: ContractStorage, genesis_schedule: EpochSchedule) -> EpochSchedule:
    """The epoch schedule the registry's state implies: the genesis schedule with every
    recorded change scheduled (every epoch; none installed: that is the replica's business)."""
    schedule = genesis_schedule
    for change in read_changes(storage):
        schedule = schedule.schedule(change.validators, passed_at=change.passed_at)
    return schedule


def _hex(address: bytes) -> str:
    return to_checksum_address(address)


class ValidatorRegistry(SystemContract):
    """The registry's rules for one chain (its genesis parameters)."""

    address = REGISTRY_ADDRESS
    gas = REGISTRY_GAS

    def __init__(self, params: EngineParams) -> None:
        self.genesis_schedule = EpochSchedule.genesis(params)
        self.min_validators = params.min_validators
        self.vote_ttl = params.vote_ttl
        self._functions: dict[bytes, Callable[[ContractStorage, bytes, bytes, int], bytes]] = {
            VOTE: self._vote, RETRACT: self._retract,
            GET_VALIDATORS: self._get_validators, EPOCH: self._epoch,
        }

    # Reads (the RPC's, on a block's state).

    def schedule(self, storage: ContractStorage) -> EpochSchedule:
        return schedule_from(storage, self.genesis_schedule)

    def live_votes(self, storage: ContractStorage, block_number: int,
                   schedule: EpochSchedule) -> list[Vote]:
        """The votes that count in block `block_number`: not expired, cast by a voter in
        every set from the one it voted in to the one deciding this block (a removed
        validator's votes stop counting with it, and stay void if it is voted in again:
        whether a later vote happened to rewrite the list in between must not matter)."""
        now = schedule.epoch_at(block_number).number
        return [v for v in read_votes(storage)
                if block_number < v.expires_at(self.vote_ttl)
                and all(v.voter in e.validators
                        for e in schedule.epochs[schedule.epoch_at(v.cast_at).number:now + 1])]

    def pending(self, storage: ContractStorage, block_number: int) -> list[Tally]:
        """The tally of every subject with live votes, as block `block_number` counts it."""
        schedule = self.schedule(storage)
        validators = schedule.set_at(block_number)
        votes = self.live_votes(storage, block_number, schedule)
        tallies = []
        for subject in dict.fromkeys(v.subject for v in votes):
            about = [v for v in votes if v.subject == subject]
            tallies.append(Tally(subject, about[0].add, tuple(v.voter for v in about),
                                 _threshold(validators),
                                 min(v.expires_at(self.vote_ttl) for v in about)))
        return tallies

    # Calls.

    def call(self, storage: ContractStorage, sender: bytes, data: bytes,
             block_number: int) -> bytes:
        function = self._functions.get(data[:4])
        if function is None:
            raise SystemContractRevert(
                f"unknown function selector 0x{data[:4].hex()}: the registry has "
                f"{VOTE_SIGNATURE}, {RETRACT_SIGNATURE}, {GET_VALIDATORS_SIGNATURE}, "
                f"{EPOCH_SIGNATURE}")
        return function(storage, sender, data[4:], block_number)

    def _vote(self, storage: ContractStorage, sender: bytes, args: bytes,
              block_number: int) -> bytes:
        subject_word, add_word, epoch = _arguments(VOTE_SIGNATURE, args,
                                                   ("address", "bool", "uint64"))
        subject, add = _address(subject_word), bool(add_word)
        if add and not subject_word:
            raise SystemContractRevert("the zero address cannot be a validator")
        schedule = self.schedule(storage)
        validators = self._check_voter(schedule, sender, epoch, block_number)
        after = schedule.epochs[-1].validators  # the set after every scheduled change
        if add and subject in after:
            raise SystemContractRevert(f"{_hex(subject)} is a validator already (or its "
                                       "addition is scheduled)")
        if not add and subject not in after:
            raise SystemContractRevert(f"{_hex(subject)} is not a validator (or its removal "
                                       "is scheduled)")
        if not add:
            self._check_floor(subject, len(after) - 1)
        votes = [v for v in self.live_votes(storage, block_number, schedule)
                 if (v.voter, v.subject) != (sender, subject)]
        mine = sum(v.voter == sender for v in votes)
        if mine >= len(validators):  # n live votes per voter: n*n in all
            raise SystemContractRevert(f"{_hex(sender)} has {mine} live votes, as many as "
                                       "there are validators: retract one first")
        votes.append(Vote(sender, subject, add, block_number))
        voters = {v.voter for v in votes if v.subject == subject and v.add == add}
        if len(voters) >= _threshold(validators):
            changed = (*after, subject) if add else tuple(v for v in after if v != subject)
            if schedule.schedule(changed, passed_at=block_number) is schedule:
                # the schedule takes the same set passing in the same block for a replay of
                # the change it knows (a restart's): recorded, it would never take effect
                raise SystemContractRevert(
                    f"this change makes the set that was scheduled already in block "
                    f"{block_number}: one change to a set per block")
            _record_change(storage, Change(changed, block_number))
            votes = [v for v in votes if v.subject != subject]
        _write_votes(storage, votes)
        return b""

    def _retract(self, storage: ContractStorage, sender: bytes, args: bytes,
                 block_number: int) -> bytes:
        subject_word, epoch = _arguments(RETRACT_SIGNATURE, args, ("address", "uint64"))
        subject = _address(subject_word)
        schedule = self.schedule(storage)
        self._check_voter(schedule, sender, epoch, block_number)
        votes = self.live_votes(storage, block_number, schedule)
        kept = [v for v in votes if (v.voter, v.subject) != (sender, subject)]
        if len(kept) == len(votes):
            raise SystemContractRevert(f"{_hex(sender)} has no live vote about "
                                       f"{_hex(subject)} to retract")
        _write_votes(storage, kept)
        return b""

    def _get_validators(self, storage: ContractStorage, sender: bytes, args: bytes,
                        block_number: int) -> bytes:
        _arguments(GET_VALIDATORS_SIGNATURE, args, ())
        validators = self.schedule(storage).set_at(block_number)
        return (_word(WORD) + _word(len(validators))
                + b"".join(bytes(WORD - ADDRESS_SIZE) + v for v in validators))

    def _epoch(self, storage: ContractStorage, sender: bytes, args: bytes,
               block_number: int) -> bytes:
        _arguments(EPOCH_SIGNATURE, args, ())
        return _word(self.schedule(storage).epoch_at(block_number).number)

    # The rules.

    @staticmethod
    def _check_voter(schedule: EpochSchedule, sender: bytes, epoch: int,
                     block_number: int) -> tuple[bytes, ...]:
        """V(b) if the sender is in it and the vote names b's epoch; else a revert."""
        current = schedule.epoch_at(block_number)
        if sender not in current.validators:
            raise SystemContractRevert(f"{_hex(sender)} is not a validator of epoch "
                                       f"{current.number} (the set deciding block "
                                       f"{block_number})")
        if epoch != current.number:
            raise SystemContractRevert(f"the vote is for epoch {epoch}, but block "
                                       f"{block_number} is in epoch {current.number}")
        return current.validators

    def _check_floor(self, subject: bytes, remaining: int) -> None:
        if remaining < self.min_validators:
            raise SystemContractRevert(
                f"removing {_hex(subject)} would leave {remaining} validators, fewer than "
                f"min_validators {self.min_validators}")


def _threshold(validators: Sequence[bytes]) -> int:
    """floor(n/2)+1: more than half of the deciding set (Besu's VoteTally, GoQuorum's >n/2)."""
    return len(validators) // 2 + 1


def _word(value: int) -> bytes:
    return value.to_bytes(WORD, "big")


_ABI_BOUNDS: dict[str, tuple[int, str]] = {  # type -> (exclusive upper bound, what it is)
    "address": (1 << (8 * ADDRESS_SIZE), "an address (20 bytes, left-padded with zeros)"),
    "bool": (2, "a bool (0 or 1)"),
    "uint64": (1 << 64, "a uint64"),
}


def _arguments(signature: str, args: bytes, types: tuple[str, ...]) -> list[int]:
    """The static ABI arguments of `signature`, each within its type; else a revert naming
    what is wrong."""
    if len(args) != WORD * len(types):
        raise SystemContractRevert(f"malformed calldata for {signature}: {len(args)} bytes "
                                   f"of arguments, expected {WORD * len(types)}")
    values = [int.from_bytes(args[i:i + WORD], "big") for i in range(0, len(args), WORD)]
    for index, (value, kind) in enumerate(zip(values, types, strict=True)):
        bound, what = _ABI_BOUNDS[kind]
        if value >= bound:
            raise SystemContractRevert(f"malformed calldata for {signature}: argument "
                                       f"{index + 1} is not {what}")
    return values


def _address(value: int) -> bytes:
    return value.to_bytes(ADDRESS_SIZE, "big")


def encode_vote(subject: bytes, add: bool, epoch: int) -> bytes:
    """Calldata of `vote(subject, add, epoch)`."""
    return VOTE + bytes(WORD - ADDRESS_SIZE) + subject + _word(int(add)) + _word(epoch)


def encode_retract(subject: bytes, epoch: int) -> bytes:
    """Calldata of `retract(subject, epoch)`."""
    return RETRACT + bytes(WORD - ADDRESS_SIZE) + subject + _word(epoch)
