"""`pbft-etl`: export a PBFT chain and its consensus evidence to Parquet, and audit it, on
Apache Spark (local[*] unless --master or spark-submit says otherwise).

Exit status: 0 done (audit: no violation), 1 the audit found violations, 2 a usage error,
3 the job could not run (a node unreachable, data missing, Spark failed)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException

from spark_etl.audit import run_audit
from spark_etl.audit.context import ValidatorSet
from spark_etl.audit.html import write_html_report
from spark_etl.audit.validators import read_genesis, read_validators_file, resolve_validators
from spark_etl.errors import EtlError, UsageError, from_spark_failure
from spark_etl.export import DEFAULT_RANGE_SIZE, ExportOptions, blocks_per_second, export
from spark_etl.rpc import RetryPolicy, parse_rpc_url
from spark_etl.session import finish_session, recording_classes, spark_session
from spark_etl.tables import Dataset, is_local_path

EXIT_VIOLATIONS = 1
EXIT_USAGE = 2
EXIT_FAILED = 3


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _positive(text: str) -> int:
    value = _count(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _export_arguments(out: argparse.ArgumentParser) -> None:
    out.add_argument("--rpc", required=True, metavar="URL[,URL...]",
                     help="the nodes' JSON-RPC URLs; each node's rows are kept apart")
    out.add_argument("--out", required=True, metavar="DIR",
                     help="output directory (or a Hadoop URI)")
    out.add_argument("--from", dest="first", type=_count, metavar="N",
                     help="first block (default 0)")
    out.add_argument("--to", dest="last", type=_count, metavar="M",
                     help="last block (default: the lowest head of the nodes)")
    out.add_argument("--master", help="Spark master URL (default local[*])")
    out.add_argument("--range-size", type=_positive, default=DEFAULT_RANGE_SIZE, metavar="BLOCKS",
                     help=f"blocks per partition directory (default {DEFAULT_RANGE_SIZE})")
    out.add_argument("--retries", type=_count, default=RetryPolicy.attempts - 1, metavar="K",
                     help="retries of a failing request, with backoff (default %(default)s)")


def _audit_arguments(audit: argparse.ArgumentParser) -> None:
    trusted = audit.add_mutually_exclusive_group()
    trusted.add_argument("--validators", type=Path, metavar="FILE",
                         help="validator addresses: JSON list, testnet.json, or one a line")
    trusted.add_argument("--genesis", type=Path, metavar="FILE",
                         help="genesis file with config.pbft.validators")
    audit.add_argument("--report", type=Path, metavar="FILE", help="write the JSON report here")
    audit.add_argument("--html", type=Path, metavar="FILE",
                       help="write a self-contained HTML page (verdict, violations, plots)")


def build_parser() -> Parser:
    parser = Parser(prog="pbft-etl", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    out = commands.add_parser("export", help="export blocks and consensus records to Parquet")
    _export_arguments(out)
    out.set_defaults(handler=_export)
    audit = commands.add_parser("audit", help="audit an exported data set")
    audit.add_argument("--data", required=True, metavar="DIR",
                       help="the --out directory of an export")
    audit.add_argument("--master", help="Spark master URL (default local[*])")
    _audit_arguments(audit)
    audit.set_defaults(handler=_audit)
    run = commands.add_parser("run", help="export, then audit what was exported (one Spark "
                                          "session: the start-up is paid once)")
    _export_arguments(run)
    _audit_arguments(run)
    run.set_defaults(handler=_export_and_audit)
    return parser


def _nodes(text: str) -> tuple[str, ...]:
    nodes = tuple(url.strip().rstrip("/") for url in text.split(",") if url.strip())
    if not nodes:
        raise UsageError("--rpc: give at least one node URL")
    if len(set(nodes)) != len(nodes):
        raise UsageError("--rpc: a node is listed twice")
    for url in nodes:
        parse_rpc_url(url)
    return nodes


def _stderr(text: str) -> None:
    print(f"pbft-etl: {text}", file=sys.stderr, flush=True)


def _export(args: argparse.Namespace) -> int:
    _export_to(args)
    return 0


def _export_to(args: argparse.Namespace) -> str:
    """Run the export of `args`; the output location."""
    out = str(Path(args.out).resolve()) if is_local_path(args.out) else args.out
    options = ExportOptions(
        nodes=_nodes(args.rpc),
        out=out,
        first=args.first,
        last=args.last,
        range_size=args.range_size,
        policy=RetryPolicy(attempts=args.retries + 1),
    )
    summary = export(spark_session(args.master, record_classes=True), options, _stderr)
    tables = ", ".join(f"{name} {count}" for name, count in summary.rows.items())
    rate = blocks_per_second(summary.blocks, summary.seconds)
    print(f"exported {summary.blocks} blocks to {out} in {summary.seconds:.1f} s "
          f"({rate} blocks/s); rows: {tables or '-'}; "
          f"{summary.skipped} range(s) were already exported")
    return out


def _audit(args: argparse.Namespace) -> int:
    if is_local_path(args.data) and not Path(args.data).is_dir():
        raise UsageError(f"--data {args.data}: no such directory (the --out of an export)")
    return _audit_data(args, args.data)


def _export_and_audit(args: argparse.Namespace) -> int:
    return _audit_data(args, _export_to(args))


def _audit_data(args: argparse.Namespace, location: str) -> int:
    addresses = read_validators_file(args.validators) if args.validators else None
    genesis: ValidatorSet | None = read_genesis(args.genesis) if args.genesis else None
    data = Dataset.read(spark_session(args.master, record_classes=True), location)
    result = run_audit(data, resolve_validators(data.export_manifest, addresses, genesis))
    print(result.summary(), end="")
    if args.html is not None:
        write_html_report(data, result, args.html)
    if args.report is not None:
        try:
            args.report.write_text(result.dumps())
        except OSError as exc:
            raise UsageError(f"--report {args.report}: {exc.strerror}") from None
    return 0 if result.ok else EXIT_VIOLATIONS


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except UsageError as exc:
        _stderr(f"error: {exc}")
        return EXIT_USAGE
    except EtlError as exc:
        _stderr(f"error: {exc}")
        return EXIT_FAILED
    except (PySparkException, Py4JError) as exc:
        failure = from_spark_failure(exc)
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        _stderr(f"error: {failure or 'Spark failed: ' + first_line}")
        return EXIT_USAGE if isinstance(failure, UsageError) else EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    finally:
        _finish()


def _finish() -> None:
    """Let a JVM that records the class archive write it (once per JVM and Spark install)."""
    archive = recording_classes()
    if archive is not None:
        _stderr(f"recording Spark's classes to {archive} for faster start-ups (once)")
    finish_session()


if __name__ == "__main__":
    sys.exit(main())
