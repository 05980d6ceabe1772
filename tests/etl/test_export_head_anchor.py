"""`pbft-etl export --genesis`: a node's claimed head must carry a commit certificate of a
quorum of the genesis validators for the header it serves there (`spark_etl.head_anchor`),
else the node is left out with a one-line warning; the honest nodes' export goes on.
Nodes are HTTP servers on 127.0.0.1 (tests/etl/fake_node.py serves the real test chain)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pbft_engine.messages import Commit, KeySigner
from spark_etl.export import ExportOptions, probe_all
from spark_etl.tables import Dataset
from tests.etl.chain_factory import CHAIN_ID, ServedChain, Validators, certificate_json
from tests.etl.conftest import etl
from tests.etl.fake_node import serving
from tests.etl.test_attack_review_export import (
    FAST,
    GENESIS_SET,
    GENESIS_SIGNERS,
    OPERATOR_SIGNERS,
    Answer,
    block_hash,
    certified_answers,
    honest_answers,
    rpc_server,
)

HEAD = 9


def genesis_file(directory: Path, validators: list[str]) -> Path:
    """What `--genesis` reads of a genesis file: the chain id and config.pbft.validators."""
    path = directory / "genesis.json"
    path.write_text(json.dumps({"config": {"chainId": CHAIN_ID,
                                           "pbft": {"validators": validators}}}))
    return path


def test_a_node_with_an_uncertified_head_is_left_out_and_the_honest_one_exported_whole(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    test_chain: ServedChain,
) -> None:
    """The liar serves the test chain but claims head 2**63 - 1, which has no certificate."""
    out = tmp_path / "out"
    genesis = genesis_file(tmp_path, test_chain.validators.addresses)
    with serving(test_chain) as honest, serving(test_chain) as liar:
        liar.heads = [2**63 - 1]
        code, _, stderr = etl(capsys, "export", "--rpc", f"{honest.url},{liar.url}", "--out",
                              str(out), "--genesis", str(genesis), "--range-size", "4",
                              "--retries", "0")
    assert code == 0, stderr
    warnings = [line for line in stderr.splitlines() if "warning" in line]
    assert warnings == [
        f"pbft-etl: warning: {liar.url}: its head {2**63 - 1} is not certified by the genesis "
        "validators (no commit certificate served): the node is left out of the export and "
        "the audit"
    ]
    data = Dataset.read(spark, str(out))
    blocks = Counter(row["node"] for row in data.blocks.select("node").collect())
    assert blocks == {honest.url: test_chain.head + 1}
    assert {row["node"] for row in data.export_manifest.select("node").collect()} == {honest.url}


def too_few_commits(head: int) -> Answer:
    """The genesis validators' certificate of each block with only Q - 1 of its COMMITs."""
    answers = certified_answers(head, GENESIS_SIGNERS)

    def answer(method: str, params: list[Any]) -> Any:
        if method != "pbft_getCommitCertificate":
            return answers(method, params)
        number = int(params[0], 16)
        commits = [GENESIS_SIGNERS.sign(Commit(0, number, block_hash(number), r))
                   for r in range(GENESIS_SET.quorum - 1)]
        return certificate_json(GENESIS_SIGNERS, commits)

    return answer


def another_header(head: int) -> Answer:
    """Real certificates of the genesis validators, but for block `head` + 1's hash: not the
    header the node serves at its head."""
    answers = certified_answers(head, GENESIS_SIGNERS)
    other = certified_answers(head + 1, GENESIS_SIGNERS)
    return lambda m, p: (other(m, [hex(int(p[0], 16) + 1)])
                         if m == "pbft_getCommitCertificate" else answers(m, p))


def outsider_replica(head: int) -> Answer:
    """A quorum of genesis COMMITs and one more, claiming replica 4 of a set of 4."""
    answers = certified_answers(head, GENESIS_SIGNERS)
    outsider = KeySigner(b"\x66" * 32)

    def answer(method: str, params: list[Any]) -> Any:
        if method != "pbft_getCommitCertificate":
            return answers(method, params)
        number = int(params[0], 16)
        commits = [GENESIS_SIGNERS.sign(Commit(0, number, block_hash(number), r))
                   for r in range(GENESIS_SET.quorum)]
        commits.append(GENESIS_SIGNERS.sign(Commit(0, number, block_hash(number), 4), outsider))
        return certificate_json(Validators([*GENESIS_SIGNERS.signers, outsider]), commits)

    return answer


def not_rlp(head: int) -> Answer:
    answers = certified_answers(head, GENESIS_SIGNERS)
    return lambda m, p: "0xc3" if m == "debug_getRawBlock" else answers(m, p)


@pytest.mark.parametrize(("liar", "why"), [
    (lambda: certified_answers(HEAD, OPERATOR_SIGNERS),
     "message claims replica 0 but is signed by another key"),
    (lambda: too_few_commits(HEAD), "commit certificate: 2 signatures, quorum is 3"),
    (lambda: outsider_replica(HEAD), "replica index 4 is not in the validator set"),
    (lambda: another_header(HEAD), "commit certificate: a commit is for another block"),
    (lambda: not_rlp(HEAD), "the block served at 9 is not an RLP block"),
    (lambda: honest_answers(HEAD), "the certificate served is not the hex of at most"),
])
def test_a_head_certificate_that_is_no_genesis_quorum_leaves_the_node_out(
    liar: Callable[[], Answer], why: str,
) -> None:
    """Signed by unknown keys, by too few validators, by a replica outside the set, for
    another header than the one served, beside a block that is not RLP, or no certificate
    at all (`honest_answers` serves "0x01"): the node is left out, the honest one kept."""
    asked: Counter[str] = Counter()

    def counted(answer: Answer) -> Answer:
        def call(method: str, params: list[Any]) -> Any:
            asked[method] += 1
            return answer(method, params)

        return call

    with rpc_server(counted(certified_answers(HEAD, GENESIS_SIGNERS))) as honest, \
            rpc_server(counted(liar())) as lying:
        options = ExportOptions(nodes=(honest, lying), out="unused", policy=FAST,
                                genesis=GENESIS_SET)
        warnings: list[str] = []
        infos = probe_all(options, warnings.append)
    assert [info.url for info in infos] == [honest]
    [warning] = warnings
    assert warning.startswith(f"warning: {lying}: its head {HEAD} is not certified by the "
                              f"genesis validators ({why}"), warning
    # the cost: one certificate (and one block) per node per probe, not per block
    assert asked["pbft_getCommitCertificate"] == asked["debug_getRawBlock"] == 2


@pytest.mark.parametrize(("extra", "message"), [
    ([], "genesis.json: not JSON"),
    (["--trust-node"], "argument --trust-node: not allowed with argument --genesis"),
])
def test_a_genesis_file_that_does_not_parse_is_a_one_line_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str], message: str,
) -> None:
    genesis = tmp_path / "genesis.json"
    genesis.write_text("{not json")
    code, stdout, stderr = etl(capsys, "export", "--rpc", "http://127.0.0.1:1", "--out",
                               str(tmp_path / "out"), "--genesis", str(genesis), *extra)
    assert (code, stdout) == (2, "")
    assert stderr.startswith("pbft-etl: error: ") and stderr.count("\n") == 1, stderr
    assert message in stderr
