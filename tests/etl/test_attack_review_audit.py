"""An attacker's review of issue 30's audit: lies a node operator (every JSON-RPC answer of
the node exported from, no validator key, any signed message the node saw replayable) can
tell today with the audit still calling the chain sound, or giving no verdict at all. Each
test plants one lie, in the exported rows (as tests/etl/test_audit.py does) or through a
FakeNode serving a modified ServedChain beside an honest one, and asserts what a sound audit
must do. They fail today: each is marked xfail(strict) with its finding's number (the
review's report ranks them); fixing the hole turns its test into a pass, and strict xfail
then asks for the mark to go."""

from __future__ import annotations

import copy
import dataclasses
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from pyspark.sql import SparkSession
from rlp.codec import length_prefix

from cli.etl import genesis_validators
from pbft_engine.messages import Prepare
from spark_etl import rpc
from spark_etl.audit import RULES, Audit, Rule, ValidatorSet, Violation, find_violations
from spark_etl.audit.anchor_rules import validator_set
from spark_etl.audit.chain_rules import block_hashes
from spark_etl.audit.column_rules import COLUMN_RULES, LIST_OFFSET
from spark_etl.audit.roots import trie_roots
from spark_etl.audit.validators import resolve_validators
from spark_etl.errors import EtlError
from spark_etl.hexcodec import from_hex, to_hex
from spark_etl.rpc import JsonRpcClient, RetryPolicy
from spark_etl.tables import Dataset
from tests.etl.chain_factory import ServedChain
from tests.etl.conftest import NODE_A, NODE_B, Tables, dataset, etl, make_audit
from tests.etl.fake_node import FakeNode, serving
from tests.etl.test_attack_review_export import served_on_loopback
from tests.etl.test_audit import rows
from tests.etl.test_audit_anchor import FAST, write_genesis

HONEST_VALIDATOR = 0  # replica 0 of the test chain: it signed every block's COMMIT
OTHER_ADDRESS = "0x" + "44" * 20


