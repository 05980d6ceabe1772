"""The exception hierarchy of the spark_etl package: the CLI catches EtlError and prints its
message as one line."""

from __future__ import annotations

import re

_SPARK_FAILURE = re.compile(r"spark_etl\.errors\.(\w+): (.+)")


class EtlError(Exception):
    """Base class of every error the ETL reports to its user."""


class UsageError(EtlError):
    """The command was given arguments that cannot work (the CLI exits 2)."""


class RpcError(EtlError):
    """A node's JSON-RPC answered with an error, or could not be reached."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


class ExtractError(EtlError):
    """A block range or consensus record could not be fetched from a node (after retries)."""


class DataError(EtlError):
    """The exported data set is missing, incomplete or inconsistent with what was asked."""


_CLASSES: dict[str, type[EtlError]] = {
    cls.__name__: cls for cls in (EtlError, UsageError, ExtractError, DataError)
}


def from_spark_failure(failure: Exception) -> EtlError | None:
    """The ETL error a Spark task raised, recovered from the job failure that wraps it.

    Spark reports a failed Python task as a Java exception whose text carries the worker's
    traceback; its last `spark_etl.errors.Name: message` line is the error to show."""
    matches = _SPARK_FAILURE.findall(str(failure))
    if not matches:
        return None
    name, message = matches[-1]
    return _CLASSES.get(name, EtlError)(message.strip())
