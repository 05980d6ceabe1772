"""Checks run after a simulation: view changes, settled pools, commit latency bounds."""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable

from tests.simulation.cluster import Cluster, Node
from tests.simulation.workload import Workload


class LivenessFailure(AssertionError):
    pass


class InvariantFailure(AssertionError):
    pass


def view_change_report(cluster: Cluster) -> str:
    """Per honest node: how often its view went up, and the core's reasons."""
    parts = []
    for node in cluster.honest():
        reasons: Counter[str] = Counter()
        if node.replica is not None:
            reasons = node.replica.view_change_reasons
        parts.append(f"{node.index}: {node.view_changes} {dict(reasons)}")
    return "; ".join(parts)


def check_no_view_change(cluster: Cluster) -> None:
    """A correct primary on a healthy network is never replaced, at any load."""
    if any(node.view_changes for node in cluster.honest()):
        raise InvariantFailure(f"view changes in an honest cluster: {view_change_report(cluster)}"
                               f" (heights {cluster.heights()})")


CHURN_ROUNDS = 4  # settle-and-watch rounds, while stranded replicas may pull the others along


def check_no_churn(cluster: Cluster, nodes: list[Node], limit_ms: int, quiet_ms: int) -> None:
    """After healing, once these replicas agree (one view, one height, nothing executable
    waiting, nothing under way), their views stay put: no view change without a reason.

    The one reason left after healing: replicas stranded in a higher view they asked for
    alone while the network was faulty (at most f). PBFT lets no lone replica change the
    view, and one may not return to a view its VIEW-CHANGE left (that message's P set would
    go stale), so it waits, following the chain by catch-up. Once f+1 replicas ask (a
    byzantine one counts), the others join it, and may move on if that view's primary is
    faulty. So with stranded replicas the cluster gets a few more settle-and-watch rounds;
    anything else that keeps it from settling, or moves a settled view, fails."""
    f = cluster.epochs.schedule.epochs[-1].f  # (the last set's: the one that settles)

    def voting() -> list[Node] | None:
        """The replicas that settled, if the rest are stranded (None: not settled yet)."""
        if any(n.replica is None or n.busy for n in nodes):
            return None
        active = [n for n in nodes if n.replica is not None and n.replica.active]
        states = {(n.replica.view, n.replica.last_exec) for n in active if n.replica}
        if len(states) != 1 or any(n.replica.requests for n in active if n.replica):
            return None
        view = states.pop()[0]
        stranded = [n for n in nodes if n not in active]
        if len(stranded) > f or any(n.replica.view <= view for n in stranded if n.replica):
            return None
        return active

    for _ in range(CHURN_ROUNDS):
        if not cluster.run_until(lambda: voting() is not None, limit_ms):
            replicas = [n.replica for n in nodes if n.replica is not None]
            raise LivenessFailure(
                f"the healed cluster never settled in {limit_ms} ms: (view, active, height, "
                f"requests) {[(r.view, r.active, r.last_exec, len(r.requests)) for r in replicas]}")
        settled_nodes = voting() or []
        before = [node.view_changes for node in settled_nodes]
        reasons = [_reasons(node) for node in settled_nodes]
        cluster.run_for(quiet_ms)
        if [node.view_changes for node in settled_nodes] == before:
            return
        if len(settled_nodes) == len(nodes) and not _faulty_primary_replaced(
                settled_nodes, reasons):  # nobody was stranded: no reason to move
            break
    raise InvariantFailure(f"views changed on an idle, healed cluster: "
                           f"{view_change_report(cluster)}; views {cluster.views()}")


# Why a view changed that proves its primary faulty: a block that does not execute, or two
# signed messages that conflict (a replica joining the others' view follows them).
PRIMARY_FAULTS = frozenset({"invalid_block", "evidence"})


def _reasons(node: Node) -> Counter[str]:
    return Counter() if node.replica is None else Counter(node.replica.view_change_reasons)


def _faulty_primary_replaced(nodes: list[Node], before: list[Counter[str]]) -> bool:
    """Whether the views changed because the primary proved itself faulty: a byzantine
    primary may propose once the cluster is idle (the trailing empty block owed after a
    block with transactions, `Replica._arm_trailing_block`: simulator seed 291 at N = 5
    with the group-commit model at 3 ms), and is replaced then; that is no churn."""
    new = [_reasons(node) - old for node, old in zip(nodes, before, strict=True)]
    return any(set(r) & PRIMARY_FAULTS for r in new) and all(
        set(r) <= PRIMARY_FAULTS | {"join"} for r in new)


def settled(cluster: Cluster, nodes: list[Node] | None = None) -> bool:
    """Every honest node (of `nodes`) is up, idle, at the same height, and holds nothing
    executable: every transaction that became executable on one of them committed. A node
    outside the validator set (a spare, or removed) follows to that height."""
    nodes = cluster.honest() if nodes is None else nodes
    return (all(node.following or (node.up and not node.busy and not node.ready)
                for node in nodes)
            and len({len(node.chain.blocks) for node in nodes}) == 1)


def check_settles(cluster: Cluster, limit_ms: int, nodes: list[Node] | None = None) -> None:
    if not cluster.run_until(lambda: settled(cluster, nodes), limit_ms):
        waiting = {node.index: len(cluster.executable(node))
                   for node in (cluster.honest() if nodes is None else nodes)}
        raise LivenessFailure(f"not settled {limit_ms} ms after the last client action: "
                              f"heights {cluster.heights()}, views {cluster.views()}, "
                              f"executable left {waiting}; view changes "
                              f"{view_change_report(cluster)}")


