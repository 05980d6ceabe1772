"""`pbft-node status`: one node's head and peers, or a whole cluster as a table.

Given several nodes (`--rpc URL,URL,...`) or a testnet (`--testnet DIR`), one row per node
with what a person on call reads first: its role (validator or observer), its address, head,
view and primary, the watermarks h/H, the stable checkpoint, the last executed block, its mode
and peers (an observer has no view, primary, watermarks or checkpoint: "-"). A node that does
not answer is a row saying why, and the command exits 1. `--watch` redraws the table every
few seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cli.errors import CliError
from cli.testnet import load_testnet

WATCH_SECONDS = 2.0
CLEAR_SCREEN = "\x1b[H\x1b[2J"
COLUMNS = ("node", "role", "address", "head", "view", "primary", "h/H", "stable", "executed",
           "mode", "peers")


def rpc(url: str, method: str, params: list[Any] | None = None) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []})
    request = urllib.request.Request(
        url, data=body.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            reply = json.loads(response.read())
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None
    except ValueError:
        raise CliError(f"{url} did not answer with JSON-RPC") from None
    if "error" in reply:
        raise CliError(f"{method}: {reply['error'].get('message')}")
    return reply.get("result")


def _short(address: str) -> str:
    return address[:8] + ".." + address[-4:]


def node_row(name: str, url: str) -> tuple[list[str], bool]:
    """The node's row, and whether it answered."""
    try:
        head = int(rpc(url, "eth_blockNumber"), 16)
        try:
            status = rpc(url, "pbft_status")
        except CliError:  # a dev-engine node has no pbft namespace
            status = {"mode": "dev engine"}
    except CliError as exc:
        return [name, str(exc)], False
    if status.get("role") == "observer":
        return [name, "observer", _short(status["node"]) if status["node"] else "-", str(head),
                "-", "-", "-", "-", str(status["lastExecuted"]), status["mode"],
                str(status["peers"])], True
    if "view" not in status:
        return [name, "-", "-", str(head), "-", "-", "-", "-", "-", status["mode"], "-"], True
    return [
        name, "validator", _short(status["validator"]), str(head), str(status["view"]),
        _short(status["primary"]), f"{status['h']}/{status['H']}",
        str(status["stableCheckpoint"]), str(status["lastExecuted"]), status["mode"],
        str(status["peers"]),
    ], True


def cluster_table(nodes: list[tuple[str, str]]) -> tuple[str, bool]:
    """The table for (name, url) nodes, and whether every node answered."""
    rows, answered = [list(COLUMNS)], True
    for name, url in nodes:
        row, ok = node_row(name, url)
        rows.append(row)
        answered = answered and ok
    full = [r for r in rows if len(r) == len(COLUMNS)]
    widths = [max(len(r[i]) for r in full) for i in range(len(COLUMNS))]
    lines = []
    for row in rows:
        if len(row) == 2:  # unreachable: the reason spans the rest of the line
            lines.append(f"{row[0]:<{widths[0]}}  {row[1]}")
        else:
            lines.append("  ".join(f"{cell:<{width}}" for cell, width in zip(row, widths,
                                                                            strict=True)))
    return "\n".join(line.rstrip() for line in lines), answered


def _nodes(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.testnet:
        description = load_testnet(Path(args.testnet))
        return [(f"node {n['index']}", n["rpc_url"]) for n in description["nodes"]]
    return [(url, url) for url in args.rpc.split(",") if url]


def _one_node(url: str) -> int:
    head = rpc(url, "eth_getBlockByNumber", ["latest", False])
    print(f"client   {rpc(url, 'web3_clientVersion')}")
    print(f"chain id {int(rpc(url, 'eth_chainId'), 16)}")
    print(f"head     #{int(head['number'], 16)} {head['hash']}")
    print(f"peers    {int(rpc(url, 'net_peerCount'), 16)}")
    with contextlib.suppress(CliError):  # a dev-engine node has no pbft namespace
        print(f"role     {rpc(url, 'pbft_status').get('role', '-')}")
    return 0


def status(args: argparse.Namespace) -> int:
    nodes = _nodes(args)
    if len(nodes) == 1 and not args.testnet and args.watch is None:
        return _one_node(nodes[0][1])
    try:
        while True:
            table, answered = cluster_table(nodes)
            if args.watch is None:
                print(table)
                return 0 if answered else 1
            sys.stdout.write(f"{CLEAR_SCREEN}{time.strftime('%H:%M:%S')}\n{table}\n")
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _interval(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"want a number of seconds above 0, got {text!r}")
    return seconds


def add_status_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "status", help="show a node's head and peers, or a cluster's consensus state"
    )
    nodes = parser.add_mutually_exclusive_group()
    nodes.add_argument("--rpc", default="http://127.0.0.1:8545",
                       help="JSON-RPC URL, or several separated by commas (a table)")
    nodes.add_argument("--testnet", metavar="DIR",
                       help="directory made by testnet init: a row for each of its nodes")
    parser.add_argument("--watch", type=_interval, nargs="?", const=WATCH_SECONDS,
                        metavar="SECONDS",
                        help=f"redraw every SECONDS ({WATCH_SECONDS:g}) until interrupted")
    parser.set_defaults(handler=status)
