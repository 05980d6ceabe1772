"""A lying node (issue 30): a real 4-validator testnet (`testnet init`'s defaults) with
transfers, an ERC-20 deployment and token transfers with logs, two stable checkpoints; one
node behind a JSON-RPC proxy (`lying_proxy`) that tells one lie per hole the audit must
close, each at its own block, exported beside an honest node in one `pbft-etl run
--genesis`. Every lie must be reported by its rule, at its block, against the lying node;
nothing against the honest one, whose export must not be cut short; the verdict is 1
(violations), never 3 (could not run); and the honest node alone audits sound (0)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import rlp
from eth_hash.auto import keccak
from pyspark.sql import SparkSession

from pbft_engine.messages import Signed, decode_commit_certificate
from spark_etl.audit.validators import read_genesis
from spark_etl.hexcodec import from_hex, to_hex
from testkit.cluster import GWEI, Cluster, rpc
from testkit.nodes import wait_for
from tests.etl.conftest import etl
from tests.etl.lying_proxy import Lie, LyingProxy, Rewrite
from tests.integration import conftest as integration
from tests.integration.test_transactions import Sender

pytestmark = pytest.mark.integration

testnet = integration.cluster  # four validators of `testnet init`'s defaults, running
LIAR, HONEST = 1, 2  # the node behind the proxy, and the one exported as it is
DEPLOYER, STRANGER = 2, 8  # dev accounts: the token's owner, one that sent nothing
TOKEN_SUPPLY = 10**24
MIN_TRANSFERS = 14  # blocks of one plain transfer each: room for every lie at its own block
CHECKPOINT_DEADLINE = 30.0
HEADER_TIMESTAMP = 11  # the timestamp's position in an RLP block header
# the lies told at a block of one plain transfer, and those told at any block of their own
TRANSFER_LIES = ("sender", "value", "nonce", "to", "price", "status", "type", "bloom")
ANY_BLOCK_LIES = ("header", "size", "signers", "evidence")


@dataclass(frozen=True)
class Chain:
    """Where the test's transactions landed."""

    head: int  # the settled head: an empty block after the last transactions
    interval: int  # K: the genesis's checkpoint interval
    deployment: int  # the token's deployment (one transaction, its log)
    log_pair: int  # two token transfers, one log each
    token_call: int  # one token transfer
    transfers: tuple[int, ...]  # one plain transfer each


@dataclass(frozen=True)
class Planted:
    """One lie (the rewrites of every answer it takes to tell it), the rule that must catch
    it and the block it must be reported at (None: a claim about the node, at no block)."""

    name: str
    rule: str
    block: int | None
    lies: tuple[Lie, ...]

    def caught(self, found: set[tuple[str, str | None, int | None]], node: str) -> bool:
        return (self.rule, node, self.block) in found

    def describe(self) -> str:
        return f"{self.name}: {self.rule} at block {self.block}"


@dataclass
class BlockPicker:
    """Hands out the chain's blocks to the lies, each at most once (each lie its own block)."""

    taken: set[int] = field(default_factory=set)

    def take(self, candidates: Iterable[int]) -> int:
        block = next((b for b in candidates if b not in self.taken), None)
        assert block is not None, f"no block left for a lie: {sorted(self.taken)} taken"
        self.taken.add(block)
        return block


