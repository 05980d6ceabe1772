"""`pbft-etl export` (and then `audit`) against fake nodes on loopback that serve the test
chain: tables and counts, resuming after an interrupted export, replacing a re-run range,
retries, and the CLI's one-line errors and exit codes."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from cli.etl import main
from spark_etl import schemas
from spark_etl.errors import RpcError
from spark_etl.export import Plan, plan_spans
from spark_etl.rpc import JsonRpcClient, RetryPolicy
from spark_etl.source import Span
from spark_etl.tables import Dataset
from tests.etl.chain_factory import ServedChain
from tests.etl.conftest import etl
from tests.etl.fake_node import FakeNode, serving

FAST = ["--retries", "1"]


@pytest.fixture
def node(test_chain: ServedChain) -> Iterator[FakeNode]:
    with serving(test_chain) as fake:
        yield fake


@pytest.fixture
def other_node(test_chain: ServedChain) -> Iterator[FakeNode]:
    with serving(test_chain) as fake:
        yield fake


def counts(spark: SparkSession, out: Path) -> dict[str, int]:
    data = Dataset.read(spark, str(out))
    return {t.name: getattr(data, t.name).count() for t in schemas.TABLES}


def expected_counts(chain: ServedChain, nodes: int) -> dict[str, int]:
    payloads = chain.payloads
    per_node = {
        "blocks": len(payloads),
        "transactions": sum(len(p.block["transactions"]) for p in payloads),
        "receipts": sum(len(p.receipts) for p in payloads),
        "logs": sum(len(r["logs"]) for p in payloads for r in p.receipts),
        "commit_certificates": sum(len(p.certificate["signers"]) for p in payloads
                                   if p.certificate),
        "checkpoints": sum(len(c["proof"]) for p in payloads for c in p.checkpoints),
        "view_changes": sum(len(v["viewChanges"]) for v in chain.view_changes),
        "evidence": len(chain.evidence),
        "epochs": 1,  # the genesis set's, no change scheduled
        "export_manifest": 6,  # ranges of 2 blocks: 0-1 .. 10
    }
    return {name: count * nodes for name, count in per_node.items()}


@pytest.fixture(scope="module")
def exported(spark: SparkSession, test_chain: ServedChain,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The test chain exported from two fake nodes, and the export's stdout and stderr."""
    out = tmp_path_factory.mktemp("export") / "out"
    with serving(test_chain) as first, serving(test_chain) as second:
        code = main(["export", "--rpc", f"{first.url},{second.url}", "--out", str(out),
                     "--range-size", "2"])
        assert code == 0
    yield out


@dataclasses.dataclass(frozen=True)
class Audited:
    """One `pbft-etl audit` of the module's export: exit status, stdout, JSON report, page."""

    code: int
    stdout: str
    report: dict[str, Any]
    page: Path


def _audit(exported: Path, directory: Path, validators: list[str] | None = None) -> Audited:
    """`pbft-etl audit --trust-node` of `exported` (and `--validators`, a file of these, if
    given) with its `--report` and `--html`: both are written from the one audit."""
    report, page = directory / "report.json", directory / "audit.html"
    args = ["audit", "--data", str(exported), "--trust-node", "--report", str(report),
            "--html", str(page)]
    if validators is not None:
        trusted = directory / "validators.txt"
        trusted.write_text("\n".join(validators) + "\n")
        args += ["--validators", str(trusted)]
    with redirect_stdout(io.StringIO()) as stdout:  # capsys is a test's, not a module's
        code = main(args)
    return Audited(code, stdout.getvalue(), json.loads(report.read_text()), page)


# The audits the tests below only read, each run once for all of them (~10 s of Spark each)
@pytest.fixture(scope="module")
def sound_audit(exported: Path, tmp_path_factory: pytest.TempPathFactory) -> Audited:
    """The export audited against the validator set the nodes report."""
    return _audit(exported, tmp_path_factory.mktemp("sound"))


