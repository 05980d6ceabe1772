"""Issue 13: the JSON-RPC read path, on a chain of 100,000 transactions.

The chain is written in this process through the node's own `Blockchain` (`build_block`,
then `commit`: the code a node commits with, read store included) into a 1-validator
testnet's data directory, then served by a real `pbft-node run` process, idle. Layout:
FULL_BLOCKS blocks of 1,000 transfers, then blocks of TRANSFERS_PER_BLOCK transfers
(at least 10,000 of them, no logs), then LOG_BLOCKS blocks of ERC-20 transfers (one log
each). Calls go over one HTTP keep-alive connection, as a wallet's or indexer's would;
ethereum-etl runs against the same node when it is installed (`make bench` installs it in
its own environment, .venv-ethereum-etl: it pins an older web3 than ours).
"""

from __future__ import annotations

import http.client
import json
import random
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from benchmarks.accounts import TOKEN_ADDRESS, sign
from benchmarks.load import BenchError
from benchmarks.report import Row
from benchmarks.testnet import BenchNet
from chain.blockchain import Blockchain
from chain.node import load_datadir_genesis, open_database

FULL_BLOCK = 1_000
FULL_BLOCKS = 10
TRANSFERS_PER_BLOCK = 9
LOG_BLOCKS = 100
TRANSFER_TOPIC = "0x" + "ddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"
SAMPLES = 500  # single lookups per method
BATCH = 300
ETHEREUM_ETL = Path(__file__).resolve().parent.parent / ".venv-ethereum-etl" / "bin" / "ethereumetl"
ANVIL_ETL_ROWS_PER_SECOND = 4_349 / 3.0  # issue 13: anvil 1.7.1 on this machine