@pytest.fixture(scope="module")
def genesis_file(test_chain: ServedChain, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_genesis(test_chain, tmp_path_factory.mktemp("genesis") / "genesis.json")


@pytest.fixture(scope="module")
def anchored(genesis_file: Path) -> ValidatorSet:
    """The auditor's trust anchor: the genesis file's set, chain id, K and block 0."""
    return genesis_validators(genesis_file)


def audit_rules() -> tuple[Rule, ...]:
    """Every rule of `pbft-etl audit` (a rule added to RULES included), but the per-block
    passes over blocks, transactions, receipts and logs (the slow part of an audit of this
    chain): none of the lies in the rows below touches those tables."""
    per_block = {*COLUMN_RULES, trie_roots, block_hashes}
    return tuple(rule for rule in RULES if rule not in per_block)


def against(found: list[Violation], node: str) -> list[Violation]:
    return [v for v in found if v.node == node]


# --- the consensus records and the manifest: lies in the exported rows --------------------


def hide_stable_checkpoints(tables: Tables, node: str) -> None:
    """The node serves its checkpoints 5 and 10 with their Q signed CHECKPOINTs (the export
    itself proves them stable) but says `stable` false, and names stable checkpoint 0 in
    view 1's VIEW-CHANGEs (the signed messages say 5)."""
    for row in rows(tables, "checkpoints", node):
        row["stable"] = False
    for row in rows(tables, "view_changes", node):
        row["stable_seq_no"] = 0


def inflate_stable_seq_no(tables: Tables, node: str) -> None:
    """View 1's VIEW-CHANGEs are signed for stable checkpoint 5; the node says 10 (the
    report's installed views then show view 1 installed at checkpoint 10)."""
    for row in rows(tables, "view_changes", node):
        row["stable_seq_no"] = 10


def accuse_honest_validators(tables: Tables, node: str, chain: ServedChain) -> None:
    """An honest node keeps one-message evidence only for a primary's PREPARE (a primary
    never prepares) and a PRE-PREPARE of an invalid block (pbft_engine/core/replica.py,
    `_record_evidence(..., None)`). The node accuses honest validator 0 with its COMMIT for
    block 3 (replayed from the block's certificate), and validator 2 with the PREPARE it
    sent for block 2 in view 0, whose primary is validator 0: neither is a fault."""
    accused = chain.validators.addresses
    commit = rows(tables, "commit_certificates", node, block_number=3,
                  replica=HONEST_VALIDATOR)[0]["message"]
    block_hash = rows(tables, "blocks", node, number=2)[0]["hash"]
    prepare = chain.validators.sign(Prepare(0, 2, from_hex(block_hash), 2))
    tables["evidence"] += [
        {"node": node, "signer": signer, "type": kind, "view": 0, "seq_no": seq_no,
         "first": first, "second": None}
        for signer, kind, seq_no, first in (
            (accused[HONEST_VALIDATOR], "commit", 3, commit),
            (accused[2], "prepare", 2, to_hex(prepare.encode())),
        )
    ]


def forge_manifest_validators(tables: Tables, node: str) -> None:
    """The node told the export (pbft_getValidators) that validator 0 is someone else."""
    for row in rows(tables, "export_manifest", node):
        row["validators"] = [OTHER_ADDRESS, *row["validators"][1:]]


@pytest.fixture(scope="module")
def planted(spark: SparkSession, clean_tables: Tables, test_chain: ServedChain,
            anchored: ValidatorSet) -> list[Violation]:
    """One audit (with --genesis) of the two nodes' export with four lies planted, each
    where its test can tell it apart. Alone, each passes every rule today (RULES, the
    per-block passes included: no violation at all, `pbft-etl audit` exits 0)."""
    tables = copy.deepcopy(clean_tables)
    hide_stable_checkpoints(tables, NODE_A)
    accuse_honest_validators(tables, NODE_A, test_chain)  # at blocks 2 and 3
    inflate_stable_seq_no(tables, NODE_B)
    forge_manifest_validators(tables, NODE_B)
    return find_violations(make_audit(spark, tables, anchored), audit_rules())


def test_stable_checkpoints_hidden_as_not_stable_are_reported(planted: list[Violation]) -> None:
    assert {v.block_number for v in against(planted, NODE_A)} >= {5, 10}


def test_one_message_evidence_against_an_honest_validator_is_evidence_false(
    planted: list[Violation]
) -> None:
    found = {(v.rule, v.block_number) for v in against(planted, NODE_A)}
    assert found >= {("evidence-false", 3), ("evidence-false", 2)}


def test_a_false_validator_set_in_the_manifest_is_reported(planted: list[Violation]) -> None:
    assert any(OTHER_ADDRESS in v.detail for v in against(planted, NODE_B))


def test_a_view_change_s_stable_seq_no_is_the_signed_one(planted: list[Violation]) -> None:
    assert any("stable_seq_no" in v.detail for v in against(planted, NODE_B))


def nested_list(depth: int) -> bytes:
    """An RLP list nested `depth` deep: well-formed RLP, a few bytes a level."""
    encoded = b"\xc0"
    for _ in range(depth):
        encoded = length_prefix(len(encoded), LIST_OFFSET) + encoded
    return encoded


def test_deeply_nested_raw_bytes_are_malformed_values(
    spark: SparkSession, tables: Tables, anchored: ValidatorSet
) -> None:
    """rlp.decode recurses once per level and only RLPException is caught; the consensus
    messages refuse lists nested deeper than 24, the raw bytes do not. (The export's
    `raw_parts` of debug_getRawBlock has the same hole outside `_readable`'s exceptions.)"""
    deep = to_hex(nested_list(30_000))
    rows(tables, "transactions", NODE_A, block_number=1)[0]["raw"] = deep
    rows(tables, "blocks", NODE_A, number=2)[0]["raw_header"] = deep
    found = find_violations(make_audit(spark, tables, anchored), COLUMN_RULES)
    assert {("malformed-value", 1), ("malformed-value", 2)} <= {
        (v.rule, v.block_number) for v in against(found, NODE_A)}


def test_trust_node_with_a_node_reporting_another_set_gives_a_verdict(
    spark: SparkSession, clean_tables: Tables,
) -> None:
    """Beside an honest node, node A reported a validator set of its own: with --trust-node
    the audit must name the disagreement (a violation), not refuse to judge the honest node
    (resolve_validators raised DataError: exit 3)."""
    tables = copy.deepcopy(clean_tables)
    forge_manifest_validators(tables, NODE_A)
    data = dataset(spark, tables)
    trusted = resolve_validators(data.export_manifest, None, None)
    found = find_violations(Audit(data, trusted), (validator_set,))
    # one against one: the tie goes to the first node by URL; the other is named, with both
    assert len(found) == 1 and OTHER_ADDRESS in found[0].detail


# --- the export: lying nodes on loopback --------------------------------------------------


class DeadlineExceeded(Exception):
    pass


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Interrupts the main thread's Python after `seconds` (a loop that would never end)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise DeadlineExceeded(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def export_audit(spark: SparkSession, capsys: pytest.CaptureFixture[str], out: Path,
                 anchored: ValidatorSet, *urls: str) -> list[Violation]:
    """`pbft-etl export` of the nodes (it must finish: exit 0), then the audit's rules but the
    per-block passes (`audit_rules`) over what it wrote, with the genesis as trust anchor."""
    code, _, err = etl(capsys, "export", "--rpc", ",".join(urls), "--out", str(out),
                       "--lag-wait", "0", *FAST)
    assert code == 0, err
    return find_violations(Audit(Dataset.read(spark, str(out)), anchored), audit_rules())


class Overclaiming(FakeNode):
    """Claims view 2**62: before, the export asked it for 2**52 pages of view changes."""

    def methods(self) -> dict[str, Callable[..., Any]]:
        return {**super().methods(),
                "pbft_status": lambda: {"engine": "pbft", "view": 2**62, "mode": "normal"}}


