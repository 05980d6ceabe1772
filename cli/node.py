"""`pbft-node`: accounts, data directories, running a node or a local testnet, status."""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import secrets
import signal
import sys
from pathlib import Path

from eth_keys import keys

from bft_client import BftClientError
from chain.errors import ChainError
from chain.genesis import load_genesis_file
from chain.node import Node, initialize_datadir
from chain.registry import available_engines
from cli.config import node_config, resolve_settings
from cli.errors import CliError
from cli.keys import list_keyfiles, read_password, write_keyfile
from cli.send import add_send_parser
from cli.status import add_status_parser
from cli.testnet import init_testnet, run_testnet
from cli.validators import add_validators_parser
from storage import StorageError

LOG_FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"


def _account_new(args: argparse.Namespace) -> int:
    password = read_password(args.password_file, confirm=True)
    private_key = keys.PrivateKey(secrets.token_bytes(32))
    path = write_keyfile(Path(args.keystore), private_key, password)
    print(f"address {private_key.public_key.to_checksum_address()}")
    print(f"keyfile {path}")
    return 0


def _account_list(args: argparse.Namespace) -> int:
    for index, (address, path) in enumerate(list_keyfiles(Path(args.keystore))):
        print(f"account #{index}: {address} {path}")
    return 0


def _init(args: argparse.Namespace) -> int:
    genesis = load_genesis_file(args.genesis, available_engines())
    head = initialize_datadir(Path(args.datadir), genesis)
    print(f"initialised {args.datadir}: chain id {genesis.chain_id}, engine {genesis.engine}")
    print(f"genesis block hash 0x{head.hash.hex()}")
    return 0


async def _serve(node: Node) -> None:
    """Run until SIGINT or SIGTERM, or until the database fails (raised after stopping)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await node.start()
    except BaseException:
        await node.stop()  # a start that failed half-way: close what it opened, then say why
        raise
    try:
        await asyncio.wait([loop.create_task(stop.wait()), node.failed],
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        await node.stop()
    if node.failed.done():
        raise node.failed.result()


def raise_fd_limit() -> None:
    """The process's soft limit on open files raised to its hard limit, as geth's
    `fdlimit.Raise`: the usual soft limit (1,024) is the JSON-RPC port's max_connections and
    its 503s (BUSY_LINGERING) away from failing the node's own sockets and files with
    EMFILE (the attack review s16, finding 6). Says nothing unless it fails."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard and hard != resource.RLIM_INFINITY:  # (no file limit: Linux refuses)
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:  # (ValueError: a hard limit the kernel refuses)
        logging.getLogger("pbft-node").warning("cannot raise the open files limit: %s", exc)


def _run(args: argparse.Namespace) -> int:
    settings = resolve_settings(args)
    logging.basicConfig(
        level=str(settings["log_level"] or "info").upper(), format=LOG_FORMAT, stream=sys.stderr
    )
    raise_fd_limit()
    config = node_config(settings)
    config.fresh_validator = args.fresh_validator
    node = Node(config)
    try:
        asyncio.run(_serve(node))
    except OSError as exc:  # the RPC port is taken or cannot be bound
        node.db.close()
        raise CliError(f"cannot listen: {exc.strerror or exc}") from None
    return 0


def _testnet_init(args: argparse.Namespace) -> int:
    pbft = {
        name: value
        for name, value in (
            ("checkpoint_interval", args.checkpoint_interval),
            ("log_multiplier", args.log_multiplier),
            ("max_in_flight", args.max_in_flight),
            ("min_validators", args.min_validators),
            ("vote_ttl", args.vote_ttl),
            ("request_timeout", args.request_timeout),
            ("new_view_timeout", args.request_timeout),
            ("new_view_timeout_cap",
             None if args.request_timeout is None else max(30, args.request_timeout)),
        )
        if value is not None
    }
    description = init_testnet(
        Path(args.dir), args.validators, args.chain_id, args.base_p2p_port, args.base_http_port,
        args.base_metrics_port, pbft, args.observers,
    )
    print(f"testnet of {len(description['nodes'])} node(s), engine {description['engine']}")
    for node in description["nodes"]:
        print(f"  node {node['index']} {node['role']:<9} {node['address']} {node['rpc_url']}")
    print(f"description: {Path(args.dir) / 'testnet.json'}")
    print(f"monitoring: {Path(args.dir) / 'monitoring'} (Prometheus scrape configuration, "
          "alert rules, Grafana dashboard)")
    print(f"start it: pbft-node testnet run --dir {args.dir}")
    return 0


