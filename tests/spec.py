"""Validation of JSON-RPC results against the execution-apis OpenRPC schemas in shared/spec."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

EMPTY_ARRAY_AMBIGUOUS = {"eth_getLogs", "eth_getFilterChanges", "eth_getFilterLogs"}
SPEC_PATH = Path(__file__).resolve().parents[2] / "shared" / "spec" / "openrpc.json"


@cache
def _methods() -> dict[str, dict[str, Any]]:
    document = json.loads(SPEC_PATH.read_text())
    return {method["name"]: method for method in document["methods"]}


def has_schema(method: str) -> bool:
    return method in _methods()


def assert_valid_result(method: str, result: Any) -> None:
    """Fail unless `result` validates against `method`'s result schema (Draft 2020-12)."""
    if method in EMPTY_ARRAY_AMBIGUOUS and result == []:
        return  # [] matches two allowed shapes at once (shared/spec/README.md)
    schema = _methods()[method]["result"]["schema"]
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(result), key=lambda e: e.path)
    if errors:
        detail = "; ".join(f"{list(e.path)}: {e.message[:200]}" for e in errors[:5])
        raise AssertionError(f"{method} result does not match the spec schema: {detail}")
