"""Votes on the validator set, on `testnet init --validators 4 --observers 1` (defaults), as
real processes: three validators vote the observer in through `pbft-node validators` (the
CLI over pbft_proposeValidatorVote), the tally from state follows every vote and retraction,
the change is recorded in state and scheduled at the handover checkpoint (pbft_getEpoch);
every bad input of issue 31 gets its one-line error and changes nothing; a vote a wallet
signs itself from a non-member is included and reverts with the registry's reason."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from eth_account import Account

from pbft_engine.epoch_feed import validators_hash
from pbft_engine.registry import REGISTRY_ADDRESS, encode_vote
from testkit.cluster import Cluster, rpc
from testkit.nodes import wait_for
from tests.spec import assert_valid_result

OBSERVER = 4
REGISTRY = "0x" + REGISTRY_ADDRESS.hex()


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster.create(tmp_path_factory.mktemp("votes"), 4, observers=1)
    try:
        cluster.start()
        yield cluster
    finally:
        codes = cluster.close()
    assert codes == [0] * len(codes)


def validators(net: Cluster, *args: str) -> subprocess.Popen[str]:
    """`pbft-node validators ARGS`, started (several run at once)."""
    return subprocess.Popen([sys.executable, "-m", "cli.node", "validators", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def ok(net: Cluster, *args: str) -> str:
    code, out, err = finished(validators(net, *args))
    assert code == 0, err
    return out


def tally(net: Cluster, node: int = 0) -> dict[str, Any]:
    result = rpc(net.nodes[node], "pbft_getPendingVotes", "latest")
    assert isinstance(result, dict)
    return result


def test_the_observer_is_voted_in_and_scheduled_and_bad_votes_change_nothing(
        net: Cluster) -> None:
    urls = [n.rpc_url for n in net.nodes]
    members = [a.lower() for a in net.description["validators"]]
    observer = net.description["nodes"][OBSERVER]["address"].lower()
    assert tally(net) == {}

    # every bad input: a one-line error, exit status 1, and nothing sent or changed
    bad = {
        "not a validator": (["propose", observer, "--add", "--rpc", urls[OBSERVER]],
                            "is not a validator of epoch 0"),
        "add a member": (["propose", members[1], "--add", "--rpc", urls[0]],
                         "is a validator already"),
        "remove a non-member": (["propose", observer, "--remove", "--rpc", urls[0]],
                                "is not a validator (or its removal is scheduled)"),
        "below min_validators": (["propose", members[3], "--remove", "--rpc", urls[0]],
                                 "would leave 3 validators, fewer than min_validators 4"),
        "malformed address": (["propose", "0x1234", "--add", "--rpc", urls[0]],
                              "invalid argument: address: expected 20 bytes, got 2"),
        "retract nothing": (["discard", observer, "--rpc", urls[1]], "has no live vote about"),
    }
    started = {name: validators(net, *args) for name, (args, _) in bad.items()}
    listed = validators(net, "pending", "--json", "--rpc", urls[2])
    for name, process in started.items():
        code, out, err = finished(process)
        assert (code, out) == (1, ""), name
        assert err.startswith("pbft-node: error: ") and err.count("\n") == 1, (name, err)
        assert bad[name][1] in err, (name, err)
    assert tally(net) == {}
    code, out, _ = finished(listed)
    assert (code, json.loads(out)) == (0, {})
    assert [rpc(net.nodes[0], "eth_getTransactionCount", m, "pending") for m in members] == [
        "0x0"] * 4
    assert int(rpc(net.nodes[0], "eth_getStorageAt", REGISTRY, "0x0", "latest"), 16) == 0

    # three of four vote the observer in (one retracts and votes again on the way)
    first = ok(net, "propose", observer, "--add", "--rpc", urls[0]).strip()
    assert_valid_result("eth_sendRawTransaction", first)  # a transaction hash, as that one's
    receipt = net.nodes[0].web3().eth.wait_for_transaction_receipt(first, timeout=60,
                                                                  poll_latency=0.05)
    assert receipt.status == 1
    for method in ("eth_getTransactionReceipt", "eth_getTransactionByHash"):  # a plain one
        assert_valid_result(method, rpc(net.nodes[0], method, first))
    net.wait_heads([OBSERVER], receipt.blockNumber)
    assert tally(net, OBSERVER) == {observer: {
        "add": True, "voters": members[:1], "threshold": "0x3",
        "expiresAt": hex(receipt.blockNumber + 30_000)}}
    assert "counted in block" in ok(net, "propose", observer, "--add", "--wait",
                                    "--rpc", urls[1])
    assert tally(net, 1)[observer]["voters"] == members[:2]
    ok(net, "discard", observer, "--wait", "--rpc", urls[1])
    assert tally(net, 1)[observer]["voters"] == members[:1]
    ok(net, "propose", observer, "--add", "--wait", "--rpc", urls[1])
    human = ok(net, "pending", "--rpc", urls[2])
    assert human.splitlines()[0] == (f"add {observer}: 2 votes, 3 needed; the first expires "
                                     f"at block {receipt.blockNumber + 30_000}")
    passed = ok(net, "propose", observer, "--add", "--wait", "--rpc", urls[2])
    passed_at = int(passed.split()[-1])
    assert tally(net, 2) == {}

    # recorded in state and scheduled at the first checkpoint c >= b + max_in_flight
    assert int(rpc(net.nodes[2], "eth_getStorageAt", REGISTRY, "0x0", "latest"), 16) == 1
    net.wait_heads([0, 3, OBSERVER], passed_at)
    c = -(-(passed_at + 2) // 10) * 10
    epoch = rpc(net.nodes[OBSERVER], "pbft_getEpoch", hex(passed_at))
    assert (epoch["epoch"], epoch["validators"], epoch["quorum"], epoch["lastBlock"]) == (
        "0x0", members, "0x3", hex(c))
    scheduled = epoch["scheduled"]
    assert (scheduled["epoch"], scheduled["firstBlock"], scheduled["validators"],
            scheduled["n"], scheduled["f"], scheduled["quorum"], scheduled["passedAt"]) == (
        "0x1", hex(c + 1), [*members, observer], "0x5", "0x1", "0x4", hex(passed_at))
    assert rpc(net.nodes[3], "pbft_getValidatorsByBlockNumber", hex(passed_at)) == members
    assert rpc(net.nodes[3], "pbft_getValidatorsByBlockNumber", hex(c + 1)) in (
        None, [*members, observer])  # known once the head reaches c
    listing = ok(net, "list", "--block", str(passed_at), "--rpc", urls[0]).splitlines()
    assert listing[0] == f"epoch 0, blocks 1..{c}: n=4 f=1 quorum=3"
    assert listing[6] == f"epoch 1, blocks {c + 1}..: n=5 f=1 quorum=4"
    assert "is a validator already" in finished(validators(
        net, "propose", observer, "--add", "--rpc", urls[3]))[2]


def test_a_wallet_signed_vote_from_a_non_member_is_included_and_reverts_with_its_reason(
        net: Cluster) -> None:
    account = net.description["accounts"][0]
    w3 = net.nodes[0].web3()
    call = {"from": account["address"], "to": w3.to_checksum_address(REGISTRY),
            "data": "0x" + encode_vote(b"\x42" * 20, True, 0).hex()}
    signed = Account.from_key(account["private_key"]).sign_transaction({
        **call, "chainId": net.description["chain_id"], "gas": 100_000, "value": 0,
        "nonce": w3.eth.get_transaction_count(account["address"], "pending"),
        "maxFeePerGas": 10**10, "maxPriorityFeePerGas": 10**9})
    tx_hash = w3.eth.send_raw_transaction(signed.raw_transaction)
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=60, poll_latency=0.05)
    assert receipt.status == 0 and receipt.gasUsed < 100_000  # a revert, not all the gas
    reply = w3.provider.make_request("eth_call", [call, hex(receipt.blockNumber - 1)])
    assert reply["error"]["code"] == 3
    assert "is not a validator of epoch" in reply["error"]["message"]


def role(net: Cluster, node: int) -> tuple[str, int]:
    status = rpc(net.nodes[node], "pbft_status")
    return status["role"], status["epoch"]


def test_the_set_changes_at_the_handover_an_observer_joins_and_a_validator_leaves(
        net: Cluster) -> None:
    """After the first test's vote: the observer votes from c+1 (the chain then needs four
    of five), and three of the five vote validator 3 out, which then follows as an observer
    while the four others go on, through a view change that needs the added validator;
    transactions sent through any node commit."""
    urls = [n.rpc_url for n in net.nodes]
    members = [a.lower() for a in net.description["validators"]]
    observer = net.description["nodes"][OBSERVER]["address"].lower()
    c = int(rpc(net.nodes[0], "pbft_getEpoch", "0x1")["lastBlock"], 16)  # epoch 0's last
    for node in range(5):  # the boundary comes even on an idle chain (empty blocks up to c)
        wait_for(lambda node=node: role(net, node) == ("validator", 1), 120,
                 f"node {node} a validator of epoch 1")
    header = net.nodes[0].web3().eth.get_block(c)
    assert bytes(header["extraData"]) == validators_hash(
        tuple(bytes.fromhex(a[2:]) for a in [*members, observer]))
    block = net.commit(via=OBSERVER, sender=1)
    certificate = rpc(net.nodes[OBSERVER], "pbft_getCommitCertificate", hex(block))
    assert certificate["epoch"] == "0x1" and len(certificate["signers"]) >= 4
    assert set(certificate["signers"]) <= {*members, observer}

    # three of the five vote validator 3 out: it votes up to its handover, then follows
    for voter in (0, 1):
        ok(net, "propose", members[3], "--remove", "--wait", "--rpc", urls[voter])
    passed = int(ok(net, "propose", members[3], "--remove", "--wait",
                    "--rpc", urls[OBSERVER]).split()[-1])
    wait_for(lambda: role(net, 3) == ("observer", 2), 120, "validator 3 to leave")
    for node in (0, 1, 2, OBSERVER):
        wait_for(lambda node=node: role(net, node) == ("validator", 2), 60,
                 f"node {node} a validator of epoch 2")
    assert rpc(net.nodes[3], "pbft_getValidators") == [*members[:3], observer]
    # the added validator voted from c + 1 (it imported nothing past c as an observer), so
    # it holds the first checkpoint of its epoch as stable as the others do
    assert rpc(net.nodes[OBSERVER], "pbft_getCheckpoint", hex(c + 10))["stable"] is True
    later = net.commit(via=3, sender=2)  # forwarded by the observer it became
    assert later > passed
    certificate = rpc(net.nodes[0], "pbft_getCommitCertificate", hex(later))
    assert certificate["epoch"] == "0x2" and members[3] not in certificate["signers"]

    # the primary of epoch 2 goes down: the view change needs the added validator (3 of
    # the 4), which the others were configured to let in as an observer, not to dial
    primary = rpc(net.nodes[0], "pbft_status")["primary"].lower()
    down = members.index(primary) if primary in members else 0
    view = rpc(net.nodes[OBSERVER], "pbft_status")["view"]
    net.stop(down, signal.SIGKILL)
    up = next(n for n in (0, 1, 2) if n != down)
    assert net.commit(via=up, sender=3) > later
    assert rpc(net.nodes[OBSERVER], "pbft_status")["view"] > view
    net.start(down)
    wait_for(lambda: role(net, down) == ("validator", 2), 60, f"node {down} back in epoch 2")
