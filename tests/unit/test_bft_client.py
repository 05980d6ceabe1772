"""bft_client against scripted validators: f+1 distinct matching receipts confirm, one
validator counts once, different receipts never add up, the re-send timer reaches every
validator, and the errors say what each validator answered."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from eth_keys import keys

from bft_client import (
    BftClient,
    BftClientError,
    ConfirmedReceipt,
    NoAgreement,
    ReceiptKey,
    ReplyTally,
    RpcReplyError,
    RpcUnreachable,
    Timeouts,
    TransactionRejected,
    TxRequest,
    fault_tolerance,
    sign_transaction,
)
from bft_client.block_set import validators_hash
from chain.blockchain import ChainVM

ADDRESSES = [
    keys.PrivateKey(bytes([i + 1]) * 32).public_key.to_checksum_address() for i in range(4)
]
V0, V1, V2, V3 = ADDRESSES
URLS = {address: f"http://127.0.0.1:{9000 + i}" for i, address in enumerate(ADDRESSES)}
RAW = b"\x02 a signed transaction, as far as the client cares"
B1 = ReceiptKey("0x" + "b1" * 32, 1, 21_000, 7)
B2 = ReceiptKey("0x" + "b2" * 32, 1, 21_000, 7)
FAST = Timeouts(
    request=0.5, poll_interval=0.01, max_poll_interval=0.02, resend_after=0.2, deadline=5.0
)
SHORT = replace(FAST, deadline=0.4)  # for the sends that must fail: they wait it out


@dataclass
class FakeValidator:
    """A node as the client sees it through JSON-RPC."""

    key: ReceiptKey | None = None  # the receipt it reports
    needs_tx: bool = False  # reports it only once the transaction was sent to it
    down: bool = False
    reject: str | None = None  # eth_sendRawTransaction's error message
    wrong_hash: bool = False  # reports a receipt of another transaction
    validators: list[str] = field(default_factory=lambda: [a.lower() for a in ADDRESSES])
    # pbft_getValidatorsByBlockNumber's answer, and the extraData of the block before (None:
    # the commitment to that set)
    block_validators: list[str] = field(default_factory=lambda: list(ADDRESSES))
    parent_extra_data: str | None = None
    answers: dict[str, Any] = field(default_factory=dict)  # other methods' results
    received: list[float] = field(default_factory=list)  # when the transaction arrived
    calls: Counter[str] = field(default_factory=Counter)

    def handle(self, method: str, params: list[Any]) -> Any:
        if method == "pbft_getValidators":
            return self.validators
        if method == "eth_sendRawTransaction":
            return self._receive(params[0])
        if method == "eth_getTransactionReceipt":
            return self._receipt(params[0])
        if method == "pbft_getValidatorsByBlockNumber":
            return self.block_validators
        if method == "eth_getBlockByNumber" and params[0] != "latest":
            extra = self.parent_extra_data
            return {"extraData": validators_hash(self.block_validators) if extra is None else extra}
        return self.answers[method]

    def _receive(self, raw: str) -> str:
        if self.reject:
            raise RpcReplyError(-32000, self.reject)
        self.received.append(time.monotonic())
        self.answers["raw"] = bytes.fromhex(raw[2:])
        return "0x" + "00" * 32

    def _receipt(self, tx_hash: str) -> dict[str, Any] | None:
        if self.key is None or (self.needs_tx and not self.received):
            return None
        return {
            "transactionHash": "0x" + "ee" * 32 if self.wrong_hash else tx_hash,
            "blockHash": self.key.block_hash,
            "blockNumber": hex(self.key.block_number),
            "status": hex(self.key.status),
            "gasUsed": hex(self.key.gas_used),
        }


class FakeTransport:
    def __init__(self, nodes: dict[str, FakeValidator]) -> None:
        self.by_url = {URLS[address]: node for address, node in nodes.items()}
        self.closed = False

    async def call(self, url: str, method: str, params: list[Any], timeout: float) -> Any:
        node = self.by_url[url]
        node.calls[method] += 1
        if node.down:
            raise RpcUnreachable("unreachable: connection refused")
        await asyncio.sleep(0)
        return node.handle(method, params)

    async def close(self) -> None:
        self.closed = True


def network(**overrides: FakeValidator) -> dict[str, FakeValidator]:
    """Four validators (V0..V3) that report nothing unless overridden by name."""
    names = {"v0": V0, "v1": V1, "v2": V2, "v3": V3}
    nodes = {address: FakeValidator() for address in ADDRESSES}
    nodes.update({names[name]: node for name, node in overrides.items()})
    return nodes


def send(
    nodes: dict[str, FakeValidator], via: str | None = None, timeouts: Timeouts = FAST
) -> ConfirmedReceipt:
    async def run() -> ConfirmedReceipt:
        transport = FakeTransport(nodes)
        async with BftClient(URLS, transport=transport, timeouts=timeouts) as client:
            return await client.send_raw_transaction(RAW, via)

    return asyncio.run(run())


@pytest.mark.parametrize(("n", "needed"), [(1, 1), (3, 1), (4, 2), (6, 2), (7, 3), (10, 4)])
def test_f_plus_one(n: int, needed: int) -> None:
    assert fault_tolerance(n) + 1 == needed


def test_two_of_four_matching_receipts_confirm() -> None:
    result = send(network(v0=FakeValidator(B1), v2=FakeValidator(B1)))
    assert result.agreeing == (V0, V2)
    assert (result.key, result.needed, result.validators) == (B1, 2, 4)
    assert result.disagreeing == {} and result.resends == 0
    assert result.block_number == 7


def test_one_validator_repeating_itself_counts_once() -> None:
    nodes = network(v1=FakeValidator(B1))
    with pytest.raises(NoAgreement) as failure:
        send(nodes, timeouts=SHORT)
    assert nodes[V1].calls["eth_getTransactionReceipt"] > 2  # it said so many times
    assert f"{V1}: {B1}" in str(failure.value)
    assert f"{V0}: no receipt yet" in str(failure.value)


def test_tally_keeps_the_latest_receipt_of_each_validator() -> None:
    tally = ReplyTally(ADDRESSES, needed=2)
    for _ in range(3):
        tally.record_receipt(V0, B1, {})
    tally.record_receipt(V1, B2, {})
    assert tally.agreement() is None
    tally.record_receipt(V1, B1, {})
    tally.record_note(V1, "no receipt yet")  # a later non-answer does not erase a receipt
    assert tally.agreement() == (B1, (V0, V1))


def test_receipts_that_differ_in_block_status_or_gas_do_not_combine() -> None:
    nodes = network(
        v0=FakeValidator(B1),
        v1=FakeValidator(B2),
        v2=FakeValidator(ReceiptKey(B1.block_hash, 0, B1.gas_used, 7)),
        v3=FakeValidator(ReceiptKey(B1.block_hash, 1, 42_000, 7)),
    )
    with pytest.raises(NoAgreement) as failure:
        send(nodes, timeouts=SHORT)
    message = str(failure.value)
    assert "no 2 of 4 validators agreed" in message
    for line in (f"{V0}: {B1}", f"{V1}: {B2}", f"{V2}: block 0x{'b1' * 32} status 0", "gas 42000"):
        assert line in message


def test_a_disagreeing_validator_is_reported() -> None:
    result = send(network(v0=FakeValidator(B1), v1=FakeValidator(B2), v3=FakeValidator(B1)))
    assert result.agreeing == (V0, V3)
    assert result.disagreeing == {V1: B2}


def test_no_resend_while_the_submission_node_delivers() -> None:
    nodes = network(**{f"v{i}": FakeValidator(B1, needs_tx=i == 0) for i in range(4)})
    result = send(nodes, via=URLS[V0])
    assert result.resends == 0
    assert [len(nodes[a].received) for a in ADDRESSES] == [1, 0, 0, 0]


def test_timeout_resends_to_every_validator() -> None:
    nodes = network(
        v0=FakeValidator(B1, needs_tx=True),
        v1=FakeValidator(B1, needs_tx=True),
        v2=FakeValidator(B1, needs_tx=True),
        v3=FakeValidator(down=True),
    )
    start = time.monotonic()
    result = send(nodes, via=V3)
    assert result.resends >= 1 and result.key == B1
    for address in (V0, V1, V2):
        assert nodes[address].received, f"{address} never got the transaction"
        assert nodes[address].received[0] >= start + FAST.resend_after
    assert nodes[V3].calls["eth_sendRawTransaction"] >= 2  # the submission and a re-send


def test_the_deadline_error_says_what_each_validator_answered() -> None:
    nodes = network(
        v0=FakeValidator(B1),
        v1=FakeValidator(down=True),
        v2=FakeValidator(B1, wrong_hash=True),
    )
    start = time.monotonic()
    with pytest.raises(NoAgreement) as failure:
        send(nodes, timeouts=SHORT)
    assert time.monotonic() - start >= SHORT.deadline
    message = str(failure.value)
    assert f"within {SHORT.deadline:g}s" in message
    assert f"{V0}: {B1}" in message
    assert f"{V1}: unreachable: connection refused" in message
    assert f"{V2}: a receipt for another transaction" in message
    assert f"{V3}: no receipt yet" in message
    assert "\n" not in message


def test_a_rejection_by_the_submission_node_ends_the_send() -> None:
    nodes = network(v1=FakeValidator(B1, reject="nonce too low"), v2=FakeValidator(B1))
    with pytest.raises(TransactionRejected, match=f"{V1} rejected the transaction: nonce too low"):
        send(nodes, via=V1)
    assert nodes[V2].calls["eth_getTransactionReceipt"] == 0


def test_already_known_is_not_a_rejection() -> None:
    nodes = network(v1=FakeValidator(B1, reject="already known"), v2=FakeValidator(B1))
    assert send(nodes, via=V1).agreeing == (V1, V2)


V4 = keys.PrivateKey(b"\x05" * 32).public_key.to_checksum_address()
AFTER_CHANGE = [V1, V2, V3, V4]  # V0 voted out, V4 in: the set that decided block 7


def test_the_set_of_the_block_is_checked_against_the_parent_s_commitment() -> None:
    nodes = network(v0=FakeValidator(B1), v2=FakeValidator(B1))
    assert send(nodes).validators == 4
    # asked once, by each agreeing validator
    assert [nodes[v].calls["pbft_getValidatorsByBlockNumber"] for v in ADDRESSES] == [1, 0, 1, 0]


def test_a_chain_without_the_commitment_keeps_the_configured_set() -> None:
    old = {"parent_extra_data": "0x"}
    assert send(network(v0=FakeValidator(B1, **old), v2=FakeValidator(B1, **old))).needed == 2


def test_after_a_set_change_f_plus_one_of_the_deciding_set_confirm() -> None:
    """V0 (voted out before block 7) and V1 agree: not enough, V0 no longer counts; V2 (in
    the new set too) makes f+1 of it."""
    changed = {"block_validators": AFTER_CHANGE}
    nodes = network(v0=FakeValidator(B1, **changed), v1=FakeValidator(B1, **changed),
                    v2=FakeValidator(B1, needs_tx=True, **changed))
    result = send(nodes, via=V0)
    assert result.agreeing == (V1, V2) and (result.validators, result.needed) == (4, 2)
    assert nodes[V2].received  # the re-send reached it: V0 and V1 alone did not confirm


@pytest.mark.parametrize(("v0", "v2", "fragment"), [
    # both serve a set that is not the one block 6 commits to
    ({"block_validators": AFTER_CHANGE, "parent_extra_data": validators_hash(ADDRESSES)},
     {"block_validators": AFTER_CHANGE, "parent_extra_data": validators_hash(ADDRESSES)},
     "block 6 commits to"),
    # one of them lies about the set
    ({"block_validators": AFTER_CHANGE}, {}, "disagree about the set that decided its block"),
])
def test_a_set_the_agreeing_validators_do_not_prove_ends_the_send(
    v0: dict[str, Any], v2: dict[str, Any], fragment: str,
) -> None:
    with pytest.raises(BftClientError, match=fragment):
        send(network(v0=FakeValidator(B1, **v0), v2=FakeValidator(B1, **v2)))


def test_the_first_reachable_node_checks_the_validator_set() -> None:
    nodes = network(v0=FakeValidator(down=True), v1=FakeValidator(B1), v2=FakeValidator(B1))
    assert send(nodes).agreeing == (V1, V2)
    assert nodes[V1].calls["pbft_getValidators"] == 1
    assert nodes[V1].received  # it is also where the transaction went


def test_a_different_validator_set_is_refused() -> None:
    stranger = keys.PrivateKey(b"\x09" * 32).public_key.to_checksum_address()
    nodes = network(v0=FakeValidator(B1, validators=[V0, V1, V2, stranger]))
    with pytest.raises(BftClientError, match="the configured validators are not the chain's"):
        send(nodes)
    assert nodes[V0].calls["eth_sendRawTransaction"] == 0


def test_no_reachable_validator() -> None:
    nodes = {address: FakeValidator(down=True) for address in ADDRESSES}
    with pytest.raises(BftClientError, match="no validator is reachable"):
        send(nodes)


@pytest.mark.parametrize(
    ("validators", "fragment"),
    [
        ({}, "no validators configured"),
        ({"0x1234": "http://a"}, "is not an address"),
        ({V0: "http://a", V1: "http://a/"}, "two validators share one URL"),
    ],
)
def test_bad_configuration(validators: dict[str, str], fragment: str) -> None:
    with pytest.raises(BftClientError, match=fragment):
        BftClient(validators, transport=FakeTransport({}))


def test_via_must_be_a_configured_validator_or_a_url() -> None:
    with pytest.raises(BftClientError, match="elsewhere is not one of the configured"):
        send(network(), via="elsewhere")


def test_via_an_observer_submits_there_and_the_validators_confirm() -> None:
    """An observer's URL: the transaction goes to it (it forwards to the validators) and
    only validators' receipts count."""
    observer = FakeValidator(B2)  # its receipt is no vote
    nodes = network(v1=FakeValidator(B1), v2=FakeValidator(B1))

    async def run() -> ConfirmedReceipt:
        transport = FakeTransport(nodes)
        transport.by_url["http://observer:8545"] = observer
        async with BftClient(URLS, transport=transport, timeouts=FAST) as client:
            return await client.send_raw_transaction(RAW, "http://observer:8545/")

    result = asyncio.run(run())
    assert len(observer.received) == 1 and observer.calls["eth_getTransactionReceipt"] == 0
    assert result.agreeing == (V1, V2) and result.key == B1