class RpcClient:
    """JSON-RPC over one keep-alive HTTP connection."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        self._connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
        self._ids = 0

    def _post(self, payload: Any) -> Any:
        body = json.dumps(payload).encode()
        self._connection.request("POST", "/", body, {"Content-Type": "application/json"})
        reply = json.loads(self._connection.getresponse().read())
        answers = reply if isinstance(reply, list) else [reply]
        for answer in answers:
            if "error" in answer:
                raise BenchError(f"JSON-RPC error: {answer['error']}")
        return reply

    def call(self, method: str, *params: Any) -> Any:
        self._ids += 1
        return self._post({"jsonrpc": "2.0", "id": self._ids, "method": method,
                           "params": list(params)})["result"]

    def batch(self, calls: list[tuple[str, list[Any]]]) -> list[Any]:
        payload = [{"jsonrpc": "2.0", "id": i, "method": m, "params": p}
                   for i, (m, p) in enumerate(calls)]
        return [answer["result"] for answer in self._post(payload)]

    def close(self) -> None:
        self._connection.close()


@dataclass
class ReadChain:
    hashes: list[bytes]  # every transaction, in chain order
    full_blocks: range
    transfer_blocks: range
    log_blocks: range
    senders_with_logs: list[bytes]


def build_chain(net: BenchNet, transactions: int) -> ReadChain:
    """Write the chain into node 0's data directory (the node is not running)."""
    accounts = net.accounts
    nonces = [0] * accounts
    counter = iter(range(10**9))

    def signed(workload: str, count: int) -> list[Any]:
        batch = []
        for _ in range(count):
            sender = next(counter) % accounts
            batch.append(sign(workload, net.chain_id, sender, nonces[sender], accounts))
            nonces[sender] += 1
        return batch

    transfer_blocks = max(10_000, (transactions - FULL_BLOCK * FULL_BLOCKS
                                   - LOG_BLOCKS * TRANSFERS_PER_BLOCK) // TRANSFERS_PER_BLOCK)
    plan = ([("transfer", FULL_BLOCK)] * FULL_BLOCKS
            + [("transfer", TRANSFERS_PER_BLOCK)] * transfer_blocks
            + [("erc20", TRANSFERS_PER_BLOCK)] * LOG_BLOCKS)
    db = open_database(Path(net.cluster.description["nodes"][0]["datadir"]))
    hashes: list[bytes] = []
    senders_with_logs: list[bytes] = []
    try:
        chain = Blockchain(db, load_datadir_genesis(db))
        builder = chain.vm_at(chain.head()).get_transaction_builder()
        start = chain.head().timestamp
        for number, (workload, count) in enumerate(plan, start=1):
            batch = [builder.decode(tx.raw) for tx in signed(workload, count)]
            executed, left_out = chain.build_block(batch, timestamp=start + number,
                                                   coinbase=b"\0" * 20)
            if left_out or len(executed.block.transactions) != count:
                raise BenchError(f"read chain: block {number} left transactions out")
            chain.commit(executed)
            hashes.extend(executed.tx_hashes)
            if workload == "erc20":
                senders_with_logs.extend(tx.sender for tx in batch)
    finally:
        db.close()
    first_log_block = FULL_BLOCKS + transfer_blocks + 1
    return ReadChain(hashes, range(1, FULL_BLOCKS + 1), range(FULL_BLOCKS + 1, first_log_block),
                     range(first_log_block, first_log_block + LOG_BLOCKS), senders_with_logs)


def _median_ms(call: Callable[[], Any], samples: int) -> float:
    times = []
    for _ in range(samples):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _cold_ms(call: Callable[[int], Any], blocks: range) -> float:
    """The median over `blocks` of each block's first read (nothing of it cached)."""
    return statistics.median(_median_ms(lambda b=b: call(b), 1) for b in blocks)


def _row(name: str, value: float, target: float | None, note: str = "") -> Row:
    return Row("13", name, value, "ms", target=target, at_most=True, absolute=True, note=note)


def measure(add: Callable[[Row], Any], url: str, chain: ReadChain, details: dict) -> None:
    rng = random.Random(13)
    client = RpcClient(url)
    try:
        hashes = ["0x" + h.hex() for h in chain.hashes]
        picks = iter(rng.choices(hashes, k=3 * SAMPLES))
        size = f"{len(hashes):,}-transaction chain"
        add(_row(f"eth_getTransactionReceipt median, {size}", _median_ms(
            lambda: client.call("eth_getTransactionReceipt", next(picks)), SAMPLES), 1.0))
        add(_row(f"eth_getTransactionByHash median, {size}", _median_ms(
            lambda: client.call("eth_getTransactionByHash", next(picks)), SAMPLES), 1.0))
        batches = [rng.choices(hashes, k=BATCH) for _ in range(5)]
        add(_row(f"batch of {BATCH} eth_getTransactionReceipt", _median_ms(
            lambda: client.batch([("eth_getTransactionReceipt", [h]) for h in batches.pop()]),
            5), 300.0, "random transactions of the whole chain"))
        full = chain.full_blocks
        add(_row(f"eth_getBlockReceipts, {FULL_BLOCK:,}-tx block, first read", _cold_ms(
            lambda b: client.call("eth_getBlockReceipts", hex(b)), full[:5]), 50.0))
        add(_row(f"eth_getBlockByNumber full, {FULL_BLOCK:,}-tx block, first read", _cold_ms(
            lambda b: client.call("eth_getBlockByNumber", hex(b), True), full[5:]), 50.0))
        add(_row(f"eth_getBlockReceipts, {FULL_BLOCK:,}-tx block, cached", _median_ms(
            lambda: client.call("eth_getBlockReceipts", hex(full[0])), 5), None))
        transfers = chain.transfer_blocks
        span = (hex(transfers[-10_000]), hex(transfers[-1]))
        add(_row("eth_getLogs over 10,000 blocks of transfers (no logs)", _median_ms(
            lambda: client.call("eth_getLogs", {"fromBlock": span[0], "toBlock": span[1]}), 5),
            50.0))
        _logs(add, client, chain, details)
        add(_row("eth_blockNumber median", _median_ms(
            lambda: client.call("eth_blockNumber"), SAMPLES), None))
    finally:
        client.close()


def _logs(add: Callable[[Row], Any], client: RpcClient, chain: ReadChain, details: dict) -> None:
    """Logs with matches: all of the token's (one per transaction of the log blocks) and one
    sender's, over the whole chain's last 10,000 blocks; time per match."""
    last = chain.log_blocks[-1]
    window = {"fromBlock": hex(last - 9_999), "toBlock": hex(last)}
    sender = "0x" + chain.senders_with_logs[0].rjust(32, b"\0").hex()
    queries = {
        "all": {**window, "address": "0x" + TOKEN_ADDRESS.hex(), "topics": [TRANSFER_TOPIC]},
        "one sender": {**window, "topics": [TRANSFER_TOPIC, sender]},
    }
    timings = {}
    for label, query in queries.items():
        matches = len(client.call("eth_getLogs", query))
        timings[label] = (matches, _median_ms(lambda q=query: client.call("eth_getLogs", q), 5))
    details["get_logs"] = {k: {"matches": m, "ms": t} for k, (m, t) in timings.items()}
    matches, ms = timings["all"]
    few, few_ms = timings["one sender"]
    add(_row(f"eth_getLogs over 10,000 blocks, {matches} matches", ms, None,
             f"{ms / matches * 1000:.0f} us a match; {few} matches: {few_ms:.1f} ms"))


class ReceiptPollers:
    """`clients` threads, each with its own connection to one of `urls` (in turn), asking for
    a receipt of `hashes` every 1/`rate` s, as wallets waiting on their transactions do."""

    def __init__(self, urls: list[str], hashes: list[str], clients: int, rate: float) -> None:
        self._stop = threading.Event()
        self.calls = 0
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._poll, args=(urls[i % len(urls)], hashes, rate, i),
                             daemon=True)
            for i in range(clients)
        ]

    def _poll(self, url: str, hashes: list[str], rate: float, seed: int) -> None:
        rng = random.Random(seed)
        client = RpcClient(url)
        try:
            next_call = time.monotonic()
            while not self._stop.wait(max(0.0, next_call - time.monotonic())):
                started = time.perf_counter()
                client.call("eth_getTransactionReceipt", rng.choice(hashes))
                with self._lock:
                    self.calls += 1
                    self.seconds += time.perf_counter() - started
                next_call += 1 / rate
        finally:
            client.close()

    def __enter__(self) -> ReceiptPollers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def ethereum_etl(add: Callable[[Row], Any], url: str, chain: ReadChain, workdir: Path,
                 details: dict) -> None:
    """ethereum-etl's two exports over the full blocks, rows per second."""
    if not ETHEREUM_ETL.exists():
        add(Row("13", "ethereum-etl export", None, "rows/s", note=NOT_INSTALLED))
        return
    first, last = chain.full_blocks[0], chain.full_blocks[2]
    rows, seconds = ethereum_etl_export(url, first, last, workdir / "ethereum-etl")
    details["ethereum_etl"] = {"rows": rows, "seconds": seconds}
    add(Row("13", f"ethereum-etl export, blocks {first}-{last}", rows / seconds, "rows/s",
            reference=ANVIL_ETL_ROWS_PER_SECOND, reference_name="anvil (issue 13)", target=0.5,
            note=f"{rows:,} rows in {seconds:.1f} s, the CLI's start-up included"))


