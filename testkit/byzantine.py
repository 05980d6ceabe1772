"""A real `pbft-node` that misbehaves on purpose (test only; CometBFT's e2e "misbehaviors").

    python -m testkit.byzantine --behaviour NAME [OPTIONS] -- run --config node0/config.toml

runs the node's normal command line (what follows `--` is `pbft-node`'s argv) with one
behaviour installed in this process: the engine adapter (`pbft_engine.engine.PbftEngine`) is
given a wrapped `EngineContext`, so what the engine sends (`broadcast`, `send`, `send_sync`)
and builds (`build_block`) passes through the behaviour, and what it receives is seen by it.
Everything else is the real node: the same key, store, pool, transport and RPC. Behaviours:

  silent-primary  as primary, sends no PRE-PREPARE (it stays connected and votes)
  equivocate      as primary, sends different PRE-PREPAREs for one (view, seqNo): the
                  first backup gets the real block, the second another one (the same block
                  with other extra data: valid too), the third both
  poisoned-block  as primary, proposes its block with one transaction's bytes replaced by
                  bytes py-evm cannot decode or recover a sender from (--poison), the
                  transaction root and header hash recomputed, the PRE-PREPARE signed over
                  the new hash: a consistent header whose body fails on every backup
  censor          as primary, leaves the transactions of one sender (--censor) out of its
                  blocks while including everyone else's
  false-bodies    as a block-sync peer, answers each range asked for (the same lie when
                  asked again) in turn with true headers over bodies that do not decode,
                  a partial range, stale certificates (another block's) and swapped
                  bodies; answers GetBlock by digest with the true header over a body
                  that does not decode
  garbage         on the consensus channel: random bytes, malformed RLP, replays of old
                  signed messages and the largest frames the transport carries; after
                  SIGUSR1 also the most item-heavy frames (a frame of one-byte list items)
                  and VIEW-CHANGEs (a Q-set as long as a frame holds)

Each act is logged at WARNING as `byzantine action NAME: ...` (tests check the behaviour
really happened). SIGUSR1 escalates a behaviour that has a second stage (garbage).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import rlp
from eth_utils import keccak

from chain.ordered_trie import ordered_trie_root_and_nodes
from pbft_engine.errors import MessageError
from pbft_engine.messages import (
    DOMAIN,
    Authenticator,
    KeySigner,
    KeyVerifier,
    MessageType,
    Prepare,
    PrePrepare,
    WireMessage,
    wire_as,
)
from pbft_engine.sync_messages import Block, Blocks, decode_sync, encode_sync

log = logging.getLogger("testkit.byzantine")

ACTION = "byzantine action"
TRANSACTION_ROOT = 4  # an Ethereum header's fields: parent, uncles, coinbase, state, txs, ...
TIMESTAMP = 11
UNKNOWN_TX_TYPE = 0x7E  # no fork defines it: py-evm raises UnrecognizedTransactionType
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
MAX_PAYLOAD = 16 * 1024 * 1024 - 1 - 16  # the transport's frame cap less channel id and tag
POISONS = ("tx-type", "y-parity", "r")


# --- blocks, as RLP structures (no py-evm: bytes it cannot decode are the point) -----------


def _decode_block(data: bytes) -> list[Any]:
    block = rlp.decode(data)
    if not isinstance(block, list) or len(block) < 3 or not isinstance(block[1], list):
        raise ValueError("not an encoded block")
    return block


def _tx_encoding(tx: bytes | list[Any]) -> bytes:
    """A transaction as the transaction trie holds it: typed ones are byte strings already."""
    return tx if isinstance(tx, bytes) else rlp.encode(tx)


def poison_transaction(tx: bytes | list[Any] | None, mode: str) -> bytes:
    """The bytes of `tx` made undecodable (tx-type: a type byte no fork defines) or made a
    signature no sender can be recovered from (y-parity: 5; r: the curve order or above)."""
    if tx is None:  # an empty block: a transaction is added
        return bytes([UNKNOWN_TX_TYPE]) + rlp.encode([])
    if mode == "tx-type":
        return bytes([UNKNOWN_TX_TYPE]) + (tx[1:] if isinstance(tx, bytes) else rlp.encode(tx))
    fields = list(rlp.decode(tx[1:]) if isinstance(tx, bytes) else tx)
    if mode == "y-parity":
        fields[-3] = b"\x05"  # v, or y-parity: typed transactions end with y, r, s
    elif mode == "r":
        fields[-2] = SECP256K1_N.to_bytes(32, "big")
    else:
        raise ValueError(f"unknown poison {mode}")
    return tx[:1] + rlp.encode(fields) if isinstance(tx, bytes) else rlp.encode(fields)


def poisoned_block(data: bytes, mode: str) -> tuple[bytes, bytes]:
    """`data` with its first transaction poisoned (one added to an empty block) and the
    header made consistent with it (transaction root): the new block and its hash."""
    block = _decode_block(data)
    header, txs = list(block[0]), list(block[1])
    if txs:
        txs[0] = poison_transaction(txs[0], mode)
    else:
        txs.append(poison_transaction(None, mode))
    header[TRANSACTION_ROOT] = ordered_trie_root_and_nodes([_tx_encoding(t) for t in txs])[0]
    return rlp.encode([header, txs, *block[2:]]), keccak(rlp.encode(header))


def false_body(data: bytes, transactions: list[Any] | None = None) -> bytes:
    """The true header of `data` over another body: `transactions` (default: the block's own
    with the first poisoned by an unknown type byte). The hash is the true one."""
    block = _decode_block(data)
    if transactions is None:
        transactions = list(block[1])
        if transactions:
            transactions[0] = poison_transaction(transactions[0], "tx-type")
        else:
            transactions.append(poison_transaction(None, "tx-type"))
    return rlp.encode([block[0], transactions, *block[2:]])


def relabelled_block(data: bytes) -> tuple[bytes, bytes]:
    """The same block a second later (valid as well: extraData is not free, it commits to
    the next validator set): new block and hash."""
    block = _decode_block(data)
    header = list(block[0])
    header[TIMESTAMP] = rlp.sedes.big_endian_int.serialize(
        rlp.sedes.big_endian_int.deserialize(header[TIMESTAMP]) + 1)
    return rlp.encode([header, *block[1:]]), keccak(rlp.encode(header))


# --- raw RLP, for frames too large to build as Python structures -------------------------


def _list_bytes(payload: bytes) -> bytes:
    return rlp.codec.length_prefix(len(payload), 0xC0) + payload


def item_heavy_frame(signed: list[Any], size: int) -> bytes:
    """A wire message of `size` bytes: a signed message and, as its blocks, as many one-byte
    items as fit (each is its own RLP encoding)."""
    head = b"".join(rlp.encode(item) for item in signed)
    count = size - len(head) - 10
    blocks = _list_bytes(b"\x01" * count)
    frame = _list_bytes(head + blocks)
    while len(frame) > size:
        count -= len(frame) - size
        frame = _list_bytes(head + _list_bytes(b"\x01" * count))
    return frame


def heavy_view_change(
    view: int, replica: int, chain_id: int, signer: KeySigner, size: int
) -> bytes:
    """A correctly signed VIEW-CHANGE(view) whose Q-set holds as many (seqNo, digest, view 0)
    entries as a frame of `size` bytes does: sorted, unique, above checkpoint 0."""
    entries: list[bytes] = []
    total, seq_no = 0, 1
    budget = size - 200
    while True:
        entry = rlp.encode([seq_no, keccak(seq_no.to_bytes(8, "big")), 0])
        if total + len(entry) + 5 > budget:
            break
        entries.append(entry)
        total += len(entry)
        seq_no += 1
    body = _list_bytes(rlp.encode(view) + rlp.encode(0) + rlp.encode([]) + rlp.encode([])
                       + _list_bytes(b"".join(entries)) + rlp.encode(replica))
    signature = signer.sign_hash(keccak(
        DOMAIN + chain_id.to_bytes(8, "big") + bytes([MessageType.VIEW_CHANGE]) + body))
    return _list_bytes(rlp.encode(int(MessageType.VIEW_CHANGE)) + body + rlp.encode(signature)
                       + rlp.encode([]))


def largest_frame(signed_prepare: WireMessage[Prepare], size: int) -> bytes:
    """A signed (stale) PREPARE carrying one block of zeros: a frame of exactly `size` bytes."""
    length = size - len(signed_prepare.encode()) - 10
    while True:
        frame = WireMessage(signed_prepare.signed, (bytes(length),)).encode()
        if len(frame) <= size:
            return frame
        length -= len(frame) - size


# --- behaviours -----------------------------------------------------------------------------


class Behaviour:
    """Honest by default: every hook passes through to the node's real context."""

    name: ClassVar[str]

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.engine: Any = None
        self.context: Any = None  # the node's real EngineContext
        self.validators: tuple[bytes, ...] = ()
        self.me = -1
        self.signer: KeySigner | None = None
        self.auth: Authenticator | None = None
        self.acts = 0

    def attach(self, engine: Any, context: Any, params: Mapping[str, Any]) -> None:
        self.engine, self.context = engine, context
        self.validators = tuple(bytes.fromhex(str(v)[2:]) for v in params["validators"])
        key = context.validator_key
        if key is not None:
            self.signer = KeySigner(key.to_bytes())
            self.me = self.validators.index(key.public_key.to_canonical_address())
        self.auth = Authenticator(context.chain_id, self.validators, KeyVerifier())

    def act(self, detail: str, *args: Any) -> None:
        self.acts += 1
        log.warning(f"{ACTION} {self.name}: {detail}", *args)

    def view(self) -> int:
        return int(self.engine.status().get("view", 0))

    # What the engine does, through the behaviour.

    def broadcast(self, payload: bytes) -> None:
        self.context.broadcast(payload)

    def send(self, peer: bytes, payload: bytes) -> None:
        self.context.send(peer, payload)

    def send_sync(self, peer: bytes, payload: bytes) -> None:
        self.context.send_sync(peer, payload)

    async def build_block(self, **kwargs: Any) -> Any:
        return await self.context.build_block(**kwargs)

    def received(self, sender: bytes, payload: bytes) -> None:
        """An engine message from a peer, before the engine gets it."""

    def started(self) -> None:
        """The engine started (on the event loop)."""

    async def stopping(self) -> None:
        """The engine is about to stop."""

    def escalate(self) -> None:
        log.warning("byzantine %s: nothing to escalate", self.name)


