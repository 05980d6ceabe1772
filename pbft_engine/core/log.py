"""What a replica keeps of the protocol: its message log and its checkpoints (Castro & Liskov,
sections 4.2 to 4.4), in memory, each change written through one `StoreWriter`.

After etcd's `raftLog` and sawtooth-pbft's `PbftLog`: the replica (`core.replica`) decides,
these keep. Each write to memory and its store operation are made in one place, and so is each
garbage collection (`MessageLog.truncate` at the low watermark, `truncate_view_change_sets`
and `CheckpointTracker.stabilize` at the stable checkpoint), so what is in memory and what a
restart reads back cannot drift apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import rlp

from encoding.rlp import encode_uint
from pbft_engine.core.epochs import Membership
from pbft_engine.core.records import (
    VIEW_MESSAGE_SEQ_NO,
    Delete,
    DeleteRange,
    Put,
    RecordReader,
    StoreName,
    StoreOp,
    cert_key,
    read_u64,
    signed_key,
    u16,
    u64,
    up_to,
)
from pbft_engine.errors import StoreError
from pbft_engine.messages import (
    Body,
    Checkpoint,
    Commit,
    MessageType,
    PhaseMessage,
    Prepare,
    PreparedProof,
    PrePrepare,
    PrePreparedEntry,
    Signed,
    WireMessage,
    decode_commit_certificate,
    decode_signed_bytes,
    signed_as,
)

V = TypeVar("V", Prepare, Commit)  # a vote
FutureKey = tuple[int, int, int]  # (replica, type, seqNo)


def hold_future(future: dict[FutureKey, WireMessage[PhaseMessage]],
                wire: WireMessage[PhaseMessage], block_bytes: int) -> int:
    """Keep a message for a view not yet entered (or a seqNo beyond the pipeline, or above
    a handover checkpoint not yet stable) in `future`, bounded: one per replica, type and
    seqNo, and blocks (only a PRE-PREPARE carries one) of at most `block_bytes` in all: the
    heaviest sender loses its highest seqNo first, so a flood costs the flooder its own and
    cannot push out an honest primary's lowest, the one needed first, by making that
    primary the heaviest (as the join buffer's rule, `joining`, whose doc says what it
    keeps). Returns how many were dropped."""
    body = wire.signed.body
    key = (body.replica, body.TYPE, body.seq_no)
    held = future.get(key)
    if held is not None and held.signed.body.view >= body.view:
        return 0  # the first copy stays: a relay sent after it must not replace its block
    future.pop(key, None)
    future[key] = wire  # the newest
    if not wire.blocks:
        return 0
    # The other steps that shrink `future` replace it: its bytes are summed here.
    senders: Counter[int] = Counter()
    for message in future.values():
        senders[message.signed.body.replica] += sum(map(len, message.blocks))
    dropped = 0
    while senders.total() > block_bytes:
        [(heaviest, _)] = senders.most_common(1)
        highest = max((k for k, m in future.items() if m.blocks and k[0] == heaviest),
                      key=lambda k: k[2])
        senders[heaviest] -= len(future.pop(highest).blocks[0])
        dropped += 1
    return dropped


class StoreWriter:
    """The store operations of one step, in the order they were made (the step's `Persist`)."""

    def __init__(self) -> None:
        self.ops: list[StoreOp] = []

    def put(self, store: StoreName, key: bytes, value: bytes) -> None:
        self.ops.append(Put(store, key, value))

    def delete(self, store: StoreName, key: bytes) -> None:
        self.ops.append(Delete(store, key))

    def delete_range(self, store: StoreName, start: bytes | None, stop: bytes | None) -> None:
        self.ops.append(DeleteRange(store, start, stop))

    def take(self) -> list[StoreOp]:
        ops, self.ops = self.ops, []
        return ops


@dataclass
class Slot:
    """certStore entry for one (view, seqNo)."""

    pre_prepare: Signed[PrePrepare] | None = None
    prepares: dict[int, Signed[Prepare]] = field(default_factory=dict)
    commits: dict[int, Signed[Commit]] = field(default_factory=dict)
    validated: bool = False
    validating: bool = False
    # Refused here as the proposer's fault, or given up on (no answer by its deadline): this
    # replica never votes for it, nor validates anything on it, in this view.
    refused: bool = False
    timed_out: bool = False  # a validation here went unanswered by its deadline (once)
    # The block it was validated (or built) on: its parent's digest (None: restored, unknown).
    parent: bytes | None = None

    @property
    def digest(self) -> bytes | None:
        return self.pre_prepare.body.digest if self.pre_prepare else None

    def matching(self, votes: dict[int, Any], exclude: int | None = None) -> list[Any]:
        return sorted(
            (m for r, m in votes.items() if r != exclude and m.body.digest == self.digest),
            key=lambda m: m.body.replica,
        )


class MessageLog:
    """The certStore's slots, the blocks (the current view's pre-prepared ones and every copy
    not yet committed), the P and Q sets a VIEW-CHANGE reports, the commit certificates and
    what this replica signed."""

    def __init__(self, membership: Membership, address: bytes, writer: StoreWriter) -> None:
        self.membership = membership
        self.address = address  # this replica's: its index is its place in each epoch's set
        self.writer = writer
        self.certs: dict[tuple[int, int], Slot] = {}  # certStore, by (view, seqNo)
        self.block_store: dict[int, tuple[int, bytes, bytes]] = {}  # seqNo -> view, digest, block
        self.outstanding_blocks: dict[tuple[int, bytes], bytes] = {}
        self.pset: dict[int, PreparedProof] = {}
        self.qset: dict[tuple[int, bytes], int] = {}
        self.certified: dict[int, tuple[bytes, bytes]] = {}  # seqNo -> digest, certificate
        self.signed: dict[bytes, Signed[Body]] = {}  # signed_key -> what this replica signed

    def load(self, records: RecordReader, low_watermark: int) -> None:
        for key, value in records.items(StoreName.SIGNED):
            self.signed[key] = decode_signed_bytes(value)
        for _, value in records.items(StoreName.CERT_STORE):
            self._load_cert_message(decode_signed_bytes(value))
        for key, value in records.items(StoreName.BLOCK_STORE):
            view, digest, block = rlp.decode(value)
            self.block_store[read_u64(key)] = (int.from_bytes(view, "big"), digest, block)
        for key, value in records.items(StoreName.OUTSTANDING_BLOCKS):
            self.outstanding_blocks[(read_u64(key), key[8:])] = value
        for key, value in records.items(StoreName.PSET):
            self.pset[read_u64(key)] = PreparedProof.from_fields(rlp.decode(value))
        for key, value in records.items(StoreName.QSET):
            self.qset[(read_u64(key), key[8:])] = int.from_bytes(rlp.decode(value), "big")
        for key, value in records.items(StoreName.COMMIT_CERTIFICATES, up_to(low_watermark)):
            digest = decode_commit_certificate(value)[0].body.digest
            self.certified[read_u64(key)] = (digest, value)

    def _load_cert_message(self, message: Signed[Body]) -> None:
        """A PRE-PREPARE, PREPARE or COMMIT of the certStore back into its slot."""
        body = message.body
        if not isinstance(body, PhaseMessage):
            raise StoreError(f"the certStore holds a {body.TYPE.name}")
        slot = self.slot(body.view, body.seq_no)
        own = body.replica == self.membership.index_at(body.seq_no, self.address)
        if (pre_prepare := signed_as(message, PrePrepare)) is not None:
            slot.pre_prepare = pre_prepare
            slot.validated = own
        elif (prepare := signed_as(message, Prepare)) is not None:
            slot.prepares[body.replica] = prepare
            slot.validated |= own
        elif (commit := signed_as(message, Commit)) is not None:
            slot.commits[body.replica] = commit
            slot.validated |= own

    # --- the certStore ----------------------------------------------------------------

    def slot(self, view: int, seq_no: int) -> Slot:
        return self.certs.setdefault((view, seq_no), Slot())

    def accept_pre_prepare(self, pre_prepare: Signed[PrePrepare], block: bytes | None) -> None:
        """Into its slot, its block (if a copy came that matches) into the blockStore, and
        its (seqNo, digest) into Q at this view."""
        body = pre_prepare.body
        self.slot(body.view, body.seq_no).pre_prepare = pre_prepare
        self._put_cert_message(pre_prepare)
        if block is not None:
            self.store_block(body.view, body.seq_no, body.digest, block)
        qkey = (body.seq_no, body.digest)
        if self.qset.get(qkey, -1) < body.view:
            self.qset[qkey] = body.view
            self.writer.put(StoreName.QSET, u64(body.seq_no) + body.digest,
                            rlp.encode(encode_uint(body.view)))

    def add_vote(self, vote: Signed[V], votes: dict[int, Signed[V]]) -> None:
        """A PREPARE or COMMIT into its slot's `votes` (prepares or commits)."""
        votes[vote.body.replica] = vote
        self._put_cert_message(vote)

    def _put_cert_message(self, message: Signed[PrePrepare] | Signed[Prepare] | Signed[Commit]
                          ) -> None:
        body = message.body
        self.writer.put(StoreName.CERT_STORE,
                        cert_key(body.seq_no, body.view, body.TYPE, body.replica),
                        message.encode())

    def add_prepared(self, proof: PreparedProof) -> None:
        """P: the prepared certificate of the highest view at its seqNo."""
        self.pset[proof.seq_no] = proof
        self.writer.put(StoreName.PSET, u64(proof.seq_no), rlp.encode(proof.fields()))

    def prepared_above(self, seq_no: int) -> tuple[PreparedProof, ...]:
        return tuple(self.pset[n] for n in sorted(self.pset) if n > seq_no)

    def pre_prepared_above(self, seq_no: int) -> tuple[PrePreparedEntry, ...]:
        return tuple(PrePreparedEntry(n, d, v) for (n, d), v in sorted(self.qset.items())
                     if n > seq_no)

    def certify(self, seq_no: int, digest: bytes, certificate: bytes) -> None:
        """A commit certificate, kept for good (catch-up serves it with the block)."""
        self.certified[seq_no] = (digest, certificate)
        self.writer.put(StoreName.COMMIT_CERTIFICATES, u64(seq_no), certificate)

    # --- blocks -----------------------------------------------------------------------

    def block_for(self, seq_no: int, digest: bytes) -> bytes | None:
        stored = self.block_store.get(seq_no)
        if stored is not None and stored[1] == digest:
            return stored[2]
        return self.outstanding_blocks.get((seq_no, digest))

    def store_block(self, view: int, seq_no: int, digest: bytes, block: bytes) -> None:
        self.block_store[seq_no] = (view, digest, block)
        self.writer.put(StoreName.BLOCK_STORE, u64(seq_no),
                        rlp.encode([encode_uint(view), digest, block]))
        self.keep_outstanding(seq_no, digest, block)

    def keep_outstanding(self, seq_no: int, digest: bytes, block: bytes) -> None:
        """A copy held until its seqNo commits (a fetched body, or one of the blockStore)."""
        self.outstanding_blocks[(seq_no, digest)] = block
        self.writer.put(StoreName.OUTSTANDING_BLOCKS, u64(seq_no) + digest, block)

    def discard_block(self, seq_no: int, digest: bytes) -> None:
        """Forget a copy that proved false (blocks travel unsigned: a copy fetched from
        another peer may be the genuine one)."""
        if self.block_store.get(seq_no, (0, b""))[1] == digest:
            del self.block_store[seq_no]
            self.writer.delete(StoreName.BLOCK_STORE, u64(seq_no))
        if self.outstanding_blocks.pop((seq_no, digest), None) is not None:
            self.writer.delete(StoreName.OUTSTANDING_BLOCKS, u64(seq_no) + digest)

    def forget_outstanding(self, seq_no: int) -> None:
        """Block seqNo committed: no copy for it is outstanding any more."""
        self.outstanding_blocks = {k: v for k, v in self.outstanding_blocks.items()
                                   if k[0] != seq_no}
        self.writer.delete_range(StoreName.OUTSTANDING_BLOCKS, u64(seq_no), up_to(seq_no))

    def clear_block_store(self) -> None:
        """A new view: the blockStore only ever holds the current view's blocks."""
        self.block_store = {}
        self.writer.delete_range(StoreName.BLOCK_STORE, None, None)

    # --- what this replica signed -----------------------------------------------------

    def own(self, key: bytes) -> Signed[Body] | None:
        return self.signed.get(key)

    def record_own(self, key: bytes, signed: Signed[Body]) -> None:
        self.signed[key] = signed
        self.writer.put(StoreName.SIGNED, key, signed.encode())

    def forget_view_messages_below(self, view: int) -> None:
        """VIEW-CHANGE / NEW-VIEW this replica signed for views below `view` (just installed)."""
        self.signed = {k: s for k, s in self.signed.items()
                       if read_u64(k) != VIEW_MESSAGE_SEQ_NO or read_u64(k, 9) >= view}
        for message_type in (MessageType.VIEW_CHANGE, MessageType.NEW_VIEW):
            self.writer.delete_range(StoreName.SIGNED,
                                     signed_key(VIEW_MESSAGE_SEQ_NO, message_type, 0),
                                     signed_key(VIEW_MESSAGE_SEQ_NO, message_type, view))

    def forget_unproven(self, first: int, proven: Callable[[Signed[Body]], bool],
                        certifies: Callable[[int, bytes, bytes], bool],
                        prepared: Callable[[PreparedProof], bool] | None = None) -> None:
        """A validator-set change: the votes and commit certificates for heights from
        `first` on that do not verify with the set deciding them now go, in memory and on
        disk, and so do Q and P there (P only where `prepared` refuses it, if given: what an
        override carries, or a restore checks again) (`handover.forget_unproven`)."""
        for seq_no, (digest, certificate) in list(self.certified.items()):
            if seq_no >= first and not certifies(seq_no, digest, certificate):
                del self.certified[seq_no]
                self.writer.delete(StoreName.COMMIT_CERTIFICATES, u64(seq_no))
        for (_, seq_no), slot in self.certs.items():
            if seq_no < first:
                continue
            if slot.pre_prepare is not None and not proven(slot.pre_prepare):
                self._forget_cert_message(slot.pre_prepare)
                slot.pre_prepare, slot.validated = None, False
            for votes in (slot.prepares, slot.commits):
                for replica, vote in list(votes.items()):
                    if not proven(vote):
                        self._forget_cert_message(vote)
                        del votes[replica]
        for seq_no, proof in list(self.pset.items()):
            if seq_no >= first and (prepared is None or not prepared(proof)):
                del self.pset[seq_no]
                self.writer.delete(StoreName.PSET, u64(seq_no))
        if prepared is None:  # (Q is no proof of anything: a restore keeps it)
            self.qset = {k: v for k, v in self.qset.items() if k[0] < first}
            self.writer.delete_range(StoreName.QSET, u64(first), None)

    def _forget_cert_message(self, message: Signed[Any]) -> None:
        body = message.body
        self.writer.delete(StoreName.CERT_STORE,
                           cert_key(body.seq_no, body.view, body.TYPE, body.replica))

    # --- garbage collection (4.3) -----------------------------------------------------

    def truncate(self, low_watermark: int) -> None:
        """moveWatermarks: forget the log at and below h, in memory and on disk. P and Q follow
        the stable checkpoint instead (`truncate_view_change_sets`), so a VIEW-CHANGE can
        always prove everything above its checkpoint."""
        h = low_watermark
        self.certs = {k: s for k, s in self.certs.items() if k[1] > h}
        self.block_store = {n: b for n, b in self.block_store.items() if n > h}
        self.outstanding_blocks = {k: b for k, b in self.outstanding_blocks.items() if k[0] > h}
        self.certified = {n: c for n, c in self.certified.items() if n > h}
        self.signed = {k: s for k, s in self.signed.items() if read_u64(k) > h}
        for store in (StoreName.CERT_STORE, StoreName.BLOCK_STORE,
                      StoreName.OUTSTANDING_BLOCKS, StoreName.SIGNED):
            self.writer.delete_range(store, None, up_to(h))

    def truncate_view_change_sets(self, stable_checkpoint: int) -> None:
        self.pset = {n: p for n, p in self.pset.items() if n > stable_checkpoint}
        self.qset = {k: v for k, v in self.qset.items() if k[0] > stable_checkpoint}
        for store in (StoreName.PSET, StoreName.QSET):
            self.writer.delete_range(store, None, up_to(stable_checkpoint))


class CheckpointTracker:
    """CHECKPOINT messages (4.3): those inside the window by seqNo and replica, the latest one
    above it from each replica, and the proof of each checkpoint that became stable. Each
    checkpoint is counted with the f and Q of its own height's epoch: the checkpoint at a
    handover is the old set's, and so is this replica's own there (its index in that set)."""

    def __init__(self, membership: Membership, address: bytes, writer: StoreWriter) -> None:
        self.membership = membership
        self.address = address
        self.writer = writer
        self.votes: dict[int, dict[int, Signed[Checkpoint]]] = {}  # seqNo -> replica -> it
        self.above_window: dict[int, Signed[Checkpoint]] = {}  # replica -> its latest above H

    def load(self, records: RecordReader) -> None:
        for _, value in records.items(StoreName.CHECKPOINTS):
            checkpoint = decode_signed_bytes(value, Checkpoint)
            self.votes.setdefault(checkpoint.body.seq_no, {})[checkpoint.body.replica] = (
                checkpoint)

    def forget_unproven(self, first: int, proven: Callable[[Signed[Body]], bool]) -> None:
        """A validator-set change: the CHECKPOINTs from `first` on that do not verify with
        the set deciding them now go (`handover.forget_unproven`)."""
        for seq_no, votes in self.votes.items():
            for replica, checkpoint in list(votes.items()):
                if seq_no >= first and not proven(checkpoint):
                    del votes[replica]
                    self.writer.delete(StoreName.CHECKPOINTS, u64(seq_no) + u16(replica))
        self.above_window = {r: c for r, c in self.above_window.items()
                             if c.body.seq_no < first or proven(c)}

    def held(self, seq_no: int, replica: int) -> Signed[Checkpoint] | None:
        return self.votes.get(seq_no, {}).get(replica)

    def add(self, checkpoint: Signed[Checkpoint]) -> None:
        body = checkpoint.body
        self.votes.setdefault(body.seq_no, {})[body.replica] = checkpoint
        self.writer.put(StoreName.CHECKPOINTS, u64(body.seq_no) + u16(body.replica),
                        checkpoint.encode())

    def conflicting(self, seq_no: int) -> bool:
        """f+1 replicas vouch for a value other than ours, or for two values: this replica or
        the cluster executed a different chain."""
        votes = self.votes[seq_no]
        own = self._own(seq_no, votes)
        heavy = {value for value, count in Counter(c.body.value for c in votes.values()).items()
                 if count >= self.membership.schedule.epoch_at(seq_no).weak_quorum}
        return bool(own is not None and heavy - {own.body.value}) or len(heavy) > 1

    def stable(self, seq_no: int) -> bool:
        """Q replicas, this one included, sent the same CHECKPOINT for seq_no."""
        votes = self.votes[seq_no]
        own = self._own(seq_no, votes)
        matching = sum(c.body.value == own.body.value for c in votes.values()) if own else 0
        return matching >= self.membership.schedule.quorum_at(seq_no)

    def _own(self, seq_no: int, votes: dict[int, Signed[Checkpoint]]
             ) -> Signed[Checkpoint] | None:
        index = self.membership.index_at(seq_no, self.address)
        return None if index is None else votes.get(index)

    def mine(self, seq_no: int) -> Signed[Checkpoint] | None:
        """This replica's CHECKPOINT at seq_no, if held."""
        return self._own(seq_no, self.votes.get(seq_no, {}))

    def short_of_proof(self, seq_no: int) -> bool:
        """Fewer than Q matching CHECKPOINTs held for seq_no (a replica that joined there),
        which is not stable by the genesis file (an override's block before it)."""
        return (len(self.proof(seq_no)) < self.membership.quorum_at(seq_no)
                and not self.membership.schedule.stable_by_genesis(seq_no))

    def proof(self, seq_no: int) -> tuple[Signed[Checkpoint], ...]:
        """C: the matching CHECKPOINTs of the most vouched-for value at seq_no."""
        votes = self.votes.get(seq_no, {})
        if not votes:
            return ()
        value, _ = Counter(c.body.value for c in votes.values()).most_common(1)[0]
        return tuple(c for _, c in sorted(votes.items()) if c.body.value == value)

    def stabilize(self, seq_no: int) -> None:
        """seq_no is the stable checkpoint: keep its proof for good, forget those below."""
        proof = self.proof(seq_no)
        self.writer.put(StoreName.STABLE_CHECKPOINTS, u64(seq_no),
                        rlp.encode([c.encode() for c in proof]))
        keep = self.votes.get(seq_no, {})
        self.votes = {n: v for n, v in self.votes.items() if n > seq_no}
        self.votes[seq_no] = keep
        self.writer.delete_range(StoreName.CHECKPOINTS, None, u64(seq_no))

    def adopt(self, seq_no: int, proof: tuple[Signed[Checkpoint], ...]) -> None:
        """A NEW-VIEW's V proves seq_no stable with these CHECKPOINTs: hold them as ours."""
        for checkpoint in proof:
            self.votes.setdefault(seq_no, {})[checkpoint.body.replica] = checkpoint
            self.writer.put(StoreName.CHECKPOINTS, u64(seq_no) + u16(checkpoint.body.replica),
                            checkpoint.encode())

    def note_above_window(self, checkpoint: Signed[Checkpoint]) -> None:
        """Checkpoints above H are kept one per replica (bounded): the latest."""
        held = self.above_window.get(checkpoint.body.replica)
        if held is None or held.body.seq_no < checkpoint.body.seq_no:
            self.above_window[checkpoint.body.replica] = checkpoint

    def take_inside(self, high_watermark: int) -> list[Signed[Checkpoint]]:
        """Those above the old window that the moved window now holds, by seqNo."""
        due = sorted((c for c in self.above_window.values() if c.body.seq_no <= high_watermark),
                     key=lambda c: c.body.seq_no)
        for checkpoint in due:
            del self.above_window[checkpoint.body.replica]
        return due

    def vouched_above(self, seq_no: int) -> tuple[int, bytes, bytes] | None:
        """The highest (seqNo, block hash, state root) above seq_no that f+1 other replicas
        vouch for, in the window or above it: a correct replica executed that far."""
        held = [c for votes in self.votes.values() for c in votes.values()]
        return self._weak_top([c for c in [*held, *self.above_window.values()]
                               if c.body.seq_no > seq_no
                               and self.membership.address_of(c.body) != self.address])

    def ahead(self) -> tuple[int, bytes, bytes] | None:
        """(seqNo, block hash, state root) that f+1 replicas vouch for above the window: this
        replica fell behind (at least one correct replica is there)."""
        return self._weak_top(list(self.above_window.values()))

    def _weak_top(self, checkpoints: list[Signed[Checkpoint]]) -> tuple[int, bytes, bytes] | None:
        tally = Counter((c.body.seq_no, c.body.value) for c in checkpoints)
        schedule = self.membership.schedule
        weak = [key for key, count in tally.items()
                if count >= schedule.epoch_at(key[0]).weak_quorum]
        if not weak:
            return None
        seq_no, (block_hash, state_root) = max(weak)
        return seq_no, block_hash, state_root
