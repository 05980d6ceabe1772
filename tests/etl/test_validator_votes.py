"""Votes on the validator set, and issue 31's script, on `testnet init --validators 4
--observers 1` (defaults, nothing tuned), as real processes. Every bad input of issue 31 gets
its one-line error and changes nothing; a vote a wallet signs itself from a non-member is
included and reverts with the registry's reason. Then the script, under a steady load (a
thread sending transfers through the nodes in turn): the observer follows and serves; three
validators vote it in through `pbft-node validators` (the CLI over pbft_proposeValidatorVote;
the tally from state follows every vote and retraction, the change is scheduled at the
handover checkpoint) and it votes from c+1; an original validator, a backup, is killed with
SIGKILL and the chain goes on with four of five; three of the others vote it out; started
again it follows as an observer of epoch 2; every transfer a node accepted commits, no node
changes view, and `pbft-etl run --genesis` from that observer and the added validator audits
the whole chain, sound, with its three epochs. Last, a view change
in epoch 2 needs the added validator."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pbft_engine.epoch_feed import validators_hash
from pbft_engine.registry import REGISTRY_ADDRESS, encode_vote
from spark_etl.rpc import JsonRpcClient
from spark_etl.tables import Dataset
from testkit.cluster import Cluster, rpc
from testkit.load import SteadyLoad
from testkit.nodes import wait_for
from tests.etl.conftest import etl
from tests.spec import assert_valid_result

pytestmark = pytest.mark.integration

OBSERVER = 4
REGISTRY = "0x" + REGISTRY_ADDRESS.hex()
LOAD_SENDERS = (4, 5, 6, 7)  # dev accounts: the other tests send from 0 to 3
LOAD_RATE = 5.0  # transfers a second, through every node in turn (each block: one or two)
ROLE_DEADLINE = 120.0  # seconds for a change to reach its handover and take effect
COMMIT_DEADLINE = 60.0  # seconds for what was accepted to commit (and reach a follower)
AFTER_KILL = 10  # transfers accepted after the kill that must commit, with 4 of 5
STALL_WINDOW = 15.0  # seconds a follower behind the validators may fetch nothing and not move
@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster.create(tmp_path_factory.mktemp("votes"), 4, observers=1)
    try:
        cluster.start()
        yield cluster
    finally:
        codes = cluster.close()
    assert codes == [0] * len(codes)


def validators(*args: str) -> subprocess.Popen[str]:
    """`pbft-node validators ARGS`, started (several run at once)."""
    return subprocess.Popen([sys.executable, "-m", "cli.node", "validators", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


def ok(*args: str) -> str:
    code, out, err = finished(validators(*args))
    assert code == 0, err
    return out


def counted(net: Cluster, via: int, *args: str) -> int:
    """`pbft-node validators ARGS --wait` through node `via`: the block the vote or retraction
    counted in, once every running node holds it (the next read may ask any of them)."""
    block = int(ok(*args, "--wait", "--rpc", net.nodes[via].rpc_url).split()[-1])
    net.wait_heads([i for i, n in enumerate(net.nodes) if n.process is not None], block)
    return block


def tally(net: Cluster, node: int = 0) -> dict[str, Any]:
    result = rpc(net.nodes[node], "pbft_getPendingVotes", "latest")
    assert isinstance(result, dict)
    return result


def role(net: Cluster, node: int) -> tuple[str, int]:
    status = net.status(node)
    return status["role"], status["epoch"]


def wait_role(net: Cluster, nodes: list[int], expected: tuple[str, int]) -> None:
    for node in nodes:
        wait_for(lambda node=node: role(net, node) == expected, ROLE_DEADLINE,
                 f"node {node} a {expected[0]} of epoch {expected[1]}")


def members_of(net: Cluster) -> tuple[list[str], str]:
    """The genesis validators and the observer's address, lower-case."""
    return ([a.lower() for a in net.description["validators"]],
            net.description["nodes"][OBSERVER]["address"].lower())


def test_every_bad_vote_gets_a_one_line_error_and_changes_nothing(net: Cluster) -> None:
    urls = [n.rpc_url for n in net.nodes]
    members, observer = members_of(net)
    assert tally(net) == {}
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
    started = {name: validators(*args) for name, (args, _) in bad.items()}
    listed = validators("pending", "--json", "--rpc", urls[2])
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


# --- issue 31's script ----------------------------------------------------------------------


def receipts(net: Cluster, node: int, hashes: list[bytes]) -> list[Any]:
    with JsonRpcClient(net.nodes[node].rpc_url) as client:
        return client.batch([("eth_getTransactionReceipt", ["0x" + h.hex()]) for h in hashes])


def wait_committed(net: Cluster, node: int, hashes: list[bytes]) -> list[dict[str, Any]]:
    """Every one of `hashes` has a receipt of status 1 on node `node`; the receipts."""
    wait_for(lambda: all(receipts(net, node, hashes)), COMMIT_DEADLINE,
             f"{len(hashes)} receipts on node {node}")
    found = receipts(net, node, hashes)
    failed = [r["transactionHash"] for r in found if r["status"] != "0x1"]
    assert not failed, f"transfers that reverted: {failed}"
    return found


