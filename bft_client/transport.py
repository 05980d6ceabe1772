"""JSON-RPC calls to one node: the transport the client polls validators through."""

from __future__ import annotations

import itertools
import json
from typing import Any, Protocol

import aiohttp

from bft_client.errors import RpcReplyError, RpcUnreachable

MAX_REPLY_BYTES = 4 * 1024 * 1024  # a receipt with many logs fits; a hostile node cannot flood


class RpcTransport(Protocol):
    async def call(self, url: str, method: str, params: list[Any], timeout: float) -> Any:
        """The result of `method`, or RpcUnreachable / RpcReplyError."""
        ...

    async def close(self) -> None: ...


class HttpTransport:
    """JSON-RPC over HTTP POST with aiohttp; replies are capped at MAX_REPLY_BYTES."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._ids = itertools.count(1)

    async def call(self, url: str, method: str, params: list[Any], timeout: float) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}
        try:
            async with self._session.post(
                url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                payload = await response.content.read(MAX_REPLY_BYTES + 1)
        except TimeoutError:
            raise RpcUnreachable(f"unreachable: no answer within {timeout:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise RpcUnreachable(f"unreachable: {exc or type(exc).__name__}") from None
        return _result(payload, method)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _result(payload: bytes, method: str) -> Any:
    if len(payload) > MAX_REPLY_BYTES:
        raise RpcUnreachable(f"{method}: reply larger than {MAX_REPLY_BYTES} bytes")
    try:
        reply = json.loads(payload)
    except ValueError:
        raise RpcUnreachable(f"{method}: the reply is not JSON-RPC") from None
    if not isinstance(reply, dict):
        raise RpcUnreachable(f"{method}: the reply is not a JSON-RPC object")
    error = reply.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        raise RpcReplyError(code if isinstance(code, int) else 0, str(error.get("message", "")))
    if "result" not in reply:
        raise RpcUnreachable(f"{method}: the reply has neither result nor error")
    return reply["result"]