def build_chain(cluster: Cluster) -> Chain:
    """Send the transactions through the primary of view 0, each block's after the one
    before committed, and wait for a settled head and its stable checkpoints."""
    w3 = cluster.nodes[0].web3()
    deployer = Sender(w3, cluster.description["accounts"][DEPLOYER]["private_key"])
    artifact = integration.load_contract("ERC20")
    factory = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
    deployed = deployer.transact(factory.constructor(TOKEN_SUPPLY), gas=2_000_000)
    token = w3.eth.contract(address=deployed.contractAddress, abi=artifact["abi"])
    recipients = [a["address"] for a in cluster.description["accounts"][3:5]]
    calls = [{"to": token.address, "gas": 100_000,
              "data": token.encode_abi("transfer", args=[to, 10**18])} for to in recipients]
    pair = _one_block(deployer, calls)
    token_call = deployer.send(**calls[0])
    interval = read_genesis(cluster.directory / "genesis.json").checkpoint_interval
    assert interval is not None
    # Past the second checkpoint: the lying node serves the later one and leaves the first
    # out (a node that names no stable checkpoint at all may have caught up by fetching the
    # blocks: checkpoint-missing requires none of it).
    transfers = [cluster.commit(via=0)]
    while len(transfers) < MIN_TRANSFERS or transfers[-1] < 2 * interval:
        transfers.append(cluster.commit(via=0))
    head = cluster.wait_idle(transfers[-1])
    _wait_stable_checkpoints(cluster, range(interval, head + 1, interval))
    return Chain(head, interval, deployed.blockNumber, pair, token_call.blockNumber,
                 tuple(transfers))


def _one_block(sender: Sender, calls: list[dict[str, Any]]) -> int:
    """Send `calls` so that they land in one block: every one but the first is sent first,
    held behind a nonce gap, and the first closes the gap. That block's number."""
    nonce = sender.w3.eth.get_transaction_count(sender.address, "pending")
    signed = [sender.sign(nonce=nonce + i, **call) for i, call in enumerate(calls)]
    hashes = [sender.w3.eth.send_raw_transaction(raw) for raw in [*signed[1:], signed[0]]]
    blocks = {sender.w3.eth.wait_for_transaction_receipt(h, timeout=60)["blockNumber"]
              for h in hashes}
    assert len(blocks) == 1, f"the gap-closing transactions landed in blocks {blocks}"
    return int(blocks.pop())


def _wait_stable_checkpoints(cluster: Cluster, seq_nos: range) -> None:
    def stable(index: int) -> set[int]:
        entries = rpc(cluster.nodes[index], "pbft_getCheckpoints", "0x0", hex(seq_nos.stop))
        return {int(c["seqNo"], 16) for c in entries if c["stable"]}

    wait_for(lambda: all(set(seq_nos) <= stable(i) for i in (LIAR, HONEST)),
             CHECKPOINT_DEADLINE, f"stable checkpoints {list(seq_nos)} on both exported nodes")


# --- the lies -------------------------------------------------------------------------------


def _at(path: tuple[str | int, ...], change: Rewrite) -> Rewrite:
    """A rewrite of the value at `path` (keys and list indexes) of a JSON result; a result
    without that path (a block with transaction hashes only) is served as it is."""
    route, last = path[:-1], path[-1]

    def rewrite(result: Any) -> Any:
        target: Any = result
        for step in route:
            target = target[step]
        if not isinstance(target, str):  # a transaction's hash, not the transaction
            target[last] = change(target[last])
        return result

    return rewrite


def _flip(text: str) -> str:
    """Another hex value of the same length (a hash, an address, call data)."""
    return text[:-1] + ("2" if text.endswith("1") else "1")


def _plus(amount: int) -> Rewrite:
    return lambda value: hex(int(value, 16) + amount)


def _always(value: Any) -> Rewrite:
    return lambda _: value


def _transaction(block: int, key: str, change: Rewrite) -> Lie:
    """The block's first transaction, as eth_getBlockByNumber serves it."""
    return Lie("eth_getBlockByNumber", _at(("transactions", 0, key), change), block)


def _receipt(block: int, key: str, change: Rewrite) -> Lie:
    """The block's first receipt, as eth_getBlockReceipts serves it."""
    return Lie("eth_getBlockReceipts", _at((0, key), change), block)


