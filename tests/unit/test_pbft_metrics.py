"""Operators see misbehaviour (issue 28): the PBFT engine's counters of evidence by accused
validator and kind, refused blocks by reason and catch-up peer faults, pbft_status's
`misbehaviour`, and every labelled counter an alert rule reads existing at zero from the
start (a series that appears with its first event gives `increase()` nothing to increase
from, so an alert on it never fires for that first event)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from eth_hash.auto import keccak
from eth_keys import keys
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import chain.p2p
import pbft_engine.core.replica
from chain.metrics import CallbackCollector, NodeMetrics
from chain.node import Node
from chain.p2p import Transport
from chain.p2p.stats import DROP_REASONS, TransportStats
from cli.monitoring import alert_rules
from pbft_engine.core import ChainHead, Replica
from pbft_engine.messages import KeyVerifier, MessageType, Prepare
from pbft_engine.metrics import (
    BLOCK_REFUSAL_REASONS,
    PEER_FAULT_KINDS,
    VIEW_CHANGE_REASONS,
    PbftMetrics,
)
from tests.unit.pbft.helpers import GENESIS, PARAMS, SIGNERS, from_peer

ME = 2
VALIDATORS = ["0x" + v.hex() for v in PARAMS.validators]
KINDS = ["pre_prepare", "prepare", "commit", "checkpoint", "view_change", "new_view"]
METRIC_NAME = re.compile(r"\b(?:chain|txpool|p2p|pbft)_[a-z0-9_]+")


def start_replica() -> Replica:
    replica = Replica(PARAMS, ME, SIGNERS[ME], KeyVerifier(), ChainHead(0, GENESIS),
                      block_digest=keccak)
    replica.start()
    return replica


def samples(registry: CollectorRegistry) -> dict[str, dict[tuple[str, ...], float]]:
    """Sample name -> label values (ordered by label name, as exposed) -> value."""
    result: dict[str, dict[tuple[str, ...], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            result.setdefault(sample.name, {})[tuple(sample.labels.values())] = sample.value
    return result


def engine_metrics() -> tuple[Replica, PbftMetrics, CollectorRegistry]:
    replica = start_replica()
    registry = CollectorRegistry()
    return replica, PbftMetrics(registry, lambda: replica), registry


def test_a_fresh_replica_exposes_every_labelled_counter_an_alert_reads_at_zero() -> None:
    _, _, registry = engine_metrics()
    exposed = samples(registry)
    assert exposed["pbft_view_changes_total"] == {(r,): 0 for r in VIEW_CHANGE_REASONS}
    assert exposed["pbft_blocks_refused_total"] == {(r,): 0 for r in BLOCK_REFUSAL_REASONS}
    assert exposed["pbft_evidence_total"] == {(v, k): 0 for v in VALIDATORS for k in KINDS}
    assert exposed["pbft_peer_faults_total"] == {  # labels kind, peer
        (k, v): 0 for v in VALIDATORS for k in PEER_FAULT_KINDS}


def _literals(pattern: str, files: list[Path]) -> set[str]:
    return {m for path in files for m in re.findall(pattern, path.read_text(), re.MULTILINE)}


def test_the_view_change_reasons_are_every_reason_the_replica_counts() -> None:
    source = sorted(Path(pbft_engine.core.replica.__file__).parent.glob("*.py"))
    used = _literals(r'_(?:start|count)_view_change\(.*"(\w+)"\)\s*$', source)
    assert {"request_timeout", "evidence", "new_view", "override"} <= used <= set(
        VIEW_CHANGE_REASONS)


def test_the_transport_counts_every_drop_reason_from_zero() -> None:
    source = sorted(Path(chain.p2p.__file__).parent.glob("*.py"))
    used = _literals(r'_drop\("(\w+)"\)', source) | _literals(r'dropped\["(\w+)"\]', source)
    assert {"queue_full", "bad_frame"} <= used <= set(DROP_REASONS)
    assert TransportStats().snapshot()["dropped"] == dict.fromkeys(DROP_REASONS, 0)


def test_the_alert_rules_read_only_series_a_fresh_node_exposes() -> None:
    """A node's whole registry, built in-process as chain.node builds it (its metrics, the
    engine's collector, the transport's counters): every metric an alert rule names has
    samples before anything happened, and its counters are all at zero."""
    metrics = NodeMetrics()
    replica = start_replica()
    PbftMetrics(metrics.registry, lambda: replica)
    key = keys.PrivateKey(keccak(b"validator 2"))
    assert key.public_key.to_canonical_address() == PARAMS.validators[ME]
    peers = {v: ("127.0.0.1", 1) for v in PARAMS.validators if v != PARAMS.validators[ME]}
    transport = Transport(key, PARAMS.chain_id, peers, "127.0.0.1", 0, lambda *_: None)
    node = SimpleNamespace(transport=transport)
    metrics.registry.register(CallbackCollector(lambda: Node._transport_metrics(node)))  # type: ignore[arg-type]
    exposed = samples(metrics.registry)
    assert exposed["p2p_dropped_frames_total"] == {(r,): 0 for r in DROP_REASONS}
    named = {name for rule in alert_rules(4) for name in METRIC_NAME.findall(rule["expr"])}
    assert {"pbft_view_changes_total", "pbft_evidence_total", "pbft_blocks_refused_total",
            "pbft_peer_faults_total"} <= named
    assert named <= set(exposed), sorted(named - set(exposed))
    for name in named:
        assert exposed[name], f"{name} has no series yet"
        if name.endswith("_total"):
            assert set(exposed[name].values()) == {0}, name


def test_evidence_is_counted_by_accused_validator_and_kind() -> None:
    """Two different PREPAREs from validator 1 for one slot are evidence against it; a
    PREPARE from the primary breaks the rules: evidence against validator 0, and a view
    change for it."""
    replica, metrics, registry = engine_metrics()
    replica.step(from_peer(Prepare(0, 1, keccak(b"a block"), 1)))
    replica.step(from_peer(Prepare(0, 1, keccak(b"another block"), 1)))
    replica.step(from_peer(Prepare(0, 1, keccak(b"a block"), 0)))
    exposed = samples(registry)
    assert exposed["pbft_evidence_total"][(VALIDATORS[0], "prepare")] == 1
    assert exposed["pbft_evidence_total"][(VALIDATORS[1], "prepare")] == 1
    assert sum(exposed["pbft_evidence_total"].values()) == 2
    assert exposed["pbft_view_changes_total"][("evidence",)] == 1
    assert metrics.misbehaviour() == {
        "evidence": {VALIDATORS[0]: {"prepare": 1}, VALIDATORS[1]: {"prepare": 1}},
        "blocksRefused": {},
        "peerFaults": {},
    }


def test_evidence_loaded_at_start_and_new_evidence_recounted() -> None:
    replica, metrics, _ = engine_metrics()
    replica.evidence.add(bytes([0, 3, MessageType.PRE_PREPARE]) + bytes(16))
    assert metrics.misbehaviour()["evidence"] == {VALIDATORS[3]: {"pre-prepare": 1}}
    replica.evidence.add(bytes([0, 3, MessageType.CHECKPOINT]) + bytes(16))
    assert metrics.misbehaviour()["evidence"] == {
        VALIDATORS[3]: {"pre-prepare": 1, "checkpoint": 1}}


def test_refused_blocks_and_peer_faults_are_counted_by_label() -> None:
    _, metrics, registry = engine_metrics()
    metrics.block_refused("invalid")
    metrics.block_refused("invalid")
    metrics.block_refused("false_copy")
    metrics.peer_fault(PARAMS.validators[1], "bad_certificate")
    exposed = samples(registry)
    assert exposed["pbft_blocks_refused_total"] == {
        **{(r,): 0 for r in BLOCK_REFUSAL_REASONS}, ("invalid",): 2, ("false_copy",): 1}
    faults = exposed["pbft_peer_faults_total"]
    assert faults[("bad_certificate", VALIDATORS[1])] == 1 and sum(faults.values()) == 1
    assert metrics.misbehaviour() == {
        "evidence": {},
        "blocksRefused": {"false_copy": 1, "invalid": 2},
        "peerFaults": {VALIDATORS[1]: {"bad_certificate": 1}},
    }


def test_every_refusal_the_core_knows_is_a_reason_counted_from_zero() -> None:
    refusal = getattr(pbft_engine.core, "Refusal", None)
    if refusal is None:
        pytest.skip("no Refusal in pbft_engine.core")
    assert {r.value for r in refusal} <= set(BLOCK_REFUSAL_REASONS)
