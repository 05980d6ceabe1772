"""The load generator: a process of its own that pre-signs a workload, submits it to the nodes
over JSON-RPC and watches it commit.

    python -m benchmarks.loadgen PLAN.json RESULT.json

Sender i's transactions go to target i mod len(targets). Every target's newHeads is watched
over WebSocket, so each block's commit time is known to the millisecond.

Without a rate (throughput), each target gets its transactions in batches of
eth_sendRawTransaction, one batch in flight per target and at most `window` of its
transactions submitted but not committed. Whether transaction (sender, nonce) has committed
is one account read (the sender's nonce), asked only when a new head arrives, so the watching
costs the nodes next to nothing while they work; receipts and block sizes are read once the
load has committed, and every receipt must have status 1.

With a rate (latency), single eth_sendRawTransaction calls leave on a fixed schedule; on each
new head the block's receipts are fetched from that node, so a transaction's latency is the
time from its submission to its receipt being available on the node it was sent to.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.accounts import SignedTx, bench_account, sign_workload

RECEIPT_BATCH = 10  # blocks of receipts per verification request
SLOWEST = 12  # transactions whose blocks a latency run reports


@dataclass
class Plan:
    chain_id: int
    accounts: int
    workload: str
    senders: list[int]
    first_nonces: list[int]
    per_sender: int
    targets: list[str]  # JSON-RPC URLs
    rate: float | None = None  # tx/s; None: as fast as the nodes take them
    batch: int = 200
    window: int = 3_000  # per target
    deadline: float = 300.0  # seconds for submitting and committing

    @classmethod
    def load(cls, path: Path) -> Plan:
        return cls(**json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))


@dataclass
class Outcome:
    """What the run saw; times are wall-clock seconds (time.time), comparable across processes."""

    count: int
    presign_seconds: float
    t_start: float = 0.0
    t_submitted: float = 0.0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    blocks: list[tuple[int, float, int, int]] = field(default_factory=list)  # n, seen, ts, txs
    latencies: list[float] = field(default_factory=list)
    # the slowest transactions: latency, its block, and its block's and the block before's
    # arrival at the entry node, seconds after the transaction was sent (what the tail is)
    slowest: list[tuple[float, int, float, float]] = field(default_factory=list)
    receipts_ok: int = 0
    receipts_failed: int = 0
    timed_out: bool = False


def _request(index: int, method: str, *params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": index, "method": method, "params": list(params)}


class RpcClient:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def post(self, payload: Any) -> Any:
        async with self.session.post(self.url, json=payload) as response:
            response.raise_for_status()
            return await response.json(content_type=None)

    async def call(self, method: str, *params: Any) -> Any:
        reply = await self.post(_request(1, method, *params))
        if "error" in reply:
            raise RuntimeError(f"{method} on {self.url}: {reply['error'].get('message')}")
        return reply["result"]

    async def committed(self, tx: SignedTx) -> bool:
        sender = "0x" + bench_account(tx.sender).address.hex()
        return int(await self.call("eth_getTransactionCount", sender, "latest"), 16) > tx.nonce


class HeadWatcher:
    """newHeads of one node: each block's arrival time and, if asked, each receipt's."""

    def __init__(self, rpc: RpcClient, *, receipts: bool) -> None:
        self.rpc = rpc
        self.want_receipts = receipts
        self.heads: dict[int, tuple[float, int]] = {}  # number -> (seen, timestamp)
        self.receipt_times: dict[str, float] = {}
        self.receipt_blocks: dict[str, int] = {}
        self.failed: set[str] = set()
        self.changed = asyncio.Condition()
        self.version = 0  # bumped on every new head and every fetched block of receipts
        self._queue: asyncio.Queue[int] = asyncio.Queue()
        self._last = -1

    async def run(self, subscribed: asyncio.Event) -> None:
        url = "ws" + self.rpc.url.removeprefix("http")
        self._last = int(await self.rpc.call("eth_blockNumber"), 16)
        async with self.rpc.session.ws_connect(url, max_msg_size=0) as socket:
            await socket.send_json(_request(1, "eth_subscribe", "newHeads"))
            await socket.receive_json()
            subscribed.set()
            worker = asyncio.create_task(self._fetch_receipts())
            try:
                async for message in socket:
                    await self._on_head(json.loads(message.data)["params"]["result"])
            finally:
                worker.cancel()

    async def _on_head(self, head: dict[str, Any]) -> None:
        seen, number = time.time(), int(head["number"], 16)
        for block in range(self._last + 1, number + 1):  # a gap is filled, never skipped
            self.heads[block] = (seen, int(head["timestamp"], 16))
            if self.want_receipts:
                self._queue.put_nowait(block)
        self._last = max(self._last, number)
        await self._bump()

    async def _bump(self) -> None:
        async with self.changed:
            self.version += 1
            self.changed.notify_all()

    async def _fetch_receipts(self) -> None:
        while True:
            number = await self._queue.get()
            receipts = await self.rpc.call("eth_getBlockReceipts", hex(number))
            arrived = time.time()
            for receipt in receipts:
                self.receipt_times[receipt["transactionHash"]] = arrived
                self.receipt_blocks[receipt["transactionHash"]] = number
                if receipt["status"] != "0x1":
                    self.failed.add(receipt["transactionHash"])
            await self._bump()

    async def changed_since(self, version: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.version > version)

    async def wait_until_committed(self, tx: SignedTx) -> None:
        """Return once `tx` has committed on this node, asking again at each new head."""
        while True:
            version = self.version
            if await self.rpc.committed(tx):
                return
            await self.changed_since(version)


class LoadGenerator:
    def __init__(self, plan: Plan, txs: list[SignedTx], outcome: Outcome) -> None:
        self.plan = plan
        self.outcome = outcome
        self.streams: list[list[SignedTx]] = [[] for _ in plan.targets]
        for tx in txs:
            self.streams[tx.sender % len(plan.targets)].append(tx)
        self.rejected: Counter[str] = Counter()
        self.sent_at: dict[str, tuple[float, int]] = {}  # accepted hash -> (time, target)

    async def run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            clients = [RpcClient(session, url) for url in self.plan.targets]
            watchers = [HeadWatcher(c, receipts=bool(self.plan.rate)) for c in clients]
            ready = [asyncio.Event() for _ in watchers]
            tasks = [asyncio.create_task(w.run(e)) for w, e in zip(watchers, ready, strict=True)]
            try:
                await asyncio.gather(*(e.wait() for e in ready))
                async with asyncio.timeout(self.plan.deadline):
                    await self._load(watchers)
                await self._collect(watchers)
            except TimeoutError:
                self.outcome.timed_out = True
            finally:
                self.outcome.accepted = len(self.sent_at)
                self.outcome.rejected = dict(self.rejected)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _load(self, watchers: list[HeadWatcher]) -> None:
        self.outcome.t_start = time.time()
        if self.plan.rate:
            await self._submit_paced(watchers)
        else:
            await asyncio.gather(*(self._submit_batches(w, i) for i, w in enumerate(watchers)))
        self.outcome.t_submitted = time.time()
        for index, watcher in enumerate(watchers):
            if self.plan.rate:
                mine = [h for h, (_, target) in self.sent_at.items() if target == index]
                while not all(h in watcher.receipt_times for h in mine):
                    await watcher.changed_since(watcher.version)
            elif self.streams[index]:
                await watcher.wait_until_committed(self.streams[index][-1])

    def _accept(self, tx: SignedTx, reply: dict[str, Any], sent: float, target: int) -> None:
        if "error" in reply:
            self.rejected[reply["error"].get("message", "?")] += 1
        else:
            self.sent_at["0x" + tx.hash.hex()] = (sent, target)

    async def _submit_batches(self, watcher: HeadWatcher, target: int) -> None:
        stream = self.streams[target]
        for start in range(0, len(stream), self.plan.batch):
            batch = stream[start : start + self.plan.batch]
            behind = start + len(batch) - 1 - self.plan.window
            if behind >= 0:
                await watcher.wait_until_committed(stream[behind])
            sent = time.time()
            replies = await watcher.rpc.post(
                [_request(i, "eth_sendRawTransaction", "0x" + tx.raw.hex())
                 for i, tx in enumerate(batch)]
            )
            for reply in replies:
                self._accept(batch[reply["id"]], reply, sent, target)

    async def _submit_paced(self, watchers: list[HeadWatcher]) -> None:
        assert self.plan.rate
        order = sorted(
            (tx for stream in self.streams for tx in stream), key=lambda t: (t.nonce, t.sender)
        )
        start = time.monotonic()
        sends = []
        for index, tx in enumerate(order):
            delay = start + index / self.plan.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # the schedule of a fixed offered rate
            sends.append(asyncio.create_task(self._send_one(watchers, tx)))
        await asyncio.gather(*sends)

    async def _send_one(self, watchers: list[HeadWatcher], tx: SignedTx) -> None:
        target = tx.sender % len(watchers)
        sent = time.time()
        reply = await watchers[target].rpc.post(
            _request(0, "eth_sendRawTransaction", "0x" + tx.raw.hex())
        )
        self._accept(tx, reply, sent, target)

    async def _collect(self, watchers: list[HeadWatcher]) -> None:
        first = watchers[0]
        counts = await self._verify_receipts(first.rpc, sorted(first.heads))
        self.outcome.blocks = [
            (n, seen, timestamp, counts.get(n, 0))
            for n, (seen, timestamp) in sorted(first.heads.items())
        ]
        if self.plan.rate:
            self.outcome.latencies = sorted(
                watchers[target].receipt_times[h] - sent
                for h, (sent, target) in self.sent_at.items()
            )
            self.outcome.slowest = self._slowest(watchers)

    def _slowest(self, watchers: list[HeadWatcher]) -> list[tuple[float, int, float, float]]:
        slowest = []
        for tx_hash, (sent, target) in self.sent_at.items():
            watcher = watchers[target]
            block = watcher.receipt_blocks[tx_hash]
            seen = [watcher.heads.get(n, (sent, 0))[0] - sent for n in (block, block - 1)]
            slowest.append((watcher.receipt_times[tx_hash] - sent, block, *seen))
        return sorted(slowest, reverse=True)[:SLOWEST]

    async def _verify_receipts(self, rpc: RpcClient, numbers: list[int]) -> dict[int, int]:
        """Every accepted transaction's receipt must say success; returns block sizes."""
        counts: dict[int, int] = {}
        for start in range(0, len(numbers), RECEIPT_BATCH):
            chunk = numbers[start : start + RECEIPT_BATCH]
            replies = await rpc.post(
                [_request(i, "eth_getBlockReceipts", hex(n)) for i, n in enumerate(chunk)]
            )
            for reply in replies:
                receipts = reply["result"]
                counts[chunk[reply["id"]]] = len(receipts)
                for receipt in receipts:
                    if receipt["transactionHash"] not in self.sent_at:
                        continue
                    if receipt["status"] == "0x1":
                        self.outcome.receipts_ok += 1
                    else:
                        self.outcome.receipts_failed += 1
        return counts


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m benchmarks.loadgen PLAN.json RESULT.json", file=sys.stderr)
        return 2
    plan = Plan.load(Path(argv[0]))
    started = time.perf_counter()
    txs = sign_workload(
        plan.workload, plan.chain_id, plan.accounts, plan.senders, plan.first_nonces,
        plan.per_sender,
    )
    outcome = Outcome(count=len(txs), presign_seconds=time.perf_counter() - started)
    asyncio.run(LoadGenerator(plan, txs, outcome).run())
    Path(argv[1]).write_text(json.dumps(asdict(outcome)))
    if outcome.timed_out:
        print(f"loadgen: not committed within {plan.deadline:.0f}s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