class PrimaryBehaviour(Behaviour):
    """Takes over this replica's own PRE-PREPAREs (sent only while it is the primary)."""

    def _own_pre_prepare(self, payload: bytes) -> WireMessage[PrePrepare] | None:
        if payload[:8].find(bytes([0x01])) < 0:  # cheap: the type is the first item
            return None
        try:
            wire = wire_as(WireMessage.decode(payload), PrePrepare)
        except MessageError:
            return None
        if wire is None or wire.signed.body.replica != self.me or len(wire.blocks) != 1:
            return None
        return wire

    def broadcast(self, payload: bytes) -> None:
        wire = self._own_pre_prepare(payload)
        if wire is None:
            self.context.broadcast(payload)
        else:
            self.pre_prepare(wire, sorted(self.context.peers()))

    def send(self, peer: bytes, payload: bytes) -> None:
        wire = self._own_pre_prepare(payload)
        if wire is None:
            self.context.send(peer, payload)
        else:
            self.pre_prepare(wire, [peer])

    def pre_prepare(self, wire: WireMessage[PrePrepare], peers: list[bytes]) -> None:
        raise NotImplementedError

    def signed_pre_prepare(self, view: int, seq_no: int, digest: bytes, block: bytes) -> bytes:
        assert self.auth is not None and self.signer is not None
        signed = self.auth.sign(PrePrepare(view, seq_no, digest, self.me), self.signer)
        return WireMessage(signed, (block,)).encode()


