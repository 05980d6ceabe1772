"""Log criteria and matching, and the installed filters of eth_newFilter/eth_newBlockFilter.

Criteria are bounded as geth bounds them: at most `MAX_ADDRESSES` addresses, `MAX_TOPICS`
topic positions and `MAX_TOPIC_ALTERNATIVES` topics in a position, checked before any is
parsed. Filters are bounded: at most `MAX_FILTERS` installed, at most `MAX_PENDING` unread
changes each (the oldest are dropped), and a filter not polled for `FILTER_TIMEOUT` seconds is
removed, as geth does. Installed filters are matched against each committed block on a thread
of their own (`FilterManager`), never on the event loop, which carries consensus.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from eth.abc import BlockHeaderAPI
from eth_bloom.bloom import get_bloom_bits

from chain.read_store import TxRecord
from chain.rpc.errors import InvalidParams, RpcError, ServerError
from chain.rpc.formatters import log_json
from chain.rpc.hexcodec import data, parse_address, parse_hash

log = logging.getLogger(__name__)

MAX_FILTERS = 1_000
MAX_PENDING = 10_000
FILTER_TIMEOUT = 300.0
MAX_TOPICS = 4  # geth's maxTopics: LOG0 to LOG4
MAX_ADDRESSES = 1_000  # geth's maxAddresses
MAX_TOPIC_ALTERNATIVES = 1_000  # geth's maxSubTopics: the topics one position may take


def _bounded(values: list[Any], most: int, what: str) -> list[Any]:
    """`values`, refused before any is parsed when there are more than `most`."""
    if len(values) > most:
        raise InvalidParams(f"invalid argument: {len(values)} {what}, at most {most} per "
                            "query: split it into several")
    return values


def _bloom_mask(value: bytes) -> int:
    mask = 0
    for bit in get_bloom_bits(value):
        mask |= bit
    return mask


@dataclass(frozen=True)
class LogCriteria:
    addresses: frozenset[bytes] = frozenset()
    topics: tuple[frozenset[bytes] | None, ...] = ()  # per position: any of these, None = any

    @classmethod
    def parse(cls, query: dict[str, Any]) -> LogCriteria:
        address = query.get("address")
        if address is None:
            addresses: frozenset[bytes] = frozenset()
        elif isinstance(address, list):
            addresses = frozenset(parse_address(a, "address")
                                  for a in _bounded(address, MAX_ADDRESSES, "addresses"))
        else:
            addresses = frozenset((parse_address(address, "address"),))
        topics = query.get("topics") or []
        if not isinstance(topics, list):
            raise InvalidParams("invalid argument: topics must be an array")
        if len(topics) > MAX_TOPICS:
            raise InvalidParams("invalid argument: too many topics (at most 4)")
        return cls(addresses, tuple(cls._parse_position(t) for t in topics))

    @staticmethod
    def _parse_position(position: Any) -> frozenset[bytes] | None:
        if position is None:
            return None
        if isinstance(position, list):
            alternatives = _bounded(position, MAX_TOPIC_ALTERNATIVES, "topics in one position")
            return frozenset(parse_hash(t, "topic") for t in alternatives) or None
        return frozenset((parse_hash(position, "topic"),))

    @cached_property
    def _bloom_masks(self) -> tuple[tuple[int, ...], ...]:
        """Per group of `bloom_groups`, each value's three bloom bits (hashed once)."""
        return tuple(tuple(_bloom_mask(v) for v in group) for group in self.bloom_groups())

    def may_match_bloom(self, bloom: int) -> bool:
        return all(any(bloom & mask == mask for mask in group) for group in self._bloom_masks)

    def bloom_groups(self) -> list[tuple[bytes, ...]]:
        """What a block's bloom must hold: one value of every group."""
        groups = [tuple(self.addresses)] if self.addresses else []
        return groups + [tuple(position) for position in self.topics if position is not None]

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
        for offset, stored in enumerate(record.logs):
            if criteria.matches(stored.address, stored.topics):
                yield log_json(stored, header, record, tx_index, offset)


