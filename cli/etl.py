"""`pbft-etl`: export a PBFT chain and its consensus evidence to Parquet, and audit it, on
Apache Spark (local[*] unless --master or spark-submit says otherwise).

Exit status: 0 done (audit: no violation), 1 the audit found violations, 2 a usage error,
3 the job could not run (a node unreachable, data missing, Spark failed)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException

from spark_etl.audit import RULES, Rule, run_audit
from spark_etl.audit.context import ValidatorSet
from spark_etl.audit.html import write_html_report
from spark_etl.audit.state_rules import state_root_rule
from spark_etl.audit.validators import read_genesis, read_validators_file, resolve_validators
from spark_etl.errors import EtlError, UsageError, from_spark_failure
from spark_etl.export import (
    DEFAULT_LAG_WAIT,
    DEFAULT_RANGE_SIZE,
    ExportOptions,
    blocks_per_second,
    export,
)
from spark_etl.hexcodec import to_hex
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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds")
    return value


def _export_arguments(out: argparse.ArgumentParser) -> None:
    out.add_argument("--rpc", required=True, metavar="URL[,URL...]",
                     help="the nodes' JSON-RPC URLs; each node's rows are kept apart")
    out.add_argument("--out", required=True, metavar="DIR", type=_directory("--out"),
                     help="output directory (or a Hadoop URI)")
    out.add_argument("--from", dest="first", type=_count, metavar="N",
                     help="first block (default 0)")
    out.add_argument("--to", dest="last", type=_count, metavar="M",
                     help="last block (default: the highest head of the nodes)")
    out.add_argument("--lag-wait", type=_seconds, default=DEFAULT_LAG_WAIT, metavar="SECONDS",
                     help="how long to wait for a node behind --to to catch up; then it is "
                          "exported up to its head (default %(default)s)")
    out.add_argument("--master", help="Spark master URL (default local[*])")
    out.add_argument("--range-size", type=_positive, default=DEFAULT_RANGE_SIZE, metavar="BLOCKS",
                     help=f"blocks per partition directory (default {DEFAULT_RANGE_SIZE})")
    out.add_argument("--retries", type=_count, default=RetryPolicy.attempts - 1, metavar="K",
                     help="retries of a failing request, with backoff (default %(default)s)")


def _trust_arguments(parser: argparse.ArgumentParser, genesis: str, trust_node: str) -> None:
    """--genesis FILE or --trust-node, with what each means to the command."""
    trusted = parser.add_mutually_exclusive_group()
    trusted.add_argument("--genesis", type=Path, metavar="FILE", help=genesis)
    trusted.add_argument("--trust-node", action="store_true", help=trust_node)


def _audit_arguments(audit: argparse.ArgumentParser) -> None:
    _trust_arguments(
        audit,
        "the chain's genesis file (config.pbft.validators): the trust anchor; block 0 must be "
        "the block it makes, and (run) each node's claimed head must be certified by its "
        "validators",
        "no genesis: trust the validator set and chain id the exported nodes report (the "
        "verdict is then only as good as the node)",
    )
    audit.add_argument("--validators", type=Path, metavar="FILE",
                       help="with --trust-node: these validator addresses instead of the "
                            "nodes' (JSON list, testnet.json, or one a line)")
    audit.add_argument("--state", action="store_true",
                       help="also replay every block from the genesis allocation (needs "
                            "--genesis) and check each block's state root (one core)")
    audit.add_argument("--report", type=Path, metavar="FILE", help="write the JSON report here")
    audit.add_argument("--html", type=Path, metavar="FILE",
                       help="write a self-contained HTML page (verdict, violations, plots)")


def build_parser() -> Parser:
    parser = Parser(prog="pbft-etl", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    out = commands.add_parser("export", help="export blocks and consensus records to Parquet")
    _export_arguments(out)
    _trust_arguments(
        out,
        "the chain's genesis file (config.pbft.validators): a node's claimed head must carry "
        "a commit certificate of a quorum of its validators, else the node is left out",
        "no genesis (as without --genesis, with a warning): follow the heads the nodes claim "
        "unchecked (a node can claim any head)",
    )
    out.set_defaults(handler=_export)
    audit = commands.add_parser("audit", help="audit an exported data set")
    audit.add_argument("--data", required=True, metavar="DIR", type=_directory("--data"),
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


GLOB = frozenset("[]{}*?\\")


def _directory(option: str) -> Callable[[str], str]:
    """A directory Spark can read back: Hadoop expands glob characters in paths, so a
    directory named `run[1]` is written but never found again."""

    def parse(text: str) -> str:
        if GLOB & set(text):
            raise UsageError(f"{option} {text}: Spark reads [ ] {{ }} * ? \\ in a path as a "
                             "pattern: choose a directory name without them")
        return text

    return parse


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
    # the genesis's validator set and chain id: all the export needs of it
    options = _export_options(args, read_genesis(args.genesis) if args.genesis else None)
    if args.trust_node:
        _stderr("warning: --trust-node: the heads the nodes claim bound the export "
                "unchecked (a node can claim any head)")
    _export_to(options, args.master)
    return 0


def _export_options(args: argparse.Namespace, genesis: ValidatorSet | None) -> ExportOptions:
    """The export of `args`, each node's claimed head certified by `genesis` if given."""
    return ExportOptions(
        nodes=_nodes(args.rpc),
        out=str(Path(args.out).resolve()) if is_local_path(args.out) else args.out,
        first=args.first,
        last=args.last,
        range_size=args.range_size,
        policy=RetryPolicy(attempts=args.retries + 1),
        lag_wait=args.lag_wait,
        genesis=genesis,
    )


