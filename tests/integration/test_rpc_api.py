"""Every JSON-RPC method against the execution-apis schemas, the error codes of EIP-1474 and
geth, the HTTP limits, and eth_subscribe over WebSocket."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import requests
import rlp
from eth_account import Account
from eth_hash.auto import keccak
from web3 import AsyncWeb3, Web3
from web3.providers.persistent import WebSocketProvider

from testkit.nodes import RunningNode
from tests.integration.conftest import load_contract
from tests.spec import assert_valid_result, has_schema

GWEI = 10**9


def rpc(url: str, method: str, *params: Any) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": list(params)}
    response = requests.post(url, json=body, timeout=30)
    assert response.status_code == 200
    return response.json()


def result(url: str, method: str, *params: Any) -> Any:
    reply = rpc(url, method, *params)
    assert "error" not in reply, f"{method}{params}: {reply['error']}"
    if has_schema(method):
        assert_valid_result(method, reply["result"])
    return reply["result"]


@pytest.fixture(scope="module")
def chain_with_activity(dev_node: RunningNode, w3: Web3) -> dict[str, Any]:
    """A legacy transfer, a dynamic-fee transfer and a contract that emits a log."""
    key = dev_node.description["accounts"][2]["private_key"]
    account = Account.from_key(key)
    chain_id = w3.eth.chain_id
    nonce = w3.eth.get_transaction_count(account.address)
    artifact = load_contract("Events")
    deployment = {
        "chainId": chain_id,
        "nonce": nonce,
        "gas": 1_000_000,
        "gasPrice": 5 * GWEI,
        "data": artifact["bytecode"],
        "value": 0,
    }
    hashes = [w3.eth.send_raw_transaction(account.sign_transaction(deployment).raw_transaction)]
    contract_address = w3.eth.wait_for_transaction_receipt(hashes[0], timeout=30).contractAddress
    contract = w3.eth.contract(address=contract_address, abi=artifact["abi"])
    store = contract.functions.store(9, 99).build_transaction(
        {
            "from": account.address,
            "nonce": nonce + 1,
            "gas": 200_000,
            "maxFeePerGas": 10 * GWEI,
            "maxPriorityFeePerGas": GWEI,
            "chainId": chain_id,
        }
    )
    hashes.append(w3.eth.send_raw_transaction(account.sign_transaction(store).raw_transaction))
    receipts = [w3.eth.wait_for_transaction_receipt(h, timeout=30) for h in hashes]
    return {"account": account.address, "contract": contract_address, "receipts": receipts}


def test_every_method_matches_the_spec(dev_node: RunningNode, chain_with_activity: dict) -> None:
    url = dev_node.rpc_url
    account = chain_with_activity["account"]
    contract = chain_with_activity["contract"]
    store_receipt = chain_with_activity["receipts"][1]
    tx_hash = "0x" + bytes(store_receipt.transactionHash).hex()
    block_hash = "0x" + bytes(store_receipt.blockHash).hex()
    block_number = hex(store_receipt.blockNumber)
    assert result(url, "web3_clientVersion").startswith("pbft-chain/")
    assert result(url, "web3_sha3", "0x68656c6c6f") == (
        "0x1c8aff950685c2ed4bc3174f3472287b56d9517b9c948127319a09a7a36deac8"
    )
    assert result(url, "net_version") == "1337"
    assert result(url, "net_listening") is True
    assert result(url, "net_peerCount") == "0x0"
    assert result(url, "eth_chainId") == "0x539"
    assert int(result(url, "eth_blockNumber"), 16) >= store_receipt.blockNumber
    assert result(url, "eth_syncing") is False
    assert result(url, "eth_accounts") == []
    assert int(result(url, "eth_gasPrice"), 16) > int(result(url, "eth_maxPriorityFeePerGas"), 16)
    history = result(url, "eth_feeHistory", "0x4", "latest", [25, 75])
    assert len(history["baseFeePerGas"]) == len(history["gasUsedRatio"]) + 1
    assert int(result(url, "eth_getBalance", account, "latest"), 16) > 0
    assert result(url, "eth_getTransactionCount", account, "latest") == "0x2"
    assert result(url, "eth_getTransactionCount", account, "pending") == "0x2"
    assert len(result(url, "eth_getCode", contract, "latest")) > 2
    assert result(url, "eth_getCode", contract, "earliest") == "0x"
    slot_zero = result(url, "eth_getStorageAt", contract, "0x0", "latest")
    assert result(url, "eth_getStorageAt", contract, "0x" + "00" * 32, "latest") == slot_zero
    getter = "0x9507d39a" + (9).to_bytes(32, "big").hex()  # get(9)
    call = {"to": contract, "input": getter}
    assert int(result(url, "eth_call", call, "latest"), 16) == 99
    assert int(result(url, "eth_call", call, {"blockHash": block_hash}), 16) == 99
    estimate = result(url, "eth_estimateGas", {"from": account, **call})
    assert int(estimate, 16) > 21_000
    tx = result(url, "eth_getTransactionByHash", tx_hash)
    assert tx["hash"] == tx_hash and tx["type"] == "0x2"
    for method, args in [
        ("eth_getTransactionByBlockNumberAndIndex", (block_number, "0x0")),
        ("eth_getTransactionByBlockHashAndIndex", (block_hash, "0x0")),
    ]:
        assert result(url, method, *args)["hash"] == tx_hash
    receipt = result(url, "eth_getTransactionReceipt", tx_hash)
    assert receipt["status"] == "0x1" and len(receipt["logs"]) == 1
    deployment = result(
        url,
        "eth_getTransactionReceipt",
        "0x" + bytes(chain_with_activity["receipts"][0].transactionHash).hex(),
    )
    assert deployment["contractAddress"] == contract.lower()
    assert result(url, "eth_getBlockReceipts", block_number)[0] == receipt
    for full in (False, True):
        by_number = result(url, "eth_getBlockByNumber", block_number, full)
        assert by_number == result(url, "eth_getBlockByHash", block_hash, full)
    for tag in ("latest", "earliest", "pending", "safe", "finalized"):
        result(url, "eth_getBlockByNumber", tag, True)
    assert result(url, "eth_getBlockTransactionCountByNumber", block_number) == "0x1"
    assert result(url, "eth_getBlockTransactionCountByHash", block_hash) == "0x1"
    logs = result(url, "eth_getLogs", {"blockHash": block_hash})
    assert logs == receipt["logs"]
    assert result(url, "eth_getLogs", {"fromBlock": "0x0", "toBlock": "0x0"}) == []
    # (From the block on: "latest", the default, moves to the empty block that follows it a
    # second later, `trailing_block_ms`, and the filter's logs would depend on the timing.)
    filter_id = result(url, "eth_newFilter", {"address": contract, "fromBlock": block_number})
    block_filter = result(url, "eth_newBlockFilter")
    assert result(url, "eth_getFilterChanges", filter_id) == []
    assert result(url, "eth_getFilterLogs", filter_id) == logs
    assert isinstance(result(url, "eth_getFilterChanges", block_filter), list)
    assert result(url, "eth_uninstallFilter", filter_id) is True
    assert result(url, "eth_getBlockByNumber", "0xffffff", False) is None
    assert result(url, "eth_getTransactionByHash", "0x" + "ab" * 32) is None
    assert result(url, "eth_getTransactionReceipt", "0x" + "ab" * 32) is None


def test_debug_get_raw_block(dev_node: RunningNode, chain_with_activity: dict) -> None:
    """The RLP block hashes to the block's hash and holds its transactions' encodings."""
    url = dev_node.rpc_url
    number = hex(chain_with_activity["receipts"][1].blockNumber)
    raw = bytes.fromhex(result(url, "debug_getRawBlock", number)[2:])
    block = result(url, "eth_getBlockByNumber", number, False)
    header, transactions, *_ = rlp.decode(raw)
    assert "0x" + keccak(rlp.encode(header)).hex() == block["hash"]
    encodings = [tx if isinstance(tx, bytes) else rlp.encode(tx) for tx in transactions]
    assert ["0x" + keccak(e).hex() for e in encodings] == block["transactions"]
    assert int(block["size"], 16) == len(raw)
    assert rpc(url, "debug_getRawBlock", "0xffffff")["error"]["code"] == -32000

@pytest.mark.parametrize(
    ("method", "params", "code"),
    [
        ("eth_nonexistent", [], -32601),
        ("eth_getBalance", [], -32602),  # missing argument
        ("eth_getBalance", ["0x" + "11" * 20, "latest", 3], -32602),  # too many
        ("eth_getBalance", ["0x1234", "latest"], -32602),  # short address
        ("eth_getBlockByNumber", ["0x01", False], -32602),  # leading zero
        ("eth_getBlockByNumber", ["0x", False], -32602),  # no digits
        ("eth_getBlockByNumber", ["0xzz", False], -32602),  # bad hex
        ("eth_getBlockByNumber", ["0x1", "yes"], -32602),  # not a boolean
        ("eth_getBalance", ["0x" + "11" * 20, "0xffffff"], -32000),  # beyond the head
        ("eth_subscribe", ["newHeads"], -32601),  # needs a WebSocket
        ("eth_getStorageAt", ["0x" + "11" * 20, "0x" + "00" * 33, "latest"], -32602),
    ],
)
def test_error_codes(dev_node: RunningNode, method: str, params: list, code: int) -> None:
    reply = rpc(dev_node.rpc_url, method, *params)
    assert reply["error"]["code"] == code, reply
    assert reply["id"] == 7


def test_protocol_errors_and_batches(dev_node: RunningNode) -> None:
    url = dev_node.rpc_url
    headers = {"Content-Type": "application/json"}
    parse = requests.post(url, data="{not json", headers=headers, timeout=10).json()
    assert parse == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "parse error"},
    }
    empty = requests.post(url, data="[]", headers=headers, timeout=10).json()
    assert empty["error"]["code"] == -32600
    invalid = requests.post(
        url, json={"jsonrpc": "1.0", "id": 1, "method": "eth_chainId"}, timeout=10
    )
    assert invalid.json()["error"]["code"] == -32600
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"},
        {"jsonrpc": "2.0", "method": "eth_chainId"},  # a notification gets no answer
        {"jsonrpc": "2.0", "id": "two", "method": "nope"},
        5,
    ]
    replies = requests.post(url, json=batch, timeout=10).json()
    assert [r["id"] for r in replies] == [1, "two", None]
    assert replies[0]["result"] == "0x539"
    assert replies[1]["error"]["code"] == -32601
    assert replies[2]["error"]["code"] == -32600
    too_many = [{"jsonrpc": "2.0", "id": i, "method": "eth_chainId"} for i in range(1001)]
    assert requests.post(url, json=too_many, timeout=10).json()["error"]["code"] == -32600
    notification_only = requests.post(
        url, json={"jsonrpc": "2.0", "method": "eth_chainId"}, timeout=10
    )
    assert notification_only.status_code == 200 and notification_only.content == b""


def test_http_guards(dev_node: RunningNode) -> None:
    url = dev_node.rpc_url
    body = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId"}
    assert requests.get(url, timeout=10).status_code == 405
    assert requests.put(url, json=body, timeout=10).status_code == 405
    assert (
        requests.post(
            url, data=json.dumps(body), headers={"Content-Type": "text/plain"}, timeout=10
        ).status_code
        == 415
    )
    assert (
        requests.post(url, json=body, headers={"Host": "evil.example"}, timeout=10).status_code
        == 403
    )
    assert (
        requests.post(
            url, json=body, headers={"Origin": "https://evil.example"}, timeout=10
        ).status_code
        == 403
    )
    huge = b'{"jsonrpc":"2.0","id":1,"method":"eth_chainId","params":["' + b"a" * (6 << 20) + b'"]}'
    response = requests.post(
        url, data=huge, headers={"Content-Type": "application/json"}, timeout=30
    )
    assert response.status_code == 413


def test_websocket_new_heads_and_logs_subscriptions(
    dev_node: RunningNode, chain_with_activity: dict
) -> None:
    account = Account.from_key(dev_node.description["accounts"][2]["private_key"])
    artifact = load_contract("Events")

    async def scenario() -> tuple[list[dict], dict]:
        async with AsyncWeb3(WebSocketProvider(dev_node.ws_url)) as aw3:
            contract = aw3.eth.contract(
                address=chain_with_activity["contract"], abi=artifact["abi"]
            )
            heads_id = await aw3.eth.subscribe("newHeads")
            logs_id = await aw3.eth.subscribe("logs", {"address": contract.address})
            store = await contract.functions.store(5, 55).build_transaction(
                {
                    "from": account.address,
                    "gas": 200_000,
                    "maxFeePerGas": 10 * GWEI,
                    "maxPriorityFeePerGas": GWEI,
                    "chainId": 1337,
                    "nonce": await aw3.eth.get_transaction_count(account.address),
                }
            )
            signed = account.sign_transaction(store)
            tx_hash = await aw3.eth.send_raw_transaction(signed.raw_transaction)

            async def two_messages() -> list[dict]:
                messages = []
                async for message in aw3.socket.process_subscriptions():
                    messages.append(message)
                    if len(messages) == 2:
                        return messages
                return messages

            messages = await asyncio.wait_for(two_messages(), timeout=30)
            receipt = await aw3.eth.wait_for_transaction_receipt(tx_hash, timeout=30)
            assert await aw3.eth.unsubscribe(heads_id)
            assert await aw3.eth.unsubscribe(logs_id)
            by_subscription = {m["subscription"]: m["result"] for m in messages}
            return [by_subscription[heads_id], by_subscription[logs_id]], receipt

    (head, log), receipt = asyncio.run(scenario())
    assert head["number"] == receipt["blockNumber"]
    assert head["hash"] == receipt["blockHash"]
    assert log["transactionHash"] == receipt["transactionHash"]
    assert log["address"] == chain_with_activity["contract"]


def test_txpool_namespace_and_block_hash_parameters(
    dev_node: RunningNode, w3: Web3, chain_with_activity: dict
) -> None:
    """txpool_* as geth answers them (queued: behind a gap; a fee cap under the pool's floor,
    the next base fee, refused as geth's --txpool.pricelimit does), and a plain block hash as
    a block parameter."""
    url = dev_node.rpc_url
    account = Account.from_key(dev_node.description["accounts"][7]["private_key"])
    nonce = w3.eth.get_transaction_count(account.address)
    recipient = Web3.to_checksum_address("0x" + "42" * 20)

    def signed(at: int, max_fee: int) -> str:
        tx = {"chainId": w3.eth.chain_id, "nonce": at, "to": recipient, "value": 5,
              "gas": 21_000, "maxFeePerGas": max_fee, "maxPriorityFeePerGas": 0}
        return "0x" + bytes(account.sign_transaction(tx).raw_transaction).hex()

    def transfer(at: int, max_fee: int) -> str:
        return "0x" + bytes(w3.eth.send_raw_transaction(signed(at, max_fee))).hex()

    underpriced = rpc(url, "eth_sendRawTransaction", signed(nonce, 1))["error"]
    assert underpriced["message"].startswith("transaction underpriced: max fee per gas 1 is "
                                             "below the pool's floor"), underpriced
    gapped_hash = transfer(nonce + 2, 10 * GWEI)  # behind a gap: queued
    assert result(url, "txpool_status") == {"pending": "0x0", "queued": "0x1"}
    content = result(url, "txpool_content")
    queued = content["queued"][account.address][str(nonce + 2)]
    assert (queued["hash"], queued["nonce"], queued["blockHash"], queued["from"]) == (
        gapped_hash, hex(nonce + 2), None, account.address.lower())
    assert content["pending"] == {}
    assert result(url, "txpool_contentFrom", account.address) == {
        "pending": {}, "queued": {str(nonce + 2): queued}}
    assert result(url, "txpool_contentFrom", "0x" + "43" * 20) == {"pending": {}, "queued": {}}
    assert result(url, "txpool_inspect") == {
        "pending": {},
        "queued": {account.address: {
            str(nonce + 2): f"{recipient}: 5 wei + 21000 gas × {10 * GWEI} wei"}},
    }
    # the missing nonces close the gap: all three commit and the pool empties
    first = transfer(nonce, 10 * GWEI)
    closing = transfer(nonce + 1, 10 * GWEI)
    receipts = [w3.eth.wait_for_transaction_receipt(h, timeout=30)
                for h in (first, closing, gapped_hash)]
    assert [r.status for r in receipts] == [1, 1, 1]
    assert result(url, "txpool_status") == {"pending": "0x0", "queued": "0x0"}

    block_hash = "0x" + bytes(receipts[2].blockHash).hex()
    number = hex(receipts[2].blockNumber)
    assert result(url, "eth_getBalance", account.address, block_hash) == result(
        url, "eth_getBalance", account.address, number)
    assert result(url, "eth_getBlockReceipts", block_hash) == result(
        url, "eth_getBlockReceipts", number)
    unknown = rpc(url, "eth_getBalance", account.address, "0x" + "00" * 32)
    assert unknown["error"] == {"code": -32000, "message": "header not found"}
    inside_object = rpc(url, "eth_getBalance", account.address, {"blockNumber": block_hash})
    assert inside_object["error"]["code"] == -32602  # an EIP-1898 blockNumber stays a number
