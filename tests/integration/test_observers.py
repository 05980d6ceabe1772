"""An observer on `testnet init --validators 4 --observers 1` (defaults), as real processes:
it follows the validators under load, serves the same blocks and receipts, forwards the
transactions sent to it, never votes, and the validators lose nothing when it dies; a node key
the validators were not given is refused."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
from collections.abc import Iterator

import pytest
from eth_keys import keys
from web3.exceptions import TransactionNotFound

from chain.p2p import Transport
from pbft_engine.messages import verify_commit_certificate
from testkit.cluster import Cluster, rpc
from testkit.nodes import pbft_node, wait_for

OBSERVER = 4
VALIDATORS = [0, 1, 2, 3]
TRANSFERS = 20  # each way: through the observer and through a validator
MAX_LAG = 2  # blocks the observer's head may be behind the validators'


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster.create(tmp_path_factory.mktemp("observers"), 4, observers=1)
    try:
        cluster.start()
        yield cluster
    finally:
        codes = cluster.close()
    assert codes == [0] * len(codes)


def _lag(cluster: Cluster) -> int:
    """How far the observer is behind the validators (their heads read first)."""
    validators = max(cluster.head(i) for i in VALIDATORS)
    return validators - cluster.head(OBSERVER)


def _signers(cluster: Cluster, number: int, block_hash: bytes) -> frozenset[int]:
    certificate = rpc(cluster.nodes[OBSERVER], "pbft_getCommitCertificate", hex(number))
    return verify_commit_certificate(
        bytes.fromhex(certificate["certificate"][2:]), validators=cluster.validators, epoch=0,
        chain_id=cluster.description["chain_id"], block_number=number, block_hash=block_hash)


def test_the_observer_follows_serves_forwards_and_never_votes(net: Cluster) -> None:
    observer = net.nodes[OBSERVER]
    assert net.description["nodes"][OBSERVER]["role"] == "observer"
    assert {n["role"] for n in net.description["nodes"][:4]} == {"validator"}
    status = net.status(OBSERVER)
    assert status["role"] == "observer" and status["peers"] == 4
    assert status["node"] == observer.node["address"]
    statuses = [net.status(i) for i in VALIDATORS]
    assert {(s["role"], s["peers"], s["observers"]) for s in statuses} == {("validator", 3, 1)}

    # load: transfers through the observer (forwarded to the validators) and a validator
    sent = []
    for _ in range(TRANSFERS):
        sent.append(net.transfer(via=OBSERVER, sender=0))
        sent.append(net.transfer(via=1, sender=1))
    lags = []
    validator = net.nodes[0].web3()

    def committed() -> bool:
        lags.append(_lag(net))
        try:
            return all(validator.eth.get_transaction_receipt(h) for h in sent[-2:])
        except TransactionNotFound:
            return False

    wait_for(committed, 60, "the transfers committed on validator 0")
    assert max(lags) <= MAX_LAG, f"the observer fell behind under load: lags {lags}"
    head = net.wait_idle()
    assert net.head(OBSERVER) == head

    # the same blocks, receipts and certificates; no signature of the observer's key
    w3 = observer.web3()
    address = bytes.fromhex(observer.node["address"][2:])
    assert address not in net.validators
    for number in range(1, head + 1):
        ours, theirs = w3.eth.get_block(number, True), validator.eth.get_block(number, True)
        assert ours == theirs
        for tx in ours.transactions:
            assert (w3.eth.get_transaction_receipt(tx.hash)
                    == validator.eth.get_transaction_receipt(tx.hash))
        assert len(_signers(net, number, bytes(ours.hash))) >= 3
    assert all(validator.eth.get_transaction_receipt(h).status == 1 for h in sent)
    frames = net.metrics(OBSERVER)
    assert frames.get("p2p_frames_total|out|engine", 0) == 0, "the observer sent consensus"


def test_send_and_status_work_through_the_observer(net: Cluster) -> None:
    """`pbft-node send` through the observer is confirmed by f+1 validators; `pbft-node
    status` shows each node's role."""
    observer = net.description["nodes"][OBSERVER]["address"]
    sent = pbft_node("send", "--testnet", str(net.directory), "--account", "3", "--to",
                     net.description["accounts"][9]["address"], "--value", "1", "--via",
                     observer, "--json", "--timeout", "30")
    result = json.loads(sent.stdout)
    validators = set(net.description["validators"])
    assert result["status"] == 1 and result["validators"] == 4
    assert len(result["confirmedBy"]) >= 2 and set(result["confirmedBy"]) <= validators
    rows = pbft_node("status", "--testnet", str(net.directory)).stdout.splitlines()
    assert rows[0].split()[:3] == ["node", "role", "address"]
    roles = [row.split()[2] for row in rows[1:]]  # "node 4 observer ..."
    assert roles == ["validator"] * 4 + ["observer"]


def test_a_key_not_in_observers_is_refused(net: Cluster) -> None:
    refused = "p2p_handshakes_refused_total|unknown_key"
    before = [net.metrics(i).get(refused, 0) for i in VALIDATORS]

    async def stranger() -> None:
        transport = Transport(
            keys.PrivateKey(secrets.token_bytes(32)), net.description["chain_id"],
            {net.validators[i]: net.endpoint(i) for i in VALIDATORS}, "127.0.0.1", 0,
            lambda *_: None)
        await transport.start()
        try:
            await asyncio.to_thread(
                wait_for, lambda: all(net.metrics(i).get(refused, 0) > before[i]
                                      for i in VALIDATORS),
                30, "every validator refusing the stranger")
        finally:
            await transport.stop()

    asyncio.run(stranger())
    assert all((net.status(i)["peers"], net.status(i)["observers"]) == (3, 1)
               for i in VALIDATORS)


def test_losing_the_observer_changes_nothing_for_the_validators(net: Cluster) -> None:
    views = {net.status(i)["view"] for i in VALIDATORS}
    net.stop(OBSERVER, signal.SIGKILL)
    wait_for(lambda: all(net.status(i)["observers"] == 0 for i in VALIDATORS), 30,
             "the validators noticing the observer is gone")
    for _ in range(5):
        net.commit(via=2, sender=2)
    statuses = [net.status(i) for i in VALIDATORS]
    assert {s["view"] for s in statuses} == views
    assert all(s["mode"] == "normal" for s in statuses)
    net.assert_consistent()
