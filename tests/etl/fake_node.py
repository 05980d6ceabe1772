"""A JSON-RPC server on 127.0.0.1 that serves a ServedChain the way a PBFT node does (the
methods the ETL calls), with faults on demand: HTTP 503 for blocks from some number on, or
for the next few requests, or a reported head (eth_blockNumber) of its choosing; its
pbft_status is a validator's or one set (an observer's). It counts which blocks were
fetched."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.etl.chain_factory import CHAIN_ID, ServedChain


def write_answer(handler: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
    """A JSON-RPC answer on a keep-alive connection."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class FakeNode:
    def __init__(self, chain: ServedChain) -> None:
        self.chain = chain
        self.fail_from: int | None = None  # requests touching blocks >= this get HTTP 503
        self.fail_from_times: int | None = None  # ... only this many of them (None: all)
        self.fail_next = 0  # this many next requests get HTTP 503
        # eth_blockNumber's next answers, the last one repeated (empty: the chain's head)
        self.heads: list[int] = []
        # pbft_status's answer: a validator's fields the ETL reads by default
        self.status: dict[str, Any] = {"engine": "pbft", "role": "validator", "view": 1,
                                       "epoch": 0, "mode": "normal"}
        self.requests = 0
        self.fetched: Counter[int] = Counter()  # eth_getBlockByNumber(n, true) per block
        self._lock = threading.Lock()
        self.url = ""

    def _payload(self, number: str) -> Any:
        index = int(number, 16)
        return self.chain.payloads[index] if index <= self.chain.head else None

    def _in_range(self, first: str, last: str) -> range:
        return range(int(first, 16), int(last, 16) + 1)

    def methods(self) -> dict[str, Callable[..., Any]]:
        chain = self.chain
        return {
            "eth_chainId": lambda: hex(CHAIN_ID),
            "eth_blockNumber": self._head,
            "eth_getBlockByNumber": self._block,
            "eth_getBlockReceipts": lambda n: getattr(self._payload(n), "receipts", None),
            "debug_getRawBlock": lambda n: getattr(self._payload(n), "raw_block", None),
            "pbft_getCommitCertificate": lambda n: getattr(self._payload(n), "certificate", None),
            "pbft_getCheckpoints": lambda a, b: [
                c for n in self._in_range(a, b) if n <= chain.head
                for c in chain.payloads[n].checkpoints
            ],
            "pbft_getValidators": lambda: chain.set_at(chain.head + 1).addresses,
            "pbft_getEpoch": lambda n: chain.epoch_of(int(n, 16)),
            "pbft_getValidatorsByBlockNumber": lambda n: chain.set_at(int(n, 16)).addresses,
            "pbft_status": lambda: self.status,
            "pbft_getViewChanges": lambda a, b: [
                v for v in chain.view_changes if int(v["view"], 16) in self._in_range(a, b)
            ],
            "pbft_getEvidence": lambda: chain.evidence,
        }

    def _head(self) -> str:
        with self._lock:
            if len(self.heads) > 1:
                return hex(self.heads.pop(0))
            return hex(self.heads[0] if self.heads else self.chain.head)

    def _block(self, number: str, full: bool) -> Any:
        payload = self._payload(number)
        if payload is None:
            return None
        if full:
            with self._lock:
                self.fetched[int(number, 16)] += 1
        return payload.block

    def _fails(self, calls: list[dict[str, Any]]) -> bool:
        with self._lock:
            self.requests += 1
            if self.fail_next > 0:
                self.fail_next -= 1
                return True
        if self.fail_from is None:
            return False
        numbers = [int(c["params"][0], 16) for c in calls
                   if c["method"] == "eth_getBlockByNumber" and c["params"][0] != "0x0"]
        if not any(n >= self.fail_from for n in numbers):
            return False
        with self._lock:
            if self.fail_from_times is None:
                return True
            self.fail_from_times -= 1
            return self.fail_from_times >= 0

    def answer(self, body: bytes) -> tuple[int, Any]:
        payload = json.loads(body)
        calls = payload if isinstance(payload, list) else [payload]
        if self._fails(calls):
            return 503, None
        methods = self.methods()
        replies = []
        for call in calls:
            method = methods.get(call["method"])
            if method is None:
                error = {"code": -32601, "message": f"the method {call['method']} does not exist"}
                replies.append({"jsonrpc": "2.0", "id": call["id"], "error": error})
                continue
            result = method(*call.get("params", []))
            replies.append({"jsonrpc": "2.0", "id": call["id"], "result": result})
        return 200, replies if isinstance(payload, list) else replies[0]


def _handler(node: FakeNode) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status, reply = node.answer(body)
            data = json.dumps(reply).encode() if reply is not None else b"busy"
            write_answer(self, status, data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving(chain: ServedChain) -> Iterator[FakeNode]:
    """A FakeNode listening on a free port of 127.0.0.1 until the block ends."""
    node = FakeNode(chain)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(node))
    server.daemon_threads = True
    node.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield node
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
