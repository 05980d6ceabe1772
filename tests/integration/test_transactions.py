"""Transfers, contracts, logs, filters, reverts and pool rejections through web3.py against a
real dev-engine node process."""

from __future__ import annotations

from typing import Any

import pytest
from eth_account import Account
from web3 import Web3
from web3.exceptions import ContractCustomError, ContractLogicError

from tests.integration.conftest import load_contract

GWEI = 10**9
RECEIPT_TIMEOUT = 30


class Sender:
    """Signs and sends transactions for one funded dev account, tracking its nonce."""

    def __init__(self, w3: Web3, private_key: str) -> None:
        self.w3 = w3
        self.account = Account.from_key(private_key)
        self.address = self.account.address

    def sign(self, **fields: Any) -> bytes:
        tx = {
            "chainId": self.w3.eth.chain_id,
            "nonce": self.w3.eth.get_transaction_count(self.address, "pending"),
            "gas": 21_000,
            "maxFeePerGas": 10 * GWEI,
            "maxPriorityFeePerGas": GWEI,
            "value": 0,
            **fields,
        }
        return self.account.sign_transaction(tx).raw_transaction

    def send(self, **fields: Any) -> Any:
        tx_hash = self.w3.eth.send_raw_transaction(self.sign(**fields))
        return self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=RECEIPT_TIMEOUT)

    def transact(self, function: Any, gas: int = 500_000) -> Any:
        tx = function.build_transaction(
            {
                "from": self.address,
                "nonce": self.w3.eth.get_transaction_count(self.address, "pending"),
                "gas": gas,
                "maxFeePerGas": 10 * GWEI,
                "maxPriorityFeePerGas": GWEI,
            }
        )
        signed = self.account.sign_transaction(tx)
        tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
        return self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=RECEIPT_TIMEOUT)


@pytest.fixture(scope="module")
def alice(w3: Web3, accounts: list[dict[str, str]]) -> Sender:
    return Sender(w3, accounts[0]["private_key"])


@pytest.fixture(scope="module")
def bob(w3: Web3, accounts: list[dict[str, str]]) -> Sender:
    return Sender(w3, accounts[1]["private_key"])


def deploy(w3: Web3, sender: Sender, name: str, *args: Any) -> Any:
    artifact = load_contract(name)
    factory = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
    receipt = sender.transact(factory.constructor(*args), gas=2_000_000)
    assert receipt.status == 1
    return w3.eth.contract(address=receipt.contractAddress, abi=artifact["abi"])


@pytest.fixture(scope="module")
def events(w3: Web3, alice: Sender) -> Any:
    return deploy(w3, alice, "Events")


def test_transfer_moves_value_and_charges_gas(w3: Web3, alice: Sender, bob: Sender) -> None:
    before_alice = w3.eth.get_balance(alice.address)
    before_bob = w3.eth.get_balance(bob.address)
    receipt = alice.send(to=bob.address, value=12345)
    assert receipt.status == 1
    assert receipt.gasUsed == 21_000
    fee = receipt.gasUsed * receipt.effectiveGasPrice
    assert w3.eth.get_balance(bob.address) == before_bob + 12345
    assert w3.eth.get_balance(alice.address) == before_alice - 12345 - fee
    block = w3.eth.get_block(receipt.blockNumber, full_transactions=True)
    assert block.transactions[receipt.transactionIndex]["hash"] == receipt.transactionHash
    assert w3.eth.get_transaction(receipt.transactionHash)["from"] == alice.address


def test_legacy_eip155_transaction_is_accepted(w3: Web3, alice: Sender, bob: Sender) -> None:
    tx = {
        "chainId": w3.eth.chain_id,
        "nonce": w3.eth.get_transaction_count(alice.address, "pending"),
        "gas": 21_000,
        "gasPrice": 5 * GWEI,
        "to": bob.address,
        "value": 1,
    }
    raw = alice.account.sign_transaction(tx).raw_transaction
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(raw), timeout=RECEIPT_TIMEOUT
    )
    assert receipt.status == 1
    assert receipt.type == 0


