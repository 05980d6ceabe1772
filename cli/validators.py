"""`pbft-node validators propose|discard|pending|list`: votes on the validator set, over a
node's JSON-RPC (the pbft_* methods of `pbft_engine.validator_rpc`; docs/validators.md).

`propose` and `discard` ask a validator's node to sign and submit the vote with its own key
(its RPC must be reachable: by default it listens on 127.0.0.1 only); `--wait` follows the
vote into a block and says whether it counted or reverted, and why. `pending` prints the
network-wide tally from state, `list` the set deciding a block, its epoch and any change
scheduled after it. Errors are one line; the exit status is 1 for any of them.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

from cli.errors import CliError
from cli.status import _interval as seconds
from cli.status import rpc

WAIT_POLL = 0.25  # seconds between looks for the vote's receipt
BLOCK_TAGS = ("latest", "pending", "earliest", "safe", "finalized")


def _vote(args: argparse.Namespace, method: str, params: list[Any]) -> int:
    tx_hash = rpc(args.rpc, method, params)
    if args.wait is None:
        print(tx_hash)
        return 0
    receipt = _receipt(args.rpc, tx_hash, args.wait)
    block = int(receipt["blockNumber"], 16)
    if receipt["status"] == "0x1":
        print(f"{tx_hash} counted in block {block}")
        return 0
    raise CliError(f"{tx_hash} reverted in block {block}: {_reason(args.rpc, tx_hash, block)}")


def _receipt(url: str, tx_hash: str, seconds: float) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        receipt = rpc(url, "eth_getTransactionReceipt", [tx_hash])
        if receipt is not None:
            return dict(receipt)
        if time.monotonic() >= deadline:
            raise CliError(f"{tx_hash} not in a block after {seconds:g} s (it may still be "
                           "included: see eth_getTransactionReceipt)")
        time.sleep(WAIT_POLL)


def _reason(url: str, tx_hash: str, block: int) -> str:
    """The registry's reason: the vote called again on the state before its block."""
    tx = rpc(url, "eth_getTransactionByHash", [tx_hash])
    call = {"from": tx["from"], "to": tx["to"], "data": tx["input"], "gas": tx["gas"]}
    try:
        rpc(url, "eth_call", [call, hex(block - 1)])
    except CliError as exc:
        return str(exc).removeprefix("eth_call: ")
    return "(it passes when called again: the chain changed under it)"


def _propose(args: argparse.Namespace) -> int:
    return _vote(args, "pbft_proposeValidatorVote", [args.address, args.add])


def _discard(args: argparse.Namespace) -> int:
    return _vote(args, "pbft_discardValidatorVote", [args.address])


def _read(args: argparse.Namespace, method: str) -> Any:
    """`method`'s answer for --block; None once printed as JSON (--json)."""
    result = rpc(args.rpc, method, [args.block])
    if result is None:
        raise CliError(f"block {args.block} is not known to {args.rpc}")
    if args.json:
        print(json.dumps(result, indent=2))
        return None
    return result


def _pending(args: argparse.Namespace) -> int:
    tally = _read(args, "pbft_getPendingVotes")
    if tally is None:
        return 0
    if not tally:
        print("no pending votes")
    for subject, votes in tally.items():
        print(f"{'add' if votes['add'] else 'remove'} {subject}: {len(votes['voters'])} votes, "
              f"{int(votes['threshold'], 16)} needed; the first expires at block "
              f"{int(votes['expiresAt'], 16)}")
        for voter in votes["voters"]:
            print(f"  {voter}")
    return 0


def _list(args: argparse.Namespace) -> int:
    epoch = _read(args, "pbft_getEpoch")
    if epoch is None:
        return 0
    _print_epoch(epoch)
    scheduled = epoch["scheduled"]
    if scheduled is not None:
        print(f"scheduled (passed in block {int(scheduled['passedAt'], 16)}):")
        _print_epoch(scheduled)
    return 0


def _print_epoch(epoch: dict[str, Any]) -> None:
    last = epoch.get("lastBlock")
    span = f"blocks {int(epoch['firstBlock'], 16)}.." + (str(int(last, 16)) if last else "")
    print(f"epoch {int(epoch['epoch'], 16)}, {span}: n={int(epoch['n'], 16)} "
          f"f={int(epoch['f'], 16)} quorum={int(epoch['quorum'], 16)}")
    for index, validator in enumerate(epoch["validators"]):
        print(f"  {index} {validator}")


def _block(text: str) -> str:
    """A block tag, or a number (decimal or 0x-hex) as the RPC's hex. Plain digits only:
    int() would also take "-5", "1_000" and other scripts' digits."""
    if text in BLOCK_TAGS:
        return text
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", text):
        return hex(int(text, 16))
    if re.fullmatch(r"[0-9]+", text):
        return hex(int(text))
    raise argparse.ArgumentTypeError(
        f"want a block number or one of {', '.join(BLOCK_TAGS)}, got {text!r}")


def add_validators_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]
                          ) -> None:
    parser = commands.add_parser(
        "validators", help="vote validators in and out, and see the votes and the set")
    actions = parser.add_subparsers(dest="validators_command", required=True)
    rpc_help = "JSON-RPC URL of the node (http://127.0.0.1:8545)"

    propose = actions.add_parser(
        "propose", help="this validator's vote to add or remove ADDRESS (signed by its node)")
    propose.add_argument("address", help="the validator to add or remove (0x...)")
    change = propose.add_mutually_exclusive_group(required=True)
    change.add_argument("--add", dest="add", action="store_true", help="vote to add it")
    change.add_argument("--remove", dest="add", action="store_false", help="vote to remove it")
    discard = actions.add_parser("discard", help="retract this validator's vote about ADDRESS")
    discard.add_argument("address", help="the subject of the vote (0x...)")
    for vote, handler in ((propose, _propose), (discard, _discard)):
        vote.add_argument("--wait", type=seconds, nargs="?", const=60.0, metavar="SECONDS",
                          help="wait (60 s) for the vote's block; exit 1 if it reverted")
        vote.set_defaults(handler=handler)

    pending = actions.add_parser("pending", help="the network-wide tally of live votes")
    listing = actions.add_parser(
        "list", help="the set deciding a block, its epoch and the change scheduled after it")
    for read, handler in ((pending, _pending), (listing, _list)):
        read.add_argument("--block", type=_block, default="latest",
                          help="block number or tag: latest (default), pending, earliest")
        read.add_argument("--json", action="store_true", help="print the RPC's JSON")
        read.set_defaults(handler=handler)
    for action in (propose, discard, pending, listing):
        action.add_argument("--rpc", default="http://127.0.0.1:8545", help=rpc_help)
