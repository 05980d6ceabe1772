"""`pbft-node send`: sign a transaction, submit it, and wait for f+1 validators to agree on its
receipt (the bft_client package does the work; this is arguments and output)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from eth_keys import keys
from eth_utils import is_hex_address

from bft_client import BftClient, ConfirmedReceipt, Timeouts, TxRequest
from cli.errors import CliError
from cli.keys import list_keyfiles, read_password, unlock_keyfile
from cli.testnet import load_testnet


def add_send_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    send = commands.add_parser(
        "send", help="send a transaction and wait until f+1 validators report its receipt"
    )
    nodes = send.add_mutually_exclusive_group(required=True)
    nodes.add_argument(
        "--testnet", metavar="DIR", help="directory made by testnet init (its validators)"
    )
    nodes.add_argument(
        "--nodes", metavar="LIST", help="the validators: ADDRESS@RPC-URL,... (every one)"
    )
    key = send.add_mutually_exclusive_group(required=True)
    key.add_argument("--account", type=int, metavar="I", help="index of a --testnet dev account")
    key.add_argument("--key-file", metavar="FILE", help="file holding a hex private key")
    key.add_argument(
        "--keystore", metavar="DIR", help="keystore directory (with --from, --password-file)"
    )
    send.add_argument(
        "--from", dest="sender", metavar="ADDRESS", help="the keystore account to send from"
    )
    send.add_argument(
        "--password-file", metavar="FILE", help="the keystore password (else prompted)"
    )
    send.add_argument("--to", metavar="ADDRESS", help="recipient address (omit to deploy --data)")
    send.add_argument("--value", type=int, default=0, metavar="WEI", help="wei to transfer (0)")
    send.add_argument("--data", default="0x", metavar="HEX", help="hex calldata or init code")
    send.add_argument("--gas", type=int, metavar="N", help="gas limit (default: eth_estimateGas)")
    send.add_argument("--nonce", type=int, metavar="N", help="nonce (default: the pending nonce)")
    send.add_argument(
        "--max-fee", type=int, metavar="WEI", help="max fee per gas in wei (2 x base fee + tip)"
    )
    send.add_argument(
        "--priority-fee", type=int, metavar="WEI", help="max priority fee per gas in wei"
    )
    send.add_argument(
        "--via", metavar="NODE",
        help="submit through this node: a validator (URL or address) or an observer (URL, or "
             "address of a --testnet observer); f+1 validators confirm either way")
    send.add_argument(
        "--timeout", type=float, default=60.0, metavar="S", help="give up after S seconds (60)"
    )
    send.add_argument(
        "--resend-after",
        type=float,
        default=10.0,
        metavar="S",
        help="re-send to all after S seconds (10)",
    )
    send.add_argument("--json", action="store_true", help="print the result as JSON")
    send.set_defaults(handler=send_command)


def _parse_nodes(value: str) -> dict[str, str]:
    validators = {}
    for entry in (e.strip() for e in value.split(",") if e.strip()):
        address, _, url = entry.partition("@")
        if not is_hex_address(address) or not url.startswith(("http://", "https://")):
            raise CliError(f"--nodes entry {entry!r} is not ADDRESS@http://host:port")
        validators[address] = url
    return validators


def _testnet_account(description: dict[str, Any], index: int) -> keys.PrivateKey:
    accounts = description["accounts"]
    if not 0 <= index < len(accounts):
        raise CliError(f"--account {index}: the testnet has accounts 0 to {len(accounts) - 1}")
    return keys.PrivateKey(bytes.fromhex(accounts[index]["private_key"].removeprefix("0x")))


def _read_key_file(path: str) -> keys.PrivateKey:
    try:
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise CliError(f"cannot read key file {path}: {exc.strerror}") from None
    try:
        return keys.PrivateKey(bytes.fromhex(text.removeprefix("0x")))
    except ValueError:
        raise CliError(f"key file {path} does not hold a 32-byte hex private key") from None


def _keystore_key(args: argparse.Namespace) -> keys.PrivateKey:
    if not args.sender:
        raise CliError("--keystore needs --from ADDRESS")
    for address, path in list_keyfiles(Path(args.keystore)):
        if address == args.sender.lower():
            return unlock_keyfile(path, read_password(args.password_file))
    raise CliError(f"no keyfile for {args.sender} in {args.keystore}")


def _private_key(args: argparse.Namespace, description: dict[str, Any] | None) -> keys.PrivateKey:
    if args.account is not None:
        if description is None:
            raise CliError("--account picks a dev account of --testnet DIR")
        return _testnet_account(description, args.account)
    if args.key_file:
        return _read_key_file(args.key_file)
    return _keystore_key(args)


def _tx_request(args: argparse.Namespace, chain_id: int | None) -> TxRequest:
    if args.to is not None and not is_hex_address(args.to):
        raise CliError(f"--to {args.to!r} is not an address")
    try:
        data = bytes.fromhex(args.data.removeprefix("0x"))
    except ValueError:
        raise CliError("--data is not hex") from None
    return TxRequest(
        to=args.to,
        value=args.value,
        data=data,
        gas=args.gas,
        nonce=args.nonce,
        max_fee_per_gas=args.max_fee,
        max_priority_fee_per_gas=args.priority_fee,
        chain_id=chain_id,
    )


def _summary(result: ConfirmedReceipt) -> dict[str, Any]:
    return {
        "transactionHash": result.tx_hash,
        "blockNumber": result.block_number,
        "blockHash": result.key.block_hash,
        "status": result.key.status,
        "gasUsed": result.key.gas_used,
        "validators": result.validators,
        "needed": result.needed,
        "confirmedBy": list(result.agreeing),
        "disagreeing": {v: str(key) for v, key in result.disagreeing.items()},
        "resends": result.resends,
        "receipt": result.receipt,
    }


def _print_human(result: ConfirmedReceipt) -> None:
    outcome = "success" if result.key.status == 1 else "reverted"
    print(f"transaction  {result.tx_hash}")
    print(f"block        #{result.block_number} {result.key.block_hash}")
    print(f"status       {result.key.status} ({outcome})")
    print(f"gas used     {result.key.gas_used}")
    if result.receipt.get("contractAddress"):
        print(f"contract     {result.receipt['contractAddress']}")
    print(
        f"confirmed by {len(result.agreeing)} of {result.validators} validators "
        f"(f+1 = {result.needed}): {', '.join(result.agreeing)}"
    )
    for validator, key in result.disagreeing.items():
        print(f"disagreeing  {validator}: {key}")
    if result.resends:
        print(f"re-sent to every validator {result.resends} time(s)")


async def _send(
    validators: dict[str, str],
    timeouts: Timeouts,
    key: keys.PrivateKey,
    request: TxRequest,
    via: str | None,
) -> ConfirmedReceipt:
    async with BftClient(validators, timeouts=timeouts) as client:
        return await client.send_transaction(key, request, via)


def send_command(args: argparse.Namespace) -> int:
    description = load_testnet(Path(args.testnet)) if args.testnet else None
    via = args.via
    if description is not None:
        validators = {node["address"]: node["rpc_url"] for node in description["nodes"]
                      if node.get("role", "validator") == "validator"}
        observers = {node["address"].lower(): node["rpc_url"] for node in description["nodes"]
                     if node.get("role") == "observer"}
        via = observers.get((via or "").lower(), via)  # an observer by address: its URL
    else:
        validators = _parse_nodes(args.nodes)
    if args.timeout <= 0 or args.resend_after <= 0:
        raise CliError("--timeout and --resend-after must be positive")
    timeouts = Timeouts(resend_after=args.resend_after, deadline=args.timeout)
    request = _tx_request(args, description["chain_id"] if description else None)
    key = _private_key(args, description)
    result = asyncio.run(_send(validators, timeouts, key, request, via))
    if args.json:
        print(json.dumps(_summary(result), indent=2))
    else:
        _print_human(result)
    return 0
