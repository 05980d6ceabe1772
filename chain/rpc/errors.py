"""JSON-RPC errors with EIP-1474 and geth's codes."""

from __future__ import annotations

from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000
RESPONSE_TOO_LARGE = -32003  # geth: a batch's results over its size limit
LIMIT_EXCEEDED = -32005
EXECUTION_REVERTED = 3


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class InvalidParams(RpcError):
    def __init__(self, message: str) -> None:
        super().__init__(INVALID_PARAMS, message)


class ServerError(RpcError):
    def __init__(self, message: str) -> None:
        super().__init__(SERVER_ERROR, message)