class SilentPrimary(PrimaryBehaviour):
    name = "silent-primary"

    def pre_prepare(self, wire: WireMessage[PrePrepare], peers: list[bytes]) -> None:
        body = wire.signed.body
        self.act("withheld the PRE-PREPARE of view %d seqNo %d from %d peers", body.view,
                 body.seq_no, len(peers))


class Equivocate(PrimaryBehaviour):
    name = "equivocate"

    def __init__(self, options: argparse.Namespace) -> None:
        super().__init__(options)
        self._other: dict[tuple[int, int], bytes] = {}

    def pre_prepare(self, wire: WireMessage[PrePrepare], peers: list[bytes]) -> None:
        body = wire.signed.body
        key = (body.view, body.seq_no)
        if key not in self._other:
            block, digest = relabelled_block(wire.blocks[0])
            self._other[key] = self.signed_pre_prepare(body.view, body.seq_no, digest, block)
            self.act("view %d seqNo %d: PRE-PREPARE 0x%s and 0x%s", body.view, body.seq_no,
                     body.digest.hex(), digest.hex())
        real, other = wire.encode(), self._other[key]
        everyone = sorted(self.validators[i] for i in range(len(self.validators))
                          if i != self.me)
        for peer in peers:
            turn = everyone.index(peer) % 3 if peer in everyone else 0
            # the first backup gets the real block, the second the other, the third both
            for payload in ((real,), (other,), (real, other))[turn]:
                self.context.send(peer, payload)


