"""Log criteria and matching, and the installed filters of eth_newFilter/eth_newBlockFilter.

Filters are bounded: at most `MAX_FILTERS` installed, at most `MAX_PENDING` unread changes
each (the oldest are dropped), and a filter not polled for `FILTER_TIMEOUT` seconds is removed,
as geth does.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from eth.abc import BlockHeaderAPI
from eth_bloom import BloomFilter

from chain.read_store import TxRecord
from chain.rpc.errors import InvalidParams, RpcError, ServerError
from chain.rpc.formatters import log_json
from chain.rpc.hexcodec import parse_address, parse_hash

MAX_FILTERS = 1_000
MAX_PENDING = 10_000
FILTER_TIMEOUT = 300.0
MAX_TOPICS = 4


@dataclass(frozen=True)
class LogCriteria:
    addresses: tuple[bytes, ...] = ()
    topics: tuple[tuple[bytes, ...] | None, ...] = ()  # per position: any of these, None = any

    @classmethod
    def parse(cls, query: dict[str, Any]) -> LogCriteria:
        address = query.get("address")
        if address is None:
            addresses: tuple[bytes, ...] = ()
        elif isinstance(address, list):
            addresses = tuple(parse_address(a, "address") for a in address)
        else:
            addresses = (parse_address(address, "address"),)
        topics = query.get("topics") or []
        if not isinstance(topics, list):
            raise InvalidParams("invalid argument: topics must be an array")
        if len(topics) > MAX_TOPICS:
            raise InvalidParams("invalid argument: too many topics (at most 4)")
        return cls(addresses, tuple(cls._parse_position(t) for t in topics))

    @staticmethod
    def _parse_position(position: Any) -> tuple[bytes, ...] | None:
        if position is None:
            return None
        if isinstance(position, list):
            return tuple(parse_hash(t, "topic") for t in position) or None
        return (parse_hash(position, "topic"),)

    def may_match_bloom(self, bloom: int) -> bool:
        bloom_filter = BloomFilter(bloom)
        if self.addresses and not any(a in bloom_filter for a in self.addresses):
            return False
        return all(
            position is None or any(topic in bloom_filter for topic in position)
            for position in self.topics
        )

    def bloom_groups(self) -> list[tuple[bytes, ...]]:
        """What a block's bloom must hold: one value of every group."""
        groups = [self.addresses] if self.addresses else []
        return groups + [position for position in self.topics if position is not None]

    def matches(self, address: bytes, topics: Sequence[bytes]) -> bool:
        if self.addresses and address not in self.addresses:
            return False
        if len(self.topics) > len(topics):
            return False
        return all(
            wanted is None or topic in wanted
            for wanted, topic in zip(self.topics, topics, strict=False)
        )


def matching_logs(
    criteria: LogCriteria, header: BlockHeaderAPI, records: Sequence[TxRecord]
) -> Iterator[dict[str, Any]]:
    """The JSON logs of one block that match `criteria`."""
    if not criteria.may_match_bloom(header.bloom):
        return
    for tx_index, record in enumerate(records):
        for offset, log in enumerate(record.logs):
            if criteria.matches(log.address, log.topics):
                yield log_json(log, header, record, tx_index, offset)


@dataclass
class InstalledFilter:
    kind: str  # "logs" or "blocks"
    criteria: LogCriteria | None
    query: dict[str, Any]
    changes: deque[Any] = field(default_factory=lambda: deque(maxlen=MAX_PENDING))
    last_poll: float = field(default_factory=time.monotonic)


class FilterManager:
    def __init__(self) -> None:
        self._filters: dict[str, InstalledFilter] = {}
        self._ids = itertools.count(1)

    def _new_id(self) -> str:
        return hex((next(self._ids) << 64) | secrets.randbits(64))

    def install(
        self, kind: str, criteria: LogCriteria | None, query: dict[str, Any] | None = None
    ) -> str:
        self.expire()
        if len(self._filters) >= MAX_FILTERS:
            raise RpcError(-32005, f"too many filters installed (limit {MAX_FILTERS})")
        filter_id = self._new_id()
        self._filters[filter_id] = InstalledFilter(kind, criteria, query or {})
        return filter_id

    def get(self, filter_id: str) -> InstalledFilter:
        installed = self._filters.get(filter_id) if isinstance(filter_id, str) else None
        if installed is None:
            raise ServerError("filter not found")
        installed.last_poll = time.monotonic()
        return installed

    def take_changes(self, filter_id: str) -> list[Any]:
        installed = self.get(filter_id)
        changes = list(installed.changes)
        installed.changes.clear()
        return changes

    def uninstall(self, filter_id: str) -> bool:
        if not isinstance(filter_id, str):
            raise InvalidParams("invalid argument 0: filter id must be a string")
        return self._filters.pop(filter_id, None) is not None

    def expire(self) -> None:
        deadline = time.monotonic() - FILTER_TIMEOUT
        for filter_id in [k for k, f in self._filters.items() if f.last_poll < deadline]:
            del self._filters[filter_id]

    def on_block(self, header: BlockHeaderAPI, records: Sequence[TxRecord]) -> None:
        for installed in self._filters.values():
            if installed.kind == "blocks":
                installed.changes.append("0x" + header.hash.hex())
            elif installed.criteria is not None:
                installed.changes.extend(matching_logs(installed.criteria, header, records))