@pytest.fixture(scope="module")
def unsound_audit(exported: Path, test_chain: ServedChain,
                  tmp_path_factory: pytest.TempPathFactory) -> Audited:
    """The export audited against another set: validator 3 replaced by an outsider."""
    validators = [*test_chain.validators.addresses[:3], "0x" + "ee" * 20]
    return _audit(exported, tmp_path_factory.mktemp("unsound"), validators)


def test_export_of_two_nodes_writes_every_row_once_and_the_audit_passes(
    spark: SparkSession, test_chain: ServedChain, exported: Path, sound_audit: Audited,
) -> None:
    assert counts(spark, exported) == expected_counts(test_chain, nodes=2)
    assert sound_audit.code == 0, sound_audit.stdout
    assert "no violations" in sound_audit.stdout
    result = sound_audit.report
    assert result["ok"] is True and result["violations"] == []
    assert sorted(result["nodes"].values()) == [11, 11]
    # 33 COMMITs, 6 CHECKPOINTs, 3 VIEW-CHANGEs and a NEW-VIEW, each recovered once for both
    # nodes (the CHECKPOINTs nested in the VIEW-CHANGEs are the same messages)
    assert result["signatures"] == 33 + 6 + 3 + 1
    # the workers' recovery CPU time reached the driver (a recovery costs ~0.1 ms, never 1 us)
    assert 0 < result["signatures_per_cpu_second"] < 1_000_000


def test_run_exports_and_audits_in_one_command(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain,
) -> None:
    """`pbft-etl run`: the export and then its audit, in the one Spark session."""
    out, report = tmp_path / "out", tmp_path / "report.json"
    with serving(test_chain) as node:
        code, stdout, stderr = etl(capsys, "run", "--rpc", node.url, "--out", str(out),
                                   "--trust-node", "--report", str(report))
    assert code == 0, stdout + stderr
    assert stdout.startswith("exported 11 blocks") and "no violations" in stdout
    assert counts(spark, out) == expected_counts(test_chain, nodes=1) | {"export_manifest": 1}
    assert json.loads(report.read_text())["ok"] is True


def test_audit_against_another_validator_set_fails_listing_each_violation(
    unsound_audit: Audited,
) -> None:
    assert unsound_audit.code == 1
    result = unsound_audit.report
    lines = unsound_audit.stdout.splitlines()
    assert f"{len(result['violations'])} violation(s)" in lines[1]
    assert len(lines) == 2 + len(result["violations"])
    assert {"certificate-non-validator", "certificate-signature"} <= set(
        result["violations_by_rule"])


def test_answers_a_lying_node_cannot_make_readable_are_left_out_and_judged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, test_chain: ServedChain,
) -> None:
    """A block whose gasUsed is not a quantity, a garbage evidence entry and a VIEW-CHANGE
    evidence entry (seqNo 2^64-1: it has none) do not stop the export: the audit reaches a
    verdict, naming the block left out, and the honest entry is exported."""
    payloads = list(test_chain.payloads)
    payloads[5] = dataclasses.replace(payloads[5], block={**payloads[5].block, "gasUsed": "zz"})
    evidence = [{"signer": "0x" + "11" * 20}, {
        "signer": test_chain.validators.addresses[1], "type": "view-change", "view": "0x2",
        "seqNo": hex(2**64 - 1), "first": "0x" + "ab" * 70, "second": None}]
    lying = dataclasses.replace(test_chain, payloads=payloads, evidence=evidence)
    out, report = tmp_path / "out", tmp_path / "report.json"
    with serving(lying) as node:
        code, stdout, stderr = etl(capsys, "run", "--rpc", node.url, "--out", str(out),
                                   "--trust-node", "--report", str(report), *FAST)
    assert code == 1, stdout + stderr
    found = {(v["rule"], v["block_number"]) for v in json.loads(report.read_text())["violations"]}
    assert ("block-gap", 6) in found or ("block-range", 5) in found, found
    assert counts_of(out, "evidence") == 1


def counts_of(out: Path, table: str) -> int:
    return int(getattr(Dataset.read(SparkSession.getActiveSession(), str(out)), table).count())