def _export_to(options: ExportOptions, master: str | None) -> str:
    """Run the export; the output location."""
    summary = export(spark_session(master, record_classes=True), options, _stderr)
    tables = ", ".join(f"{name} {count}" for name, count in summary.rows.items())
    rate = blocks_per_second(summary.blocks, summary.seconds)
    print(f"exported {summary.blocks} blocks to {options.out} in {summary.seconds:.1f} s "
          f"({rate} blocks/s); rows: {tables or '-'}; "
          f"{summary.skipped} range(s) were already exported")
    return options.out


def _audit(args: argparse.Namespace) -> int:
    if is_local_path(args.data) and not Path(args.data).is_dir():
        raise UsageError(f"--data {args.data}: no such directory (the --out of an export)")
    state = _state_rules(args)  # before the genesis thread starts: see _state_rules
    return _audit_data(args, args.data, _trust(args), state)


def _export_and_audit(args: argparse.Namespace) -> int:
    # first: a usage error costs no export; the state rules before the genesis thread
    state, trust = _state_rules(args), _trust(args)
    spark_session(args.master, record_classes=True)  # Spark starts while block 0 is built
    out = _export_to(_export_options(args, trust.genesis_set()), args.master)
    return _audit_data(args, out, trust, state)


@dataclass(frozen=True)
class Trust:
    """What the audit takes as given: the genesis's validator set (chain id, K, block 0), or
    (--trust-node) the addresses of --validators, if any, beside what the nodes report."""

    genesis: Future[ValidatorSet] | None  # being built on a thread of its own
    addresses: tuple[str, ...] | None

    def genesis_set(self) -> ValidatorSet | None:
        """The genesis's validator set once built (its UsageError raised here)."""
        return self.genesis.result() if self.genesis is not None else None


def _trust(args: argparse.Namespace) -> Trust:
    if args.validators is not None and not args.trust_node:
        raise UsageError("--validators: add --trust-node (the chain id and block 0 then come "
                         "from the nodes), or give --genesis FILE instead")
    if args.genesis is not None:
        return Trust(_beside_spark(genesis_validators, args.genesis), None)
    if not args.trust_node:
        raise UsageError("give --genesis FILE (the chain's genesis file), or --trust-node to "
                         "take the validator set and chain id from the nodes")
    _stderr("warning: --trust-node: the validator set and chain id are the exported nodes' "
            "own answers, so the verdict trusts the node")
    addresses = read_validators_file(args.validators) if args.validators else None
    return Trust(None, addresses)


def _state_rules(args: argparse.Namespace) -> tuple[Rule, ...]:
    """--state: the state-root rule, its genesis file checked here (before Spark runs).
    Called before `_trust` starts the genesis thread: both import py-evm's and the chain's
    modules, and two threads importing them at once can each get the other's half-imported
    module (an ImportError, seen on a loaded machine)."""
    if not args.state:
        return ()
    if args.genesis is None:
        raise UsageError("--state replays from the genesis allocation: give --genesis FILE")
    # Imported here: py-evm's chain classes, which only --state and --genesis need.
    from cli.state_replay import ChainStateReplay

    return (state_root_rule(ChainStateReplay.from_file(args.genesis)),)


def _beside_spark(build: Callable[[Path], ValidatorSet], path: Path) -> Future[ValidatorSet]:
    """`build(path)` on a thread while this one starts Spark: block 0 is built by py-evm in
    Python (seconds for a genesis of 2,000 accounts) and Spark's start-up mostly waits on its
    JVM, so on two cores the two overlap."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="genesis")
    try:
        return pool.submit(build, path)
    finally:
        pool.shutdown(wait=False)


def genesis_validators(path: Path) -> ValidatorSet:
    """The genesis file's validator set, chain id, checkpoint interval and block 0 hash."""
    return replace(read_genesis(path), genesis_hash=genesis_block_hash(path))


def genesis_block_hash(path: Path) -> str:
    """The hash of block 0 as the chain's own code builds it from the genesis file."""
    # Imported here: py-evm's chain classes cost a quarter second that only --genesis needs.
    from eth.db.atomic import AtomicDB
    from eth_utils import ValidationError

    from chain.blockchain import chain_class
    from chain.errors import GenesisError
    from chain.genesis import load_genesis_file
    from chain.registry import available_engines

    try:
        genesis = load_genesis_file(path, available_engines())
        state: Any = genesis.state()  # py-evm's AccountDetails are these dicts
        built = chain_class(genesis.chain_id).from_genesis(
            AtomicDB(), genesis.header_params(), state
        )
    except (GenesisError, ValidationError) as exc:  # what the node would refuse to start on
        raise UsageError(f"--genesis {path}: {exc}") from None
    return to_hex(built.get_canonical_head().hash)


def _audit_data(args: argparse.Namespace, location: str, trust: Trust,
                state: tuple[Rule, ...]) -> int:
    spark = spark_session(args.master, record_classes=True)  # while block 0 is built
    genesis = trust.genesis_set()  # a genesis the chain refuses is a usage error, data or not
    data = Dataset.read(spark, location)
    validators = resolve_validators(data.export_manifest, trust.addresses, genesis,
                                    data.epochs)
    result = run_audit(data, validators, RULES + state)
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
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
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
