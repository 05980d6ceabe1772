"""`pbft-etl audit --html FILE`: the audit as one self-contained page for people.

The verdict and every violation with its evidence come first, then plots (plotly, with its
JavaScript inlined, so the page opens with no network): blocks and transactions over time,
the block interval distribution, the view changes (which view, at which stable checkpoint, by
whom), each validator's share of commit certificates and checkpoints (an offline or lagging
validator stands out) and the verified equivocation evidence against it, and the signed
messages verified. Who signed is always the signer recovered from the signature
(`ConsensusFigures`), never a signer column the node filled in. Spark aggregates; only the
small results reach the driver. The JSON report (`--report`) stays the one for machines.
"""

from __future__ import annotations

import html
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from pyspark.sql import functions as F

from spark_etl.audit.context import Audit
from spark_etl.audit.records_rules import consensus_figures
from spark_etl.audit.report import AuditResult, ConsensusFigures, epochs_note
from spark_etl.errors import UsageError
from spark_etl.tables import Dataset

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } .sound { color: #1a7f37; } .unsound { color: #c62828; }
table { border-collapse: collapse; width: 100%; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } .figure { margin: 1.5em 0; }
"""


def write_html_report(data: Dataset, result: AuditResult, path: Path) -> None:
    blocks = _one_node_blocks(data)
    consensus = result.figures or consensus_figures(Audit(data, result.validators))
    figures = [
        _blocks_over_time(blocks), _block_intervals(blocks), _view_changes(consensus),
        _validator_shares(consensus, result.validators.members()), _signatures(data, result),
    ]
    body = [_verdict(result) + _epochs(result)]
    for index, figure in enumerate(figures):
        body.append(figure.to_html(full_html=False, include_plotlyjs=False,
                                   div_id=f"figure-{index}", default_height="420px"))
    page = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>pbft-chain audit</title><style>{STYLE}</style>"
            f"<script>{get_plotlyjs()}</script></head><body>\n"
            + "\n".join(f'<div class="figure">{part}</div>' if i else part
                        for i, part in enumerate(body))
            + "\n</body></html>\n")
    try:
        path.write_text(page)
    except OSError as exc:
        raise UsageError(f"--html {path}: {exc.strerror}") from None


def _verdict(result: AuditResult) -> str:
    v = result.validators
    scope = (f"{sum(result.blocks.values())} blocks from {len(result.blocks)} node(s), "
             f"{result.transactions} transactions, {result.signatures} signed messages "
             f"verified (N = {v.size}, f = {v.max_faulty}, Q = {v.quorum}, chain id "
             f"{v.chain_id}{epochs_note(v)})")
    if result.ok:
        return (f'<h1 class="sound">Sound: no violations</h1><p>{html.escape(scope)}: the '
                "chain and its certificates are sound.</p>")
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in (
            x.rule, "-" if x.block_number is None else str(x.block_number), x.node or "-",
            x.detail)) + "</tr>"
        for x in result.violations)
    counts = ", ".join(f"{html.escape(rule)} {n}" for rule, n in result.by_rule().items())
    return (f'<h1 class="unsound">Unsound: {len(result.violations)} violation(s)</h1>'
            f"<p>{html.escape(scope)}. By rule: {counts}.</p><table><tr><th>rule</th>"
            f"<th>block</th><th>node</th><th>evidence</th></tr>{rows}</table>")


def _epochs(result: AuditResult) -> str:
    """The validator-set epochs the audit counted with, as a table."""
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in (
            e["epoch"], e["first_block"], "-" if e["last_block"] is None else e["last_block"],
            e["n"], e["f"], e["quorum"], ", ".join(e["validators"]), e["validators_hash"]))
        + "</tr>"
        for e in result.validators.epoch_table())
    return ("<h2>Validator-set epochs</h2><table><tr><th>epoch</th><th>first block</th>"
            "<th>last block</th><th>N</th><th>f</th><th>Q</th><th>validators</th>"
            f"<th>validators hash</th></tr>{rows}</table>")


def _one_node_blocks(data: Dataset) -> list[tuple[int, int, int]]:
    """(number, timestamp, transactions) of every block, each number once."""
    rows = (data.blocks.groupBy("number")
            .agg(F.first("timestamp").alias("timestamp"),
                 F.first("transaction_count").alias("transactions"))
            .orderBy("number").collect())
    return [(r["number"], r["timestamp"], r["transactions"]) for r in rows]


def _blocks_over_time(blocks: list[tuple[int, int, int]]) -> go.Figure:
    per_second: Counter[int] = Counter()
    transactions: Counter[int] = Counter()
    for _, timestamp, count in blocks:
        per_second[timestamp] += 1
        transactions[timestamp] += count
    seconds = sorted(per_second)
    figure = go.Figure([
        go.Scatter(x=[_time(s) for s in seconds], y=[per_second[s] for s in seconds],
                   name="blocks", mode="lines+markers"),
        go.Scatter(x=[_time(s) for s in seconds], y=[transactions[s] for s in seconds],
                   name="transactions", mode="lines+markers", yaxis="y2"),
    ])
    figure.update_layout(title="Blocks and transactions per second of block time",
                         yaxis={"title": "blocks"},
                         yaxis2={"title": "transactions", "overlaying": "y", "side": "right"})
    return figure


def _block_intervals(blocks: list[tuple[int, int, int]]) -> go.Figure:
    intervals = [b[1] - a[1] for a, b in zip(blocks, blocks[1:], strict=False)]
    figure = go.Figure([go.Histogram(x=intervals, name="blocks")])
    figure.update_layout(title="Block interval (seconds between consecutive block times)",
                         xaxis={"title": "seconds"}, yaxis={"title": "blocks"})
    return figure


def _view_changes(consensus: ConsensusFigures) -> go.Figure:
    views = consensus.views
    figure = go.Figure([go.Scatter(
        x=[v.stable_seq_no for v in views], y=[v.view for v in views], mode="markers+text",
        text=[f"{v.senders} VIEW-CHANGEs, primary {(v.primary or 'not proven')[:10]}"
              for v in views],
        textposition="top center", name="installed views")])
    figure.update_layout(title=f"View changes: {len(views)} installed view(s) (the reasons: "
                               "each node's pbft_view_changes_total)",
                         xaxis={"title": "stable checkpoint (block)"},
                         yaxis={"title": "view"})
    return figure


def _validator_shares(consensus: ConsensusFigures, addresses: tuple[str, ...]) -> go.Figure:
    names = [f"{i}: {a[:10]}" for i, a in enumerate(addresses)]
    shares = (("COMMITs in certificates", consensus.commits),
              ("CHECKPOINTs kept", consensus.checkpoints),
              ("equivocations proven", consensus.equivocations))
    figure = go.Figure([go.Bar(x=names, y=[counts.get(a, 0) for a in addresses], name=name)
                        for name, counts in shares])
    figure.update_layout(title="Each validator's share of commit certificates and checkpoints "
                               "(by recovered signer)",
                         barmode="group", yaxis={"title": "signed messages"})
    return figure


def _signatures(data: Dataset, result: AuditResult) -> go.Figure:
    kinds = {
        "COMMIT": data.commit_certificates.select("signature").distinct().count(),
        "CHECKPOINT": data.checkpoints.where(F.col("signature").isNotNull())
        .select("signature").distinct().count(),
        "VIEW-CHANGE": data.view_changes.select("message").distinct().count(),
        "NEW-VIEW": data.view_changes.select("new_view").distinct().count(),
    }
    figure = go.Figure([go.Bar(x=list(kinds), y=list(kinds.values()))])
    figure.update_layout(title=f"Signed messages verified: {result.signatures} distinct, "
                               f"{result.to_json()['signatures_per_second']:,} per second",
                         yaxis={"title": "distinct messages"})
    return figure


def _time(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")
