"""A node keeps every block, balance and receipt across a clean stop and across kill -9."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from eth_account import Account
from web3 import Web3

from testkit.nodes import RunningNode, make_testnet

GWEI = 10**9


def _snapshot(w3: Web3, addresses: list[str], tx_hashes: list[Any]) -> dict[str, Any]:
    head = w3.eth.block_number
    return {
        "blocks": [dict(w3.eth.get_block(n, full_transactions=True)) for n in range(head + 1)],
        "balances": {a: w3.eth.get_balance(a) for a in addresses},
        "nonces": {a: w3.eth.get_transaction_count(a) for a in addresses},
        "receipts": [dict(w3.eth.get_transaction_receipt(h)) for h in tx_hashes],
    }


def _send_transfers(w3: Web3, key: str, to: str, count: int) -> list[Any]:
    account = Account.from_key(key)
    nonce = w3.eth.get_transaction_count(account.address)
    hashes = []
    for i in range(count):
        tx = {
            "chainId": w3.eth.chain_id,
            "nonce": nonce + i,
            "gas": 21_000,
            "to": to,
            "value": 1000 + i,
            "maxFeePerGas": 10 * GWEI,
            "maxPriorityFeePerGas": GWEI,
        }
        hashes.append(w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction))
    for tx_hash in hashes:
        w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30)
    return hashes


def test_restart_keeps_blocks_balances_and_receipts(tmp_path: Path) -> None:
    description = make_testnet(tmp_path / "net")
    node = RunningNode(description, description["nodes"][0], tmp_path / "node.log")
    accounts = description["accounts"]
    addresses = [a["address"] for a in accounts[:3]]
    node.start()
    try:
        w3 = node.web3()
        hashes = _send_transfers(w3, accounts[0]["private_key"], addresses[1], 5)
        before = _snapshot(w3, addresses, hashes)
        assert len(before["blocks"]) > 1
        assert node.stop() == 0
        node.start()
        assert _snapshot(node.web3(), addresses, hashes) == before

        hashes += _send_transfers(node.web3(), accounts[1]["private_key"], addresses[2], 3)
        before = _snapshot(node.web3(), addresses, hashes)
        node.stop(signal.SIGKILL)  # every acknowledged commit was a synced batch
        node.start()
        assert _snapshot(node.web3(), addresses, hashes) == before
        # and the chain goes on from there
        _send_transfers(node.web3(), accounts[2]["private_key"], addresses[0], 1)
        assert node.web3().eth.block_number == before["blocks"][-1]["number"] + 1
    finally:
        node.stop()
