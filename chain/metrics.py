"""Prometheus metrics of a node, served on their own port (`--metrics.port`, like geth's
`--metrics.addr/--metrics.port`). One registry per node; an engine adds its own collector
(`EngineContext.metrics`). Values that already live elsewhere (pool size, peers, transport
counters) are read when scraped instead of being copied on every change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

EXECUTION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class CallbackCollector(Collector):
    """Metric families computed at scrape time by `collect`."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Metric]:
        yield from self._collect()


def labelled_counter(
    name: str, documentation: str, labels: list[str], values: Mapping[tuple[str, ...], float]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for label_values, value in sorted(values.items()):
        family.add_metric(list(label_values), value)
    return family


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.head_block = Gauge("chain_head_block", "Number of the canonical head block",
                                registry=self.registry)
        self.pool_size = Gauge("txpool_transactions", "Transactions in the pool",
                               registry=self.registry)
        self.peers = Gauge("p2p_peers",
                           "Validators connected now (an observer's: every peer it dials)",
                           registry=self.registry)
        self.executable = Gauge("txpool_executable",
                                "Pool transactions the next block could include (up to 1,000)",
                                registry=self.registry)
        self.transactions_committed = Counter("chain_transactions_committed",
                                              "Transactions in committed blocks",
                                              registry=self.registry)
        self.gossip_backlog = Gauge("txpool_gossip_backlog",
                                    "Gossiped transactions waiting for admission",
                                    registry=self.registry)
        self.gossip_dropped = Counter("txpool_gossip_dropped",
                                      "Gossiped transactions dropped: the backlog was full",
                                      registry=self.registry)
        self.gossip_backlog_bytes = Gauge("txpool_gossip_backlog_bytes",
                                          "Bytes of gossiped transactions waiting for admission",
                                          registry=self.registry)
        self.gossip_refused = Counter("txpool_gossip_refused",
                                      "Gossiped transactions this pool refused (undecodable, "
                                      "underpriced, behind too many gapped ones, ...)",
                                      registry=self.registry)
        self.pool_queued = Gauge("txpool_queued",
                                 "Pool transactions behind a nonce gap (geth's queued)",
                                 registry=self.registry)
        self.block_execution = Histogram(
            "chain_block_execution_seconds", "Time to execute a block, by what it was for",
            ["kind"], buckets=EXECUTION_BUCKETS, registry=self.registry)
        self.websocket_disconnects = Counter(
            "rpc_websocket_disconnects", "WebSocket clients the node cut, by reason",
            ["reason"], registry=self.registry)
        self.http_disconnects = Counter(
            "rpc_http_disconnects", "HTTP clients the node cut: an answer not taken within the "
            "read timeout", registry=self.registry)
        self.websocket_outbox_bytes = Gauge(
            "rpc_websocket_outbox_bytes", "Bytes queued for WebSocket clients",
            registry=self.registry)

    @contextmanager
    def timing(self, kind: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.block_execution.labels(kind).observe(time.perf_counter() - started)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """GET /metrics in the Prometheus text format; nothing else."""

    def __init__(self, metrics: NodeMetrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _serve(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})
