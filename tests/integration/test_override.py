"""The override (genesis `config.pbft.transitions`), as real processes on `testnet init`'s
defaults: two of four validators are gone for good, so the chain halts (3 of 4 needed); the
operators restart the two survivors with a genesis whose override makes them the set from the
next block (`pbft-node init` on their data directories takes it: the same block 0), and the
chain goes on with them alone. A genesis that changes anything else is refused, and the
survivors agree on every block and certificate, each counted with its own epoch's set."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.cluster import Cluster, rpc
from testkit.nodes import wait_for


def init(genesis: Path, datadir: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.node", "init", "--genesis", str(genesis),
                           "--datadir", datadir], capture_output=True, text=True, timeout=60)


def test_the_survivors_restart_with_an_override_and_go_on_alone(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    net = Cluster.create(tmp_path_factory.mktemp("override"), 4)
    try:
        net.start()
        head = net.wait_idle(net.commit(via=0))
        for gone in (2, 3):
            net.stop(gone, signal.SIGKILL)
        net.transfer(via=0)  # it waits for a quorum that never comes
        with pytest.raises(AssertionError):  # 2 of 4: no quorum, the chain is halted
            wait_for(lambda: net.head(0) > head, 5, "a block without a quorum")
        for survivor in (0, 1):
            assert net.stop(survivor) == 0

        document = json.loads(Path(net.description["genesis"]).read_text())
        survivors = [net.description["nodes"][i]["address"] for i in (0, 1)]
        document["config"]["pbft"]["transitions"] = [
            {"block": head + 1, "validators": survivors}]
        overridden = net.directory / "genesis-override.json"
        overridden.write_text(json.dumps(document))
        other = json.loads(json.dumps(document))
        other["config"]["pbft"]["validators"] = survivors  # rewrites history: refused
        (net.directory / "genesis-other.json").write_text(json.dumps(other))
        refused = init(net.directory / "genesis-other.json",
                       net.description["nodes"][0]["datadir"])
        assert refused.returncode != 0 and "another genesis" in refused.stderr
        for survivor in (0, 1):
            applied = init(overridden, net.description["nodes"][survivor]["datadir"])
            assert applied.returncode == 0, applied.stderr

        net.start(0, 1)
        after = net.commit(via=1)
        assert after > head
        net.wait_heads([0, 1], after)
        first = rpc(net.nodes[0], "pbft_getCommitCertificate", hex(head + 1))
        assert first["epoch"] == "0x1"
        assert sorted(s.lower() for s in first["signers"]) == sorted(a.lower() for a in survivors)
        assert rpc(net.nodes[0], "pbft_getCommitCertificate", hex(head))["epoch"] == "0x0"
        assert rpc(net.nodes[1], "pbft_status")["epoch"] == 1
        assert "OVERRIDE" in (net.directory / "node0.log").read_text()
        hashes = {net.nodes[i].web3().eth.get_block(after).hash for i in (0, 1)}
        assert len(hashes) == 1
    finally:
        net.terminate()