def test_a_node_claiming_an_enormous_head_gets_a_verdict(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain, anchored: ValidatorSet,
) -> None:
    """`--to` defaults to the highest head any node claims, and `plan_spans` walks every
    range up to it (then every 250-block partition, each a Spark task) before asking the
    node whether it has a single block there (finding 1). Now a node is not asked above the
    first block it did not serve, and view changes stop at a page with none."""
    overclaiming = Overclaiming(test_chain)
    overclaiming.heads = [2**40]
    # deadline: an export that ends (the test chain takes ~10 s of it)
    with serving(test_chain) as honest, serving_node(overclaiming) as liar, deadline(90):
        found = export_audit(spark, capsys, tmp_path / "out", anchored, honest.url, liar.url)
    assert against(found, liar.url) != []


def _unreadable(chain: ServedChain) -> ServedChain:
    """The chain with every block's timestamp not a quantity (block 0's hash, which the
    export's probe reads, kept): each block is left out by the export's `_readable`."""
    payloads = [dataclasses.replace(p, block={**p.block, "timestamp": "not a quantity"})
                for p in chain.payloads]
    return dataclasses.replace(chain, payloads=payloads)


class Mute(FakeNode):
    """Serves the chain's head and records, but never a block's raw bytes."""

    def methods(self) -> dict[str, Callable[..., Any]]:
        return {**super().methods(), "debug_getRawBlock": lambda number: None}


@contextmanager
def serving_node(node: FakeNode) -> Iterator[FakeNode]:
    """`node` on a free port of 127.0.0.1, as fake_node.serving does for a plain FakeNode."""
    with serving(node.chain) as plain:
        plain.methods = node.methods  # type: ignore[method-assign]
        yield plain


def test_a_node_serving_no_readable_block_is_reported(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain, anchored: ValidatorSet,
) -> None:
    """Beside an honest node: one liar answers every block unreadably (left out, with a
    warning), another answers null raw blocks from block 0 (its span ends there). Their
    claimed heads are the chain's; nothing of their 11 blocks is exported."""
    with serving(test_chain) as honest, serving(_unreadable(test_chain)) as garbled, \
            serving_node(Mute(test_chain)) as mute:
        found = export_audit(spark, capsys, tmp_path / "out", anchored, honest.url,
                             garbled.url, mute.url)
    assert against(found, garbled.url) != [] and against(found, mute.url) != []


class Refusing(FakeNode):
    """Answers debug_getRawBlock with a JSON-RPC error ("the method does not exist")."""

    def methods(self) -> dict[str, Callable[..., Any]]:
        served = super().methods()
        del served["debug_getRawBlock"]
        return served


def test_a_node_answering_errors_cannot_stop_the_honest_node_s_verdict(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain, anchored: ValidatorSet,
) -> None:
    """`_readable` leaves out an unreadable answer so that a lying node cannot stop the
    export; an error object instead of the answer was a non-retriable RpcError that failed the
    task, the job and the run: no verdict on the honest node either (finding 7). Now what a
    node refuses is left out while another node served every block it was asked for."""
    with serving(test_chain) as honest, serving_node(Refusing(test_chain)) as liar:
        found = export_audit(spark, capsys, tmp_path / "out", anchored, honest.url, liar.url)
    assert against(found, liar.url) != []


@contextmanager
def raw_server(body: bytes) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering every POST with `body`; its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with served_on_loopback(Handler) as url:
        yield url


# What `pbft-etl run --genesis` has imported by the time it probes the nodes: py-evm, whose
# py_ecc raises the recursion limit to 100,000, deeper than the C stack holds.
DEEP_CALL = """
import sys
import eth  # noqa: F401
from spark_etl.errors import EtlError
from spark_etl.rpc import JsonRpcClient, RetryPolicy
try:
    JsonRpcClient(sys.argv[1], RetryPolicy(attempts=1)).call("eth_chainId")
except EtlError:
    sys.exit(0)
"""


def test_a_deeply_nested_answer_is_an_rpc_error() -> None:
    """json.loads recurses once per nesting level; after `import eth` (as `run --genesis`
    does before the export) the limit is 100,000 and 100,000 `[` overflow the C stack. Run in
    a child process: the crash must not take the test session with it."""
    with raw_server(b"[" * 100_000) as url:
        child = subprocess.run([sys.executable, "-c", DEEP_CALL, url], capture_output=True,
                               timeout=60, check=False)
    assert child.returncode == 0, child.stderr[-300:]


def test_an_answer_larger_than_the_bound_is_an_rpc_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """`response.read()` read whatever a node sent; the answer is now read up to the bound
    (256 MiB: set to 1,000 bytes here) and what is above refused before it is parsed."""
    monkeypatch.setattr(rpc, "MAX_ANSWER_BYTES", 1_000)
    answer = b'{"jsonrpc": "2.0", "id": 0, "result": "' + b"0" * 2_000 + b'"}'
    with raw_server(answer) as url, pytest.raises(EtlError, match="larger than"):
        JsonRpcClient(url, RetryPolicy(attempts=1)).call("eth_chainId")
