"""What `testnet init` writes into DIR/monitoring for an operator: a Prometheus scrape
configuration of the testnet's nodes, alert rules, and a Grafana dashboard (JSON, imported
as is: Dashboards > New > Import, then pick the Prometheus data source).

Every metric a query or a rule names is one a node serves at `/metrics`; an integration test
checks that against a live testnet, so the dashboard cannot drift from the code. The YAML is
written by hand (JSON strings are valid YAML scalars), so no YAML library is needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

JOB = "pbft-chain"
DASHBOARD_UID = "pbft-chain-cluster"
SCRAPE_INTERVAL = "5s"
# PromQL shared by the alerts and the dashboard
COMMIT_LATENCY = ("histogram_quantile({q}, sum by (le, node) "
                  "(rate(pbft_commit_latency_seconds_bucket[5m])))")
# Misbehaviour a replica saw in the last 5 minutes, naming whom: evidence against a validator
# (label accused; the target's own label `validator` is the node that reports it), a block
# it refused to vote for (not those it could not check: reason unavailable blames nobody),
# a catch-up peer that served false data (label peer). Every series exists at zero from the
# start, so the first event is an increase.
EVIDENCE = "increase(pbft_evidence_total[5m])"
REFUSED = 'increase(pbft_blocks_refused_total{reason!="unavailable"}[5m])'
PEER_FAULTS = "increase(pbft_peer_faults_total[5m])"
MISBEHAVIOUR = f"{EVIDENCE} > 0 or {REFUSED} > 0 or {PEER_FAULTS} > 0"


def alert_rules(validators: int) -> list[dict[str, str]]:
    """The rules: what an operator on call must look at, with how long before it fires."""
    return [
        {"alert": "PbftNoCommit", "for": "1m", "severity": "critical",
         "expr": "delta(chain_head_block[2m]) == 0 and txpool_executable > 0",
         "summary": "{{ $labels.node }}: no block committed for 2 minutes while executable "
                    "transactions wait"},
        {"alert": "PbftViewChurn", "for": "0m", "severity": "warning",
         "expr": "sum by (node) (increase(pbft_view_changes_total[10m])) > 3",
         "summary": "{{ $labels.node }}: more than 3 view changes in 10 minutes"},
        {"alert": "PbftValidatorDown", "for": "1m", "severity": "critical",
         "expr": f'up{{job="{JOB}"}} == 0',
         "summary": "{{ $labels.node }} does not answer its metrics scrape"},
        {"alert": "PbftStuckCatchingUp", "for": "5m", "severity": "warning",
         "expr": 'pbft_mode{mode="catching-up"} == 1',
         "summary": "{{ $labels.node }} has been catching up for 5 minutes"},
        {"alert": "PbftFollowingTooLong", "for": "30m", "severity": "warning",
         "expr": 'pbft_mode{mode="following"} == 1',
         "summary": "{{ $labels.node }} lost its consensus records and still only follows"},
        {"alert": "PbftHalted", "for": "0m", "severity": "critical",
         "expr": 'pbft_mode{mode="halted"} == 1',
         "summary": "{{ $labels.node }} halted on an alarm: read its log"},
        {"alert": "PbftPeersLow", "for": "2m", "severity": "warning",
         "expr": f"p2p_peers < {validators - 1}",
         "summary": f"{{{{ $labels.node }}}} is connected to fewer than {validators - 1} "
                    "validators"},
        {"alert": "PbftValidatorMisbehaving", "for": "0m", "severity": "warning",
         "expr": MISBEHAVIOUR,
         "summary": "{{ $labels.node }}: {{ if $labels.accused }}validator "
                    "{{ $labels.accused }} signed conflicting or forbidden {{ $labels.kind }} "
                    "messages{{ else if $labels.peer }}catch-up peer {{ $labels.peer }} served "
                    "false data ({{ $labels.kind }}){{ else }}refused a proposed block "
                    "({{ $labels.reason }}; the log names the primary){{ end }}: see "
                    "pbft_status misbehaviour and pbft_getEvidence"},
    ]


def prometheus_config(nodes: list[dict[str, Any]]) -> str:
    lines = [
        "# Prometheus for this testnet: prometheus --config.file=prometheus.yml",
        "global:",
        f"  scrape_interval: {SCRAPE_INTERVAL}",
        f"  evaluation_interval: {SCRAPE_INTERVAL}",
        "rule_files:",
        "  - alerts.yml",
        "scrape_configs:",
        f"  - job_name: {JOB}",
        "    static_configs:",
    ]
    for node in nodes:
        target = node["metrics_url"].removeprefix("http://").removesuffix("/metrics")
        lines += [
            f"      - targets: [{json.dumps(target)}]",
            "        labels:",
            f"          node: {json.dumps('node' + str(node['index']))}",
            f"          validator: {json.dumps(node['address'].lower())}",
        ]
    return "\n".join(lines) + "\n"


def alerts_file(validators: int) -> str:
    lines = ["groups:", f"  - name: {JOB}", "    rules:"]
    for rule in alert_rules(validators):
        lines += [
            f"      - alert: {rule['alert']}",
            f"        expr: {json.dumps(rule['expr'])}",
            f"        for: {rule['for']}",
            "        labels:",
            f"          severity: {rule['severity']}",
            "        annotations:",
            f"          summary: {json.dumps(rule['summary'])}",
        ]
    return "\n".join(lines) + "\n"


def _panel(index: int, title: str, targets: list[tuple[str, str]], unit: str = "short"
           ) -> dict[str, Any]:
    """A time series panel, two to a row."""
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
             "datasource": {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


PANELS: list[tuple[str, list[tuple[str, str]], str]] = [
    ("Head block", [("chain_head_block", "{{node}}")], "short"),
    ("Committed transactions per second",
     [("rate(chain_transactions_committed_total[1m])", "{{node}}")], "ops"),
    ("Commit latency (PRE-PREPARE to commit)",
     [(COMMIT_LATENCY.format(q="0.5"), "p50 {{node}}"),
      (COMMIT_LATENCY.format(q="0.99"), "p99 {{node}}")], "s"),
    ("View", [("pbft_view", "{{node}}")], "short"),
    ("View changes by reason (5 min)",
     [("sum by (node, reason) (increase(pbft_view_changes_total[5m]))",
       "{{node}} {{reason}}")], "short"),
    ("Mode per replica", [('max by (node, mode) (pbft_mode) == 1', "{{node}} {{mode}}")],
     "short"),
    ("Watermarks and stable checkpoint",
     [("pbft_low_watermark", "h {{node}}"), ("pbft_high_watermark", "H {{node}}"),
      ("pbft_stable_checkpoint", "stable {{node}}"),
      ("pbft_last_executed", "executed {{node}}")], "short"),
    ("Peers", [("p2p_peers", "{{node}}")], "short"),
    ("Pool", [("txpool_transactions", "pooled {{node}}"),
              ("txpool_executable", "executable {{node}}"),
              ("txpool_gossip_backlog", "gossip backlog {{node}}")], "short"),
    ("Dropped frames and messages per second",
     [("sum by (node, reason) (rate(p2p_dropped_frames_total[5m]))", "frames {{node}} {{reason}}"),
      ("sum by (node, reason) (rate(pbft_dropped_messages_total[5m]))",
       "messages {{node}} {{reason}}"),
      ("sum by (node) (rate(txpool_gossip_dropped_total[5m]))", "gossip {{node}}")], "ops"),
    ("Block execution time (p99)",
     [("histogram_quantile(0.99, sum by (le, node, kind) "
       "(rate(chain_block_execution_seconds_bucket[5m])))", "{{kind}} {{node}}")], "s"),
    ("Consensus messages per second",
     [("sum by (node, direction) (rate(pbft_messages_total[1m]))", "{{node}} {{direction}}")],
     "ops"),
    ("Evidence by accused validator and kind (5 min)",
     [(f"sum by (node, accused, kind) ({EVIDENCE})", "{{node}}: {{accused}} {{kind}}")],
     "short"),
    ("Blocks refused by reason (5 min)",
     [("sum by (node, reason) (increase(pbft_blocks_refused_total[5m]))",
       "{{node}} {{reason}}")], "short"),
    ("Catch-up peers that served false data (5 min)",
     [(f"sum by (node, peer, kind) ({PEER_FAULTS})", "{{node}}: {{peer}} {{kind}}")],
     "short"),
]


def grafana_dashboard() -> dict[str, Any]:
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "uid": DASHBOARD_UID,
        "title": "pbft-chain cluster",
        "tags": ["pbft-chain", "pbft"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "panels": [_panel(i, title, targets, unit)
                   for i, (title, targets, unit) in enumerate(PANELS)],
    }


def write_monitoring(directory: Path, nodes: list[dict[str, Any]]) -> Path:
    """DIR/monitoring/{prometheus.yml, alerts.yml, grafana-dashboard.json}."""
    monitoring = directory / "monitoring"
    monitoring.mkdir(exist_ok=True)
    (monitoring / "prometheus.yml").write_text(prometheus_config(nodes))
    (monitoring / "alerts.yml").write_text(alerts_file(len(nodes)))
    (monitoring / "grafana-dashboard.json").write_text(
        json.dumps(grafana_dashboard(), indent=2) + "\n")
    return monitoring
