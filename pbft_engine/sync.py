"""Catch-up: fetch committed blocks with their commit certificates from peers (block sync).

The core decides *that* a replica fell behind (`FetchCommitted`); this module carries it out
over the transport's block-sync channel and answers with `FetchCompleted` or `FetchFailed`.
Every fetched block is accepted only with a commit certificate of Q distinct validators over
its hash (`verify_commit_certificate`), then executed like any other block, and imported in
one batch with that certificate. The link is authenticated by the transport; the data is not
trusted: a lying peer can waste a request, never make us import a block.

It also serves peers: STATUS (our head, its certificate and the NEW-VIEW we are in), ranges
of certified blocks, and single blocks by digest. A replica that makes no progress asks its
peers for STATUS every poll interval, so a node that missed blocks on a quiet chain, or
started empty, still catches up (`PeerCommitted`), and a replica left in an old view learns
the NEW-VIEW it missed. VIEW-CHANGE and NEW-VIEW name blocks by digest only: a replica that
lacks a body asks every peer for it (`FetchBlock`), again each poll interval, until a copy
whose header hashes to the digest arrives (`BlockReceived`).

Observers (`pbft_engine.observer`) follow through this module alone. A validator asks only
validators and believes only their answers; it serves anyone the transport let in, and after
each commit it pushes the block with its certificate to the observers connected to it
(COMMITTED, encoded once for all of them), so they import it without asking back; when the
replica no longer holds the body it announces a STATUS with the certificate instead, and they
fetch it. An observer asks every peer (each answer is verified all the same) and hears the
validators' announcements, checking a certificate only for a head above what it already knows;
what it does with a pushed block is its own (`Observer`).

The messages and their encoding: `pbft_engine.sync_messages`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from functools import partial

import rlp
from eth_utils import keccak
from rlp.codec import consume_length_prefix

from chain.blockchain import ExecutedBlock, block_hash_of, check_body_matches_header
from chain.engine import EngineContext, TimerHandle
from chain.errors import BlockValidationError, FalseBodyError, StaleParentError
from encoding.rlp import check_rlp_bounds
from pbft_engine.core import (
    BlockReceived,
    Event,
    FetchCompleted,
    FetchFailed,
    FetchProgressed,
    MessageReceived,
    PeerCommitted,
    Put,
    ReplicaStatus,
    StoreName,
)
from pbft_engine.core.epochs import Epoch
from pbft_engine.core.params import FETCH_ANSWER_WAIT_MS
from pbft_engine.core.records import META_NEW_VIEW, u64
from pbft_engine.epoch_feed import EpochFeed
from pbft_engine.errors import MessageError, PbftError
from pbft_engine.messages import (
    NewView,
    WireMessage,
    decode_signed_bytes,
    verify_commit_certificate,
)
from pbft_engine.record_store import LevelDBConsensusStore
from pbft_engine.sync_messages import (
    MAX_BLOCKS_PER_REQUEST,
    Block,
    Blocks,
    Committed,
    GetBlock,
    GetBlocks,
    GetStatus,
    Status,
    decode_sync,
    encode_sync,
)
from pbft_engine.tasks import BackgroundTasks
from storage import WriteBatch

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 8 * 1024 * 1024  # below the transport's frame cap
REQUEST_TIMEOUT_S = FETCH_ANSWER_WAIT_MS / 1000  # (the core judges a fetch by it)
# A range asked of a peer that has not answered this long is asked of the next peer too
# (the first answer that verifies wins), and once every peer was asked, those that had no
# such block are asked once more: a byzantine peer that holds a request for
# REQUEST_TIMEOUT_S costs a fetch about this much, not 10 s, so that the replica, which
# excuses its request timeouts only while its fetch progresses (`catch_up.stalled`), keeps
# excusing an honest one. The engine gives half its request timeout.
HEDGE_AFTER_S = 1.0
MAX_WANTED_BLOCKS = 256  # bodies asked for at once (a window holds fewer)
# A block larger than this is announced (STATUS), not pushed: a push goes to every observer.
MAX_PUSHED_BYTES = MAX_RESPONSE_BYTES
HEADER_NUMBER_INDEX = 8  # an Ethereum header's fields: ..., difficulty, number, ...
HEADER_ITEMS = 32  # the header list and its fields (21 since Prague), with room


class SyncError(PbftError):
    """A peer could not serve a range, or served something that does not verify."""


class NoSuchBlock(SyncError):
    """A peer answered that it holds no block at the start of a range (it may be executing
    the cluster's newest one: it is asked once more, `BlockSync._fetch_range`)."""


class PeerLied(SyncError):
    """A peer served what it cannot have honestly: a false certificate or a certified block
    whose body is not the certified one. It is blamed (`on_peer_fault`, with `kind`, one of
    `pbft_engine.metrics.PEER_FAULT_KINDS`) and asked last."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def encoded_header(block: bytes) -> bytes:
    """The header's bytes in an encoded block, its length prefixes read and the rest not
    decoded (on the loop: the body can be megabytes of items, checked off the loop by
    `check_body_matches_header`). ValueError if it holds no header list."""
    _, kind, _, start = consume_length_prefix(block, 0)
    _, header_kind, length, header_start = consume_length_prefix(block, start)
    if kind is not list or header_kind is not list or header_start + length > len(block):
        raise ValueError("not a block")
    header = block[start:header_start + length]
    check_rlp_bounds(header, max_depth=1, max_items=HEADER_ITEMS, max_list_items=HEADER_ITEMS)
    return header


def certified_block_hash(
    block: bytes, certificate: bytes, *, number: int, epoch: Epoch, chain_id: int,
) -> bytes:
    """The hash of `block` if it is block `number` and `certificate` certifies it (Q of
    `epoch`'s set, the epoch deciding `number`)."""
    try:
        header = rlp.decode(encoded_header(block), strict=True)
        claimed = int.from_bytes(header[HEADER_NUMBER_INDEX], "big")
        block_hash = keccak(rlp.encode(header))
    except (rlp.exceptions.RLPException, IndexError, TypeError, ValueError, RecursionError):
        raise PeerLied("undecodable", f"block {number} is not an encoded block") from None
    if claimed != number:
        raise PeerLied("wrong_block", f"asked for block {number}, got block {claimed}")
    try:
        verify_commit_certificate(certificate, validators=epoch.validators, epoch=epoch.number,
                                  chain_id=chain_id, block_number=number, block_hash=block_hash)
    except MessageError as exc:
        raise PeerLied("bad_certificate", f"block {number}: {exc}") from None
    return block_hash


# A block ready to import: (number, encoded block, commit certificate, the certified hash).
CertifiedBlock = tuple[int, bytes, bytes, bytes]


class BlockSync:
    """Block sync for one replica: serves peers and fetches what the replica is missing."""

    def __init__(
        self,
        context: EngineContext,
        store: LevelDBConsensusStore,
        feed: EpochFeed,
        *,
        deliver: Callable[[Event], None],
        replica_status: Callable[[], ReplicaStatus],
        held_block: Callable[[int, bytes], bytes | None],
        chain_lock: asyncio.Lock,
        poll_interval: float,
        on_peer_fault: Callable[[bytes, str], None] = lambda peer, kind: None,
        sources: Callable[[], frozenset[bytes]] | None = None,
        observer: bool = False,
        on_pushed: Callable[[bytes, Committed], None] | None = None,
        hedge_after: float = HEDGE_AFTER_S,
    ) -> None:
        self.context = context
        self.hedge_after = hedge_after
        # The connected peers asked and believed (default: all): a validator's adapter gives
        # the connected validators, so an observer's word is never part of its decisions.
        self.sources = sources or context.peers
        self.observer = observer  # hears the validators' announcements
        self.on_pushed = on_pushed  # (validator, message): an observer's, for their pushes
        self.store = store
        self.feed = feed  # which set decides which height, as committed state says
        self.deliver = deliver
        self.replica_status = replica_status
        self.held_block = held_block  # the replica's copy of an uncommitted block, by digest
        self.chain_lock = chain_lock  # held while a block is imported (here or by the adapter)
        self.poll_interval = poll_interval
        self.on_peer_fault = on_peer_fault  # (peer, kind): a peer served a provable lie
        # Failed range requests so far: each moves the order in which peers are asked on by
        # one, so a retry starts with another peer; liars of this fetch are asked last.
        self._rotation = 0
        self._liars: set[bytes] = set()
        self._imported: list[ExecutedBlock] = []  # by the fetch under way
        self._last = 0  # its target: a range answered (or prefetched) beyond it is cut there
        self._reported = 0  # the target the replica asked for, as its progress names it
        self._request_ids = itertools.count(1)
        self._pending: dict[int, tuple[bytes, asyncio.Future[Blocks]]] = {}
        self._status_asked: set[bytes] = set()
        # The last NEW-VIEW a STATUS carried that was not above this replica's view: every
        # peer sends the same one at every poll, and decoding it costs more than the poll.
        self._old_new_view = b""
        self._proving = False  # a head above the horizon is being proved (`_prove_horizon`)
        self._serving: set[bytes] = set()  # one range served at a time per peer
        self._tasks = BackgroundTasks()
        self._poll: TimerHandle | None = None
        self._last_progress = -1
        self._wanted: dict[tuple[int, bytes], None] = {}  # bodies the replica asked for
        # Who served each body delivered: asked for again, the copy proved false (its header
        # matched, its body did not), so that peer is asked last.
        self._served_by: dict[tuple[int, bytes], set[bytes]] = {}

    # Lifecycle.

    def start(self) -> None:
        self._poll = self.context.call_later(self.poll_interval, self._tick)

    async def stop(self) -> None:
        if self._poll is not None:
            self._poll.cancel()
        await self._tasks.cancel_all()

    def _tick(self) -> None:
        """No progress since the last tick: ask every peer where it is."""
        status = self.replica_status()
        if status.fetching is None and status.last_executed == self._last_progress:
            self._ask_status()
        self._last_progress = status.last_executed
        self._wanted = {k: None for k in self._wanted if k[0] > status.last_executed}
        self._served_by = {k: v for k, v in self._served_by.items()
                           if k[0] > status.last_executed}
        for seq_no, digest in self._wanted:
            self._ask_block(seq_no, digest)
        self._poll = self.context.call_later(self.poll_interval, self._tick)

    def _ask_status(self) -> None:
        self._status_asked = set(self.sources())
        for peer in self._status_asked:
            self.context.send_sync(peer, encode_sync(GetStatus()))

    def announce(self, seq_no: int) -> None:
        """Block `seq_no` committed here: push it with its certificate to the connected
        observers (the peers that are no source), encoded once for all of them, so that they
        import it without asking back; a STATUS with the certificate instead when the replica
        no longer holds the body (a new view cleared it) or it is over MAX_PUSHED_BYTES: they
        fetch it. Each goes through the transport's bounded queue of that observer, which
        drops what does not fit (never waits): an observer that missed a push fetches it.
        Validators learn of the block through consensus."""
        observers = self.context.peers() - self.sources()
        if not observers:
            return
        certificate = self.store.get(StoreName.COMMIT_CERTIFICATES, u64(seq_no))
        head = self.context.head()
        if certificate is None or head.block_number != seq_no:
            return
        block = self.held_block(seq_no, head.hash)
        announcement = encode_sync(
            Committed(seq_no, block, certificate)
            if block is not None and len(block) <= MAX_PUSHED_BYTES
            else Status(seq_no, head.hash, certificate, b""))
        for peer in observers:
            self.context.send_sync(peer, announcement)

    def want_block(self, seq_no: int, digest: bytes) -> None:
        """Ask every peer for a block body now and each tick until one arrives (bounded: the
        replica wants at most one body per seqNo of its window)."""
        if len(self._wanted) >= MAX_WANTED_BLOCKS:
            self._wanted.pop(next(iter(self._wanted)))
        self._wanted[(seq_no, digest)] = None
        self._ask_block(seq_no, digest)

    def _ask_block(self, seq_no: int, digest: bytes) -> None:
        """Every source but those whose copy of this body proved false (all, if none is
        left)."""
        peers = self.sources()
        honest = peers - self._served_by.get((seq_no, digest), set())
        for peer in honest or peers:
            self.context.send_sync(peer, encode_sync(GetBlock(seq_no, digest)))

    # Messages from peers.

    def on_message(self, sender: bytes, payload: bytes,
                   charge: Callable[[float], None] = lambda seconds: None) -> None:
        """A peer's block-sync message. A request for blocks starts a serve (one at a time
        per peer), whose time is given to `charge` when it ends: the caller checks the
        sender's budget before it passes a message on (`PbftEngine.on_sync_message`)."""
        try:
            message = decode_sync(payload)
        except MessageError as exc:
            log.warning("block sync: dropped a message from 0x%s: %s", sender.hex(), exc)
            return
        if isinstance(message, GetStatus):
            self.context.send_sync(sender, encode_sync(self._status()))
        elif isinstance(message, Status):
            self._on_status(sender, message)
        elif isinstance(message, GetBlocks | GetBlock):
            if sender not in self._serving:
                self._serving.add(sender)
                self._tasks.spawn(self._serve(sender, message, charge), "serving blocks")
        elif isinstance(message, Block):
            if sender in self.sources():
                self._on_block(sender, message)
        elif isinstance(message, Committed):
            if self.on_pushed is not None and sender in self.feed.members():
                self.on_pushed(sender, message)
        else:
            pending = self._pending.get(message.request_id)
            if pending is not None and pending[0] == sender and not pending[1].done():
                pending[1].set_result(message)

    def _status(self) -> Status:
        head = self.context.head()
        certificate = self.store.get(StoreName.COMMIT_CERTIFICATES, u64(head.block_number))
        new_view = self.store.get(StoreName.META, META_NEW_VIEW)
        return Status(head.block_number, head.hash, certificate or b"", new_view or b"")

    def _on_status(self, sender: bytes, status: Status) -> None:
        mine = self.replica_status()
        if sender in self._status_asked:
            self._status_asked.discard(sender)
        elif not (self.observer and sender in self.feed.members()
                  and status.head_number > max(mine.last_executed, mine.fetching or 0)):
            return  # unasked, and not a validator's news for an observer: not worth a check
        later = bool(status.new_view) and not self.observer and self._offer_new_view(
            status.new_view, mine.view)
        # Our own head's certificate too, from a peer in a later view or to a replica waiting
        # in a view: it proves that view to a replica that cannot take the NEW-VIEW (another
        # epoch's: `join_certified_view`; the attack review s8, finding 1).
        if status.head_number < mine.last_executed or (
                status.head_number == mine.last_executed and mine.active and not later):
            return
        epoch = self.feed.epoch_at(status.head_number)
        if epoch is None:
            # Above what committed state can tell (a set may change before it), its
            # certificate cannot be checked: ask that peer for the certified block at the
            # horizon instead, and believe only that (then catch up to it, and go on).
            self._prove_horizon(sender)
            return
        try:
            verify_commit_certificate(
                status.certificate, validators=epoch.validators, epoch=epoch.number,
                chain_id=self.context.chain_id, block_number=status.head_number,
                block_hash=status.head_hash)
        except MessageError as exc:
            log.warning("block sync: 0x%s claims head %d without a valid certificate: %s",
                        sender.hex(), status.head_number, exc)
            return
        self.deliver(PeerCommitted(status.head_number, status.head_hash, status.certificate))

    def certify(self, sender: bytes, pushed: Committed) -> bytes | None:
        """The hash of a validator's pushed block if its certificate is one of a quorum of the
        set of its height; None if not (counted against `sender`), or if that set is not known
        yet: the block is above the horizon, proved as a STATUS's head would be."""
        head = self.context.head()
        self.feed.refresh(head.block_number, head.hash)
        epoch = self.feed.epoch_at(pushed.number)
        if epoch is None:
            self._prove_horizon(sender)
            return None
        try:
            return certified_block_hash(pushed.block, pushed.certificate, number=pushed.number,
                                        epoch=epoch, chain_id=self.context.chain_id)
        except PeerLied as exc:
            self.on_peer_fault(sender, exc.kind)
            log.warning("block sync: 0x%s pushed a false block %d: %s", sender.hex(),
                        pushed.number, exc)
            return None

    def _prove_horizon(self, peer: bytes) -> None:
        """One at a time: the block at the feed's horizon and its certificate, from `peer`
        (a head above the horizon implies it holds it); a peer that cannot serve it proved
        nothing, one that serves a false one is counted."""
        if self._proving:
            return
        self._proving = True
        self._tasks.spawn(self._horizon_from(peer, self.feed.horizon), "proving a head")

    async def _horizon_from(self, peer: bytes, horizon: int) -> None:
        """The proof, its body check included: the next starts when it ends (a liar's claims
        otherwise piled up body checks of up to 8 MiB each, the attack review s12,
        finding 1)."""
        try:
            await self._prove_from(peer, horizon)
        finally:
            self._proving = False

    async def _prove_from(self, peer: bytes, horizon: int) -> None:
        try:
            block, certificate = (await self._request(peer, horizon, 1)).blocks[0]
            block_hash = certified_block_hash(
                block, certificate, number=horizon, epoch=self._epoch_at(horizon),
                chain_id=self.context.chain_id)
        except PeerLied as exc:
            self._failed_peer(peer, horizon, exc)
            return
        except SyncError:
            return
        try:
            await self._check_body(horizon, block)
        except PeerLied as exc:  # a lie, though the certified header proves the head
            self._failed_peer(peer, horizon, exc)
        if horizon > self.replica_status().last_executed:
            self.deliver(PeerCommitted(horizon, block_hash, certificate))

    def _offer_new_view(self, data: bytes, view: int) -> bool:
        """A NEW-VIEW for a view above ours goes to the replica, which verifies it (views only
        grow: one found not above ours never will be); True if it went."""
        if data == self._old_new_view:
            return False
        try:
            new_view = decode_signed_bytes(data, NewView)
        except MessageError:
            return False
        if new_view.body.view > view:
            self.deliver(MessageReceived(WireMessage(new_view).encode()))
            return True
        self._old_new_view = data
        return False

    def _on_block(self, sender: bytes, answer: Block) -> None:
        """A copy of a wanted body: the replica checks it against the digest, and asks again
        (`FetchBlock`) if it proves false after all (its header matches, its body not)."""
        entry = (answer.seq_no, answer.digest)
        if entry in self._wanted and block_hash_of(answer.block) == answer.digest:
            del self._wanted[entry]
            if len(self._served_by) < MAX_WANTED_BLOCKS or entry in self._served_by:
                self._served_by.setdefault(entry, set()).add(sender)
            self.deliver(BlockReceived(answer.seq_no, answer.digest, answer.block))

    async def _serve(self, peer: bytes, request: GetBlocks | GetBlock,
                     charge: Callable[[float], None]) -> None:
        """Read, look up the certificates, encode and send; the whole time is charged to
        the peer, its read on the read worker included (waiting for its turn too): how long
        its request held this node's serving is what one peer must not take without end."""
        started = time.perf_counter()
        try:
            if isinstance(request, GetBlock):
                block = await self._block_by_digest(request.seq_no, request.digest)
                if block is not None:
                    self.context.send_sync(peer, encode_sync(
                        Block(request.seq_no, request.digest, block)))
                return
            count = min(request.count, MAX_BLOCKS_PER_REQUEST)
            blocks = await self.context.peer_blocks(request.first, count) \
                if request.first > 0 else []
            answer: list[tuple[bytes, bytes]] = []
            size = 0
            for number, block in enumerate(blocks, request.first):
                certificate = self.store.get(StoreName.COMMIT_CERTIFICATES, u64(number))
                size += len(block) + len(certificate or b"")
                if certificate is None or (answer and size > MAX_RESPONSE_BYTES):
                    break
                answer.append((block, certificate))
            self.context.send_sync(peer, encode_sync(Blocks(request.request_id, tuple(answer))))
        finally:
            charge(time.perf_counter() - started)
            self._serving.discard(peer)

    async def _block_by_digest(self, seq_no: int, digest: bytes) -> bytes | None:
        held = self.held_block(seq_no, digest)
        if held is not None or not 0 < seq_no <= self.context.head().block_number:
            return held
        blocks = await self.context.peer_blocks(seq_no, 1)
        return blocks[0] if blocks and block_hash_of(blocks[0]) == digest else None

    # Fetching.

    async def fetch(self, target: int, target_hash: bytes,
                    stop_at: Callable[[], int | None] = lambda: None) -> Event:
        """Import certified blocks up to `target` from whichever peers can serve them; the
        next range is requested while this one is executed, and a range is committed in one
        batch. A fetch that fails part-way says how far it got (`failed`). `stop_at`, asked
        before each range: a height not to import past (an observer voted in stops at the
        handover checkpoint, to vote from the block after it)."""
        imported: list[ExecutedBlock] = []
        self._imported, self._reported = imported, target
        ahead: tuple[int, bytes, asyncio.Future[Blocks]] | None = None
        served, first = True, 0
        try:
            while served and self.context.head().block_number < target:
                stop = stop_at()
                if stop is not None and stop < target:
                    target, target_hash = stop, b""
                    if self.context.head().block_number >= target:
                        break
                self._last = target
                first = self.context.head().block_number + 1
                count = min(MAX_BLOCKS_PER_REQUEST, target - first + 1)
                prefetched = None
                if ahead is not None:
                    prefetched = ahead[1:] if ahead[0] == first else None
                    if prefetched is None:
                        await self._drop(ahead)
                following = first + count
                ahead = self._prefetch(following, target) if following <= target else None
                served = await self._fetch_range(first, count, imported, prefetched)
            await self._drop(ahead)
            ahead = None
        finally:
            if ahead is not None:  # this fetch was cancelled: nothing more is waited for
                ahead[2].cancel()
        if not served:
            log.warning("catch-up to block %d failed at block %d: no peer served it",
                        target, first)
            return self.failed(target)
        head = self.context.head()
        if (imported and imported[-1].number == target and target_hash
                and imported[-1].hash != target_hash):
            # Q validators certified this block, f+1 claimed another: more than f are faulty.
            log.error("catch-up: certified block %d is 0x%s, the fetch target said 0x%s",
                      target, imported[-1].hash.hex(), target_hash.hex())
        log.info("caught up to block %d (%d blocks imported)", head.block_number, len(imported))
        self._ask_status()  # the peers went on meanwhile: where are they now?
        self._liars.clear()
        return self._reached(imported)

    def failed(self, target: int) -> FetchFailed:
        """The fetch of `target` gave up: with what it imported before, if anything."""
        self._rotation += 1
        imported, self._imported = self._imported, []
        return FetchFailed(target, self._reached(imported) if imported else None)

    def _reached(self, imported: list[ExecutedBlock]) -> FetchCompleted:
        head = self.context.head()
        tx_hashes = tuple(h for executed in imported for h in executed.tx_hashes)
        return FetchCompleted(head.block_number, head.hash, head.state_root, tx_hashes)

    def _prefetch(self, first: int, target: int
                  ) -> tuple[int, bytes, asyncio.Future[Blocks]] | None:
        """Ask the range from `first` of the peer whose turn it is, in the background."""
        peers = self._peers_for(first)
        if not peers:
            return None
        count = min(MAX_BLOCKS_PER_REQUEST, target - first + 1)
        request = asyncio.ensure_future(self._request(peers[0], first, count))
        request.add_done_callback(lambda done: done.cancelled() or done.exception())
        return first, peers[0], request

    async def _drop(self, ahead: tuple[int, bytes, asyncio.Future[Blocks]] | None) -> None:
        """A prefetched range this fetch will not import (it caught up otherwise, or the
        range before it came short): not waited for if unanswered, but an answer already
        here is judged as an imported one is, up to the horizon (certificates, bodies against
        the certified roots), so that a liar's answer is charged whichever way the fetch
        went (it costs no request)."""
        if ahead is None:
            return
        first, peer, request = ahead
        if not request.done():
            request.cancel()
            return
        if request.cancelled() or request.exception() is not None:
            return
        blocks = enumerate(request.result().blocks, first)
        try:
            for number, (block, certificate) in blocks:
                if number > self.feed.horizon:
                    break
                certified_block_hash(block, certificate, number=number,
                                     epoch=self._epoch_at(number), chain_id=self.context.chain_id)
                await self._check_body(number, block)
        except PeerLied as exc:
            self._failed_peer(peer, first, exc)

    def _peers_for(self, first: int) -> list[bytes]:
        """The connected sources, starting with the one whose turn the range from `first` is
        (the ranges are spread over them, and each failure moves the turn on), those that
        lied in this fetch last."""
        peers = sorted(self.sources())
        turn = (first // MAX_BLOCKS_PER_REQUEST + self._rotation) % len(peers) if peers else 0
        ordered = peers[turn:] + peers[:turn]
        return ([p for p in ordered if p not in self._liars]
                + [p for p in ordered if p in self._liars])

    async def _fetch_range(self, first: int, count: int, imported: list[ExecutedBlock],
                           prefetched: tuple[bytes, asyncio.Future[Blocks]] | None) -> bool:
        """The prefetched answer, and the connected peers in turn, hedged: one that has not
        answered in `hedge_after` keeps its request, and the next peer is asked too, up to a
        third of the peers plus one in flight (f+1 of N-1: one of them a correct peer's,
        whose answer comes at once, so f holders cannot stop the turn; all of them at once
        sent N-1 copies of an answer down a slow link, the attack review s17-censor, finding
        2); the first answer that verifies is imported, the others are dropped. A peer that
        had no such block (a fresh head: it was executing it) is asked again each
        `hedge_after` while the fetch waits, at most REQUEST_TIMEOUT_S / `hedge_after` times
        (asked once more only, it left the fetch waiting on a holder for REQUEST_TIMEOUT_S:
        finding 3). True once one of them served verified blocks. Asked one at a time, f
        byzantine peers each held the range REQUEST_TIMEOUT_S (the attack review s14-core,
        findings 1 and 2)."""
        queue = deque(p for p in self._peers_for(first)
                      if prefetched is None or p != prefetched[0])
        pending: dict[asyncio.Future[Blocks], bytes] = {}
        if prefetched is not None:
            pending[prefetched[1]] = prefetched[0]
        most = (len(queue) + len(pending)) // 3 + 1
        lacking: deque[bytes] = deque()  # peers that had no such block, to be asked again
        asks: Counter[bytes] = Counter()
        retries = max(1, int(REQUEST_TIMEOUT_S / self.hedge_after))

        def ask(peers: deque[bytes], every: bool = False) -> None:
            while peers and (every or len(pending) < most):
                peer = peers.popleft()
                asks[peer] += 1
                pending[asyncio.ensure_future(self._request(peer, first, count))] = peer
                if not every:
                    return

        try:
            while True:
                if not pending:
                    if not queue:  # nothing held up: those that had none, once more only
                        lacking = deque(p for p in lacking if asks[p] < 2)
                        if not lacking:
                            return False
                        await asyncio.sleep(self.hedge_after)  # (they may hold it by then)
                    ask(queue or lacking, every=not queue)
                done, _ = await asyncio.wait(
                    pending, timeout=self.hedge_after if queue or lacking else None,
                    return_when=asyncio.FIRST_COMPLETED)
                for answer in done:
                    peer = pending.pop(answer)
                    if await self._served(peer, first, count, answer, imported):
                        return True
                    if isinstance(answer.exception(), NoSuchBlock) and asks[peer] <= retries:
                        lacking.append(peer)
                if not done:  # the peers asked are slow: those that had none, and one more
                    ask(lacking, every=True)
                ask(queue)  # (at once after an answer: a correct peer's "none" is quick)
        finally:
            for request in pending:  # (an answer that came with the winner's is read here:
                if not request.done():  # unread, its failure was logged when collected)
                    request.cancel()
                elif not request.cancelled():
                    request.exception()

    async def _served(self, peer: bytes, first: int, count: int,
                      answer: asyncio.Future[Blocks], imported: list[ExecutedBlock]) -> bool:
        """A peer's answer to a range request (done): imported if it verifies."""
        try:
            await self._import_answer(first, count, answer.result(), imported)
            return True
        except SyncError as exc:
            self._failed_peer(peer, first, exc)
            return False

    async def _import_answer(self, first: int, count: int, answer: Blocks,
                             imported: list[ExecutedBlock]) -> None:
        """Import a peer's answer for `count` blocks from `first`. A short one (the peer's
        head, the response cap, or a peer serving a block per request, each just inside
        REQUEST_TIMEOUT_S) moves the turn on as a failure does: the next range starts in
        the same turn, and the replica, which hears of the fetch only when it ends, excuses
        the primary all along (the attack review s10, finding 1)."""
        await self._import_reported(first, answer, imported)
        if len(answer.blocks) < count:
            self._rotation += 1

    def _failed_peer(self, peer: bytes, first: int, exc: SyncError) -> None:
        self._rotation += 1
        name = "0x" + peer.hex()
        if isinstance(exc, PeerLied):
            self._liars.add(peer)
            self.on_peer_fault(peer, exc.kind)
            log.warning("block sync: %s served false blocks from %d: %s", name, first, exc)
        else:
            log.info("block sync from %s (blocks %d..): %s", name, first, exc)

    async def _request(self, peer: bytes, first: int, count: int) -> Blocks:
        request_id = next(self._request_ids)
        future: asyncio.Future[Blocks] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (peer, future)
        try:
            self.context.send_sync(peer, encode_sync(GetBlocks(request_id, first, count)))
            answer = await asyncio.wait_for(future, REQUEST_TIMEOUT_S)
        except TimeoutError:
            raise SyncError(f"no answer for blocks {first}.. in {REQUEST_TIMEOUT_S:.0f} s") \
                from None
        finally:
            del self._pending[request_id]
        if not answer.blocks:
            raise NoSuchBlock(f"peer has no block {first}")
        return answer

    async def _import_reported(self, first: int, answer: Blocks,
                               imported: list[ExecutedBlock]) -> None:
        """`_import`, told to the replica (`FetchProgressed`): it executes what a peer
        served (its own work), then waits for peers again at the head it reached, which is
        progress only if the head moved (a range that does not verify is none)."""
        last = min(first + len(answer.blocks) - 1, self._last)
        self.deliver(FetchProgressed(self._reported, last, executing=True))
        try:
            await self._import(first, answer, imported)
        finally:
            head = self.context.head().block_number
            self.deliver(FetchProgressed(self._reported, head, executing=False))

    async def _import(self, first: int, answer: Blocks, imported: list[ExecutedBlock]
                      ) -> None:
        """Import the range up to the feed's horizon, then (the set of the heights above may
        have changed in what was imported) read the schedule again and go on."""
        blocks = [entry for entry in enumerate(answer.blocks, first) if entry[0] <= self._last]
        while blocks:
            head = self.context.head()
            self.feed.refresh(head.block_number, head.hash)
            segment = [entry for entry in blocks if entry[0] <= self.feed.horizon]
            imported.extend(await self._import_segment(segment))
            blocks = blocks[len(segment):]
        # and once more after the last: whoever imports next (a replica's catch-up, the
        # observer, a proof of a head above the horizon) reads the schedule of this head
        head = self.context.head()
        self.feed.refresh(head.block_number, head.hash)

    async def _import_segment(self, blocks: list[tuple[int, tuple[bytes, bytes]]]
                              ) -> list[ExecutedBlock]:
        """Verify every certificate with the set of its block's height, execute each block
        on the one before it, then commit them (with the certificates) in one batch; nothing
        of it if one fails."""
        return await self.import_certified([
            (number, block, certificate, certified_block_hash(
                block, certificate, number=number, epoch=self._epoch_at(number),
                chain_id=self.context.chain_id))
            for number, (block, certificate) in blocks])

    async def import_certified(self, certified: Sequence[CertifiedBlock]
                               ) -> list[ExecutedBlock]:
        """Execute verified blocks (consecutive, the first after the head or at or below it)
        each on the one before it, then commit them with their certificates in one batch;
        nothing of it if one fails (PeerLied: it executes to another hash, or not at all)."""
        chain: list[tuple[ExecutedBlock, Callable[[WriteBatch], None]]] = []
        async with self.chain_lock:
            head = self.context.head().block_number
            parent: ExecutedBlock | None = None
            for number, block, certificate, block_hash in certified:
                if number <= head:
                    continue  # committed meanwhile through the normal case
                executed = await self._execute(block, number, parent)
                if executed.hash != block_hash:
                    raise PeerLied("invalid_block", f"block {number} executes to another hash")
                ops = [Put(StoreName.COMMIT_CERTIFICATES, u64(number), certificate)]
                chain.append((executed, partial(self.store.write, ops=ops)))
                parent = executed
            if chain:
                await self.context.commit_blocks(chain)
        return [executed for executed, _ in chain]

    @staticmethod
    async def _check_body(number: int, block: bytes) -> None:
        """A certified block that is not executed here: its body against the roots of its
        header (off the loop, as a validation is), the lie a true header over a false body
        would otherwise get away with."""
        try:
            await asyncio.to_thread(check_body_matches_header, block)
        except FalseBodyError as exc:
            raise PeerLied("false_copy", f"certified block {number}: {exc}") from None
        except BlockValidationError:
            pass  # a header without the roots is its signers' fault, not this copy's

    def _epoch_at(self, number: int) -> Epoch:
        epoch = self.feed.epoch_at(number)
        assert epoch is not None, "a segment ends at the horizon"
        return epoch

    async def _execute(self, block: bytes, number: int, parent: ExecutedBlock | None
                       ) -> ExecutedBlock:
        """A certified block's body that does not execute is false: its header was certified
        by a quorum, who executed the block the header commits to."""
        try:
            return await self.context.validate_block(block, parent)
        except StaleParentError as exc:
            raise SyncError(f"block {number}: {exc}") from None
        except BlockValidationError as exc:
            raise PeerLied("invalid_block",
                           f"certified block {number} does not execute here: {exc}") from None
