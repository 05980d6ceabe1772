"""The JSON-RPC server: HTTP POST and WebSocket on one port (aiohttp).

Limits, as geth's defaults: request bodies up to `MAX_BODY_BYTES`, batches up to
`MAX_BATCH_ITEMS` calls and `MAX_BATCH_RESPONSE_BYTES` of results. The Host header must be in
the allowlist; a request carrying a browser Origin is refused unless CORS allows that origin.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from chain.rpc.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    InvalidParams,
    RpcError,
)
from chain.rpc.eth import EthApi, Method
from chain.rpc.subscriptions import Subscriptions

if TYPE_CHECKING:
    from chain.node import Node

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 5 * 1024 * 1024
MAX_BATCH_ITEMS = 1_000
MAX_BATCH_RESPONSE_BYTES = 25 * 1024 * 1024
WS_SEND_QUEUE = 1_000
JSON_CONTENT_TYPES = ("application/json", "application/json-rpc", "application/jsonrequest")


def _response(request_id: Any, result: Any = None, error: RpcError | None = None) -> dict:
    response: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
    if error is not None:
        response["error"] = error.to_json()
    else:
        response["result"] = result
    return response


def _encode(response: dict) -> str:
    return json.dumps(response, separators=(",", ":"))


def _check_arity(method: Method, params: list[Any]) -> None:
    signature = inspect.signature(method)
    positional = list(signature.parameters.values())
    required = sum(1 for p in positional if p.default is inspect.Parameter.empty)
    if len(params) > len(positional):
        raise InvalidParams(f"too many arguments, want at most {len(positional)}")
    if len(params) < required:
        raise InvalidParams(f"missing value for required argument {len(params)}")


class Dispatcher:
    """Decodes requests, calls methods, encodes responses; shared by HTTP and WebSocket."""

    def __init__(self, methods: dict[str, Method]) -> None:
        self.methods = methods

    async def call(self, request: Any, session: Any = None) -> dict | None:
        """One request object; None for a notification (a request without an id)."""
        if not isinstance(request, dict):
            return _response(None, error=RpcError(INVALID_REQUEST, "invalid request"))
        request_id = request.get("id")
        is_notification = "id" not in request
        if (
            request.get("jsonrpc") != "2.0"
            or not isinstance(request_id, str | int | None)
            or (isinstance(request_id, bool))
        ):
            return _response(None, error=RpcError(INVALID_REQUEST, "invalid request"))
        try:
            result = await self._invoke(request, session)
        except RpcError as exc:
            return None if is_notification else _response(request_id, error=exc)
        except Exception:
            log.exception("internal error in %s", request.get("method"))
            error = RpcError(INTERNAL_ERROR, "internal error")
            return None if is_notification else _response(request_id, error=error)
        return None if is_notification else _response(request_id, result)

    async def _invoke(self, request: dict, session: Any) -> Any:
        name = request.get("method")
        if not isinstance(name, str):
            raise RpcError(INVALID_REQUEST, "invalid request: method must be a string")
        params = request.get("params", [])
        if params is None:
            params = []
        if not isinstance(params, list):
            raise InvalidParams("non-array args")
        if session is not None and name in session.methods:
            method = session.methods[name]
        elif name in self.methods:
            method = self.methods[name]
        elif name in Subscriptions.METHODS:
            raise RpcError(METHOD_NOT_FOUND, "notifications not supported")
        else:
            raise RpcError(METHOD_NOT_FOUND, f"the method {name} does not exist/is not available")
        _check_arity(method, params)
        return await method(*params)

    async def handle_payload(self, body: bytes | str, session: Any = None) -> str | None:
        """A whole body, a single request or a batch, to the encoded answer (None: nothing to
        answer). Each response is encoded once; its size counts toward the batch limit."""
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            return _encode(_response(None, error=RpcError(PARSE_ERROR, "parse error")))
        if not isinstance(payload, list):
            response = await self.call(payload, session)
            return None if response is None else _encode(response)
        if not payload:
            return _encode(_response(None, error=RpcError(INVALID_REQUEST, "empty batch")))
        if len(payload) > MAX_BATCH_ITEMS:
            return _encode(_response(None, error=RpcError(INVALID_REQUEST, "batch too large")))
        encoded: list[str] = []
        size = 0
        for item in payload:
            response = await self.call(item, session)
            if response is None:
                continue
            text = _encode(response)
            size += len(text)
            if size > MAX_BATCH_RESPONSE_BYTES:
                error = RpcError(-32003, "response too large")
                text = _encode(_response(response.get("id"), error=error))
            encoded.append(text)
        return "[" + ",".join(encoded) + "]" if encoded else None


class RpcServer:
    def __init__(self, node: Node) -> None:
        self.node = node
        config = node.config
        self.host_allowlist = {h.lower() for h in config.host_allowlist}
        self.cors_origins = set(config.cors_origins)
        methods = EthApi(node).methods()
        methods.update(node.engine.rpc_methods())
        self.dispatcher = Dispatcher(methods)
        self.subscriptions = Subscriptions(node)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._guard])
        app.router.add_route("*", "/", self._handle)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        host = (request.host or "").rsplit(":", 1)[0].strip("[]").lower()
        if "*" not in self.host_allowlist and host not in self.host_allowlist:
            return web.Response(status=403, text="invalid host specified\n")
        origin = request.headers.get("Origin")
        if origin and "*" not in self.cors_origins and origin not in self.cors_origins:
            return web.Response(status=403, text="origin not allowed\n")
        response = await handler(request)
        if origin and not response.prepared:
            response.headers["Access-Control-Allow-Origin"] = origin
        return response

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request)
        if request.method == "OPTIONS":
            return web.Response(status=200)
        if request.method != "POST":
            return web.Response(status=405, text="method not allowed\n")
        if request.content_type not in JSON_CONTENT_TYPES:
            return web.Response(
                status=415, text="invalid content type, only application/json is supported\n"
            )
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            return web.Response(status=413, text="content length too large\n")
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.Response(status=413, text="content length too large\n")
        result = await self.dispatcher.handle_payload(body)
        if result is None:
            return web.Response(status=200)
        return web.Response(text=result, content_type="application/json")

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(max_msg_size=MAX_BODY_BYTES, heartbeat=30)
        await socket.prepare(request)
        outbox: asyncio.Queue[str] = asyncio.Queue(maxsize=WS_SEND_QUEUE)
        session = self.subscriptions.session(outbox)
        writer = asyncio.create_task(self._ws_writer(socket, outbox))
        try:
            async for message in socket:
                if message.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                    break  # CLOSE or ERROR; pings are answered by aiohttp itself
                result = await self.dispatcher.handle_payload(message.data, session)
                if result is not None and not session.enqueue(result):
                    break
                if session.overflowed:
                    break
        finally:
            session.close()
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
            await socket.close()
        return socket

    @staticmethod
    async def _ws_writer(socket: web.WebSocketResponse, outbox: asyncio.Queue[str]) -> None:
        while True:
            text = await outbox.get()
            await socket.send_str(text)

    async def start(self) -> None:
        config = self.node.config
        self._runner = web.AppRunner(self._app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, config.http_addr, config.http_port)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1] if sockets else config.http_port
        log.info("JSON-RPC on http://%s:%d (HTTP and WebSocket)", config.http_addr, self.port)

    async def stop(self) -> None:
        self.subscriptions.close_all()
        if self._runner is not None:
            await self._runner.cleanup()