class PoisonedBlock(PrimaryBehaviour):
    name = "poisoned-block"

    def __init__(self, options: argparse.Namespace) -> None:
        super().__init__(options)
        self._poisoned: dict[tuple[int, int], bytes] = {}

    def pre_prepare(self, wire: WireMessage[PrePrepare], peers: list[bytes]) -> None:
        body = wire.signed.body
        key = (body.view, body.seq_no)
        if key not in self._poisoned:
            block, digest = poisoned_block(wire.blocks[0], self.options.poison)
            self._poisoned[key] = self.signed_pre_prepare(body.view, body.seq_no, digest, block)
            self.act("view %d seqNo %d: proposed 0x%s, a block with a %s-poisoned transaction "
                     "(built as 0x%s)", body.view, body.seq_no, digest.hex(),
                     self.options.poison, body.digest.hex())
        for peer in peers:
            self.context.send(peer, self._poisoned[key])


class Censor(Behaviour):
    name = "censor"

    def __init__(self, options: argparse.Namespace) -> None:
        super().__init__(options)
        if not options.censor:
            raise SystemExit("censor needs --censor ADDRESS")
        self.censored = bytes.fromhex(options.censor.removeprefix("0x").lower())
        self.left_out = 0

    def attach(self, engine: Any, context: Any, params: Mapping[str, Any]) -> None:
        super().attach(engine, context, params)
        from chain.txpool import TxPool

        executable = TxPool.executable
        behaviour = self

        def censored(pool: TxPool, **kwargs: Any) -> list[Any]:
            batch = executable(pool, **kwargs)
            kept = [tx for tx in batch if tx.sender != behaviour.censored]
            behaviour.left_out += len(batch) - len(kept)
            return kept

        TxPool.executable = censored  # type: ignore[method-assign]

    async def build_block(self, **kwargs: Any) -> Any:
        before = self.left_out
        executed = await self.context.build_block(**kwargs)
        if self.left_out > before:
            self.act("left %d transactions of 0x%s out of block %d", self.left_out - before,
                     self.censored.hex(), executed.number)
        return executed