def test_send_transaction_fills_signs_and_confirms() -> None:
    base_fee, tip = 7 * 10**9, 10**9
    answers = {
        "eth_chainId": "0x539",
        "eth_getTransactionCount": "0x5",
        "eth_maxPriorityFeePerGas": hex(tip),
        "eth_getBlockByNumber": {"baseFeePerGas": hex(base_fee)},
        "eth_estimateGas": hex(30_000),
    }
    nodes = network(v0=FakeValidator(B1, answers=answers), v1=FakeValidator(B1))
    sender = keys.PrivateKey(b"\x42" * 32)

    async def run() -> ConfirmedReceipt:
        client = BftClient(URLS, transport=FakeTransport(nodes), timeouts=FAST)
        return await client.send_transaction(sender, TxRequest(to=V3, value=9, data=b"\x01"))

    result = asyncio.run(run())
    tx = ChainVM.get_transaction_builder().decode(nodes[V0].answers["raw"])
    assert tx.sender == sender.public_key.to_canonical_address()
    assert (tx.chain_id, tx.nonce, tx.gas, tx.value, tx.data) == (1337, 5, 30_000, 9, b"\x01")
    assert (tx.max_priority_fee_per_gas, tx.max_fee_per_gas) == (tip, 2 * base_fee + tip)
    assert tx.to == bytes.fromhex(V3[2:])
    assert result.tx_hash == "0x" + tx.hash.hex()


@pytest.mark.parametrize("to", [V3, None])
def test_signed_transactions_are_byte_identical_to_py_evm_s(to: str | None) -> None:
    """The client signs without the node's VM; its encoding is py-evm's, byte for byte (a
    transfer, and a contract creation whose `to` is empty)."""
    key = keys.PrivateKey(b"\x07" * 32)
    request = TxRequest(to=to, value=10**18, data=b"\x60\x00" * 40, gas=90_000, nonce=300,
                        max_fee_per_gas=3 * 10**9, max_priority_fee_per_gas=10**9,
                        chain_id=1337)
    unsigned = ChainVM.get_transaction_builder().new_unsigned_dynamic_fee_transaction(
        chain_id=1337, nonce=300, max_priority_fee_per_gas=10**9, max_fee_per_gas=3 * 10**9,
        gas=90_000, to=bytes.fromhex(to[2:]) if to else b"", value=10**18,
        data=b"\x60\x00" * 40, access_list=())
    assert sign_transaction(key, request) == unsigned.as_signed_transaction(key).encode()