def _testnet_run(args: argparse.Namespace) -> int:
    return run_testnet(Path(args.dir))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pbft-node", description="A permissioned Ethereum-style chain node (PBFT)."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    account = commands.add_parser("account", help="manage V3 keystore accounts")
    account_commands = account.add_subparsers(dest="account_command", required=True)
    new = account_commands.add_parser("new", help="create a new account in a keystore")
    new.add_argument("--keystore", required=True, help="keystore directory")
    new.add_argument("--password-file", help="file holding the password (else prompted)")
    new.set_defaults(handler=_account_new)
    listing = account_commands.add_parser("list", help="list the accounts of a keystore")
    listing.add_argument("--keystore", required=True, help="keystore directory")
    listing.set_defaults(handler=_account_list)

    init = commands.add_parser("init", help="initialise a data directory from a genesis file")
    init.add_argument("--genesis", required=True, help="geth-style genesis.json")
    init.add_argument("--datadir", required=True, help="data directory to create")
    init.set_defaults(handler=_init)

    run = commands.add_parser("run", help="run a node")
    run.add_argument("--config", help="TOML config file (flags override it)")
    run.add_argument("--datadir", help="data directory (made by init)")
    run.add_argument("--http.addr", dest="http_addr", help="JSON-RPC address (127.0.0.1)")
    run.add_argument("--http.port", dest="http_port", type=int, help="JSON-RPC port (8545)")
    run.add_argument("--http.hosts", dest="http_hosts", help="Host allowlist, comma-separated")
    run.add_argument("--http.corsdomain", dest="http_corsdomain", help="allowed browser origins")
    run.add_argument("--p2p.addr", dest="p2p_addr", help="validator transport address")
    run.add_argument("--p2p.port", dest="p2p_port", type=int, help="validator transport port")
    run.add_argument("--peers", help="the validators (and observers) to dial: "
                     "ADDRESS@host:port,...")
    run.add_argument("--observers", help="observer node addresses allowed to connect to "
                     "this validator: ADDRESS,...")
    run.add_argument("--keystore", help="keystore holding this node's key (a validator's, "
                     "or an observer's; without one an observer uses DATADIR/nodekey)")
    run.add_argument("--password-file", dest="password_file", help="the keystore password")
    run.add_argument(
        "--fresh-validator", dest="fresh_validator", action="store_true",
        help="this validator never voted on this chain: start voting without its consensus "
             "records or validator_state.json (never give it to a validator that ran before)")
    run.add_argument("--metrics.addr", dest="metrics_addr", help="metrics address (127.0.0.1)")
    run.add_argument("--metrics.port", dest="metrics_port", type=int,
                     help="serve Prometheus metrics on this port (off by default)")
    run.add_argument("--log.level", dest="log_level", help="debug, info, warning or error")
    run.add_argument("--http.max-connections", dest="http_max_connections", type=int,
                     help="HTTP and WebSocket connections at once (256)")
    run.add_argument("--rpc.batch-request-limit", dest="rpc_batch_request_limit", type=int,
                     help="calls in one JSON-RPC batch (1000)")
    run.add_argument("--rpc.batch-response-max-size", dest="rpc_batch_response_max_size",
                     type=int, help="bytes of one batch's answers (25000000)")
    run.add_argument("--rpc.gascap", dest="rpc_gascap", type=int,
                     help="gas for eth_call and eth_estimateGas (50000000)")
    run.add_argument("--rpc.evmtimeout", dest="rpc_evmtimeout", type=float,
                     help="seconds an eth_call or eth_estimateGas may execute (5)")
    run.add_argument("--txpool.pricelimit", dest="txpool_pricelimit", type=int,
                     help="lowest fee cap admitted, in wei, above the next base fee (1)")
    run.add_argument("--txpool.lifetime", dest="txpool_lifetime", type=float,
                     help="seconds a sender's queued transactions stay without activity (10800)")
    run.add_argument("--txpool.accountqueue", dest="txpool_accountqueue", type=int,
                     help="queued (gapped) transactions per sender (200)")
    run.add_argument("--txpool.globalqueue", dest="txpool_globalqueue", type=int,
                     help="queued (gapped) transactions in all (4000)")
    run.set_defaults(handler=_run)

    testnet = commands.add_parser("testnet", help="a local cluster of nodes")
    testnet_commands = testnet.add_subparsers(dest="testnet_command", required=True)
    tinit = testnet_commands.add_parser("init", help="write genesis, keys and configs")
    tinit.add_argument("--validators", type=int, default=4, help="number of validators (4)")
    tinit.add_argument("--observers", type=int, default=0,
                       help="number of observers: nodes that follow and serve RPC (0)")
    tinit.add_argument("--dir", required=True, help="directory for the testnet")
    tinit.add_argument("--chain-id", type=int, default=1337, help="chain id (1337)")
    tinit.add_argument("--base-p2p-port", type=int, default=30303, help="first p2p port")
    tinit.add_argument("--base-http-port", type=int, default=8545, help="first RPC port")
    tinit.add_argument("--base-metrics-port", type=int, default=6060, help="first metrics port")
    tinit.add_argument("--checkpoint-interval", type=int, help="PBFT checkpoint period K (10)")
    tinit.add_argument("--log-multiplier", type=int, help="watermark window L = K x this (4)")
    tinit.add_argument("--max-in-flight", type=int,
                       help="blocks the primary may have proposed and not executed (2)")
    tinit.add_argument(
        "--request-timeout", type=float, help="seconds before a view change (2; also new-view)"
    )
    tinit.add_argument("--min-validators", type=int,
                       help="smallest set a vote may leave (min(4, --validators))")
    tinit.add_argument("--vote-ttl", type=int,
                       help="blocks a vote on the validator set stays live (30000)")
    tinit.set_defaults(handler=_testnet_init)
    trun = testnet_commands.add_parser("run", help="run every node of a testnet")
    trun.add_argument("--dir", required=True, help="directory made by testnet init")
    trun.set_defaults(handler=_testnet_run)

    add_status_parser(commands)

    add_send_parser(commands)

    add_validators_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (CliError, ChainError, StorageError, BftClientError) as exc:
        print(f"pbft-node: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