def test_interrupted_export_resumes_from_the_manifest(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain, node: FakeNode,
) -> None:
    out = tmp_path / "out"
    node.fail_from = 9  # ranges of 2 blocks, 4 a wave: 0..7 are written, 8..10 fail
    code, _, stderr = etl(capsys, "export", "--rpc", node.url, "--out", str(out),
                          "--range-size", "2", *FAST)
    assert code == 3 and "Traceback" not in stderr
    error = stderr.splitlines()[-1]
    assert re.search(f"error: blocks 8-10 from {node.url}: HTTP 503", error), error
    assert spark.read.parquet(str(out / "blocks")).count() == 8
    node.fail_from = None
    node.fetched.clear()
    code, stdout, stderr = etl(capsys, "export", "--rpc", node.url, "--out", str(out),
                               "--range-size", "2")
    assert code == 0, stderr
    assert sorted(node.fetched) == [8, 9, 10]  # only what the manifest did not hold
    assert "4 range(s) were already exported" in stdout
    assert counts(spark, out) == expected_counts(test_chain, nodes=1)


def test_a_passing_failure_is_fetched_again(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain, node: FakeNode,
) -> None:
    """Blocks 8-10 fail every attempt of their task (503 twice), then are served: the span
    is asked again and fetched whole, not left out (that would read as a node withholding
    blocks) nor failing the export."""
    out = tmp_path / "out"
    node.fail_from, node.fail_from_times = 9, 2
    code, stdout, stderr = etl(capsys, "export", "--rpc", node.url, "--out", str(out),
                               "--range-size", "4", *FAST)
    assert code == 0, stderr
    assert "exported 11 blocks" in stdout  # each fetched once in the count
    assert f"{node.url} serves block 8 now: fetching blocks 8-10 from {node.url} again" \
        in stderr
    assert counts(spark, out) == {**expected_counts(test_chain, nodes=1), "export_manifest": 3}


def test_rerunning_a_range_replaces_it(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain, node: FakeNode,
) -> None:
    out = tmp_path / "out"
    args = ["export", "--rpc", node.url, "--out", str(out), "--range-size", "4"]
    assert etl(capsys, *args, "--to", "5")[0] == 0  # range 4..7 holds 4 and 5
    node.fetched.clear()
    assert etl(capsys, *args)[0] == 0
    assert sorted(node.fetched) == [4, 5, 6, 7, 8, 9, 10]  # range 4..7 again, whole
    data = Dataset.read(spark, str(out))
    numbers = [r["number"] for r in data.blocks.select("number").collect()]
    assert sorted(numbers) == list(range(11))
    assert data.transactions.count() == expected_counts(test_chain, 1)["transactions"]


def test_plan_skips_what_the_manifest_holds_and_widens_partial_ranges() -> None:
    done = {("a", 0): (0, 3), ("a", 4): (4, 5), ("b", 0): (2, 3)}
    assert plan_spans(("a", "b"), 0, 9, 4, done) == [
        Span("b", 0, 3, 0),
        Span("a", 4, 7, 4),
        Span("b", 4, 7, 4),
        Span("a", 8, 9, 8),
        Span("b", 8, 9, 8),
    ]
    assert plan_spans(("a",), 5, 5, 4, done) == []
    plan = Plan(("a", "b"), 0, 9, 4, done)
    assert plan.held() == [("a", 0)] and plan.blocks() == 20 - 4  # a: 4..5 is partial


def test_plan_is_lazy_and_asks_a_stopped_node_for_nothing_more() -> None:
    """A head claimed at 2**63 - 1 costs what the node serves, not 2**61 ranges."""
    plan = Plan(("honest", "liar"), 0, 2**63 - 1, 4, heads={"honest": 9})
    assert plan.next_wave(4) == [
        Span("honest", 0, 3, 0), Span("liar", 0, 3, 0),
        Span("honest", 4, 7, 4), Span("liar", 4, 7, 4),
    ]
    plan.stopped.add("liar")  # it served less than span 4..7
    assert plan.fetch_again(Span("honest", 4, 7, 4))  # it failed, then served
    assert plan.next_wave(4) == [Span("honest", 4, 7, 4), Span("honest", 8, 9, 8)]
    assert plan.next_wave(4) == []
    assert plan.blocks() == 10 + 2**63