class FalseBodies(Behaviour):
    """A consistent liar: each range (by asking peer and first block) gets the next lie in
    LIES the first time it is asked for, and the same lie whenever it is asked again."""

    name = "false-bodies"
    LIES = ("poisoned bodies", "a partial range", "stale certificates", "swapped bodies")

    def __init__(self, options: argparse.Namespace) -> None:
        super().__init__(options)
        self._lies: dict[tuple[bytes, int], str] = {}

    def send_sync(self, peer: bytes, payload: bytes) -> None:
        try:
            message = decode_sync(payload)
        except MessageError:
            message = None
        if isinstance(message, Blocks) and message.blocks:
            key = (peer, _number(message.blocks[0][0]))
            lie = self._lies.setdefault(key, self.LIES[len(self._lies) % len(self.LIES)])
            blocks = self._lie(lie, list(message.blocks))
            self.act("answered GetBlocks %d (%d blocks from block %s) from 0x%s with %s "
                     "(%d blocks)", message.request_id, len(message.blocks),
                     _number(message.blocks[0][0]), peer.hex(), lie, len(blocks))
            payload = encode_sync(Blocks(message.request_id, tuple(blocks)))
        elif isinstance(message, Block):
            self.act("answered GetBlock %d 0x%s from 0x%s with a false body", message.seq_no,
                     message.digest.hex(), peer.hex())
            payload = encode_sync(Block(message.seq_no, message.digest,
                                        false_body(message.block)))
        self.context.send_sync(peer, payload)

    @staticmethod
    def _lie(lie: str, blocks: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        if lie == "a partial range":
            return blocks[: len(blocks) // 2]
        if lie == "stale certificates" and len(blocks) > 1:
            certificates = [c for _, c in blocks]
            stale = [certificates[-1], *certificates[:-1]]  # each block another's certificate
            return [(b, c) for (b, _), c in zip(blocks, stale, strict=True)]
        if lie == "swapped bodies" and len(blocks) > 1:
            bodies = [_decode_block(b)[1] for b, _ in blocks]
            swapped = [bodies[-1], *bodies[:-1]]
            return [(false_body(b, t), c) for (b, c), t in zip(blocks, swapped, strict=True)]
        return [(false_body(b), c) for b, c in blocks]


def _number(block: bytes) -> int:
    return int.from_bytes(_decode_block(block)[0][8], "big")


class Garbage(Behaviour):
    name = "garbage"
    TICK = 0.1  # seconds between rounds of light garbage
    REPLAY_AGE = 2.0  # seconds a recorded message ages before it is replayed
    LARGE_EVERY = 20  # ticks between largest frames
    HEAVY_EVERY = 50  # ticks between item-heavy frames, once escalated
    TALLY_EVERY = 10  # ticks between logged tallies of what was sent

    def __init__(self, options: argparse.Namespace) -> None:
        super().__init__(options)
        self.rng = random.Random(options.seed)
        self.recorded: deque[tuple[float, bytes]] = deque(maxlen=512)
        self.heavy = False
        self._task: asyncio.Task[None] | None = None
        self._frames: dict[str, bytes] = {}
        self.sent: dict[str, int] = {}

    def broadcast(self, payload: bytes) -> None:
        self.recorded.append((time.monotonic(), payload))
        self.context.broadcast(payload)

    def received(self, sender: bytes, payload: bytes) -> None:
        if len(payload) < 4096:
            self.recorded.append((time.monotonic(), payload))

    def started(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stopping(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def escalate(self) -> None:
        self.heavy = True
        self.act("escalated: item-heavy frames and VIEW-CHANGEs from now on")

    def _send_all(self, kind: str, payloads: Sequence[bytes]) -> None:
        for peer in sorted(self.context.peers()):
            for payload in payloads:
                self.context.send(peer, payload)
                self.sent[kind] = self.sent.get(kind, 0) + 1

    async def _run(self) -> None:
        tick = 0
        while True:
            await asyncio.sleep(self.TICK)
            tick += 1
            try:
                self._send_all("random", [self.rng.randbytes(self.rng.randint(1, 4096))
                                          for _ in range(2)])
                self._send_all("malformed", self._malformed())
                if tick % 10 == 0:
                    self._send_all("replay", self._replays())
                if tick % self.LARGE_EVERY == 1:
                    self._send_all("largest", [await self._frame("largest")])
                if self.heavy and tick % self.HEAVY_EVERY == 1:
                    self._send_all("heavy", [await self._frame("item-heavy"),
                                             await self._frame(f"view-change {self.view() + 1}")])
                if tick % self.TALLY_EVERY == 0:
                    self.act("sent so far %s", dict(sorted(self.sent.items())))
            except Exception:  # a behaviour that stops sending garbage is a quiet test
                log.exception("byzantine garbage round failed")

    async def _frame(self, kind: str) -> bytes:
        frame = self._frames.get(kind)
        if frame is None:
            assert self.auth is not None and self.signer is not None
            stale = WireMessage(self.auth.sign(Prepare(0, 0, keccak(b"garbage"), self.me),
                                               self.signer))
            build: Callable[[], bytes]
            if kind == "largest":
                def build() -> bytes:
                    return largest_frame(stale, MAX_PAYLOAD)
            elif kind == "item-heavy":
                def build() -> bytes:
                    return item_heavy_frame(stale.signed.to_rlp(), MAX_PAYLOAD)
            else:
                view, signer, chain_id = int(kind.split()[-1]), self.signer, self.context.chain_id

                def build() -> bytes:
                    return heavy_view_change(view, self.me, chain_id, signer, MAX_PAYLOAD)
            frame = self._frames[kind] = await asyncio.to_thread(build)
            self.act("built a %s frame of %d bytes", kind, len(frame))
        return frame

    def _malformed(self) -> list[bytes]:
        rng = self.rng
        recent = self.recorded[-1][1] if self.recorded else rlp.encode([b"\x02", [], b""])
        depth = rng.randint(25, 2_000)
        nested = b"\xc0"
        for _ in range(depth):
            nested = _list_bytes(nested)
        return [
            recent[: rng.randint(1, max(1, len(recent) - 1))],  # truncated
            b"\xf9\xff\xff" + rng.randbytes(16),  # a list longer than the frame
            b"\xb8\x05hello",  # a long-form prefix for a short string: not canonical
            rlp.encode([b"\x02", [b"\x01", b"\x00\x01", b"x" * 31], b"\x00" * 65, []]),
            rlp.encode([b"\x09", [], b"\x00" * 65, []]),  # an unknown message type
            rlp.encode([b"\x01", [[[[[[]]]]]], b"", [b"", [b""]]]),  # the wrong shapes
            nested,  # nested deeper than any message
        ]

    def _replays(self) -> list[bytes]:
        old = [p for at, p in self.recorded if at < time.monotonic() - self.REPLAY_AGE]
        return self.rng.sample(old, min(16, len(old)))


BEHAVIOURS: dict[str, type[Behaviour]] = {
    cls.name: cls
    for cls in (SilentPrimary, Equivocate, PoisonedBlock, Censor, FalseBodies, Garbage)
}


# --- installing a behaviour into this process's engine ------------------------------------


class _Context:
    """The node's EngineContext as the engine sees it: every call goes to the node's, but
    sending and building, which go through the behaviour."""

    def __init__(self, real: Any, behaviour: Behaviour) -> None:
        self._real = real
        self._behaviour = behaviour

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def broadcast(self, payload: bytes) -> None:
        self._behaviour.broadcast(payload)

    def send(self, peer: bytes, payload: bytes) -> None:
        self._behaviour.send(peer, payload)

    def send_sync(self, peer: bytes, payload: bytes) -> None:
        self._behaviour.send_sync(peer, payload)

    async def build_block(self, **kwargs: Any) -> Any:
        return await self._behaviour.build_block(**kwargs)


def install(behaviour: Behaviour) -> None:
    """Wrap `PbftEngine` (the class the node loads by name) around `behaviour`."""
    from pbft_engine.engine import PbftEngine

    init, start, stop, on_message = (PbftEngine.__init__, PbftEngine.start, PbftEngine.stop,
                                     PbftEngine.on_message)

    def wrapped_init(engine: PbftEngine, context: Any, params: Mapping[str, Any]) -> None:
        init(engine, _Context(context, behaviour), params)  # type: ignore[arg-type]
        behaviour.attach(engine, context, params)

    async def wrapped_start(engine: PbftEngine) -> None:
        await start(engine)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, behaviour.escalate)
        behaviour.started()
        log.warning("byzantine %s: installed in validator %d (pid %d)", behaviour.name,
                    behaviour.me, os.getpid())

    async def wrapped_stop(engine: PbftEngine) -> None:
        await behaviour.stopping()
        await stop(engine)

    def wrapped_on_message(engine: PbftEngine, sender: bytes, payload: bytes) -> None:
        behaviour.received(sender, payload)
        on_message(engine, sender, payload)

    PbftEngine.__init__ = wrapped_init  # type: ignore[method-assign]
    PbftEngine.start = wrapped_start  # type: ignore[method-assign]
    PbftEngine.stop = wrapped_stop  # type: ignore[method-assign]
    PbftEngine.on_message = wrapped_on_message  # type: ignore[method-assign]


def command(node_command: Sequence[str], behaviour: str, *options: str) -> list[str]:
    """A testnet node's `command` (from testnet.json) run as this behaviour instead."""
    argv = list(node_command)
    start = argv.index("cli.node") + 1 if "cli.node" in argv else 1
    return [sys.executable, "-m", "testkit.byzantine", "--behaviour", behaviour, *options,
            "--", *argv[start:]]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.byzantine",
        description="Run pbft-node with a byzantine behaviour installed (tests only).",
        epilog="example: python -m testkit.byzantine --behaviour silent-primary -- run "
               "--config node0/config.toml")
    parser.add_argument("--behaviour", required=True, choices=sorted(BEHAVIOURS))
    parser.add_argument("--poison", choices=POISONS, default="tx-type",
                        help="poisoned-block: how the transaction is poisoned (tx-type)")
    parser.add_argument("--censor", help="censor: the sender address left out of blocks")
    parser.add_argument("--seed", type=int, default=1, help="garbage: random seed (1)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if "--" not in argv:
        parser.parse_args(argv)  # --help, or what is wrong with the options
        parser.error("the node's arguments follow `--` (e.g. -- run --config FILE)")
    split = argv.index("--")
    options = parser.parse_args(argv[:split])
    install(BEHAVIOURS[options.behaviour](options))
    from cli.node import main as node_main

    return node_main(argv[split + 1:])


if __name__ == "__main__":
    sys.exit(main())
