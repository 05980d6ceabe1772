"""Four PBFT validators as real processes on loopback: transactions sent to different nodes
commit, every node holds the same chain, and every block's commit certificate verifies."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from testkit.cluster import Cluster, rpc
from testkit.nodes import free_port, pbft_node, wait_for


def test_transactions_to_every_node_commit_everywhere(cluster: Cluster) -> None:
    sent = [cluster.transfer(via=index, sender=index) for index in range(4) for _ in range(3)]
    first = cluster.nodes[0].web3()
    receipts = [first.eth.wait_for_transaction_receipt(h, timeout=60) for h in sent]
    assert all(r.status == 1 for r in receipts)
    cluster.wait_heads([0, 1, 2, 3], max(r.blockNumber for r in receipts))
    for tx_hash, receipt in zip(sent, receipts, strict=True):
        for node in cluster.nodes[1:]:
            other = node.web3().eth.get_transaction_receipt(tx_hash)
            assert (other.blockHash, other.status, other.gasUsed) == (
                receipt.blockHash,
                receipt.status,
                receipt.gasUsed,
            )
    cluster.assert_consistent()


def test_status_and_validators(cluster: Cluster) -> None:
    statuses = [cluster.status(i) for i in range(4)]
    assert {s["view"] for s in statuses} == {0}
    assert {s["primary"] for s in statuses} == {cluster.nodes[0].node["address"].lower()}
    assert all(s["mode"] == "normal" for s in statuses)
    validators = [v.lower() for v in cluster.description["validators"]]
    assert [s["validator"] for s in statuses] == validators
    assert all(s["peers"] == 3 and s["checkpointInterval"] == 10 for s in statuses)
    assert all(s["misbehaviour"]["evidence"] == {} and s["misbehaviour"]["peerFaults"] == {}
               and "blocksRefused" in s["misbehaviour"] for s in statuses)
    assert rpc(cluster.nodes[1], "pbft_getValidators") == validators
    provider = cluster.nodes[2].web3().provider
    assert provider.make_request("pbft_getCommitCertificate", ["0xffffff"])["result"] is None
    bad = provider.make_request("pbft_getCommitCertificate", ["12"])
    assert bad["error"]["code"] == -32602
    assert rpc(cluster.nodes[2], "pbft_getEvidence") == []
    assert rpc(cluster.nodes[2], "pbft_getViewChanges", "0x0", "0x10") == []
    wide = provider.make_request("pbft_getCheckpoints", ["0x0", hex(10**6)])
    assert wide["error"]["code"] == -32602


def test_cluster_status_table(cluster: Cluster) -> None:
    """`pbft-node status --testnet DIR`: a row per validator, as a person on call reads it;
    a node that does not answer is a row saying so, and the exit status is 1."""
    cluster.wait_idle()  # no block (nor checkpoint) lands while the table and statuses are read
    table = pbft_node("status", "--testnet", str(cluster.directory)).stdout.splitlines()
    statuses = [cluster.status(i) for i in range(4)]
    assert table[0].split() == ["node", "role", "address", "head", "view", "primary", "h/H",
                                "stable", "executed", "mode", "peers"]
    rows = [line.split() for line in table[1:]]
    assert [r[:3] for r in rows] == [["node", str(i), "validator"] for i in range(4)]
    primary = cluster.description["validators"][0].lower()
    for row, validator, status in zip(rows, cluster.description["validators"], statuses,
                                      strict=True):
        assert row[3].startswith(validator.lower()[:8])  # the validator, shortened
        assert (row[5], row[6][:8], row[10], row[11]) == ("0", primary[:8], "normal", "3")
        # h/H: 0 until the earlier tests' blocks (and the empty ones after them) reach K = 10
        assert row[7] == f"{status['h']}/{status['H']}"
    gone = f"http://127.0.0.1:{free_port()}"
    urls = ",".join([cluster.nodes[1].rpc_url, gone])
    partial = pbft_node("status", "--rpc", urls, check=False)
    assert partial.returncode == 1
    name, reason = partial.stdout.splitlines()[2].split(None, 1)
    assert (name, reason.split(":")[0]) == (gone, "cannot reach http")


def test_cluster_status_watch_redraws_until_interrupted(cluster: Cluster) -> None:
    command = [sys.executable, "-m", "cli.node", "status", "--testnet", str(cluster.directory),
               "--watch", "0.2"]
    # SIGINT as a terminal sends it, even when this run inherited it ignored (a shell's
    # background job does), which Python would then never turn into KeyboardInterrupt
    watch = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        seen = ""

        def redrawn_twice() -> bool:
            nonlocal seen
            if select.select([watch.stdout], [], [], 0.5)[0]:
                seen += os.read(watch.stdout.fileno(), 65536).decode()
            return seen.count("\x1b[H\x1b[2J") >= 2 and seen.count("normal") >= 8

        wait_for(redrawn_twice, 30, "two frames of pbft-node status --watch")
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=30) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()


def test_prometheus_metrics(cluster: Cluster) -> None:
    height = cluster.commit(via=1, sender=5)
    cluster.wait_heads([0, 1, 2, 3], height)
    url = cluster.nodes[1].node["metrics_url"]
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        samples = {
            sample.name + repr(sorted(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.read().decode())
            for sample in family.samples
        }
    assert samples["chain_head_block[]"] >= height
    assert samples["pbft_view[]"] == 0
    assert samples["p2p_peers[]"] == 3
    assert samples["pbft_mode[('mode', 'normal')]"] == 1
    assert samples["pbft_messages_total[('direction', 'in'), ('type', 'commit')]"] >= 2 * height
    assert samples["pbft_messages_total[('direction', 'out'), ('type', 'prepare')]"] >= height
    assert samples["pbft_commit_latency_seconds_count[]"] >= 1
    assert samples["pbft_record_write_seconds_count[]"] >= 1  # group commits (issue 29)
    assert samples["chain_block_execution_seconds_count[('kind', 'validate')]"] >= 1
    assert "txpool_transactions[]" in samples
    assert samples["p2p_frames_total[('channel', 'engine'), ('direction', 'in')]"] > 0


METRIC_NAME = re.compile(r"\b(?:chain|txpool|p2p|pbft)_[a-z0-9_]+")
MODE_SELECTOR = re.compile(r'pbft_mode\{mode="([a-z-]+)"\}')


def test_the_monitoring_files_name_only_what_a_node_serves(cluster: Cluster) -> None:
    """testnet init's Prometheus configuration scrapes every node; every metric the alert
    rules and the Grafana dashboard query (and every pbft_mode they select) is on a live
    node's /metrics, so the dashboard cannot drift from the code; and every metric a rule
    reads has series before its first event (a counter whose series appears with its first
    event gives `increase()` nothing to increase from: the alert would miss that event)."""
    monitoring = cluster.directory / "monitoring"
    config = yaml.safe_load((monitoring / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = config["scrape_configs"]
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == [n.node["metrics_url"][len("http://"):-len("/metrics")]
                       for n in cluster.nodes]
    rules = yaml.safe_load((monitoring / "alerts.yml").read_text())["groups"][0]["rules"]
    dashboard = json.loads((monitoring / "grafana-dashboard.json").read_text())
    queries = [r["expr"] for r in rules] + [t["expr"] for panel in dashboard["panels"]
                                            for t in panel["targets"]]
    assert {r["alert"] for r in rules} >= {"PbftNoCommit", "PbftValidatorDown", "PbftHalted",
                                           "PbftValidatorMisbehaving"}
    with urllib.request.urlopen(cluster.nodes[1].node["metrics_url"], timeout=10) as reply:
        families = list(text_string_to_metric_families(reply.read().decode()))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    served = {f.name + suffix for f in families for suffix in ("", *suffixes.get(f.type, ()))}
    named = {name for query in queries for name in METRIC_NAME.findall(query)}
    assert len(named) >= 15 and named <= served, sorted(named - served)
    alerted = {name for rule in rules for name in METRIC_NAME.findall(rule["expr"])}
    with_series = {s.name for f in families for s in f.samples}
    assert "pbft_view_changes_total" in alerted and alerted <= with_series, sorted(
        alerted - with_series)
    modes = {s.labels["mode"] for f in families if f.name == "pbft_mode" for s in f.samples}
    selected = {mode for query in queries for mode in MODE_SELECTOR.findall(query)}
    assert selected and selected <= modes, sorted(selected - modes)


def test_promtool_accepts_the_configuration_the_rules_and_every_dashboard_query(
    cluster: Cluster, tmp_path: Path,
) -> None:
    """Prometheus's own checker (Debian's prometheus package; `make test` installs it): the
    scrape configuration with its rule file, and each dashboard query as a recording rule."""
    monitoring = cluster.directory / "monitoring"
    checked = subprocess.run(["promtool", "check", "config", "prometheus.yml"],
                             cwd=monitoring, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 8 rules found" in checked.stdout
    dashboard = json.loads((monitoring / "grafana-dashboard.json").read_text())
    rules = [{"record": f"dashboard:query{i}", "expr": target["expr"]}
             for i, target in enumerate(t for p in dashboard["panels"] for t in p["targets"])]
    queries = tmp_path / "queries.yml"
    queries.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(["promtool", "check", "rules", str(queries)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout
