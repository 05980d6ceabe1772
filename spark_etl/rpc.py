"""A JSON-RPC client for one node: keep-alive HTTP, batched calls (at most MAX_BATCH a
request, as geth and the node allow), retries with exponential backoff on transport errors."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.client import HTTPConnection, HTTPSConnection
from typing import Any
from urllib.parse import urlsplit

from encoding.json_bounds import nesting_within, without_strings
from spark_etl.errors import RpcError, UsageError

MAX_BATCH = 1000
METHOD_NOT_FOUND = -32601
RESPONSE_TOO_LARGE = -32003
RETRIABLE_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_ANSWER_DEPTH = 32
# The node answers a batch within 25 MB (geth's BatchResponseMaxSize) and one call alone
# within a block's size; what is far above is no answer to what the ETL asks
MAX_ANSWER_BYTES = 256 << 20
READ_CHUNK = 1 << 20
MAX_BACKOFF = 10.0

Call = tuple[str, list[Any]]


class MethodNotFound(RpcError):
    """The node does not serve the method (JSON-RPC -32601)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failing request is repeated."""

    attempts: int = 6
    backoff: float = 0.5  # seconds before the first retry; doubles each time, capped
    timeout: float = 60.0  # seconds for one HTTP request

    def delay(self, attempt: int) -> float:
        return min(self.backoff * 2**attempt, MAX_BACKOFF)


def parse_rpc_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of an http(s) JSON-RPC URL; UsageError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--rpc {url!r}: expected an http:// or https:// URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UsageError(f"--rpc {url!r}: bad port") from None
    return parts.scheme, parts.hostname, port, parts.path or "/"


class JsonRpcClient:
    """Calls one node. Not thread-safe: one client per task."""

    def __init__(self, url: str, policy: RetryPolicy | None = None) -> None:
        self.url = url
        self.policy = policy or RetryPolicy()
        self._scheme, self._host, self._port, self._path = parse_rpc_url(url)
        self._connection: HTTPConnection | None = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self) -> JsonRpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, *params: Any) -> Any:
        return self.batch([(method, list(params))])[0]

    def batch(self, calls: Sequence[Call]) -> list[Any]:
        """The results of `calls`, in order; RpcError if any call fails."""
        results: list[Any] = []
        for start in range(0, len(calls), MAX_BATCH):
            results.extend(self._batch(calls[start : start + MAX_BATCH]))
        return results

    def _batch(self, calls: Sequence[Call]) -> list[Any]:
        payload = [
            {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
            for i, (method, params) in enumerate(calls)
        ]
        replies = self._post_with_retries(payload if len(payload) > 1 else payload[0])
        if isinstance(replies, dict):
            replies = [replies]
        if not isinstance(replies, list):
            raise RpcError(f"answered a batch with {type(replies).__name__}",
                           retriable=False)
        by_id = {reply.get("id"): reply for reply in replies if isinstance(reply, dict)}
        alone = len(calls) == 1
        return [self._result(by_id.get(i), calls[i], alone) for i in range(len(calls))]

    def _result(self, reply: dict[str, Any] | None, call: Call, alone: bool) -> Any:
        method, params = call
        if reply is None:
            raise RpcError(f"no answer to {method}", retriable=True)
        error = reply.get("error")
        if error is None:
            return reply.get("result")
        if isinstance(error, dict) and error.get("code") == RESPONSE_TOO_LARGE and not alone:
            return self.call(method, *params)  # alone, it is not bound by the batch limit
        message = error.get("message") if isinstance(error, dict) else error
        kind = (MethodNotFound if isinstance(error, dict) and error.get("code") == METHOD_NOT_FOUND
                else RpcError)
        raise kind(f"{method}{tuple(params)}: {message}", retriable=False)

    def _post_with_retries(self, payload: Any) -> Any:
        body = json.dumps(payload).encode()
        failure: RpcError | None = None
        for attempt in range(self.policy.attempts):
            if failure is not None:
                self.close()
                time.sleep(self.policy.delay(attempt - 1))
            try:
                return self._post(body)
            except RpcError as exc:
                if not exc.retriable:
                    raise
                failure = exc
        raise RpcError(f"{failure} (gave up after {self.policy.attempts} attempts)",
                       retriable=False)

    def _connect(self) -> HTTPConnection:
        if self._connection is None:
            factory = HTTPSConnection if self._scheme == "https" else HTTPConnection
            self._connection = factory(self._host, self._port, timeout=self.policy.timeout)
        return self._connection

    def _read(self, response: http.client.HTTPResponse) -> bytes:
        """The answer, up to MAX_ANSWER_BYTES + 1 bytes, within the policy's timeout for the
        whole of it: the socket's timeout bounds each recv only, and a node sending a byte
        a minute would hold the task (and its wave) for years."""
        deadline = time.monotonic() + self.policy.timeout
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_ANSWER_BYTES:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the answer took more than {self.policy.timeout:g} s")
            chunk = response.read1(min(READ_CHUNK, MAX_ANSWER_BYTES + 1 - size))
            if not chunk:
                response.read()  # at the end: closes it, so the connection is used again
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)

    def _post(self, body: bytes) -> Any:
        headers = {"Content-Type": "application/json", "Connection": "keep-alive"}
        try:
            connection = self._connect()
            connection.request("POST", self._path, body, headers)
            response = connection.getresponse()
            data = self._read(response)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise RpcError(f"{type(exc).__name__}: {exc}", retriable=True) from None
        if response.status != 200:
            raise RpcError(
                f"HTTP {response.status} {response.reason}",
                retriable=response.status in RETRIABLE_STATUS,
            )
        if len(data) > MAX_ANSWER_BYTES:
            self.close()  # the rest of the answer is never read
            raise RpcError(f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB (not an "
                           "answer to what was asked)", retriable=False)
        if not nesting_within(without_strings(data), MAX_ANSWER_DEPTH):
            # json recurses per level: 100,000 `[` crashed the process (py-evm raises the
            # recursion limit); what the ETL asks for nests under 10 deep
            raise RpcError(f"the answer nests deeper than {MAX_ANSWER_DEPTH} (not an answer "
                           "to what was asked)", retriable=False)
        try:
            return json.loads(data)
        except ValueError:
            raise RpcError("the answer is not JSON", retriable=True) from None
