"""kill -9 during block commit and during checkpoint garbage collection, many times.

A 4-validator testnet (checkpoint every 2 blocks, so the low watermark moves, and the stores
are range-deleted, every other block) runs under continuous load. One node at a time is
restarted as tests/integration/crashing_node.py, which SIGKILLs itself before, during or after
its n-th commit batch or watermark-moving batch. Each time, its data directory is checked
offline (chain head, consensus stores and certificates agree: tests/integration/datadir_check)
before the node restarts and rejoins; at the end every acknowledged transaction is committed
and all nodes hold the same certified chain.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.nodes import wait_for
from tests.integration import crashing_node
from tests.integration.datadir_check import check_datadir
from tests.soak import Load, settle_all

pytestmark = pytest.mark.integration

FLAGS = ("--checkpoint-interval", "2", "--log-multiplier", "2", "--request-timeout", "1")
CRASH_DEADLINE = 60.0
CRASHES = [(point, when) for when in crashing_node.WHENS for point in crashing_node.POINTS]


def _crash(cluster: Cluster, index: int, point: str, count: int, when: str) -> None:
    """Restart node `index` to die at its `count`-th `point` batch; wait for the SIGKILL."""
    node = cluster.nodes[index]
    assert cluster.stop(index) == 0
    argv = [sys.executable, crashing_node.__file__, point, str(count), when,
            *node.node["command"][3:]]  # the node's own arguments after `-m cli.node`
    with open(node.log_path, "ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=log)
    try:
        code = process.wait(timeout=CRASH_DEADLINE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"node {index} never reached {point} #{count}") from None
    assert code == -signal.SIGKILL, f"node {index} exited with {code}, not by its SIGKILL"


def _views(cluster: Cluster) -> set[tuple[int, str]]:
    return {(status["view"], status["mode"]) for status in map(cluster.status, range(4))}


def test_kill_during_commit_and_checkpoint_gc_leaves_a_consistent_database(
    tmp_path: Path,
) -> None:
    rng = random.Random(5)
    cluster = Cluster.create(tmp_path, 4, *FLAGS)
    cluster.start()
    load = Load(cluster, random.Random(6))
    generator = threading.Thread(target=load.run, daemon=True)
    generator.start()
    try:
        for round_, (point, when) in enumerate(CRASHES):
            index = round_ % 4
            load.down.add(index)
            _crash(cluster, index, point, rng.randint(1, 3), when)
            state = check_datadir(Path(cluster.nodes[index].node["datadir"]), index)
            assert state.head > 0
            cluster.start(index)
            load.down.discard(index)
            height = max(cluster.head(i) for i in range(4) if i != index)
            cluster.wait_heads([index], height, 60)  # it rejoins: catches up and goes on
        load.stop.set()
        generator.join(timeout=60)
        settle_all(cluster, load)
        assert len(load.acknowledged) > 100
        assert load.committed == load.acknowledged
        cluster.assert_consistent()
        wait_for(lambda: _views(cluster) == {(cluster.status(0)["view"], "normal")}, 60,
                 "every node active in one view")
    finally:
        load.stop.set()
        cluster.close()
