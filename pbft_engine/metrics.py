"""The PBFT engine's Prometheus metrics, read from the replica when scraped: view, seqNo,
watermarks, mode, view changes, messages in and out by type, dropped messages by reason; and
commit latency, timed here from the moment this replica first works on a block (builds it as
primary or validates its PRE-PREPARE) until the block is committed."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from chain.metrics import CallbackCollector, labelled_counter
from pbft_engine.core import Mode, Replica

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
class PbftMetrics:
    def __init__(self, registry: CollectorRegistry, replica: Callable[[], Replica | None]) -> None:
        self._replica = replica
        self._started: dict[int, float] = {}  # seqNo -> when this replica began on it
        self.commit_latency = Histogram(
            "pbft_commit_latency_seconds",
            "From building or validating a block here to committing it",
            buckets=LATENCY_BUCKETS, registry=registry)
        registry.register(CallbackCollector(self._collect))

    def block_started(self, seq_no: int) -> None:
        self._started.setdefault(seq_no, time.perf_counter())

    def block_committed(self, seq_no: int) -> None:
        started = self._started.pop(seq_no, None)
        if started is not None:
            self.commit_latency.observe(time.perf_counter() - started)
        self._started = {n: t for n, t in self._started.items() if n > seq_no}

    def _collect(self) -> list[Metric]:
        replica = self._replica()
        if replica is None:
            return []
        families: list[Metric] = []
        for name, documentation, value in (
            ("pbft_view", "Current view", replica.view),
            ("pbft_seq_no", "Highest seqNo assigned or accepted", replica.seq_no),
            ("pbft_low_watermark", "Low watermark h", replica.low_watermark),
            ("pbft_high_watermark", "High watermark H", replica.high_watermark),
            ("pbft_stable_checkpoint", "Last stable checkpoint", replica.stable_checkpoint),
            ("pbft_last_executed", "Last block executed", replica.last_exec),
        ):
            families.append(GaugeMetricFamily(name, documentation, value=value))
        mode = GaugeMetricFamily("pbft_mode", "1 for the replica's current mode", labels=["mode"])
        for each in Mode:
            mode.add_metric([each.value], float(replica.mode is each))
        families.append(mode)
        largest = GaugeMetricFamily(
            "pbft_largest_sent_message_bytes",
            "The largest consensus message this replica sent since it started, by type "
            "(a frame is capped at 16 MiB)", labels=["type"])
        for kind, size in replica.largest_sent.items():
            largest.add_metric([kind], size)
        families.append(largest)
        messages: dict[tuple[str, ...], float] = {
            ("in", t): n for t, n in replica.received.items()}
        messages.update({("out", t): n for t, n in replica.sent.items()})
        families += [
            labelled_counter("pbft_view_changes",
                             "View changes this replica made since it started, by reason",
                             ["reason"],
                             {(r,): n for r, n in replica.view_change_reasons.items()}),
            labelled_counter("pbft_messages", "Consensus messages by direction and type",
                             ["direction", "type"], messages),
            labelled_counter("pbft_dropped_messages", "Consensus messages dropped, by reason",
                             ["reason"], {(r,): n for r, n in replica.dropped.items()}),
        ]
        return families