NOT_INSTALLED = f"not installed ({ETHEREUM_ETL}); `make bench` installs it"


def ethereum_etl_export(url: str, first: int, last: int, out: Path) -> tuple[int, float]:
    """ethereum-etl's blocks, transactions, receipts and logs of blocks first..last from one
    node, as its README runs them (three commands): (rows written, seconds)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.monotonic()
    _ethereumetl("export_blocks_and_transactions", "--start-block", str(first), "--end-block",
                 str(last), "--provider-uri", url, "--blocks-output", str(out / "blocks.csv"),
                 "--transactions-output", str(out / "transactions.csv"))
    _ethereumetl("extract_csv_column", "--input", str(out / "transactions.csv"), "--column",
                 "hash", "--output", str(out / "hashes.txt"))
    _ethereumetl("export_receipts_and_logs", "--transaction-hashes", str(out / "hashes.txt"),
                 "--provider-uri", url, "--receipts-output", str(out / "receipts.csv"),
                 "--logs-output", str(out / "logs.csv"))
    seconds = time.monotonic() - started
    rows = sum(max(0, len((out / f).read_text().splitlines()) - 1)
               for f in ("blocks.csv", "transactions.csv", "receipts.csv", "logs.csv"))
    return rows, seconds


def _ethereumetl(*args: str) -> None:
    done = subprocess.run([str(ETHEREUM_ETL), *args], capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise BenchError(f"ethereumetl {args[0]} exited {done.returncode}: {said}")
