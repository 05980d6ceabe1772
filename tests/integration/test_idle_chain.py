"""The empty block that follows a block with transactions (issue 29, docs/engine.md "Empty
blocks"), as a real client meets it on a default `pbft-node testnet init --validators 4`
(PBFT) and `--validators 1` (the dev engine): a web3.js 1.x client that reads its receipt
and then subscribes to new heads is woken by a head within a deadline, and after that one
block the chain stays idle."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testkit.cluster import Cluster

pytestmark = pytest.mark.integration

HEAD_DEADLINE = 10.0  # trailing_empty_block is 1 s; the rest is slack for a loaded machine
IDLE_WATCH = 3.0  # seconds without a block: the trailing block is not armed again
ATTEMPTS = 3  # a subscription confirmed after the empty block landed saw nothing: again


class Client:
    """JSON-RPC over one WebSocket: answers by id; subscription notifications queued."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.ids = ws, itertools.count(1)
        self.answers: dict[int, asyncio.Future[Any]] = {}
        self.heads: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            reply = json.loads(message.data)
            if reply.get("method") == "eth_subscription":
                await self.heads.put(reply["params"]["result"])
            else:
                self.answers.pop(reply["id"]).set_result(reply)

    async def call(self, method: str, *params: Any) -> Any:
        request_id = next(self.ids)
        answer = self.answers[request_id] = asyncio.get_running_loop().create_future()
        await self.ws.send_json({"jsonrpc": "2.0", "id": request_id, "method": method,
                                 "params": list(params)})
        reply = await asyncio.wait_for(answer, HEAD_DEADLINE)
        assert "error" not in reply, reply
        return reply["result"]


@pytest.fixture(params=[4, 1], ids=["pbft", "dev"])
def testnet(request: pytest.FixtureRequest, cluster: Cluster, tmp_path: Path
            ) -> Iterator[Cluster]:
    """The module's 4-validator cluster, or a fresh 1-validator (dev engine) testnet."""
    if request.param == 4:
        yield cluster
        return
    dev = Cluster.create(tmp_path, 1)
    try:
        dev.start()
        yield dev
    finally:
        codes = dev.close()
    assert codes == [0]


def test_a_client_subscribing_after_its_receipt_gets_a_head_then_the_chain_idles(
    testnet: Cluster,
) -> None:
    testnet.wait_idle()  # nothing due from before
    entry = min(2, len(testnet.nodes) - 1)
    receipt, head = asyncio.run(_receipt_then_new_head(testnet, entry))
    assert int(head["number"], 16) == receipt + 1
    block = testnet.nodes[entry].web3().eth.get_block(receipt + 1)
    assert block.transactions == [] and block.hash.to_0x_hex() == head["hash"]
    assert all(testnet.head(i) == receipt + 1 for i in range(len(testnet.nodes)))  # idled


async def _receipt_then_new_head(cluster: Cluster, entry: int) -> tuple[int, dict[str, Any]]:
    """Send a transfer, wait for its receipt, then subscribe to newHeads (the web3 1.x order)
    on node `entry` over its WebSocket (opened before, as a client's is); the receipt's block
    number and the first head notified, after checking that no other comes in IDLE_WATCH."""
    async with aiohttp.ClientSession() as session, session.ws_connect(
            cluster.nodes[entry].ws_url) as ws:
        client = Client(ws)
        try:
            for _ in range(ATTEMPTS):
                receipt = await asyncio.to_thread(cluster.commit, entry)
                subscription = await client.call("eth_subscribe", "newHeads")
                if int(await client.call("eth_blockNumber"), 16) > receipt:
                    # the empty block may have been committed before the subscription: a
                    # notification is not due (nor is one missed by a test this slow, a bug)
                    await client.call("eth_unsubscribe", subscription)
                    await asyncio.to_thread(cluster.wait_idle, receipt, [entry])
                    while not client.heads.empty():
                        client.heads.get_nowait()
                    continue
                try:
                    head = await asyncio.wait_for(client.heads.get(), HEAD_DEADLINE)
                except TimeoutError:
                    raise AssertionError(
                        f"no new head within {HEAD_DEADLINE} s of the receipt in block "
                        f"{receipt}: a web3 1.x client waits for ever") from None
                try:
                    late = await asyncio.wait_for(client.heads.get(), IDLE_WATCH)
                except TimeoutError:
                    return receipt, head
                raise AssertionError(f"block {int(late['number'], 16)} came within "
                                     f"{IDLE_WATCH} s of the empty one: the chain is not idle")
            raise AssertionError(f"in {ATTEMPTS} attempts, the empty block always landed "
                                 "before the subscription was confirmed")
        finally:
            client.reader.cancel()