def _swap_log_indexes(receipts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first two receipts' first logs trade their logIndex."""
    first, second = receipts[0]["logs"][0], receipts[1]["logs"][0]
    first["logIndex"], second["logIndex"] = second["logIndex"], first["logIndex"]
    return receipts


def _later_header(raw_block: str) -> str:
    """The raw block with its header's timestamp one second later (its transactions kept)."""
    header, *rest = rlp.decode(from_hex(raw_block))
    header = list(header)
    timestamp = int.from_bytes(header[HEADER_TIMESTAMP], "big") + 1
    header[HEADER_TIMESTAMP] = timestamp.to_bytes((timestamp.bit_length() + 7) // 8, "big")
    return to_hex(rlp.encode([header, *rest]))


def _swap_signers(certificate: dict[str, Any]) -> dict[str, Any]:
    signers = certificate["signers"]
    signers[0], signers[1] = signers[1], signers[0]
    return certificate


def _false_evidence(cluster: Cluster, block: int) -> dict[str, Any]:
    """Evidence that the first signer of `block`'s certificate equivocated: its real COMMIT
    and a COMMIT for another digest under the same signature (no key can be forged)."""
    served = rpc(cluster.nodes[LIAR], "pbft_getCommitCertificate", hex(block))
    real = decode_commit_certificate(from_hex(served["certificate"]))[0]
    forged = Signed(replace(real.body, digest=keccak(real.body.digest)), real.signature)
    return {
        "signer": cluster.description["validators"][real.body.replica].lower(),
        "type": "commit",
        "view": hex(real.body.view),
        "seqNo": hex(real.body.seq_no),
        "first": to_hex(real.encode()),
        "second": to_hex(forged.encode()),
    }


def _leave_out(seq_no: int) -> Rewrite:
    return lambda entries: [c for c in entries if int(c["seqNo"], 16) != seq_no]


def plant(cluster: Cluster, chain: Chain) -> tuple[Planted, ...]:
    """One lie per hole, each at a block of its own."""
    picker = BlockPicker({0, chain.interval})  # the genesis and checkpoint lies' blocks
    claimed_head = chain.head - 1
    at = {name: picker.take(chain.transfers) for name in TRANSFER_LIES}
    at["deployment"] = picker.take([chain.deployment])
    at["log pair"] = picker.take([chain.log_pair])
    at["input"] = picker.take([chain.token_call])
    at |= {name: picker.take(range(1, claimed_head + 1)) for name in ANY_BLOCK_LIES}
    stranger = cluster.description["accounts"][STRANGER]["address"].lower()
    evidence = _false_evidence(cluster, at["evidence"])
    return (
        Planted("a transaction's from (and its receipt's)", "transaction-sender", at["sender"],
                (_transaction(at["sender"], "from", _always(stranger)),
                 _receipt(at["sender"], "from", _always(stranger)))),
        Planted("a transaction's value", "transaction-fields", at["value"],
                (_transaction(at["value"], "value", _plus(10**18)),)),
        Planted("a transaction's input", "transaction-fields", at["input"],
                (_transaction(at["input"], "input", _flip),)),
        Planted("a transaction's nonce", "transaction-fields", at["nonce"],
                (_transaction(at["nonce"], "nonce", _plus(1)),)),
        Planted("a transaction's to (and its receipt's)", "transaction-fields", at["to"],
                (_transaction(at["to"], "to", _flip), _receipt(at["to"], "to", _flip))),
        Planted("a receipt's contractAddress", "receipt-fields", at["deployment"],
                (_receipt(at["deployment"], "contractAddress", _flip),)),
        Planted("a receipt's effectiveGasPrice (and the transaction's gasPrice)",
                "receipt-fields", at["price"],
                (_receipt(at["price"], "effectiveGasPrice", _plus(GWEI)),
                 _transaction(at["price"], "gasPrice", _plus(GWEI)))),
        Planted("a receipt's status 2", "receipt-fields", at["status"],
                (_receipt(at["status"], "status", _always("0x2")),)),
        Planted("two logs' logIndex swapped across transactions", "log-order", at["log pair"],
                (Lie("eth_getBlockReceipts", _swap_log_indexes, at["log pair"]),)),
        Planted("the raw block's header timestamp (the JSON's kept)", "raw-block", at["header"],
                (Lie("debug_getRawBlock", _later_header, at["header"]),)),
        Planted("a block's size", "raw-block", at["size"],
                (Lie("eth_getBlockByNumber", _at(("size",), _plus(1)), at["size"]),)),
        Planted("a certificate's signer names swapped", "signer-column", at["signers"],
                (Lie("pbft_getCommitCertificate", _swap_signers, at["signers"]),)),
        Planted("evidence against an honest validator", "evidence-false", at["evidence"],
                (Lie("pbft_getEvidence", lambda found: [*found, evidence]),)),
        Planted("the first stable checkpoint left out", "checkpoint-missing", chain.interval,
                (Lie("pbft_getCheckpoints", _leave_out(chain.interval), chain.interval),)),
        # reported at the highest block another node served with a quorum certificate
        Planted("a head one block lower than the node's", "node-behind", chain.head,
                (Lie("eth_blockNumber", _always(hex(claimed_head))),)),
        Planted("block 0 with another hash", "genesis-block", 0,
                (Lie("eth_getBlockByNumber", _at(("hash",), _flip), 0),)),
        Planted("another chain id", "chain-id", None, (Lie("eth_chainId", _plus(1)),)),
        Planted("a receipt type of 0x100", "malformed-value", at["type"],
                (_receipt(at["type"], "type", _always("0x100")),)),
        Planted("a non-hex receipt logsBloom", "malformed-value", at["bloom"],
                (_receipt(at["bloom"], "logsBloom", _always("0x" + "zz" * 256)),)),
    )


# --- the audit ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One `pbft-etl run`: its exit status, its report (empty if it wrote none), its output."""

    code: int
    report: dict[str, Any]
    output: str

    @property
    def found(self) -> set[tuple[str, str | None, int | None]]:
        return {(v["rule"], v["node"], v["block_number"])
                for v in self.report.get("violations", [])}


def audit_run(capsys: pytest.CaptureFixture[str], out: Path, genesis: Path,
              *nodes: str) -> Run:
    report = out / "report.json"
    out.mkdir()
    # --lag-wait 0: the lying node never catches up with the head it hides, and the chain
    # is settled (no node is behind for real)
    code, stdout, stderr = etl(capsys, "run", "--rpc", ",".join(nodes), "--out",
                               str(out / "data"), "--genesis", str(genesis), "--lag-wait", "0",
                               "--report", str(report))
    return Run(code, json.loads(report.read_text()) if report.exists() else {},
               stdout + stderr)


def test_every_lie_of_a_lying_node_is_caught_at_its_block(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path, testnet: Cluster
) -> None:
    chain = build_chain(testnet)
    planted = plant(testnet, chain)
    genesis = testnet.directory / "genesis.json"
    honest = testnet.nodes[HONEST].rpc_url
    lies = [lie for p in planted for lie in p.lies]
    with LyingProxy(testnet.nodes[LIAR].rpc_url, lies) as proxy:
        lying = audit_run(capsys, tmp_path / "lying", genesis, honest, proxy.url)
    alone = audit_run(capsys, tmp_path / "honest", genesis, honest)

    outcome = {
        "exit status": lying.code,
        "lies never served": [p.name for p in planted if not all(proxy.told[x] for x in p.lies)],
        "uncaught lies": [p.describe() for p in planted if not p.caught(lying.found, proxy.url)],
        "reported against the honest node": sorted(
            f"{rule} at block {block}" for rule, node, block in lying.found if node == honest),
        "the honest node's blocks exported": lying.report.get("nodes", {}).get(honest),
        "the honest node alone: exit status": alone.code,
    }
    assert outcome == {
        "exit status": 1,
        "lies never served": [],
        "uncaught lies": [],
        "reported against the honest node": [],
        "the honest node's blocks exported": chain.head + 1,
        "the honest node alone: exit status": 0,
    }, f"with the lies:\n{lying.output}\nthe honest node alone:\n{alone.output}"
