"""Attack review of the export's lazy plan, its second asking of a node that served less
(`Plan.next_wave`, `fetch_again`, `short_spans`, `ask_again`, `Stops`) and what it rests on
(`probe`, `catch_up`, `read_done`, `JsonRpcClient`). Threat: a node operator controls every
JSON-RPC answer of some of the nodes exported from (no validator key); honest nodes may have
passing outages. Each xfail is a finding: the export (a) runs without bound on a lying
node's claims, (b) lets a lying node stop an honest node's export, (c) loses rows, or (d)
turns an honest node's passing outage into a hole the audit reads as "unsound".

No Spark: the plan is driven by hand, nodes are tiny HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import rlp
from eth_hash.auto import keccak

from pbft_engine.messages import KeySigner
from spark_etl import schemas
from spark_etl.audit.context import ValidatorSet
from spark_etl.errors import EtlError, UsageError
from spark_etl.export import (
    COUNTED,
    ExportOptions,
    NodeInfo,
    Plan,
    Stops,
    block_bounds,
    export,
    manifest_rows,
    probe_all,
    read_done,
    short_spans,
)
from spark_etl.rpc import JsonRpcClient, RetryPolicy
from spark_etl.source import Span
from tests.etl.chain_factory import (
    CHAIN_ID,
    Validators,
    certificate_json,
    commits_for,
)

FAST = RetryPolicy(attempts=1, backoff=0.01, timeout=2.0)
GENESIS = "0x" + "11" * 32
Answer = Callable[[str, list[Any]], Any]  # (method, params) -> a reply's "result" or "error"


class Error(dict[str, Any]):
    """An answer that is a JSON-RPC error object instead of a result."""


def honest_answers(head: int = 9, view: int = 1) -> Answer:
    """What a node of a chain of `head` + 1 blocks answers (the blocks are not real: what
    the export counts, never parses, in the functions tested here)."""

    def answer(method: str, params: list[Any]) -> Any:
        if method == "eth_chainId":
            return "0x539"
        if method == "eth_blockNumber":
            return hex(head)
        if method == "pbft_getValidators":
            return ["0x" + "aa" * 20]
        if method == "pbft_status":
            return {"engine": "pbft", "view": view, "mode": "normal"}
        if method in ("pbft_getCheckpoints", "pbft_getViewChanges", "pbft_getEvidence"):
            return []
        if method == "pbft_getBlockBundles":  # the range method being added: not served here
            return Error(code=-32601, message="the method does not exist")
        number = int(params[0], 16)
        if number > head:
            return None
        if method == "eth_getBlockByNumber":
            return {"number": hex(number), "hash": GENESIS if number == 0 else "0x" + "22" * 32}
        return "0x01"

    return answer


def made_up_header(number: int) -> list[Any]:
    """A header of height `number` the export only hashes and reads extraData of (its 13th
    field, 0x: a chain built before the commitment to the next set)."""
    return [number, b"made up", *[b""] * 11]


def made_up_block(number: int) -> bytes:
    """An RLP block [header, transactions, ommers] of height `number`."""
    return rlp.encode([made_up_header(number), [], []])


def block_hash(number: int) -> bytes:
    return keccak(rlp.encode(made_up_header(number)))


def certified_answers(head: int, signers: Validators, answers: Answer | None = None) -> Answer:
    """`answers` (default: `honest_answers(head)`) with each block up to `head` served as an
    RLP block and a commit certificate over its header hash, signed by `signers`."""
    served = answers or honest_answers(head)

    def answer(method: str, params: list[Any]) -> Any:
        if method not in ("debug_getRawBlock", "pbft_getCommitCertificate"):
            return served(method, params)
        number = int(params[0], 16)
        if number > head:
            return None
        if method == "debug_getRawBlock":
            return "0x" + made_up_block(number).hex()
        return certificate_json(signers, commits_for(signers, number, block_hash(number)))

    return answer


GENESIS_SIGNERS = Validators()
# what a node operator can sign with: keys of its own, none of the genesis validators'
OPERATOR_SIGNERS = Validators([KeySigner(bytes([0x66 + i]) * 32) for i in range(4)])
GENESIS_SET = ValidatorSet(tuple(GENESIS_SIGNERS.addresses), CHAIN_ID)


@contextmanager
def rpc_server(answer: Answer) -> Iterator[str]:
    """A JSON-RPC node on 127.0.0.1 answering each call with `answer`; its URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls = payload if isinstance(payload, list) else [payload]
            replies = []
            for call in calls:
                result = answer(call["method"], call.get("params", []))
                key = "error" if isinstance(result, Error) else "result"
                replies.append({"jsonrpc": "2.0", "id": call["id"], key: result})
            data = json.dumps(replies if isinstance(payload, list) else replies[0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with served_on_loopback(Handler) as url:
        yield url


@contextmanager
def served_on_loopback(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served by threads on a free port of 127.0.0.1; its URL; stopped after."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def drain(plan: Plan, waves: int = 1_000) -> list[Span]:
    """Every span the plan still gives, as `export` takes them (every node serving all)."""
    spans: list[Span] = []
    for _ in range(waves):
        wave = plan.next_wave(4)
        if not wave:
            return spans
        spans.extend(wave)
    raise AssertionError(f"the plan still gives spans after {waves} waves ({len(spans)} spans)")


def count_row(node: str, start: int, first: int | None, last: int | None,
              blocks: int) -> dict[str, Any]:
    """A row of `range_counts`: what the wave's Spark job served of (node, range)."""
    return {"node": node, "range_start": start, "first_block": first, "last_block": last,
            "blocks": blocks, **dict.fromkeys(COUNTED, 0)}


# --- finding 1 (c, d): a range with a hole inside is recorded whole in the manifest -------


class ManifestOnly:
    """What `read_done` asks of a SparkSession: the manifest rows `manifest_rows` wrote."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        names = schemas.EXPORT_MANIFEST.schema.names
        self.rows = [dict(zip(names, row, strict=True)) for row in rows]
        self.read = self

    def schema(self, _: Any) -> ManifestOnly:
        return self

    def parquet(self, _: str) -> ManifestOnly:
        return self

    def collect(self) -> list[dict[str, Any]]:
        return self.rows


def test_a_range_with_a_hole_inside_is_fetched_again_by_a_resumed_export(
    tmp_path: Path,
) -> None:
    """Range 0..999 is four partition tasks of 250 blocks. An honest node's passing outage
    fails the task of 250..499 only: the range's row counts 750 blocks, min 0, max 999.
    `short_spans` sees it short, but `manifest_rows` records first_block 0, last_block 999,
    and `read_done` hands the plan (0, 999): the range is "held", so a resumed export (after
    an interruption, or once the node's retries ran out) never asks for 250..499, although
    `_left_out` promises "exporting again into the same --out fetches the hole"."""
    node = "http://honest:8545"
    span = Span(node, 0, 999, 0)
    counts = [count_row(node, 0, 0, 999, 750)]
    assert short_spans([span], counts) != []  # the export knows the range is not whole
    info = NodeInfo(node, 1337, GENESIS, ("0x" + "aa" * 20,), 999, 1)
    rows = manifest_rows(counts, {node: info}, 1_000, (0, 999))
    (tmp_path / schemas.EXPORT_MANIFEST.name).mkdir()
    options = ExportOptions(nodes=(node,), out=str(tmp_path))
    done = read_done(ManifestOnly(rows), options, [info])  # type: ignore[arg-type]
    resumed = drain(Plan((node,), 0, 999, 1_000, done, {node: 999}))
    assert any(s.first <= 250 and s.last >= 499 for s in resumed), resumed


# --- finding 2 (d): only a node's first short span of a wave is settled -------------------


def test_every_short_span_of_a_node_in_a_wave_is_fetched_again() -> None:
    """A wave holds 2 x parallelism spans, often several ranges of one node. A passing
    outage fails a task in ranges 0..3 and 4..7 of the same node; the node serves again when
    asked. Range 0..3 is queued again; range 4..7 is forgotten: the plan has moved past it,
    the node is not stopped, so it goes on serving 8.. and the audit finds a gap 6..7 in
    an honest node's chain (block-gap): "unsound" from a passing outage."""
    with rpc_server(honest_answers(head=11)) as node:
        plan = Plan((node,), 0, 11, 4)
        wave = plan.next_wave(3)
        assert [s.range_start for s in wave] == [0, 4, 8]
        counts = [count_row(node, 0, 0, 1, 2), count_row(node, 4, 4, 5, 2),
                  count_row(node, 8, 8, 11, 4)]
        stops = Stops()
        options = ExportOptions(nodes=(node,), out="unused", policy=FAST)
        stops.settle_wave(plan, short_spans(wave, counts), options, lambda _: None)
        assert node not in plan.stopped
        assert Span(node, 4, 7, 4) in drain(plan)


# --- finding 3 (d): three re-fetches per node for the whole export ------------------------


def test_an_honest_node_s_fourth_passing_outage_is_fetched_again() -> None:
    """A long export (a million blocks, a thousand ranges) of an honest node that had a
    blip at four separate times, each over when asked again: the first three ranges are
    fetched again, the fourth is not (`fetch_again` is False) and `settle` stops the node
    there, asked for nothing above: block-range / node-behind, an unsound verdict. It is
    recorded with error "" (a null), so `fail_if_no_node_served` does not fail the export
    even when it is the only node (a re-run could not resume what was not failed)."""
    with rpc_server(honest_answers(head=15)) as node:
        plan = Plan((node,), 0, 15, 4)
        stops = Stops()
        options = ExportOptions(nodes=(node,), out="unused", policy=FAST)
        for start in range(0, 16, 4):
            wave = plan.next_wave(1)
            assert [s.range_start for s in wave] == [start]
            # the blip: the range's last task failed; asked again, the node serves
            counts = [count_row(node, start, start, start + 1, 2)]
            stops.settle_wave(plan, short_spans(wave, counts), options, lambda _: None)
            assert plan.next_wave(1) == wave  # fetched again: served whole this time
        assert node not in plan.stopped and stops.refused == {}


# --- finding 4 (d): the first block not served is mis-computed ----------------------------


def test_the_first_block_not_served_is_the_hole_not_the_span_s_end() -> None:
    """Tasks 0..249 and 250..499 of span 0..999 failed, 500..999 were served: the row is
    min 500, max 999, 500 blocks. `first_missing` = min(999 + 1, 999) = 999: `ask_again`
    asks block 999 (served, so "it serves now" whatever the node does at 0..499), and when
    the node is stopped the progress line and `Stops.refused` name block 999."""
    node = "http://node:8545"
    span = Span(node, 0, 999, 0)
    assert short_spans([span], [count_row(node, 0, 500, 999, 500)]) == [(span, 0)]
    [(_, middle)] = short_spans([span], [count_row(node, 0, 0, 999, 750)])
    assert middle <= 250  # the hole is in 250..499 (or anywhere below 999)


# --- finding 5 (b): an answer of -32003 to a call made alone recurses without end ---------


class TooLarge:
    """A node that answers -32003 (response too large) to its first `budget` requests, then
    errors plainly (a test must end: the client's recursion ends only at the recursion
    limit, which py-evm, imported by the audit, raises; ~20 requests a second here)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.requests = 0

    def __call__(self, method: str, params: list[Any]) -> Any:
        self.requests += 1
        if self.requests <= self.budget:
            return Error(code=-32003, message="response too large")
        return Error(code=-32000, message="enough")


def test_a_call_alone_answered_response_too_large_is_an_rpc_error() -> None:
    """`_result` answers RESPONSE_TOO_LARGE by `self.call(method, *params)`; a call already
    alone that gets -32003 again recurses, one request per level, without bound but the
    recursion limit: thousands of requests, then RecursionError (or a C stack overflow).
    That is no EtlError: `BlockReader.read`, `NodeReader.read`, `probe` and `ask_again`
    let it through, the Spark job (or the driver) fails and the honest node beside the liar
    gets no verdict."""
    liar = TooLarge(budget=60)
    with rpc_server(liar) as url, JsonRpcClient(url, FAST) as client, pytest.raises(EtlError):
        client.call("eth_blockNumber")
    assert liar.requests <= 2


# --- finding 6 (a, b): no bound on the time of one answer ---------------------------------


@contextmanager
def dripping_server(stop: threading.Event) -> Iterator[str]:
    """A node that announces a 1 MB answer and sends it a byte every 50 ms (each recv well
    within the client's timeout) until `stop`."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(1 << 20))
            self.end_headers()
            self.wfile.write(b"[")
            self.wfile.flush()
            while not stop.wait(0.05):
                self.wfile.write(b" ")
                self.wfile.flush()
            self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with served_on_loopback(Handler) as url:
        yield url


def test_an_answer_dripped_byte_by_byte_is_bounded_by_the_timeout() -> None:
    """`response.read(MAX_ANSWER_BYTES + 1)` reads until the answer ends, 256 MiB or the
    connection closes; the socket timeout is per recv. At a byte per 59 s (default timeout
    60 s) one request lasts ~500 years; every probe, task and `ask_again` is exposed, and a
    wave waits for its slowest task."""
    stop = threading.Event()
    outcome: list[BaseException | Any] = []
    with dripping_server(stop) as liar:
        policy = RetryPolicy(attempts=1, backoff=0.01, timeout=0.5)

        def ask() -> None:
            try:
                with JsonRpcClient(liar, policy) as client:
                    outcome.append(client.call("eth_blockNumber"))
            except BaseException as exc:  # noqa: BLE001 - what the call ended with
                outcome.append(exc)

        caller = threading.Thread(target=ask, daemon=True)
        started = time.monotonic()
        caller.start()
        caller.join(timeout=3.0)
        finished = not caller.is_alive()
        stop.set()
        caller.join(timeout=5.0)
    assert finished, f"the call still runs after {time.monotonic() - started:.1f} s"
    assert isinstance(outcome[0], EtlError)


# --- finding 7 (b): a lying node's probe answer stops every node's export -----------------


class Reached(Exception):
    """The export went past probing its nodes (to the plan's first Spark job)."""


class NoSpark:
    def __getattr__(self, name: str) -> Any:
        raise Reached(name)


def liar_claiming_view_2_64() -> Answer:
    return honest_answers(head=9, view=2**64 - 1)


def liar_claiming_head_2_63() -> Answer:
    answers = honest_answers(head=9)
    return lambda m, p: hex(2**63) if m == "eth_blockNumber" else answers(m, p)


def liar_behind_then_failing() -> Answer:
    """Claims head 0 at the probe (behind --to: `catch_up` polls it), then an error."""
    answers = honest_answers(head=9)
    asked = []

    def answer(method: str, params: list[Any]) -> Any:
        if method == "eth_blockNumber":
            asked.append(method)
            return "0x0" if len(asked) == 1 else Error(code=-32000, message="no")
        return answers(method, params)

    return answer


@pytest.mark.parametrize("liar", [liar_claiming_view_2_64, liar_claiming_head_2_63,
                                  liar_behind_then_failing])
def test_a_lying_node_s_status_cannot_stop_the_honest_node_s_export(
    tmp_path: Path, liar: Callable[[], Answer],
) -> None:
    """`probe` turns a view or head above 2**63 - 1 (`long`), a malformed answer or any
    error into ExtractError, and `catch_up`'s `_head` an error at its poll: `export` stops
    there, before a block of the honest node is asked for. The honest node's export must go
    on (the liar recorded without blocks, as `record_nodes_without_blocks` does, and
    judged by the audit); here it must reach its first Spark job (`Reached`)."""
    with rpc_server(honest_answers(head=9)) as honest, rpc_server(liar()) as lying:
        options = ExportOptions(nodes=(honest, lying), out=str(tmp_path / "out"),
                                policy=FAST, lag_wait=0.6)
        with pytest.raises(Reached):
            export(NoSpark(), options, lambda _: None)  # type: ignore[arg-type]


# --- finding 8 (a, b): a node that serves every block it claims is followed for ever ------


def liar_making_up_blocks() -> Answer:
    """Claims head 2**63 - 1 and serves a well-formed block and a commit certificate for every
    number up to it: certificates signed by the operator's own keys (it holds no validator
    key), over the hashes of the headers it serves."""
    return certified_answers(2**63 - 1, OPERATOR_SIGNERS)


def test_a_node_making_up_blocks_up_to_an_enormous_head_is_bounded() -> None:
    """--to defaults to the highest head claimed; the export checks nothing of a block
    (the audit checks its certificate), so a node operator answering well-formed blocks
    without a certificate (or with its own) for every number kept the plan going: every
    wave gave it another range, none was short, nothing ever stopped it. With --genesis
    (`ExportOptions.genesis`) a claimed head must carry a quorum certificate of the genesis
    validators: the liar is left out with a warning, the plan ends at the honest head."""
    with rpc_server(certified_answers(9, GENESIS_SIGNERS)) as honest, \
            rpc_server(liar_making_up_blocks()) as liar:
        options = ExportOptions(nodes=(honest, liar), out="unused", range_size=4,
                                policy=FAST, genesis=GENESIS_SET)
        warnings: list[str] = []
        infos = probe_all(options, warnings.append)
    first, last = block_bounds(options, infos)
    plan = Plan(tuple(i.url for i in infos), first, last, 4, {}, {i.url: i.head for i in infos})
    assert drain(plan) == [Span(honest, 0, 3, 0), Span(honest, 4, 7, 4), Span(honest, 8, 9, 8)]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {liar}: its head "), warnings


# --- finding 9 (d): a node down when asked again is never asked again ---------------------


def test_a_node_down_when_asked_again_is_asked_once_more_after_the_waves() -> None:
    """Two honest nodes; `b` is down for a few seconds (a restart) while the wave of range
    0..3 runs and while `settle` asks it again (error: connection refused). `a` served
    everything, so the export does not fail: `b` is stopped at block 0, asked for nothing
    more, and the audit reports it (block-range, node-behind) from a passing outage. Once
    the waves are done (minutes later on a real chain), asking the nodes stopped by an
    error once more and fetching their rest would cost one request per node."""
    with rpc_server(honest_answers(head=7)) as a:
        with rpc_server(honest_answers(head=7)) as b:
            pass  # b is down from here on: its port refuses connections
        plan = Plan((a, b), 0, 7, 4)
        wave = plan.next_wave(2)
        counts = [count_row(a, 0, 0, 3, 4)]  # b's task failed
        stops = Stops()
        options = ExportOptions(nodes=(a, b), out="unused", policy=FAST)
        stops.settle_wave(plan, short_spans(wave, counts), options, lambda _: None)
        assert b in stops.refused and stops.refused[b][1]  # stopped, with the error
        stops.fail_if_no_node_served(plan)  # a served all: no failure, b left to the audit
        rest = drain(plan)
    assert Span(b, 0, 3, 0) in rest or Span(b, 4, 7, 4) in rest  # b asked again, later


# --- finding 10 (c, low): a node listed twice is fetched twice into one partition ---------


def test_a_node_listed_twice_is_planned_once() -> None:
    """`export` is also a library call (benchmarks, `run`): `Plan` yields Span(a, 0, 3, 0)
    twice in one wave, the Spark job fetches both into partition node=a/range_start=0
    (8 rows for 4 blocks), `short_spans` then reads 8 != 4 as a short span and asks again,
    and `Stops.refused` (a dict by node) can never reach len(plan.nodes)."""
    with pytest.raises(UsageError, match="listed twice"):
        Plan(("http://a:8545", "http://a:8545"), 0, 3, 4)
