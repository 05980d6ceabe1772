"""A hostile validator against three real nodes: validator 0's key in the hands of an attacker
(its node is down; f = 1) sends malformed, forged, replayed, out-of-window and flooding
messages on every channel. The nodes stay up, count each refusal in their metrics by reason,
keep their memory bounded and keep committing. And anyone who reaches the p2p ports: idle
connections from one address neither keep a restarted validator from its peers nor fill the
log."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import rlp
from eth_utils import keccak

from chain.p2p import Channel, Transport
from cli.keys import DEV_VALIDATOR_SEED, dev_private_key
from pbft_engine.messages import (
    Authenticator,
    Checkpoint,
    KeySigner,
    KeyVerifier,
    NewView,
    Prepare,
    PrePrepare,
    Signed,
    ViewChange,
    WireMessage,
    signing_hash,
)
from testkit.cluster import Cluster
from testkit.nodes import wait_for
from tests.integration.test_pbft_faults import FAST
from tests.unit.test_rlp_depth import nested as nested_rlp

pytestmark = pytest.mark.integration

FLOOD = 3_000
MAX_RSS_GROWTH = 64 * 1024 * 1024
IDLE_PER_PORT = 80  # more than a node's 64 pending-handshake slots
# The flood's pace: each connection is reopened this long after it was closed (4,000 a second
# a port at most), so that this test's own thread does not starve the nodes of the CPU.
RECONNECT_PAUSE = 0.02


class Attacker:
    """Signs as validator 0, or forges the ways a liar would."""

    def __init__(self, cluster: Cluster) -> None:
        self.chain_id = cluster.description["chain_id"]
        self.validators = cluster.validators
        self.auth = Authenticator(self.chain_id, self.validators, KeyVerifier())
        self.signer = KeySigner(dev_private_key(0, DEV_VALIDATOR_SEED).to_bytes())

    def wire(self, body: object, blocks: tuple[bytes, ...] = ()) -> bytes:
        return WireMessage(self.auth.sign(body, self.signer), blocks).encode()

    def future_flood(self, view: int, seq_no: int) -> list[bytes]:
        """Valid messages for ever later views: a replica keeps one per (sender, type, seqNo)."""
        digest = keccak(b"a future block")
        return [self.wire(Prepare(v, seq_no, digest, 0)) for v in range(view + 1, view + FLOOD)]

    def engine_payloads(self, view: int, seq_no: int) -> dict[str, list[bytes]]:
        """Each hostile engine message, by the drop reason a replica must count it under."""
        digest = keccak(b"a block nobody proposed")
        prepare = self.wire(Prepare(view, seq_no, digest, 0))
        tampered = bytearray(prepare)
        tampered[prepare.index(digest) + 5] ^= 0x01  # a byte of the body, after signing
        unknown_type = rlp.decode(prepare)
        unknown_type[0] = b"\x63"
        foreign = Authenticator(self.chain_id + 1, self.validators, KeyVerifier())
        stranger = KeySigner(keccak(b"not a validator"))
        body = Prepare(view, seq_no, digest, 0)
        checkpoint = Checkpoint(4, digest, digest, 0)
        ours = view + 4 - view % 4  # a later view whose primary is validator 0
        forged_view_change = ViewChange(ours, 4, (self.auth.sign(checkpoint, self.signer),),
                                        (), (), 0)
        lonely_new_view = NewView(ours, (self.auth.sign(forged_view_change, self.signer),),
                                  (), 0)
        return {
            "MessageError": [b"\x00garbage", nested_rlp(50_000), rlp.encode(unknown_type)],
            "SignatureError": [
                bytes(tampered),
                WireMessage(foreign.sign(Prepare(view, seq_no, digest, 0), self.signer)).encode(),
                WireMessage(Signed(body, stranger.sign_hash(signing_hash(body, self.chain_id)))
                            ).encode(),  # a non-validator's signature
                self.wire(Prepare(view, seq_no, digest, 2)),  # claims to be replica 2
            ],
            "duplicate": [prepare] * FLOOD,
            "outside the watermarks": [self.wire(Prepare(view, 10**9, digest, 0)),
                                       self.wire(Prepare(2**64 - 2, 2**64 - 1, digest, 0))],
            "pre-prepare not from the primary or without its block": [
                self.wire(PrePrepare(view, seq_no, digest, 0), (b"block",))],
            "view-change: CertificateError": [self.wire(forged_view_change)],
            "new-view: CertificateError": [self.wire(lonely_new_view)],
        }


def rss(cluster: Cluster, index: int) -> int:
    process = cluster.nodes[index].process
    assert process is not None
    status = Path(f"/proc/{process.pid}/status").read_text()
    (line,) = [x for x in status.splitlines() if x.startswith("VmRSS:")]
    return int(line.split()[1]) * 1024


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster.create(tmp_path, 4, *FAST)
    try:
        cluster.start(1, 2, 3)
        yield cluster
    finally:
        cluster.close()


def test_hostile_validator_is_refused_and_counted(cluster: Cluster) -> None:
    """Each hostile kind of message is counted under its reason, but for the flood of
    duplicates: those past the sender's share of the loop (`peer_budget`: 1 s of CPU, then
    0.2 s a second) are dropped unread, as it is there to do, and counted as such. At
    ~200-300 us a duplicate (decoded, its signing hash made) a host this slow, or loaded,
    ran the sender dry within 3,000 duplicates: 1,000-2,900 were counted as duplicates at
    each node, the rest (and the later kinds, sent behind them) as over budget, whatever
    the JSON-RPC server's code (session 17: main and the accept loop failed alike, and
    session 16 blamed the accept loop)."""
    cluster.commit(via=1)  # node 0 is silent: view 1 (primary: node 1)
    view, seq_no = cluster.status(1)["view"], cluster.status(1)["seqNo"] + 1
    attacker = Attacker(cluster)
    payloads = attacker.engine_payloads(view, seq_no)
    before = {i: cluster.metrics(i) for i in (1, 2, 3)}
    memory = {i: rss(cluster, i) for i in (1, 2, 3)}
    over = asyncio.run(_attack(cluster, payloads, attacker.future_flood(view, seq_no)))
    height = cluster.commit(via=2, sender=1)  # still committing, with node 0's key hostile
    cluster.wait_heads([1, 2, 3], height)
    hostile = _hex(cluster.validators[0])
    for index in (1, 2, 3):
        after = cluster.metrics(index)
        for reason, sent in payloads.items():
            counted = _delta(after, before[index], f"{DROPPED}|{reason}")
            if reason == "duplicate":  # the first is a vote; the rest refused one way or other
                assert counted + over[index] >= len(sent) - 1, (index, counted, over[index])
                assert not over[index] or _delta(after, before[index],
                                                 f"{FAULTS}|{hostile}") > 0, index
            else:
                assert counted >= len(sent), (index, reason, counted)
        assert rss(cluster, index) - memory[index] < MAX_RSS_GROWTH
    cluster.assert_consistent()


DROPPED = "pbft_dropped_messages_total"
OVER_BUDGET = "pbft_budget_dropped_messages_total"
FAULTS = "pbft_peer_faults_total|over_budget"


def _hex(address: bytes) -> str:
    return "0x" + address.hex()


def _delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0) - before.get(key, 0)


async def _attack(cluster: Cluster, payloads: dict[str, list[bytes]], flood: list[bytes]
                  ) -> dict[int, float]:
    """Every kind but the duplicates, counted by reason before the duplicates are sent
    (they cost the sender's budget little); then the duplicates, each counted as one or as
    over the sender's budget; then the flood of future views and the other channels' junk.
    The duplicates dropped over the budget, by node."""
    budget = (f"{OVER_BUDGET}|{_hex(cluster.validators[0])}",)
    kinds = [sent for reason, sent in payloads.items() if reason != "duplicate"]
    async with cluster.impersonate(0) as attacker:
        start = {i: cluster.metrics(i) for i in (1, 2, 3)}
        await _each(attacker, cluster, kinds)
        await asyncio.to_thread(_wait_counted, cluster, start, sum(map(len, kinds)), ())
        start = {i: cluster.metrics(i) for i in (1, 2, 3)}
        await _each(attacker, cluster, [payloads["duplicate"]])
        await asyncio.to_thread(_wait_counted, cluster, start,
                                len(payloads["duplicate"]) - 1, budget)
        over = {i: _delta(cluster.metrics(i), start[i], budget[0]) for i in (1, 2, 3)}
        await _each(attacker, cluster, [flood])
        for peer in cluster.validators[1:]:  # the other channels: dropped, logged
            for channel in (Channel.BLOCK_SYNC, Channel.TX_GOSSIP):
                for junk in (b"", b"\xff" * 100, nested_rlp(10_000), rlp.encode([9, 9, 9])):
                    await _send(attacker, peer, channel, junk)
    return over


async def _each(attacker: Transport, cluster: Cluster, kinds: list[list[bytes]]) -> None:
    for messages in kinds:
        for peer in cluster.validators[1:]:
            for message in messages:
                await _send(attacker, peer, Channel.ENGINE, message)


async def _send(transport: Transport, peer: bytes, channel: Channel, payload: bytes) -> None:
    assert transport.send(peer, channel, payload), "the attack outgrew the send queue"
    await asyncio.sleep(0)  # let the writer drain the queue as we go


def _wait_counted(cluster: Cluster, start: dict[int, dict[str, float]], expected: int,
                  also: tuple[str, ...]) -> None:
    """Until every node counted `expected` more dropped messages than at `start`, by
    reason or under the keys `also`."""
    def counted() -> bool:
        for i in (1, 2, 3):
            now = cluster.metrics(i)
            keys = [k for k in now if k.startswith(DROPPED)] + list(also)
            if sum(_delta(now, start[i], k) for k in keys) < expected:
                return False
        return True

    # (60 s was passed on a host 2 x slower, loaded: session 16's clean-clone run)
    wait_for(counted, 180, "every hostile message counted")


def test_idle_connections_do_not_keep_a_restarted_validator_from_its_peers(
    tmp_path: Path,
) -> None:
    """Both validators' p2p ports flooded with silent connections from 127.0.0.1 (the
    validators' own address), each reopened once closed; validator 0 comes back meanwhile (its
    transport, with its key, on its port) and reaches its peer. Before issue 29 the silent
    connections held all 64 handshake slots (5 s each): a restarted validator stayed at 0
    peers for the whole flood, and each refusal was a WARNING line (28,000 lines, 3.9 MB of
    log a node in 40 s)."""
    cluster = Cluster.create(tmp_path, 2, *FAST)
    try:
        cluster.start(1)
        with _flooding([cluster.endpoint(i) for i in range(2)]):
            wait_for(lambda: _refused(cluster, 1) > IDLE_PER_PORT, 30, "the flood under way")
            asyncio.run(_come_back(cluster))
        assert cluster.metrics(1).get("p2p_handshakes_refused_total|evicted", 0) > 0
        lines = [line for line in cluster.nodes[1].log_path.read_text().splitlines()
                 if "refused handshake" in line]
        assert len(lines) < 20, lines[:10]
    finally:
        cluster.close()


def _refused(cluster: Cluster, index: int) -> float:
    return sum(v for k, v in cluster.metrics(index).items()
               if k.startswith("p2p_handshakes_refused_total|"))


async def _come_back(cluster: Cluster) -> None:
    async with cluster.impersonate(0, peers=(1,)):  # yields once connected, within 30 s
        pass


@contextlib.contextmanager
def _flooding(endpoints: list[tuple[str, int]]) -> Iterator[None]:
    """Silent connections to every endpoint, kept open (reopened) from a thread of their own
    until the block ends."""
    loop = asyncio.new_event_loop()
    flood = loop.create_task(_flood(endpoints))
    thread = threading.Thread(target=loop.run_until_complete, args=(flood,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(flood.cancel)
        thread.join(30)
        loop.close()


async def _flood(endpoints: list[tuple[str, int]]) -> None:
    async def hold(host: str, port: int) -> None:
        while True:
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection(host, port)
                with contextlib.suppress(OSError):
                    await reader.read()  # until the node closes it
                writer.transport.abort()
            await asyncio.sleep(RECONNECT_PAUSE)

    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*(hold(*endpoint) for endpoint in endpoints
                               for _ in range(IDLE_PER_PORT)))
