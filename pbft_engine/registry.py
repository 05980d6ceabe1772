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

Storage: slot 0 counts the changes; change i is an RLP blob at keccak("change", i). Each vote
is one word, kept twice: in its voter's list (at keccak("voter", voter)) and in its subject's
(at keccak("subject", subject)), so a vote reads and writes two lists of at most about n words
each, however many votes the others hold (a single blob of every vote made each vote's work
n*n words for a fixed gas). A voter holds at most n live votes; its list drops its dead votes
when it votes or retracts, from their subjects' lists too, and a subject's list drops its dead
votes when it is voted on, so storage stays bounded. Empty storage is "no change, no vote":
the genesis state root is the same as without a registry. Pure: no I/O besides the
ContractStorage it is handed.
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


def voter_base(voter: bytes) -> int:
    """Where `voter`'s list of votes is: its length, then one word per vote."""
    return _slot(b"voter", voter)


def subject_base(subject: bytes) -> int:
    """Where the list of votes about `subject` is."""
    return _slot(b"subject", subject)


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


# A vote's word: the other party's address (the subject in a voter's list, the voter in a
# subject's), then the add flag, then the block it was cast in (a uint64).
_CAST_BITS = 64
_ADDRESS_SHIFT = _CAST_BITS + 32


def _pack(address: bytes, vote: Vote) -> int:
    return (int.from_bytes(address, "big") << _ADDRESS_SHIFT | int(vote.add) << _CAST_BITS
            | vote.cast_at)


def _words(storage: ContractStorage, base: int) -> list[int]:
    return [storage.get(base + 1 + i) for i in range(storage.get(base))]


def _address_of(word: int) -> bytes:
    return _address(word >> _ADDRESS_SHIFT)


def _unpack(voter: bytes, subject: bytes, word: int) -> Vote:
    return Vote(voter, subject, bool(word >> _CAST_BITS & 1), word & ((1 << _CAST_BITS) - 1))


def votes_of(storage: ContractStorage, voter: bytes) -> list[Vote]:
    """The votes `voter`'s list holds (live, or dead and not dropped yet)."""
    return _Lists(storage).of(voter)


def votes_about(storage: ContractStorage, subject: bytes) -> list[Vote]:
    """The votes `subject`'s list holds (live, or dead and not dropped yet)."""
    return _Lists(storage).about(subject)


class _Lists:
    """The voters' and subjects' lists one call reads and writes: each list is read once,
    and a write sets only the words that changed (a vote replacing one rewrites one word of
    each list)."""

    def __init__(self, storage: ContractStorage) -> None:
        self.storage = storage
        self._read: dict[int, list[int]] = {}

    def _get(self, base: int) -> list[int]:
        if base not in self._read:
            self._read[base] = _words(self.storage, base)
        return self._read[base]

    def _put(self, base: int, words: list[int]) -> None:
        old = self._get(base)
        if len(words) != len(old):
            self.storage.set(base, len(words))
        for i in range(max(len(old), len(words))):
            word = words[i] if i < len(words) else 0  # cleared: as if never written
            if i >= len(old) or old[i] != word:
                self.storage.set(base + 1 + i, word)
        self._read[base] = words

    def of(self, voter: bytes) -> list[Vote]:
        return [_unpack(voter, _address_of(w), w) for w in self._get(voter_base(voter))]

    def about(self, subject: bytes) -> list[Vote]:
        return [_unpack(_address_of(w), subject, w) for w in self._get(subject_base(subject))]

    def put_of(self, voter: bytes, votes: Sequence[Vote]) -> None:
        self._put(voter_base(voter), [_pack(v.subject, v) for v in votes])

    def put_about(self, subject: bytes, votes: Sequence[Vote]) -> None:
        self._put(subject_base(subject), [_pack(v.voter, v) for v in votes])