class BlockLogs:
    """One block's logs, matched against many criteria: each log is formatted once, the same
    object for every filter it matches, and indexed by address and by topic, so that one
    criteria's matches cost set operations over the block's distinct values, not a pass over
    its logs."""

    def __init__(self, header: BlockHeaderAPI, records: Sequence[TxRecord]) -> None:
        self._header = header
        self._logs = [(record, tx_index, offset)
                      for tx_index, record in enumerate(records)
                      for offset in range(len(record.logs))]
        self._formatted: dict[int, dict[str, Any]] = {}
        self._by_address: dict[bytes, set[int]] = {}
        self._by_topic: list[dict[bytes, set[int]]] = [{} for _ in range(MAX_TOPICS)]
        self._with_topics: list[set[int]] = [set() for _ in range(MAX_TOPICS + 1)]
        for index, (record, _, offset) in enumerate(self._logs):
            stored = record.logs[offset]
            self._by_address.setdefault(stored.address, set()).add(index)
            for position, topic in enumerate(stored.topics[:MAX_TOPICS]):
                self._by_topic[position].setdefault(topic, set()).add(index)
                self._with_topics[position + 1].add(index)

    def matching(self, criteria: LogCriteria) -> list[dict[str, Any]]:
        selected = self._selected(criteria)
        indices = range(len(self._logs)) if selected is None else sorted(selected)
        return [self._json(i) for i in indices]

    def _selected(self, criteria: LogCriteria) -> set[int] | None:
        """The indices of the logs that match (None: every log)."""
        groups = [(self._by_address, criteria.addresses)] if criteria.addresses else []
        groups += [(self._by_topic[position], wanted)
                   for position, wanted in enumerate(criteria.topics) if wanted is not None]
        selected = self._with_topics[len(criteria.topics)] if criteria.topics else None
        for index, wanted in sorted(groups, key=lambda group: len(group[1])):  # narrowest first
            found = set().union(*map(index.__getitem__, index.keys() & wanted))
            selected = found if selected is None else selected & found
            if not selected:
                break
        return selected

    def _json(self, index: int) -> dict[str, Any]:
        formatted = self._formatted.get(index)
        if formatted is None:
            record, tx_index, offset = self._logs[index]
            formatted = log_json(record.logs[offset], self._header, record, tx_index, offset)
            self._formatted[index] = formatted
        return formatted


@dataclass
class InstalledFilter:
    kind: str  # "logs" or "blocks"
    criteria: LogCriteria | None
    query: dict[str, Any]
    changes: deque[Any] = field(default_factory=lambda: deque(maxlen=MAX_PENDING))
    last_poll: float = field(default_factory=time.monotonic)


class FilterManager:
    """The installed filters. Each committed block is matched against them on the matcher
    thread, in commit order (`on_block` only hands the block over), filters with equal
    criteria once; a poll first waits for the blocks committed before it to be matched, so a
    client that has seen a block (or a receipt in it) finds its logs."""

    def __init__(self) -> None:
        self._filters: dict[str, InstalledFilter] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the filters' changes, shared with the matcher thread
        self._matcher = ThreadPoolExecutor(1, thread_name_prefix="rpc-filters")
        self._matched: Future[None] | None = None  # the last block handed over

    def _new_id(self) -> str:
        return hex((next(self._ids) << 64) | secrets.randbits(64))

    def install(
        self, kind: str, criteria: LogCriteria | None, query: dict[str, Any] | None = None
    ) -> str:
        self.expire()
        if len(self._filters) >= MAX_FILTERS:
            raise RpcError(-32005, f"too many filters installed (limit {MAX_FILTERS}): "
                                   "uninstall some, or use eth_getLogs")
        filter_id = self._new_id()
        self._filters[filter_id] = InstalledFilter(kind, criteria, query or {})
        return filter_id

    def get(self, filter_id: str) -> InstalledFilter:
        installed = self._filters.get(filter_id) if isinstance(filter_id, str) else None
        if installed is None:
            raise ServerError("filter not found")
        installed.last_poll = time.monotonic()
        return installed

    async def take_changes(self, filter_id: str) -> list[Any]:
        installed = self.get(filter_id)
        if self._matched is not None:
            await asyncio.wrap_future(self._matched)
        with self._lock:
            changes = list(installed.changes)
            installed.changes.clear()
        return changes

    def close(self) -> None:
        """On stop: the matcher thread ends once the block it holds is matched."""
        self._matcher.shutdown(wait=True, cancel_futures=True)

    def uninstall(self, filter_id: str) -> bool:
        if not isinstance(filter_id, str):
            raise InvalidParams("invalid argument 0: filter id must be a string")
        return self._filters.pop(filter_id, None) is not None

    def expire(self) -> None:
        deadline = time.monotonic() - FILTER_TIMEOUT
        for filter_id in [k for k, f in self._filters.items() if f.last_poll < deadline]:
            del self._filters[filter_id]

    def on_block(self, header: BlockHeaderAPI, records: Sequence[TxRecord]) -> None:
        """On the event loop: the filters installed now get this block's changes."""
        if self._filters:
            installed = list(self._filters.values())
            self._matched = self._matcher.submit(self._match, installed, header, records)

    def _match(self, installed: list[InstalledFilter], header: BlockHeaderAPI,
               records: Sequence[TxRecord]) -> None:
        try:
            block = BlockLogs(header, records)
            found: dict[LogCriteria | None, list[Any]] = {None: [data(header.hash)]}
            for one in installed:
                changes = found.get(one.criteria)
                if changes is None:
                    changes = found[one.criteria] = block.matching(one.criteria)
                with self._lock:
                    one.changes.extend(changes)
        except Exception:  # a bug here must not stop the next blocks' matching
            log.exception("matching block %d against the filters failed", header.block_number)