def check_all_commit(cluster: Cluster, nodes: list[Node], limit_ms: int) -> None:
    """After healing, every transaction executable on one of these replicas commits on all of
    them: they end at one height with nothing executable left (also what only a replica
    stranded in a view it asked for alone holds)."""

    def left() -> dict[int, list[bytes]]:
        return {n.index: cluster.executable(n) for n in nodes}

    def done() -> bool:
        return (not any(left().values()) and not any(n.busy for n in nodes)
                and len({len(n.chain.blocks) for n in nodes}) == 1)

    if not cluster.run_until(done, limit_ms):
        waiting = {i: len(h) for i, h in left().items() if h}
        raise LivenessFailure(
            f"not every executable transaction committed {limit_ms} ms after healing: "
            f"executable left {waiting}, heights {cluster.heights()}, views "
            f"{cluster.views()}, active {[n.replica.active if n.replica else None for n in nodes]}")


def work_under_way(node: Node) -> list[str]:
    """What the replica waits for the adapter to finish: a build, a validation (in its view),
    a commit, a catch-up."""
    replica = node.replica
    if replica is None:
        return []
    work = [f"validating {seq_no}" for (view, seq_no), slot in replica.log.certs.items()
            if view == replica.view and slot.validating]
    if replica.executing is not None:
        work.append(f"executing {replica.executing}")
    if replica.building is not None:
        work.append(f"building {replica.building}")
    if replica.fetching is not None:
        work.append(f"fetching {replica.fetching}")
    return work


def check_idle(cluster: Cluster, limit_ms: int) -> None:
    """No honest replica ends waiting for ever on block work: once the load is over, every
    one that is up ends with nothing built, validated, executed or fetched (a validation
    whose answer was lost is given up by the core's VALIDATION deadline)."""
    nodes = [node for node in cluster.honest() if node.up]
    if not cluster.run_until(lambda: not any(work_under_way(n) for n in nodes), limit_ms):
        stuck = {n.index: (work_under_way(n), "executor busy" if n.busy else "executor idle")
                 for n in nodes if work_under_way(n)}
        raise LivenessFailure(f"replicas still waiting on block work {limit_ms} ms after the "
                              f"load: {stuck}; heights {cluster.heights()}, views "
                              f"{cluster.views()}")


def check_accounts(cluster: Cluster, workload: Workload) -> None:
    """Each account's committed run reached what its client sent: up to the first nonce that
    never became executable, at least up to the first marginal fee cap."""
    for account in workload.accounts:
        upper = account.next_nonce if account.blocked_at is None else account.blocked_at
        lower = upper if account.marginal_at is None else min(upper, account.marginal_at)
        for node in cluster.honest():
            nonce = node.chain.nonce(account.sender)
            if not lower <= nonce <= upper:
                raise InvariantFailure(f"account {account.sender.hex()[:8]} at nonce {nonce} "
                                       f"on node {node.index}, expected {lower}..{upper}")
    reported = workload.never & cluster.reported
    if reported:
        raise InvariantFailure(f"{len(reported)} never-executable transactions were reported")


def check_latency(cluster: Cluster, *, capacity: int, rounds: int, extra_ms: int,
                  slack_ms: int, only: Iterable[bytes] | None = None,
                  nodes: list[int] | None = None) -> None:
    """Every transaction commits on every honest node (of `nodes`, if given) by

        ready + (ceil(ahead / capacity) + rounds) x request_timeout + extra_ms

    where ready is the latest time it became executable on an honest node (before it
    committed there), ahead counts the transactions that were executable within slack_ms of
    that (gossip reaches the pools in different orders) and not committed before it, and
    capacity is the fewest transactions a primary's block holds while more wait (the time
    budget or the gas limit): the primary takes them in arrival order, so at most
    ceil(ahead / capacity) blocks go first, each within a request timeout."""
    honest = [node.index for node in cluster.honest()] if nodes is None else nodes
    ready: dict[bytes, int] = {}
    done: dict[bytes, int] = {}
    for tx_hash, commits in cluster.commit_at.items():
        if any(i not in commits for i in honest):
            continue
        times = [t for i, t in cluster.ready_at.get(tx_hash, {}).items()
                 if i in commits and t <= commits[i] and i in honest]
        if times:
            ready[tx_hash], done[tx_hash] = max(times), max(commits[i] for i in honest)
    ready_times, done_times = sorted(ready.values()), sorted(done.values())
    timeout = cluster.params.request_timeout_ms
    for tx_hash in ready if only is None else only:
        if tx_hash not in ready:
            continue
        start = ready[tx_hash]
        ahead = (bisect.bisect_right(ready_times, start + slack_ms)
                 - bisect.bisect_left(done_times, start))
        bound = start + (math.ceil(ahead / capacity) + rounds) * timeout + extra_ms
        if done[tx_hash] > bound:
            raise LivenessFailure(
                f"transaction {tx_hash.hex()[:8]} executable at {start} ms with {ahead} ahead "
                f"(capacity {capacity}) committed everywhere at {done[tx_hash]} ms, after the "
                f"bound {bound} ms; view changes {view_change_report(cluster)}")
