"""An honest, healthy, loaded cluster must not replace its honest primary because the
oldest request a backup waits for is "passed over" (issue 28's attacker review; it predated
the issue).

Pools hand out transactions in arrival order, and arrival order differs per pool: the first
transaction a backup received from its client reaches the primary after gossip, behind
everything the primary already holds (its own clients' transactions and earlier gossip).
In a burst the primary then commits many blocks before it gets to it; when every one of
them counted as passing it over, the backup's timer stopped restarting after
MAX_PASSED_OVER (8), ran out, and the backup asked for a view change (others joined): every
seed below changed view with reason request_timeout (so did the sweep's honest seeds 525 at
N = 9, 2286 at N = 4 and 5026 at N = 2). Now only a commit holding a request that arrived
here after the oldest one's fairness mark (a quarter of the request timeout later: it has
reached the primary by then) counts.
"""

from __future__ import annotations

import random

import pytest

from tests.simulation.cluster import Cluster
from tests.unit.pbft.helpers import tx_hashes


@pytest.mark.parametrize("seed", [0, 1])
def test_an_honest_burst_does_not_replace_the_primary(seed: int) -> None:
    cluster = Cluster(4, seed, gossip_delays=True)
    rng = random.Random(seed)
    txs = tx_hashes(600, f"burst {seed}")
    for tx in txs:
        cluster.submit(tx, to=rng.randrange(4))
    assert cluster.run_until(lambda: cluster.all_committed(txs), 120_000)
    cluster.check_safety()
    reasons = {node.index: dict(node.replica.view_change_reasons)
               for node in cluster.nodes if node.replica is not None}
    assert all(not r for r in reasons.values()), f"honest primary replaced: {reasons}"
