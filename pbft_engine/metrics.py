"""The PBFT engine's Prometheus metrics, read from the replica when scraped: view, seqNo,
watermarks, mode, view changes, messages in and out by type, dropped messages by reason,
evidence held by accused validator and kind; counted here: blocks refused by reason and
catch-up peers that served false data; and commit latency, timed here from the moment this
replica first works on a block (builds it as primary or validates its PRE-PREPARE) until the
block is committed.

Every labelled counter an alert rule reads exists at zero from the start, for each label value
the code can produce (the validators are known from genesis), so `increase()` sees the first
event: a series that appears with its first event has no earlier sample to increase from."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from chain.metrics import CallbackCollector, labelled_counter
from pbft_engine.core import Mode, Replica
from pbft_engine.messages import MessageType

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
WRITE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
# Every reason the replica passes to _start_view_change / _count_view_change (a unit test
# reads them from the replica's source).
VIEW_CHANGE_REASONS = ("request_timeout", "new_view_timeout", "evidence", "invalid_block",
                       "join", "new_view", "override")
# Why this replica refused to vote for a proposed block: it does not decode or execute and
# its body is the one its header commits to (invalid: the proposer's fault), was not checked
# by the deadline the core gives a validation (timeout), the copy held is not the proposer's
# (false_copy), or could not be checked here at all (unavailable: says nothing about the
# proposer, so the misbehaviour alert leaves it out).
BLOCK_REFUSAL_REASONS = ("invalid", "timeout", "false_copy", "unavailable")
# What a catch-up peer served that proved false: bytes that are no block (undecodable),
# another block than the one asked for (wrong_block), a commit certificate that does not
# verify (bad_certificate), a certified block that does not execute to its hash
# (invalid_block), a body that does not match its header (false_copy).
PEER_FAULT_KINDS = ("undecodable", "wrong_block", "bad_certificate", "invalid_block",
                    "false_copy", "over_budget")


def _hex(address: bytes) -> str:
    return "0x" + address.hex()


def _kind(type_code: int) -> str:
    """The message type as pbft_messages_total names it (pre_prepare, view_change, ...)."""
    try:
        return MessageType(type_code).name.lower()
    except ValueError:
        return f"type_{type_code}"


class PbftMetrics:
    def __init__(self, registry: CollectorRegistry, replica: Callable[[], Replica | None]) -> None:
        self._replica = replica
        self._started: dict[int, float] = {}  # seqNo -> when this replica began on it
        self.blocks_refused: Counter[str] = Counter()  # by reason, since start
        self.peer_faults: Counter[tuple[str, ...]] = Counter()  # (0x peer, kind), since start
        self.budget_dropped: Counter[tuple[str, ...]] = Counter()  # (0x peer,), since start
        # Evidence counted by (accused, kind), recounted only when the replica holds more.
        self._evidence_counted: tuple[int, int] = (0, -1)  # (id of the replica, keys counted)
        self._evidence: Counter[tuple[str, ...]] = Counter()
        self.commit_latency = Histogram(
            "pbft_commit_latency_seconds",
            "From building or validating a block here to committing it",
            buckets=LATENCY_BUCKETS, registry=registry)
        # its count over the blocks committed: synced writes a block (issue 29's tail)
        self.record_writes = Histogram(
            "pbft_record_write_seconds",
            "One synced write of consensus records (the steps it covers, then the signing "
            "bound), on the writer thread",
            buckets=WRITE_BUCKETS, registry=registry)
        registry.register(CallbackCollector(self._collect))

    def block_started(self, seq_no: int) -> None:
        self._started.setdefault(seq_no, time.perf_counter())

    def block_committed(self, seq_no: int) -> None:
        started = self._started.pop(seq_no, None)
        if started is not None:
            self.commit_latency.observe(time.perf_counter() - started)
        self._started = {n: t for n, t in self._started.items() if n > seq_no}

    def block_refused(self, reason: str) -> None:
        """This replica refused to vote for a proposed block, for `reason` (one of
        BLOCK_REFUSAL_REASONS; another is counted too, but exists only once it happened)."""
        self.blocks_refused[reason] += 1

    def peer_fault(self, peer: bytes, kind: str) -> None:
        """A catch-up peer served data that proved false, of `kind` (one of
        PEER_FAULT_KINDS; another is counted too, but exists only once it happened)."""
        self.peer_faults[(_hex(peer), kind)] += 1

    def peer_dropped(self, peer: bytes) -> None:
        """A message of a peer that had used up its budget (`peer_budget`) was dropped."""
        self.budget_dropped[(_hex(peer),)] += 1

    def evidence_counts(self) -> Counter[tuple[str, ...]]:
        """Evidence this replica holds (stored, so it survives a restart), by (0x accused
        validator, message type); evidence is never deleted, so the counts only grow."""
        replica = self._replica()
        if replica is None:
            return Counter()
        if self._evidence_counted != (id(replica), len(replica.evidence)):
            validators = replica.params.validators
            counts: Counter[tuple[str, ...]] = Counter()
            for key in replica.evidence:  # replica (u16) || type || view || seqNo
                index = int.from_bytes(key[:2], "big")
                accused = _hex(validators[index]) if index < len(validators) else f"#{index}"
                counts[(accused, _kind(key[2]))] += 1
            self._evidence = counts
            self._evidence_counted = (id(replica), len(replica.evidence))
        return self._evidence

    def misbehaviour(self) -> dict[str, Any]:
        """pbft_status's `misbehaviour`: the non-zero counts only. Evidence by accused
        validator and message type (as pbft_getEvidence names it: pre-prepare, prepare, ...),
        blocks refused by reason and catch-up peer faults by peer and kind since start."""
        evidence: dict[str, dict[str, int]] = {}
        for (accused, kind), n in sorted(self.evidence_counts().items()):
            evidence.setdefault(accused, {})[kind.replace("_", "-")] = n
        faults: dict[str, dict[str, int]] = {}
        for (peer, kind), n in sorted(self.peer_faults.items()):
            faults.setdefault(peer, {})[kind] = n
        return {
            "evidence": evidence,
            "blocksRefused": {r: n for r, n in sorted(self.blocks_refused.items()) if n},
            "peerFaults": faults,
        }

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
        validators = [_hex(v) for v in replica.params.validators]
        view_changes: dict[tuple[str, ...], float] = {(r,): 0 for r in VIEW_CHANGE_REASONS}
        view_changes.update({(r,): n for r, n in replica.view_change_reasons.items()})
        refused: dict[tuple[str, ...], float] = {(r,): 0 for r in BLOCK_REFUSAL_REASONS}
        refused.update({(r,): n for r, n in self.blocks_refused.items()})
        evidence: dict[tuple[str, ...], float] = {
            (v, _kind(t)): 0 for v in validators for t in MessageType}
        evidence.update(self.evidence_counts())
        faults: dict[tuple[str, ...], float] = {
            (v, k): 0 for v in validators for k in PEER_FAULT_KINDS}
        faults.update(self.peer_faults)
        families += [
            labelled_counter("pbft_view_changes",
                             "View changes this replica made since it started, by reason",
                             ["reason"], view_changes),
            labelled_counter("pbft_messages", "Consensus messages by direction and type",
                             ["direction", "type"], messages),
            labelled_counter("pbft_dropped_messages", "Consensus messages dropped, by reason",
                             ["reason"], {(r,): n for r, n in replica.dropped.items()}),
            labelled_counter("pbft_blocks_refused",
                             "Proposed blocks this replica refused to vote for since it "
                             "started, by reason", ["reason"], refused),
            labelled_counter("pbft_evidence",
                             "Evidence of misbehaviour this replica holds, by accused "
                             "validator and message type", ["accused", "kind"], evidence),
            labelled_counter("pbft_peer_faults",
                             "Peers that served data that proved false, or used up their "
                             "budget of message handling, since this replica started, by "
                             "peer and kind", ["peer", "kind"], faults),
            labelled_counter("pbft_budget_dropped_messages",
                             "Messages dropped because their sender had used up its budget "
                             "of message handling, by peer", ["peer"],
                             {(v,): 0 for v in validators} | dict(self.budget_dropped)),
        ]
        return families
