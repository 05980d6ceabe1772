"""A lying node for the audit's tests: a threaded JSON-RPC proxy on 127.0.0.1 in front of a
real node, which forwards every request (batches included, as the ETL sends them) and rewrites
some answers with `Lie`s, as an operator who controls the node's JSON-RPC but holds no
validator key could. It counts the lies it told, so a test can tell an uncaught lie from one
never served.

Bounded: at most MAX_CONNECTIONS connections at once (more are refused), a request body of at
most MAX_BODY bytes, an idle connection closed after IDLE_TIMEOUT seconds. Leaving the `with`
block stops it cleanly: no new connection, open ones shut down, every thread joined."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tests.etl.fake_node import write_answer

MAX_CONNECTIONS = 32
MAX_BODY = 16 * 2**20
IDLE_TIMEOUT = 30.0  # seconds a kept-alive connection may wait for its next request
UPSTREAM_TIMEOUT = 60.0

# Methods whose first parameter is a block number, and those whose first two are a range.
BLOCK_METHODS = frozenset({
    "eth_getBlockByNumber", "eth_getBlockReceipts", "debug_getRawBlock",
    "pbft_getCommitCertificate",
})
RANGE_METHODS = frozenset({"pbft_getCheckpoints"})

Rewrite = Callable[[Any], Any]
# Answered -32601 as by a node without it, so that the export asks the calls above, whose
# answers the lies rewrite (the bundles' own lies: tests/etl/test_export_bundles.py)
NOT_SERVED = "pbft_getBlockBundles"


def blocks_asked(call: Any) -> range:
    """The block numbers a JSON-RPC call asks about (empty for any other call)."""
    if not isinstance(call, dict):
        return range(0)
    method, params = call.get("method"), call.get("params") or []
    try:
        if method in BLOCK_METHODS:
            number = int(params[0], 16)
            return range(number, number + 1)
        if method in RANGE_METHODS:
            return range(int(params[0], 16), int(params[1], 16) + 1)
    except (IndexError, KeyError, TypeError, ValueError):
        pass  # "latest", a hash, no parameters: no block number
    return range(0)


@dataclass(frozen=True)
class Lie:
    """Answer `method` with `rewrite(the node's result)`: for calls that ask about `block`,
    or for every call of the method when `block` is None. `rewrite` may change its argument
    in place (a fresh copy of the node's answer) and returns the result to serve."""

    method: str
    rewrite: Rewrite
    block: int | None = None

    def applies(self, call: Any) -> bool:
        if not isinstance(call, dict) or call.get("method") != self.method:
            return False
        return self.block is None or self.block in blocks_asked(call)


class LyingProxy:
    """`with LyingProxy(node_url, lies) as proxy:` serves at `proxy.url` until the block ends."""

    def __init__(self, upstream: str, lies: Sequence[Lie]) -> None:
        self.upstream = upstream
        self.lies = tuple(lies)
        self.told: Counter[Lie] = Counter()  # answers each lie rewrote
        self._lock = threading.Lock()
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> LyingProxy:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._server.shutdown()  # serves no new connection
        self._server.drop_connections()  # wakes handlers waiting on kept-alive ones
        self._server.server_close()  # joins every connection's thread
        self._thread.join()

    def answer(self, body: bytes) -> tuple[int, bytes]:
        """(HTTP status, body) for one POSTed request: the node's answer, lied about."""
        refused = _not_served(body)
        if refused is not None:
            return 200, refused
        request = urllib.request.Request(
            self.upstream, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=UPSTREAM_TIMEOUT) as reply:
                data: bytes = reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError as exc:
            return 502, str(exc).encode()
        try:
            calls, replies = json.loads(body), json.loads(data)
        except ValueError:
            return 200, data  # nothing to lie about in what is not JSON
        self._lie(calls if isinstance(calls, list) else [calls],
                  replies if isinstance(replies, list) else [replies])
        return 200, json.dumps(replies).encode()

    def _lie(self, calls: list[Any], replies: list[Any]) -> None:
        by_id = {c.get("id"): c for c in calls if isinstance(c, dict)}
        for reply in replies:
            if not isinstance(reply, dict) or "result" not in reply:
                continue
            call = by_id.get(reply.get("id"))
            for lie in self.lies:
                if lie.applies(call):
                    reply["result"] = lie.rewrite(reply["result"])
                    with self._lock:
                        self.told[lie] += 1


def _not_served(body: bytes) -> bytes | None:
    """The -32601 answer to a lone call of NOT_SERVED (None for any other request)."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or call.get("method") != NOT_SERVED:
        return None
    error = {"code": -32601, "message": f"the method {NOT_SERVED} does not exist"}
    return json.dumps({"jsonrpc": "2.0", "id": call.get("id"), "error": error}).encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the connections' threads: a clean stop

    def __init__(self, proxy: LyingProxy) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.proxy = proxy
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._open_lock:
            if len(self._open) >= MAX_CONNECTIONS:
                return False  # refused: the server closes it
            self._open.add(request)
        return True

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the ETL's client expects
    timeout = IDLE_TIMEOUT
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            self._send(413, b"a JSON-RPC request of 1 to MAX_BODY bytes, with its length")
            self.close_connection = True
            return
        self._send(*self.server.proxy.answer(self.rfile.read(length)))

    def _send(self, status: int, data: bytes) -> None:
        write_answer(self, status, data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the tests' output is the audit's
