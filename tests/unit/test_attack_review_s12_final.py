"""Final attack review (session 12) of the session's change: an unauthenticated WebSocket
client against `_PaidReads` (chain/rpc/server.py), and a byzantine primary against
`check_block_bounds` (chain/blockchain.py).

Finding 1 (fixed, was a strict xfail; `_paid` leaves aiohttp's own pause alone): when a debt
is paid, `_PaidReads._paid` passes the held bytes on to aiohttp and then resumes the
transport it paused, though aiohttp paused reading meanwhile (its message queue over its
limit: the client's requests are not taken, e.g. `_ws_read` waits for room in an outbox the
client does not drain, or for a slow call). The transport reads again with aiohttp's flow
control lifted; aiohttp 3.14's WebSocketReader stashes each read in its unparsed tail
(`self._tail + data`), so the tail grows at the budget's rate for as long as the reader is
stalled, each read copying all of it on the loop. The fix is `_paid`'s alone: resume only if
aiohttp's protocol is not paused itself (`_reading_paused`, private: its BaseProtocol).

Finding 2 (fixed, was a strict xfail; `check_typed_transaction_bounds`):
`check_block_bounds` walks the block's own lists only; a typed transaction is a string
there, and py-evm decodes its payload with pyrlp in `decode_block`, whose list decoding
grows with the square of the list's length (the reason for the bound). A byzantine primary
proposes a block whose one typed transaction's payload is a list of one-byte items, with the
true transaction root: `check_body_matches_header` passes it, and every correct replica's
validation spends quadratic CPU before refusing it, on the node's one executor thread
(chain/node.py `run_in_executor`: no build, validation or commit meanwhile). Measured here,
`decode_block`'s CPU: 400,000 items (400 KB) 2.0 s, 1,200,000 (1.2 MB) 22.5 s. The txpool
bounds a transaction from a client (`check_rlp_bounds` on its payload); a block's
transactions never pass there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import rlp

from chain import ordered_trie
from chain.blockchain import Blockchain
from chain.errors import BlockValidationError
from chain.genesis import Genesis
from chain.rpc.server import PAYMENT, BodyBudget, _PaidReads
from storage import Database
from tests.unit.test_attack_review_s11_rpc import PaidBudget, websocket_server
from tests.unit.test_attack_review_s12_rpc import HANDSHAKE, frame_head


class Transport:
    """The reading half of a transport."""

    def __init__(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class StalledReader:
    """aiohttp's protocol under a stalled reader: once its WebSocket queue passes its limit
    it pauses the transport (`BaseProtocol.pause_reading`) until the reader drains the
    queue, which a stalled reader does not."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.received = 0
        self._reading_paused = False

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if self.received > PAYMENT and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()


def owed(paid_reads: _PaidReads) -> asyncio.TimerHandle | None:
    return paid_reads._debt


def test_a_paid_debt_does_not_lift_aiohttps_pause() -> None:
    async def scenario() -> None:
        transport = Transport()
        handler = StalledReader(transport)
        budget = BodyBudget(rate=1_000_000, burst=0)  # in debt from the first byte
        paid_reads = _PaidReads(handler, transport, budget)  # type: ignore[arg-type]
        size = 3 * PAYMENT  # one binary frame, unmasked (the budget reads only frame heads)
        frame = b"\x82\x7f" + size.to_bytes(8, "big") + b"\x00" * size
        paid_reads.data_received(frame)  # one read: its first part passed on, the rest held
        assert paid_reads._debt is not None and not transport.is_reading()
        while (debt := owed(paid_reads)) is not None:  # each debt paid: the next part on
            debt.cancel()
            paid_reads._paid()
        assert handler._reading_paused
        # aiohttp still wants its transport paused (its queue is full): it is not read.
        assert not transport.is_reading()

    asyncio.run(scenario())


class Stalled:
    """The dispatcher of a node whose first call does not end (a slow call: `_ws_read`
    takes no message meanwhile, as when the client leaves its outbox full)."""

    async def handle_payload(self, body: str | bytes, session: object,
                             pay: object = None) -> bytes:
        await asyncio.Event().wait()
        return b""


@contextlib.asynccontextmanager
async def stalled_websocket(budget: BodyBudget) -> AsyncIterator[asyncio.StreamWriter]:
    """A raw client of the node's WebSocket handler, with a stalled dispatcher."""
    async with websocket_server(budget, Stalled()) as listening:
        reader, writer = await asyncio.open_connection(listening.host, listening.port)
        writer.write(HANDSHAKE + b"\r\n")
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
        try:
            yield writer
        finally:
            writer.transport.abort()


def test_a_stalled_websocket_reader_bounds_what_the_node_reads() -> None:
    """Finding 1 end to end: a client whose first call is slow sends 1 KiB messages. aiohttp
    alone stops reading its socket about a queue (128 KiB) and one read (256 KiB) in; here the
    node keeps reading them into aiohttp's unparsed tail, each read copying the whole tail
    (measured, 64 MiB sent, budget 16 MiB/s, over 6 s: 35.8 MB paid and 5.3 s of CPU, against
    1.1 MB and 1.5 s with `_paid` leaving aiohttp's pause alone)."""
    async def scenario() -> int:
        budget = PaidBudget(16 * 1024 * 1024, 0)
        async with stalled_websocket(budget) as writer:
            message = frame_head(0x81, 1024) + b"x" * 1024
            sending = asyncio.create_task(writer.drain())
            writer.write(message * (16 * 1024))  # 16 MiB of messages
            end = asyncio.get_running_loop().time() + 3
            while budget.paid < 4 * 1024 * 1024 and asyncio.get_running_loop().time() < end:
                await asyncio.sleep(0.05)  # (a condition polled, with a deadline)
            sending.cancel()
            return budget.paid

    assert asyncio.run(scenario()) < 4 * 1024 * 1024


TYPED_ITEMS = 600_000  # ~4.5 s of pyrlp's decoding here; a bounded walk: ~0.1 s
DYNAMIC_FEE = b"\x02"
TRANSACTIONS_ROOT_FIELD = 4


def test_a_typed_transaction_in_a_proposal_is_bounded_before_it_is_decoded(
        tmp_path: Path) -> None:
    """Finding 2: a proposal whose typed transaction is a list of TYPED_ITEMS one-byte
    items (its root true) is refused within a bounded walk, not after pyrlp's quadratic
    decoding of it (CPU time: the gap is ~40 x)."""
    with Database(tmp_path / "chaindata") as db:
        blockchain = Blockchain(db, Genesis(chain_id=1337, engine="dev", engine_params={},
                                            alloc={}, timestamp=1_700_000_000))
        executed, _ = blockchain.build_block([], timestamp=1_700_000_001, coinbase=bytes(20))
        typed = DYNAMIC_FEE + rlp.encode([b"\x01"] * TYPED_ITEMS)
        header = rlp.decode(rlp.encode(executed.block.header))
        header[TRANSACTIONS_ROOT_FIELD] = ordered_trie.ordered_trie_root_and_nodes([typed])[0]
        proposal = rlp.encode([header, [typed], [], []])
        started = time.process_time()
        with pytest.raises(BlockValidationError):
            blockchain.validate_encoded(proposal)
        assert time.process_time() - started < 1.0
