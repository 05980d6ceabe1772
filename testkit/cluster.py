"""A PBFT testnet of real node processes, for the multi-validator tests: start and stop single
nodes, send transfers, wait for receipts, and check at the end that every live node holds the
same block at every height and that every block's commit certificate verifies."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_keys.datatypes import PrivateKey
from prometheus_client.parser import text_string_to_metric_families
from web3 import Web3

from chain.p2p import Transport
from cli.keys import DEV_VALIDATOR_SEED, dev_private_key
from pbft_engine.messages import verify_commit_certificate
from testkit import byzantine
from testkit.nodes import RunningNode, copy_testnet, make_testnet, wait_for

GWEI = 10**9
RECEIPT_DEADLINE = 60.0
# The empty block that follows a block with transactions comes trailing_empty_block (genesis
# config.pbft, 1 s by default) after it; far more than that under load is a failure.
TRAILING_DEADLINE = 30.0


@dataclass
class Cluster:
    directory: Path
    description: dict[str, Any]
    nodes: list[RunningNode]

    @classmethod
    def create(cls, directory: Path, validators: int = 4, *pbft_flags: str, observers: int = 0
               ) -> Cluster:
        return cls.describe(directory, make_testnet(directory, validators, *pbft_flags,
                                                    observers=observers))

    @classmethod
    def copy(cls, template: Path, directory: Path) -> Cluster:
        """A fresh copy of the never-started testnet in `template`, on free ports."""
        return cls.describe(directory, copy_testnet(template, directory))

    @classmethod
    def describe(cls, directory: Path, description: dict[str, Any]) -> Cluster:
        nodes = [
            RunningNode(description, node, directory / f"node{node['index']}.log")
            for node in description["nodes"]
        ]
        return cls(directory, description, nodes)

    def make_byzantine(self, index: int, behaviour: str, *options: str) -> None:
        """Node `index` runs from now on as `python -m testkit.byzantine --behaviour ...`."""
        node = self.nodes[index]
        node.argv = byzantine.command(node.node["command"], behaviour, *options)

    @property
    def running(self) -> list[RunningNode]:
        return [n for n in self.nodes if n.process is not None]

    def start(self, *indices: int) -> None:
        """Start these nodes (all by default) and wait until the running ones form a mesh."""
        starting = [self.nodes[i] for i in indices or range(len(self.nodes))]
        for node in starting:  # all at once: they start in parallel
            node.launch()
        for node in starting:
            node.wait_ready()
        peers = len(self.running) - 1
        wait_for(lambda: all(n.web3().net.peer_count == peers for n in self.running), 30,
                 f"{peers} peers on every running node")

    def stop(self, index: int, sig: int = signal.SIGTERM) -> int:
        return self.nodes[index].stop(sig)

    def close(self) -> list[int]:
        """Stop every running node (resuming a stopped one first); their exit codes."""
        codes = []
        for node in self.running:
            if node.process is not None and node.process.poll() is None:
                node.process.send_signal(signal.SIGCONT)
            codes.append(node.stop())
        return codes

    def terminate(self, grace: float = 10) -> None:
        """SIGTERM to every running node at once, SIGKILL to those still up after `grace`
        seconds in all (a node whose event loop is stuck cannot handle SIGTERM)."""
        running = [n for n in self.running if n.process is not None]
        for node in running:
            assert node.process is not None
            if node.process.poll() is None:
                node.process.send_signal(signal.SIGCONT)
                node.process.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace
        for node in running:
            assert node.process is not None
            try:
                node.process.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
            node.process = None

    def status(self, index: int) -> dict[str, Any]:
        return rpc(self.nodes[index], "pbft_status")

    def metrics(self, index: int) -> dict[str, float]:
        """Node `index`'s Prometheus samples, keyed "name|label value|..."."""
        url = self.nodes[index].node["metrics_url"]
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
        return {
            sample.name + "|" + "|".join(sample.labels.values()): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def head(self, index: int) -> int:
        return self.nodes[index].web3().eth.block_number

    def transfer(self, via: int, sender: int = 0, value: int = 1) -> bytes:
        """Send a transfer from dev account `sender` through node `via`; returns its hash."""
        account = self.description["accounts"][sender]
        w3 = self.nodes[via].web3()
        tx = {
            "chainId": self.description["chain_id"],
            "nonce": w3.eth.get_transaction_count(account["address"], "pending"),
            "gas": 21_000,
            "to": self.description["accounts"][9]["address"],
            "value": value,
            "maxFeePerGas": 10 * GWEI,
            "maxPriorityFeePerGas": GWEI,
        }
        signed = Account.from_key(account["private_key"]).sign_transaction(tx)
        return bytes(w3.eth.send_raw_transaction(signed.raw_transaction))

    def commit(self, via: int, sender: int = 0) -> int:
        """Send one transfer and wait for its receipt on the same node; its block number."""
        tx_hash = self.transfer(via, sender)
        receipt = self.nodes[via].web3().eth.wait_for_transaction_receipt(
            tx_hash, timeout=RECEIPT_DEADLINE, poll_latency=0.05)
        assert receipt.status == 1
        return receipt.blockNumber

    def wait_heads(self, indices: list[int], height: int, deadline: float = 60) -> None:
        wait_for(lambda: all(self.head(i) >= height for i in indices), deadline,
                 f"nodes {indices} at height {height}")

    def wait_idle(self, after: int = -1, indices: Sequence[int] | None = None,
                  deadline: float = TRAILING_DEADLINE) -> int:
        """A settled head, for a test that needs one: nodes `indices` (the running ones by
        default) share a head above block `after` (the last block with transactions the test
        committed) that is genesis or holds no transaction. That is the empty block the
        protocol makes after the last block with transactions (genesis
        config.pbft.trailing_empty_block), so no block comes until the next transaction: it
        is certain to land while the primary is up. The head's number.

        Exactly one empty block follows a block with transactions committed alone; a block
        with transactions that took longer than the trailing wait to commit after the one
        before it may be followed by two (the first proposed while it was in flight), and the
        wait may then end at the first."""
        nodes = list(range(len(self.nodes))) if indices is None else list(indices)
        nodes = [i for i in nodes if self.nodes[i].process is not None]
        assert nodes, "no running node to wait on"

        def idle() -> list[int]:
            heads = {self.head(i) for i in nodes}
            if len(heads) != 1:
                return []
            (head,) = heads
            if head <= after:
                return []
            if head and self.nodes[nodes[0]].web3().eth.get_block(head).transactions:
                return []
            return [head]

        (head,) = wait_for(idle, deadline,
                           f"nodes {nodes} at one empty head above block {after}")
        return head

    @property
    def validators(self) -> tuple[bytes, ...]:
        return tuple(bytes.fromhex(v[2:]) for v in self.description["validators"])

    def endpoint(self, index: int) -> tuple[str, int]:
        host, port = self.nodes[index].node["p2p"].split(":")
        return host, int(port)

    @asynccontextmanager
    async def impersonate(
        self, index: int, key: PrivateKey | None = None, peers: tuple[int, ...] = (1, 2, 3)
    ) -> AsyncIterator[Transport]:
        """A transport speaking as validator `index` (its node must be down) or, with `key`,
        as someone else, dialling `peers`; yields once connected to all of them (at once with
        a `key`: the peers refuse a stranger, though its own side may count one as connected
        until that peer's refusal reaches it)."""
        transport = Transport(
            key or dev_private_key(index, DEV_VALIDATOR_SEED), self.description["chain_id"],
            {self.validators[i]: self.endpoint(i) for i in peers},
            *self.endpoint(index), lambda *_: None)
        await transport.start()
        try:
            if key is None:
                await asyncio.wait_for(transport.wait_until(
                    lambda: len(transport.connected_peers()) == len(peers)), 30)
            yield transport
        finally:
            await transport.stop()

    def assert_consistent(self) -> None:
        """Every running node: the same hash at every height, and certificates that verify."""
        assert_same_chain_with_valid_certificates(self.running)


def assert_next_busy_block(w3: Web3, after: int, number: int) -> None:
    """Block `number` is the first block after block `after` (one with transactions,
    committed alone) that holds transactions: between them, at most the empty block that
    follows a block with transactions (genesis config.pbft.trailing_empty_block), when it
    landed first."""
    between = {n: len(w3.eth.get_block(n).transactions) for n in range(after + 1, number)}
    assert number > after and len(between) <= 1 and not any(between.values()), (
        f"block {number} is not the first with transactions after block {after}: "
        f"transactions per block between them {between}")


def rpc(node: RunningNode, method: str, *params: Any) -> Any:
    reply = node.web3().provider.make_request(method, list(params))
    assert "error" not in reply, reply
    return reply["result"]


def assert_same_chain_with_valid_certificates(nodes: list[RunningNode]) -> None:
    description = nodes[0].description
    validators = [bytes.fromhex(v[2:]) for v in description["validators"]]
    quorum = (len(validators) + (len(validators) - 1) // 3 + 2) // 2
    height = min(n.web3().eth.block_number for n in nodes)
    assert height > 0
    for number in range(1, height + 1):
        hashes = {bytes(n.web3().eth.get_block(number).hash) for n in nodes}
        assert len(hashes) == 1, f"nodes disagree at height {number}"
        (block_hash,) = hashes
        for node in nodes:
            certificate = rpc(node, "pbft_getCommitCertificate", hex(number))["certificate"]
            signers = verify_commit_certificate(
                bytes.fromhex(certificate[2:]),
                validators=validators,
                epoch=0,  # these clusters never change their set
                chain_id=description["chain_id"],
                block_number=number,
                block_hash=block_hash,
            )
            assert len(signers) >= quorum