def wait_accepted(load: SteadyLoad, count: int, via: int | None = None) -> list[bytes]:
    """The first `count` hashes the load has had accepted (through node `via`)."""
    wait_for(lambda: len(load.accepted(via)) >= count, COMMIT_DEADLINE,
             f"{count} transfers accepted via {via}")
    return load.accepted(via)[:count]


def vote_the_observer_in(net: Cluster) -> int:
    """Three of four vote the observer in (one retracts and votes again on the way): the
    tally follows each; the block it passed in."""
    urls = [n.rpc_url for n in net.nodes]
    members, observer = members_of(net)
    first = ok("propose", observer, "--add", "--rpc", urls[0]).strip()
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
    counted(net, 1, "propose", observer, "--add")
    assert tally(net, 1)[observer]["voters"] == members[:2]
    counted(net, 1, "discard", observer)
    assert tally(net, 1)[observer]["voters"] == members[:1]
    counted(net, 1, "propose", observer, "--add")
    human = ok("pending", "--rpc", urls[2])
    assert human.splitlines()[0] == (f"add {observer}: 2 votes, 3 needed; the first expires "
                                     f"at block {receipt.blockNumber + 30_000}")
    passed_at = counted(net, 2, "propose", observer, "--add")
    assert tally(net, 2) == {}
    return passed_at


def check_scheduled(net: Cluster, passed_at: int) -> int:
    """The addition is recorded in state and scheduled at the first checkpoint c >= b +
    max_in_flight (b: the block it passed in); c."""
    urls = [n.rpc_url for n in net.nodes]
    members, observer = members_of(net)
    assert int(rpc(net.nodes[2], "eth_getStorageAt", REGISTRY, "0x0", "latest"), 16) == 1
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
    listing = ok("list", "--block", str(passed_at), "--rpc", urls[0]).splitlines()
    assert listing[0] == f"epoch 0, blocks 1..{c}: n=4 f=1 quorum=3"
    assert listing[6] == f"epoch 1, blocks {c + 1}..: n=5 f=1 quorum=4"
    assert "is a validator already" in finished(validators(
        "propose", observer, "--add", "--rpc", urls[3]))[2]
    return c


def check_epoch_1(net: Cluster, c: int) -> None:
    """From c+1 the observer votes: block c's extraData commits to the five, and a block
    after it is certified by epoch 1's quorum of four."""
    members, observer = members_of(net)
    wait_role(net, list(range(5)), ("validator", 1))
    header = net.nodes[0].web3().eth.get_block(c)
    assert bytes(header["extraData"]) == validators_hash(
        tuple(bytes.fromhex(a[2:]) for a in [*members, observer]))
    block = net.commit(via=OBSERVER, sender=1)
    certificate = rpc(net.nodes[OBSERVER], "pbft_getCommitCertificate", hex(block))
    assert certificate["epoch"] == "0x1" and len(certificate["signers"]) >= 4
    assert set(certificate["signers"]) <= {*members, observer}


def kill_a_backup(net: Cluster, load: SteadyLoad) -> int:
    """SIGKILL of an original validator that is not the primary (the load routed around it
    first, and what it accepted committed); the four others go on, a quorum of epoch 1's
    five. The node's index."""
    members, observer = members_of(net)
    primary = net.status(0)["primary"].lower()
    victim = max(i for i in range(4) if members[i] != primary)
    load.route(*(i for i in range(5) if i != victim))
    wait_committed(net, 0, load.accepted(victim))
    assert net.stop(victim, signal.SIGKILL) == -signal.SIGKILL
    sent = len(load.accepted())
    after = wait_accepted(load, sent + AFTER_KILL)[sent:]
    block = int(wait_committed(net, 0, after)[-1]["blockNumber"], 16)
    certificate = rpc(net.nodes[0], "pbft_getCommitCertificate", hex(block))
    assert certificate["epoch"] == "0x1"
    assert set(certificate["signers"]) == {*members, observer} - {members[victim]}
    return victim


def vote_out(net: Cluster, victim: int) -> int:
    """Three of the five (two original validators and the added one) vote the killed one out;
    the four others form epoch 2 after the handover. The block it passed in."""
    members, observer = members_of(net)
    voters = [i for i in range(3) if i != victim][:2] + [OBSERVER]
    passed = max(counted(net, v, "propose", members[victim], "--remove") for v in voters)
    wait_role(net, [i for i in range(5) if i != victim], ("validator", 2))
    assert rpc(net.nodes[0], "pbft_getValidators") == [
        *(m for m in members if m != members[victim]), observer]
    return passed


def follows(net: Cluster, node: int) -> bool:
    """Node `node` reaches the head validator 0 has now (True), or stops short of it: its
    head unchanged for STALL_WINDOW seconds while it fetches nothing (False)."""
    target, last = net.head(0), {"head": -1, "since": time.monotonic()}

    def outcome() -> str | None:
        status = net.status(node)
        if status["lastExecuted"] >= target:
            return "followed"
        if status["lastExecuted"] != last["head"] or status["fetching"] is not None:
            last.update(head=status["lastExecuted"], since=time.monotonic())
        elif time.monotonic() - last["since"] > STALL_WINDOW:
            return "stalled"
        return None

    return wait_for(outcome, COMMIT_DEADLINE, f"node {node} at block {target}") == "followed"


