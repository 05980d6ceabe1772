"""The misbehaviour alert, run by Prometheus's own rule tester (`promtool test rules`; Debian's
prometheus package, which `make tools` installs): it fires on the first piece of evidence,
refused block or false catch-up answer, naming the validator, since every such series
exists at zero from the start; a block that could not be checked here blames nobody."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cli.monitoring import alerts_file

ACCUSED = "0x00000000000000000000000000000000000000aa"
PEER = "0x00000000000000000000000000000000000000bb"
ALERT = "PbftValidatorMisbehaving"


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    selector = ",".join(f'{k}="{v}"' for k, v in {"node": "node1", **labels}.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


def test_the_misbehaviour_alert_fires_on_the_first_event_and_names_whom(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (make tools)")
    (tmp_path / "alerts.yml").write_text(alerts_file(4))
    see = ": see pbft_status misbehaviour and pbft_getEvidence"
    expected = [
        ({"accused": ACCUSED, "kind": "pre_prepare"},
         f"node1: validator {ACCUSED} signed conflicting or forbidden pre_prepare messages"),
        ({"peer": PEER, "kind": "bad_certificate"},
         f"node1: catch-up peer {PEER} served false data (bad_certificate)"),
        ({"reason": "invalid"}, "node1: refused a proposed block (invalid; the log names the "
                                "primary)"),
    ]
    tests = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            # At zero from the start, then the first event at minute 3.
            "input_series": [
                _series("pbft_evidence_total", "0 0 0 1 1", accused=ACCUSED, kind="pre_prepare"),
                _series("pbft_evidence_total", "0 0 0 0 0", accused=PEER, kind="pre_prepare"),
                _series("pbft_peer_faults_total", "0 0 0 1 1", peer=PEER, kind="bad_certificate"),
                _series("pbft_blocks_refused_total", "0 0 0 1 1", reason="invalid"),
                _series("pbft_blocks_refused_total", "0 0 0 5 5", reason="unavailable"),
                # A series that appears with its first event: increase() has nothing before
                # it, so no alert (why every series must exist at zero from the start).
                _series("pbft_evidence_total", "_ _ _ 1 1", accused=PEER, kind="commit"),
            ],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": ALERT, "exp_alerts": []},
                {"eval_time": "4m", "alertname": ALERT, "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "node": "node1", **labels},
                     "exp_annotations": {"summary": summary + see}}
                    for labels, summary in expected]},
            ],
        }],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    checked = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr + json.dumps(tests)