def test_client_retries_with_backoff_then_gives_up(node: FakeNode) -> None:
    policy = RetryPolicy(attempts=3, backoff=0.01)
    node.fail_next = 2
    with JsonRpcClient(node.url, policy) as client:
        assert client.call("eth_blockNumber") == "0xa"
        assert node.requests == 3
        node.fail_next = 3
        with pytest.raises(RpcError, match="HTTP 503.*gave up after 3 attempts"):
            client.call("eth_blockNumber")
        with pytest.raises(RpcError, match="does not exist") as error:
            client.call("eth_noSuchMethod")
        assert not error.value.retriable


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "--out", "x"], "the following arguments are required: --rpc"),
        (["export", "--rpc", "ftp://node", "--out", "x"], "expected an http:// or https:// URL"),
        (["export", "--rpc", "http://a,http://a", "--out", "x"], "a node is listed twice"),
        (["export", "--rpc", "http://a", "--out", "x", "--from", "-1"], "is negative"),
        (["audit", "--data", "/no/such/dir", "--trust-node"], "no such directory"),
        (["audit", "--data", ".", "--trust-node", "--genesis", "b"], "not allowed with"),
        (["export", "--rpc", "http://a", "--out", "run[1]"], "in a path as a pattern"),
        (["audit", "--data", "out*", "--trust-node"], "in a path as a pattern"),
    ],
)
def test_usage_errors_are_one_line_with_exit_status_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, stderr = etl(capsys, *args)
    assert code == 2
    assert stderr.count("\n") == 1 and message in stderr and stderr.startswith("pbft-etl: error")


def test_a_range_beyond_the_head_and_an_unreachable_node_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, node: FakeNode
) -> None:
    code, _, stderr = etl(capsys, "export", "--rpc", node.url, "--out", str(tmp_path),
                          "--to", "99")
    assert (code, stderr.count("\n")) == (2, 1)
    assert f"--to 99 is above the head 10 of {node.url}" in stderr
    unreachable = node.url.rsplit(":", 1)[0] + ":1"
    code, _, stderr = etl(capsys, "export", "--rpc", unreachable, "--out", str(tmp_path),
                          "--retries", "0")
    assert (code, stderr.count("\n")) == (3, 1)
    assert "ConnectionRefusedError" in stderr and "is it a running PBFT node?" in stderr


def _render(page: Path) -> tuple[str, list[str]]:
    """The page as headless Chromium leaves it after running its scripts, and every console
    message it logged."""
    result = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=20000", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, [line for line in result.stderr.splitlines() if ":CONSOLE(" in line]


@pytest.mark.parametrize("sound", [True, False])
def test_the_html_report_renders_every_figure_with_no_console_error(
    request: pytest.FixtureRequest, sound: bool,
) -> None:
    """`audit --html`: one self-contained page (no network: every script inline); verdict and
    violations first; in a real browser every figure draws and the console stays clean."""
    audited: Audited = request.getfixturevalue("sound_audit" if sound else "unsound_audit")
    assert audited.code == (0 if sound else 1)
    page = audited.page
    text = page.read_text()
    assert not re.search(r"""<script[^>]+src=|<link[^>]+href=["']?https?:""", text)
    verdict = text.index("Sound: no violations" if sound else "Unsound: ")
    assert verdict < text.index('id="figure-0"')
    if not sound:
        assert "certificate-non-validator" in text[verdict:text.index('id="figure-0"')]
    dom, console = _render(page)
    assert console == []
    figures = re.findall(r'id="figure-\d+"', dom)
    assert len(figures) == 5
    for index in range(5):
        start = dom.index(f'id="figure-{index}"')
        end = dom.find('id="figure-', start + 1)
        assert "main-svg" in dom[start:end if end > 0 else None], f"figure {index} not drawn"
