"""The epoch schedule: which validator set decides which height (DESIGN.md section 10).

An epoch is a first height and an ordered validator set; the genesis set is epoch 0 and
decides from block 1. A change that passes in committed block b takes effect after the
handover checkpoint c, the first multiple of K with c >= b + max_in_flight: blocks up to c
are decided by the old set, blocks after c by the new one. While a change waits, the high
watermark stops at c; the checkpoint at c, stable with a quorum of the OLD set, installs the
new epoch. Views stay monotonic across epochs: the primary of view v in epoch e is
V_e[v mod n_e].

`EpochSchedule` holds these rules as immutable values (a change returns a new schedule), so
the replica, catch-up and the adapter consult one answer for "the set of height n" and a
message is only ever counted with the set, f and quorum of its own height's epoch: the
anchors' recurring bug is counting a certificate with the current set's quorum for a height
of another epoch (`research/membership.md`, section 1 item 3: Sawtooth PBFT's e7da88d,
polygon-edge#1127). `Membership` is the replica's handle on it: the schedule in force here
and the authenticator of each epoch's set. Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from pbft_engine.core.params import ADDRESS_SIZE, EngineParams
from pbft_engine.errors import ConfigError
from pbft_engine.messages import (
    Authenticator,
    B,
    Body,
    Checkpoint,
    MessageLimits,
    NewView,
    PhaseMessage,
    PreparedProof,
    Signed,
    Signer,
    Verifier,
    ViewChange,
    verify_commit_certificate,
)
from pbft_engine.quorum import max_faulty, quorum, view_change_quorum, weak_quorum

GENESIS_FIRST_HEIGHT = 1  # block 0 is genesis: nobody decides it


@dataclass(frozen=True)
class Epoch:
    """Epoch `number`: `validators` (in order: replica i is validators[i]) decide the heights
    from `first` up to the next epoch's first height minus one (its handover checkpoint)."""

    number: int
    first: int
    validators: tuple[bytes, ...]
    passed_at: int | None = None  # the committed block in which the change passed (genesis: None)
    # From genesis `config.pbft.transitions`: takes over at `first` without a vote or a
    # handover certificate (first - 1 is stable by the genesis file, as block 0 is).
    override: bool = False

    def __post_init__(self) -> None:
        if not self.validators:
            raise ConfigError(f"epoch {self.number}: a validator set needs at least one address")
        if any(len(v) != ADDRESS_SIZE for v in self.validators):
            raise ConfigError(f"epoch {self.number}: validators must be 20-byte addresses")
        if len(set(self.validators)) != len(self.validators):
            raise ConfigError(f"epoch {self.number}: the validator set lists an address twice")

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
    def view_change_quorum(self) -> int:
        return view_change_quorum(self.n)

    @property
    def weak_quorum(self) -> int:
        return weak_quorum(self.n)

    def primary(self, view: int) -> int:
        """The replica index of view v's primary in this epoch: V_e[v mod n_e]."""
        return view % self.n

    def index(self, address: bytes) -> int | None:
        """The replica index of `address` in this epoch's set; None if it is no member."""
        return self.validators.index(address) if address in self.validators else None