def test_erc20_deploy_transfer_and_revert_reason(w3: Web3, alice: Sender, bob: Sender) -> None:
    supply = 10**24
    token = deploy(w3, alice, "ERC20", supply)
    assert token.functions.totalSupply().call() == supply
    assert token.functions.symbol().call() == "TT"
    receipt = alice.transact(token.functions.transfer(bob.address, 500))
    assert receipt.status == 1
    assert token.functions.balanceOf(bob.address).call() == 500
    assert token.functions.balanceOf(alice.address).call() == supply - 500
    (transfer,) = token.events.Transfer().process_receipt(receipt)
    assert transfer.args.value == 500
    with pytest.raises(ContractLogicError, match="ERC20: insufficient balance"):
        token.functions.transfer(alice.address, 10**30).call({"from": bob.address})
    estimate = token.functions.transfer(bob.address, 1).estimate_gas({"from": alice.address})
    assert 21_000 < estimate < 100_000


def test_reverts_carry_reason_and_data(w3: Web3, events: Any) -> None:
    with pytest.raises(ContractLogicError, match="execution reverted: boom") as raised:
        events.functions.fail("boom").call()
    assert raised.value.data.startswith("0x08c379a0")
    with pytest.raises(ContractLogicError, match="x must not be zero"):
        events.functions.failIfZero(0).call()
    assert events.functions.failIfZero(5).call() == 5
    with pytest.raises(ContractCustomError):
        events.functions.failCustom(99).call()


def test_logs_filters_and_get_logs(w3: Web3, alice: Sender, events: Any) -> None:
    log_filter = events.events.Stored.create_filter(from_block="latest")
    block_filter = w3.eth.filter("latest")
    receipts = [alice.transact(events.functions.store(key, key * 10)) for key in (1, 2, 3)]
    assert events.functions.get(2).call() == 20
    changes = log_filter.get_new_entries()
    assert [entry.args.key for entry in changes] == [1, 2, 3]
    assert log_filter.get_new_entries() == []
    new_blocks = block_filter.get_new_entries()
    assert {r.blockHash for r in receipts} <= set(new_blocks)
    first, last = receipts[0].blockNumber, receipts[-1].blockNumber
    logs = w3.eth.get_logs(
        {
            "fromBlock": first,
            "toBlock": last,
            "address": events.address,
            "topics": [None, None, "0x" + (2).to_bytes(32, "big").hex()],
        }
    )
    assert len(logs) == 1
    assert logs[0]["transactionHash"] == receipts[1].transactionHash
    assert logs[0]["logIndex"] == 0
    everything = w3.eth.get_logs({"fromBlock": first, "toBlock": last})
    assert len(everything) == 3
    assert w3.eth.uninstall_filter(log_filter.filter_id)
    assert not w3.eth.uninstall_filter(log_filter.filter_id)


def _send_raw_error(w3: Web3, raw: bytes) -> dict[str, Any]:
    response = w3.provider.make_request("eth_sendRawTransaction", ["0x" + raw.hex()])
    assert "error" in response, f"expected a rejection, got {response}"
    return response["error"]


def test_pool_rejections_use_geth_messages(w3: Web3, alice: Sender, bob: Sender) -> None:
    nonce = w3.eth.get_transaction_count(alice.address, "pending")
    alice.send(to=bob.address, value=1)
    cases = {
        "nonce too low": alice.sign(to=bob.address, nonce=nonce),
        "insufficient funds for gas * price + value": alice.sign(to=bob.address, value=10**30),
        "intrinsic gas too low": alice.sign(to=bob.address, gas=20_000),
        "exceeds block gas limit": alice.sign(to=bob.address, gas=10**9),
    }
    for message, raw in cases.items():
        error = _send_raw_error(w3, raw)
        assert (error["code"], error["message"]) == (-32000, message)
    # A future nonce stays queued in the pool: resending it, or replacing it without a 10%
    # price bump, is refused.
    future = w3.eth.get_transaction_count(alice.address, "pending") + 5
    queued = alice.sign(to=bob.address, nonce=future)
    w3.eth.send_raw_transaction(queued)
    assert _send_raw_error(w3, queued) == {"code": -32000, "message": "already known"}
    underpriced = alice.sign(to=bob.address, nonce=future, value=2, maxFeePerGas=10 * GWEI + 1)
    error = _send_raw_error(w3, underpriced)
    assert error == {"code": -32000, "message": "replacement transaction underpriced"}
    bumped = alice.sign(
        to=bob.address,
        nonce=future,
        value=2,
        maxFeePerGas=11 * GWEI,
        maxPriorityFeePerGas=GWEI * 11 // 10,
    )
    assert w3.eth.send_raw_transaction(bumped)
    wrong_chain = alice.sign(to=bob.address, chainId=w3.eth.chain_id + 1)
    assert _send_raw_error(w3, wrong_chain)["message"] == "invalid chain id for signer"
    assert _send_raw_error(w3, b"\x01\x02\x03")["code"] == -32000