def _in_place(votes: Sequence[Vote], cast: Vote, same: Callable[[Vote], bool]) -> list[Vote]:
    """`votes` with `cast` in the place of the one it replaces (at the end if none): a
    replaced vote keeps its word, so only that word is written."""
    placed = [cast if same(v) else v for v in votes]
    return placed if any(map(same, votes)) else [*placed, cast]


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

    def schedule_in(self, storage: ContractStorage, block_number: int) -> EpochSchedule:
        """The schedule as block `block_number` executes with it: without the overrides of
        genesis that start above it. A block runs the same whenever it is executed again,
        before or after an override was written into the genesis file (a change that a later
        override voids still counts in the blocks below it, as it did when they first ran)."""
        return schedule_from(storage, self.genesis_schedule.as_of(block_number))

    def counts(self, vote: Vote, block_number: int, schedule: EpochSchedule) -> bool:
        """Whether `vote` counts in block `block_number`: not expired, cast by a voter in
        every set from the one it voted in to the one deciding this block (a removed
        validator's votes stop counting with it, and stay void if it is voted in again:
        whether a later vote happened to drop them in between must not matter). Once dead,
        dead for good: the sets of blocks up to a change's are fixed before it passes."""
        now = schedule.epoch_at(block_number).number
        return (block_number < vote.expires_at(self.vote_ttl)
                and all(vote.voter in e.validators
                        for e in schedule.epochs[schedule.epoch_at(vote.cast_at).number:now + 1]))

    def live_votes(self, storage: ContractStorage, block_number: int) -> list[Vote]:
        """The votes that count in block `block_number`, by voter in the order of its set:
        a vote counts only while its voter is in the set, so the set's n lists hold them all."""
        schedule = self.schedule_in(storage, block_number)
        return [v for voter in schedule.set_at(block_number) for v in votes_of(storage, voter)
                if self.counts(v, block_number, schedule)]

    def pending(self, storage: ContractStorage, block_number: int) -> list[Tally]:
        """The tally of every subject with live votes, as block `block_number` counts it."""
        threshold = _threshold(self.schedule_in(storage, block_number).set_at(block_number))
        votes = self.live_votes(storage, block_number)
        tallies = []
        for subject in dict.fromkeys(v.subject for v in votes):
            about = [v for v in votes if v.subject == subject]
            tallies.append(Tally(subject, about[0].add, tuple(v.voter for v in about),
                                 threshold, min(v.expires_at(self.vote_ttl) for v in about)))
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
        schedule = self.schedule_in(storage, block_number)
        validators = self._check_voter(schedule, sender, epoch, block_number)
        after = schedule.after_changes(block_number)  # after every scheduled change
        if add and subject in after:
            raise SystemContractRevert(f"{_hex(subject)} is a validator already (or its "
                                       "addition is scheduled)")
        if not add and subject not in after:
            raise SystemContractRevert(f"{_hex(subject)} is not a validator (or its removal "
                                       "is scheduled)")
        if not add:
            self._check_floor(subject, len(after) - 1)
        lists = _Lists(storage)
        recorded_mine = lists.of(sender)
        mine = self._live(recorded_mine, block_number, schedule)
        others = [v for v in mine if v.subject != subject]
        if len(others) >= len(validators):  # n live votes per voter: n*n in all
            raise SystemContractRevert(f"{_hex(sender)} has {len(others)} live votes, as many "
                                       "as there are validators: retract one first")
        cast = Vote(sender, subject, add, block_number)
        recorded = lists.about(subject)
        about = _in_place(self._live(recorded, block_number, schedule), cast,
                          lambda v: v.voter == sender)
        if len({v.voter for v in about if v.add == add}) >= _threshold(validators):
            changed = (*after, subject) if add else tuple(v for v in after if v != subject)
            if schedule.knows(changed, block_number):
                # the schedule takes the same set passing in the same block for a replay of
                # the change it knows (a restart's): recorded, it would never take effect.
                # (One an override of genesis voids is recorded all the same: a block below
                # an override executes as it did before the override was written.)
                raise SystemContractRevert(
                    f"this change makes the set that was scheduled already in block "
                    f"{block_number}: one change to a set per block")
            _record_change(storage, Change(changed, block_number))
            self._drop_subject(lists, subject, recorded, sender)
            lists.put_of(sender, others)
        else:
            lists.put_about(subject, about)
            lists.put_of(sender, _in_place(mine, cast, lambda v: v.subject == subject))
        # a dead vote of the sender's about `subject` is out of that list already
        self._drop_dead(lists, [v for v in recorded_mine if v.subject != subject], mine,
                        block_number, schedule)
        return b""

    def _retract(self, storage: ContractStorage, sender: bytes, args: bytes,
                 block_number: int) -> bytes:
        subject_word, epoch = _arguments(RETRACT_SIGNATURE, args, ("address", "uint64"))
        subject = _address(subject_word)
        schedule = self.schedule_in(storage, block_number)
        self._check_voter(schedule, sender, epoch, block_number)
        lists = _Lists(storage)
        recorded_mine = lists.of(sender)
        mine = self._live(recorded_mine, block_number, schedule)
        kept = [v for v in mine if v.subject != subject]
        if len(kept) == len(mine):
            raise SystemContractRevert(f"{_hex(sender)} has no live vote about "
                                       f"{_hex(subject)} to retract")
        lists.put_about(subject, [v for v in self._live(lists.about(subject), block_number,
                                                        schedule) if v.voter != sender])
        lists.put_of(sender, kept)
        self._drop_dead(lists, recorded_mine, mine, block_number, schedule)
        return b""

    @staticmethod
    def _drop_subject(lists: _Lists, subject: bytes, recorded: Sequence[Vote],
                      sender: bytes) -> None:
        """A change about `subject` passed: its votes are dropped from its list and from
        their voters' (the sender's list is the caller's); at most one list per voter."""
        lists.put_about(subject, [])
        for voter in (v.voter for v in recorded if v.voter != sender):
            lists.put_of(voter, [v for v in lists.of(voter) if v.subject != subject])

    def _drop_dead(self, lists: _Lists, recorded: Sequence[Vote], live: Sequence[Vote],
                   block_number: int, schedule: EpochSchedule) -> None:
        """The dead votes of a voter's list as `recorded` (its list, just written, dropped
        them) out of their subjects' lists too, with those lists' other dead votes, so no
        dead vote stays in storage for good; each vote is dropped once (amortized, one
        list per vote cast)."""
        for dead in (v for v in recorded if v not in live):
            lists.put_about(dead.subject, [
                v for v in self._live(lists.about(dead.subject), block_number, schedule)
                if v.voter != dead.voter])

    def _live(self, votes: Sequence[Vote], block_number: int,
              schedule: EpochSchedule) -> list[Vote]:
        return [v for v in votes if self.counts(v, block_number, schedule)]

    def _get_validators(self, storage: ContractStorage, sender: bytes, args: bytes,
                        block_number: int) -> bytes:
        _arguments(GET_VALIDATORS_SIGNATURE, args, ())
        validators = self.schedule_in(storage, block_number).set_at(block_number)
        return (_word(WORD) + _word(len(validators))
                + b"".join(bytes(WORD - ADDRESS_SIZE) + v for v in validators))

    def _epoch(self, storage: ContractStorage, sender: bytes, args: bytes,
               block_number: int) -> bytes:
        _arguments(EPOCH_SIGNATURE, args, ())
        return _word(self.schedule_in(storage, block_number).epoch_at(block_number).number)

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