def handover_checkpoint(passed_at: int, checkpoint_interval: int, max_in_flight: int) -> int:
    """c = the first multiple of K with c >= b + max_in_flight: every block that may have been
    in flight when b committed (up to b + max_in_flight - 1) is decided by the old set."""
    k = checkpoint_interval
    return -(-(passed_at + max_in_flight) // k) * k


@dataclass(frozen=True)
class EpochSchedule:
    """Every epoch known here, in order of first height, and how many of them are installed
    (their handover checkpoint stable here): the later ones are scheduled."""

    checkpoint_interval: int  # K
    max_in_flight: int
    epochs: tuple[Epoch, ...]
    installed: int = 0  # the number of the newest installed epoch

    def __post_init__(self) -> None:
        firsts = [e.first for e in self.epochs]
        if not self.epochs or firsts[0] != GENESIS_FIRST_HEIGHT:
            raise ConfigError("an epoch schedule starts with the genesis set at block 1")
        if firsts != sorted(set(firsts)) or any(
                e.number != i for i, e in enumerate(self.epochs)):
            raise ConfigError("epochs must be numbered 0, 1, ... by increasing first height")
        if not 0 <= self.installed < len(self.epochs):
            raise ConfigError(f"installed epoch {self.installed} is not in the schedule")

    @classmethod
    def genesis(cls, params: EngineParams) -> EpochSchedule:
        """The genesis set as epoch 0, then the overrides of `config.pbft.transitions`
        (scheduled from the start; nothing else is)."""
        overrides = (Epoch(i, first, validators, override=True)
                     for i, (first, validators) in enumerate(params.transitions, 1))
        return cls(params.checkpoint_interval, params.max_in_flight,
                   (Epoch(0, GENESIS_FIRST_HEIGHT, params.validators), *overrides))

    @cached_property
    def _firsts(self) -> tuple[int, ...]:
        return tuple(e.first for e in self.epochs)

    # --- which set decides which height ---------------------------------------------------

    def epoch_at(self, height: int) -> Epoch:
        """The epoch whose set decides `height` (genesis and below: epoch 0)."""
        return self.epochs[max(0, bisect.bisect_right(self._firsts, height) - 1)]

    def set_at(self, height: int) -> tuple[bytes, ...]:
        return self.epoch_at(height).validators

    def quorum_at(self, height: int) -> int:
        return self.epoch_at(height).quorum

    def f_at(self, height: int) -> int:
        return self.epoch_at(height).f

    def primary(self, view: int, height: int) -> int:
        """The replica index, in the set of `height`'s epoch, of view v's primary."""
        return self.epoch_at(height).primary(view)

    @property
    def current(self) -> Epoch:
        """The newest installed epoch: the set deciding the heights of the watermark window."""
        return self.epochs[self.installed]

    @property
    def largest_n(self) -> int:
        """The largest set known: what a peer's message may hold (a NEW-VIEW of N-f votes)."""
        return max(e.n for e in self.epochs)

    # --- what is scheduled, and the handover ----------------------------------------------

    @property
    def handover(self) -> int | None:
        """The checkpoint the first scheduled change waits for (None: nothing scheduled)."""
        if self.installed + 1 < len(self.epochs):
            return self.epochs[self.installed + 1].first - 1
        return None

    def high_watermark_cap(self) -> int | None:
        """H stops at the handover checkpoint while a change is scheduled: nothing above c is
        pre-prepared, prepared or committed until the checkpoint at c is stable."""
        return self.handover

    def _known_at(self, block: int) -> int:
        """How many epochs a change passing in `block` comes after: all but the overrides
        that take over above it (those stay last, whatever passes before them)."""
        count = len(self.epochs)
        while self.epochs[count - 1].override and self.epochs[count - 1].first > block:
            count -= 1
        return count

    def as_of(self, block: int) -> EpochSchedule:
        """This schedule without the overrides that start above `block` (they are last)."""
        return replace(self, epochs=self.epochs[:self._known_at(block)])

    def after_changes(self, block: int) -> tuple[bytes, ...]:
        """The set after every change known in `block`: what a change passing there
        changes (a later override aside)."""
        return self.epochs[self._known_at(block) - 1].validators

    def schedule(self, validators: Sequence[bytes], *, passed_at: int) -> EpochSchedule:
        """The schedule with a change to `validators` that passed in committed block
        `passed_at`; its handover checkpoint is its epoch's first height minus one. One
        change per epoch: a change that passes while another is scheduled takes effect at
        the first checkpoint after that one's (a FIFO queue, so every epoch spans at least K
        heights). A change that an override of genesis would take over from before it takes
        effect is void (returns this schedule). Any scheduled change fed again (a restart
        replaying the state) changes nothing."""
        change = tuple(validators)
        if self.knows(change, passed_at):
            return self
        voted = [e.passed_at for e in self.epochs if e.passed_at is not None]
        if voted and passed_at < voted[-1]:
            raise ConfigError(f"a change passed at {passed_at} comes after one that passed at "
                              f"{voted[-1]}")
        if passed_at < GENESIS_FIRST_HEIGHT:
            raise ConfigError(f"a change passes in a committed block, not at {passed_at}")
        known = self._known_at(passed_at)
        last, later = self.epochs[known - 1], self.epochs[known:]
        if change == last.validators:
            raise ConfigError("the change leaves the validator set as it is")
        c = max(handover_checkpoint(passed_at, self.checkpoint_interval, self.max_in_flight),
                self._interval_after(last))
        if later and later[0].first <= c + 1:
            return self  # the override takes over before it would
        epochs = (*self.epochs[:known], Epoch(known, c + 1, change, passed_at),
                  *(replace(e, number=e.number + 1) for e in later))
        return EpochSchedule(self.checkpoint_interval, self.max_in_flight, epochs,
                             self.installed)

    def knows(self, validators: Sequence[bytes], passed_at: int) -> bool:
        """A change to `validators` passing in `passed_at` is scheduled here already."""
        change = tuple(validators)
        return any((e.passed_at, e.validators) == (passed_at, change) for e in self.epochs)

    def horizon(self, head: int) -> int:
        """The highest height whose set the executed `head` fixes: a change passing above it
        takes effect after the first checkpoint c >= head + 1 + max_in_flight, and at least K
        after the last change known then (one change per epoch); an override from genesis is
        known from the start. A replica votes only up to here: a backup whose execution lags
        its certified blocks would otherwise vote on a height above a handover it has not
        learnt of yet, in the old epoch (the attack review of the epoch on the wire,
        findings 1 and 2)."""
        k, last = self.checkpoint_interval, self.epochs[self._known_at(head + 1) - 1]
        return max(-(-(head + 1 + self.max_in_flight) // k) * k, self._interval_after(last))

    def _interval_after(self, epoch: Epoch) -> int:
        """The first checkpoint a whole interval K after `epoch`'s first height: the
        earliest handover of a change after it (one change per epoch). A multiple of K, so
        a CHECKPOINT is sent there (an override's first height - 1 need not be one; the
        carried blocks' attack review, finding 4)."""
        k = self.checkpoint_interval
        return -(-(epoch.first - 1 + k) // k) * k

    def stable_by_genesis(self, seq_no: int) -> bool:
        """Block 0, and the block before an override: stable without any CHECKPOINT."""
        following = self.epoch_at(seq_no + 1)
        return seq_no == 0 or (following.override and following.first == seq_no + 1)

    def install(self, stable_checkpoint: int) -> EpochSchedule:
        """What a stable checkpoint installs: every scheduled epoch whose handover checkpoint
        it is or passed (a checkpoint proved stable above c proves c's handover too). An
        override's block before it is stable by the genesis file once executed: pass the
        last executed block for those (`installed_by`)."""
        installed = self.epoch_at(stable_checkpoint + 1).number
        if installed <= self.installed:
            return self
        return EpochSchedule(self.checkpoint_interval, self.max_in_flight, self.epochs,
                             installed)

    def install_executed(self, last_executed: int) -> EpochSchedule:
        """What a block executed here installs: an epoch after c once a block above c is (a
        quorum of its set committed it), an override once the block before it is."""
        reached = max((e.first - 1 for e in self.epochs
                       if e.override and e.first - 1 <= last_executed), default=0)
        return self.install(max(last_executed - 1, reached))


def message_height(body: Body) -> int:
    """The height whose epoch a message belongs to: a vote's or checkpoint's seqNo; for a
    VIEW-CHANGE the first height above its stable checkpoint (the heights the next view
    decides: its checkpoint proof is of the epoch of that checkpoint, each prepared
    certificate of its own seqNo's); for a NEW-VIEW that of its highest VIEW-CHANGE (min-s)."""
    match body:
        case PhaseMessage() | Checkpoint():
            return body.seq_no
        case ViewChange():
            return body.stable_seq_no + 1
        case NewView():
            return max((vc.body.stable_seq_no for vc in body.view_changes), default=0) + 1
    raise TypeError(f"no height for a {type(body).__name__}")


class Membership:
    """The schedule in force at one replica (replaced as changes are scheduled and installed)
    and each epoch's authenticator: a signature counts only if its signer is in the set of
    the epoch of the height it is for, at the index it claims there."""

    def __init__(self, chain_id: int, schedule: EpochSchedule, verifier: Verifier) -> None:
        self.chain_id = chain_id
        self.schedule = schedule
        self.verifier = verifier
        self._authenticators: dict[Epoch, Authenticator] = {}

    @classmethod
    def of(cls, params: EngineParams, verifier: Verifier,
           schedule: EpochSchedule | None = None) -> Membership:
        """For a chain's parameters; without a schedule, the genesis set's."""
        return cls(params.chain_id, schedule or EpochSchedule.genesis(params), verifier)

    @property
    def current(self) -> Epoch:
        return self.schedule.current

    def primary(self, view: int, height: int) -> int:
        return self.schedule.primary(view, height)

    def quorum_at(self, height: int) -> int:
        return self.schedule.quorum_at(height)

    def epoch_number_at(self, height: int) -> int:
        """The number of the epoch of `height`: what a message for it names."""
        return self.schedule.epoch_at(height).number

    def auth_at(self, height: int) -> Authenticator:
        return self._auth(self.schedule.epoch_at(height))

    def _auth(self, epoch: Epoch) -> Authenticator:
        auth = self._authenticators.get(epoch)
        if auth is None:
            auth = Authenticator(self.chain_id, epoch.validators, self.verifier, epoch.number)
            self._authenticators[epoch] = auth
        return auth

    def index_at(self, height: int, address: bytes) -> int | None:
        """`address`'s replica index in the set of `height`'s epoch (None: no member)."""
        return self.schedule.epoch_at(height).index(address)

    def address_of(self, body: Body) -> bytes | None:
        """The member a message names as its sender: replica `body.replica` of the epoch of
        its height (None: no such index there). The same index names another member in
        another epoch, so a sender is recognised by this, never by its index alone."""
        validators = self.schedule.epoch_at(message_height(body)).validators
        return validators[body.replica] if body.replica < len(validators) else None

    def verify(self, signed: Signed[Body]) -> None:
        """The message names its height's epoch, and its signer is the member of that epoch's
        set it claims to be; raises MessageError (EpochMismatch: another epoch named)."""
        self.auth_at(message_height(signed.body)).verify(signed)

    def with_epoch(self, body: B) -> B:
        """`body` naming the epoch of its height, as every message this replica signs does."""
        return replace(body, epoch=self.epoch_number_at(message_height(body)))

    def sign(self, body: B, signer: Signer) -> Signed[B]:
        return self.auth_at(message_height(body)).sign(body, signer)

    def verify_checkpoint_proof(self, seq_no: int, proof: Sequence[Signed[Checkpoint]]
                                ) -> tuple[bytes, bytes] | None:
        """Q matching CHECKPOINTs of seq_no's epoch; none needed for a checkpoint stable by
        the genesis file (block 0, the block before an override: returns None)."""
        if not proof and self.schedule.stable_by_genesis(seq_no):
            return None
        return self.auth_at(seq_no).verify_checkpoint_proof(seq_no, proof)

    def verify_prepared_proof(self, proof: PreparedProof) -> None:
        """A VIEW-CHANGE's prepared certificate, counted with the set of its height's epoch;
        at an override's heights also with the epoch before it, which it names (what the
        old set prepared there before the override: `handover.stand_on_override`)."""
        epoch = self.schedule.epoch_at(proof.seq_no)
        named = proof.pre_prepare.body.epoch
        if epoch.override and named == epoch.number - 1 and (
                proof.seq_no < epoch.first + self.schedule.max_in_flight):
            # (only as far as the old primary could have proposed past T - 1: keys of the
            # gone validators, maybe stolen, forge nothing above; finding 2 of that review)
            epoch = self.schedule.epochs[named]
        self._auth(epoch).verify_prepared_proof(proof)

    def verify_certificate(self, certificate: bytes, height: int, block_hash: bytes) -> None:
        """Q of the set of `height`'s epoch committed this block; raises MessageError."""
        epoch = self.schedule.epoch_at(height)
        verify_commit_certificate(certificate, validators=epoch.validators, epoch=epoch.number,
                                  chain_id=self.chain_id, block_number=height,
                                  block_hash=block_hash, verifier=self.verifier)

    def limits(self, log_size: int) -> MessageLimits:
        return MessageLimits(self.schedule.largest_n, log_size)
