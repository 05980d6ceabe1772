"""A steady load for a test that changes a running testnet: transfers at a modest fixed rate,
from a few dev accounts in turn, each through the next of the nodes it is routed to, every
hash a node accepted recorded with that node, for the test to check that each one commits."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from types import TracebackType

from eth_account import Account

from testkit.cluster import GWEI, Cluster

RECIPIENT = 9  # the dev account every transfer pays, as Cluster.transfer's
JOIN_DEADLINE = 60.0  # seconds for the sending thread to finish its last send


class SteadyLoad:
    """`rate` transfers a second from dev accounts `senders` (each its own nonces, counted
    here: a node's "pending" count may lag the gossip), through `targets` in turn; a node that
    does not answer (killed) passes the same signed transfer to the next target. A refusal is
    recorded and its nonce used again. Use as a context manager: it sends until the block
    ends."""

    def __init__(self, cluster: Cluster, senders: Sequence[int], rate: float) -> None:
        self._cluster = cluster
        accounts = cluster.description["accounts"]
        self._accounts = [Account.from_key(accounts[i]["private_key"]) for i in senders]
        w3 = cluster.nodes[0].web3()
        self._nonces: list[int] = [w3.eth.get_transaction_count(a.address, "pending")
                                   for a in self._accounts]
        self._recipient = accounts[RECIPIENT]["address"]
        self._interval = 1 / rate
        self._targets: tuple[int, ...] = tuple(range(len(cluster.nodes)))
        self._turn = 0  # transfers accepted: picks the sender and the first target to try
        self._accepted: list[tuple[bytes, int]] = []  # (hash, node), in the order sent
        self.refused: list[str] = []
        # held while a transfer is sent: route() returns only when no send to the targets it
        # replaces is under way
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="steady-load", daemon=True)

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(JOIN_DEADLINE)
        if kind is None:  # the test's own failure comes first
            assert not self._thread.is_alive(), "the load's last send did not return"
            if self._failure is not None:
                raise AssertionError(f"the load failed: {self._failure!r}") from self._failure

    def route(self, *targets: int) -> None:
        """Send through `targets` from now on (leave a node out before killing it: a
        transfer it alone holds would die with it, as any client's would)."""
        with self._lock:
            self._targets = targets

    def accepted(self, via: int | None = None) -> list[bytes]:
        """The hashes accepted so far (by node `via` only, if given), in the order sent."""
        with self._lock:
            return [h for h, node in self._accepted if via is None or node == via]

    def _run(self) -> None:
        due = time.monotonic()
        try:
            while not self._stop.wait(max(0.0, due - time.monotonic())):
                due = max(due + self._interval, time.monotonic())
                with self._lock:
                    self._send()
        except BaseException as failure:  # reported by __exit__, in the test's thread
            self._failure = failure

    def _send(self) -> None:
        sender = self._turn % len(self._accounts)
        tx = {"chainId": self._cluster.description["chain_id"], "nonce": self._nonces[sender],
              "gas": 21_000, "to": self._recipient, "value": 1,
              "maxFeePerGas": 10 * GWEI, "maxPriorityFeePerGas": GWEI}
        raw = "0x" + bytes(self._accounts[sender].sign_transaction(tx).raw_transaction).hex()
        first = self._turn % len(self._targets)
        for node in [*self._targets[first:], *self._targets[:first]]:
            try:
                reply = self._cluster.nodes[node].web3().provider.make_request(
                    "eth_sendRawTransaction", [raw])
            except OSError:  # down: the next target
                continue
            if "error" in reply:
                self.refused.append(f"node {node}: {reply['error']}")
                return
            self._accepted.append((bytes.fromhex(reply["result"][2:]), node))
            self._nonces[sender] += 1
            self._turn += 1
            return