def restart_as_observer(net: Cluster, victim: int) -> None:
    """Started again, the validator voted out follows as an observer of epoch 2 (it left the
    set during its catch-up, whose fetch once ran on the observer's block sync and left it
    stalled: a059582)."""
    net.start(victim)
    wait_role(net, [victim], ("observer", 2))
    assert follows(net, victim), "voted out while down and started again, it does not follow"


def audit(net: Cluster, capsys: pytest.CaptureFixture[str], out: Path, nodes: list[int]
          ) -> tuple[dict[str, Any], str]:
    """`pbft-etl run --genesis` from `nodes` into `out`: its report and its output."""
    report = out / "report.json"
    code, stdout, stderr = etl(capsys, "run", "--rpc", ",".join(net.nodes[i].rpc_url
                                                                for i in nodes),
                               "--out", str(out / "data"),
                               "--genesis", str(net.directory / "genesis.json"),
                               "--report", str(report))
    result = json.loads(report.read_text()) if report.exists() else {}
    assert code == (1 if result.get("violations") else 0), stdout + stderr
    return result, stdout + stderr


def test_the_script_of_issue_31_under_a_steady_load(
        net: Cluster, spark: SparkSession, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    """The observer voted in, a backup killed, voted out and started again as an observer,
    under a steady load; no view change, every accepted transfer committed, and the audit of
    the whole chain from that observer and the added validator sound, with three epochs."""
    members, observer = members_of(net)
    views = {net.status(i)["view"] for i in range(4)}
    with SteadyLoad(net, LOAD_SENDERS, LOAD_RATE) as load:
        wait_committed(net, OBSERVER, wait_accepted(load, 3, via=OBSERVER))  # it serves
        first_change = check_scheduled(net, vote_the_observer_in(net))
        check_epoch_1(net, first_change)
        victim = kill_a_backup(net, load)
        second_change = -(-(vote_out(net, victim) + 2) // 10) * 10
        restart_as_observer(net, victim)
        before = len(load.accepted(victim))
        load.route(*range(5))
        forwarded = wait_committed(net, victim,
                                   wait_accepted(load, before + 3, via=victim)[before:])
        assert follows(net, victim), "it does not go on following"
    assert load.refused == []
    # the added validator voted from c + 1 (it imported nothing past c as an observer), so it
    # holds the first checkpoint of its epoch as stable as the others do
    assert rpc(net.nodes[OBSERVER], "pbft_getCheckpoint", hex(first_change + 10))["stable"]
    certificate = rpc(net.nodes[victim], "pbft_getCommitCertificate",
                      forwarded[-1]["blockNumber"])  # forwarded by the observer it became
    assert certificate["epoch"] == "0x2" and members[victim] not in certificate["signers"]
    accepted = load.accepted()
    last = max(int(r["blockNumber"], 16) for r in wait_committed(net, victim, accepted))
    assert {net.status(i)["view"] for i in range(5) if i != victim} == views == {0}

    head = net.wait_idle(last)
    result, output = audit(net, capsys, tmp_path, [victim, OBSERVER])
    down = net.nodes[victim].rpc_url
    # (checkpoint-missing asks nothing of it for the checkpoints it was down for)
    assert result["violations"] == [], output
    assert result["nodes"] == {net.nodes[i].rpc_url: head + 1 for i in (victim, OBSERVER)}
    remaining = [m for m in members if m != members[victim]]
    assert [(e["epoch"], e["first_block"], e["validators"]) for e in result["epochs"]] == [
        (0, 1, members), (1, first_change + 1, [*members, observer]),
        (2, second_change + 1, [*remaining, observer])]
    data = Dataset.read(spark, str(tmp_path / "data"))
    assert data.view_changes.count() == 0
    assert data.commit_certificates.where(F.col("view") != 0).count() == 0
    exported = {r["hash"] for r in data.transactions.where(F.col("node") == down)
                .select("hash").collect()}
    assert {"0x" + h.hex() for h in accepted} <= exported


def test_a_view_change_in_epoch_2_needs_the_added_validator(net: Cluster) -> None:
    """After the script: the primary of epoch 2 goes down; the view change needs the added
    validator (3 of the 4), which the others were configured to let in as an observer, not to
    dial."""
    members, _ = members_of(net)
    primary = net.status(0)["primary"].lower()
    down = members.index(primary) if primary in members else 0
    up = next(n for n in range(5) if n != down and role(net, n) == ("validator", 2))
    view, head = net.status(OBSERVER)["view"], net.head(up)
    net.stop(down, signal.SIGKILL)
    assert net.commit(via=up, sender=3) > head
    assert net.status(OBSERVER)["view"] > view
    net.start(down)
    wait_role(net, [down], ("validator", 2))
