"""The txpool_* methods, in geth's shapes: pending = transactions whose nonces follow on from
their account's, queued = those behind a nonce gap; accounts as EIP-55 checksummed
addresses and nonces as decimal strings, the keys geth uses.

A full pool (20,000 transactions) takes ~0.4 s to format: the answers are built a slice of
FORMAT_SLICE transactions at a time, the event loop serving consensus in between, from the
pool as it was when the call arrived."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from eth_utils import to_checksum_address

from chain.rpc.backend import RpcBackend
from chain.rpc.eth import Method
from chain.rpc.formatters import transaction_json
from chain.rpc.hexcodec import parse_address, quantity
from chain.txpool import PoolEntry

FORMAT_SLICE = 500  # transactions formatted between two turns of the event loop (~10 ms)


def _transaction(entry: PoolEntry) -> dict[str, Any]:
    return transaction_json(entry.tx.encode(), entry.tx.hash, entry.sender)


def _summary(entry: PoolEntry) -> str:
    """geth's txpool_inspect line (the price is the fee cap, as geth's `tx.GasPrice()`)."""
    tx = entry.tx
    to = to_checksum_address(tx.to) if tx.to else "contract creation"
    return f"{to}: {tx.value} wei + {tx.gas} gas × {tx.max_fee_per_gas} wei"


def _by_nonce(entries: list[PoolEntry], show: Callable[[PoolEntry], Any]) -> dict[str, Any]:
    return {str(entry.tx.nonce): show(entry) for entry in entries}


async def _by_sender(split: dict[bytes, list[PoolEntry]], show: Callable[[PoolEntry], Any]
                     ) -> dict[str, Any]:
    """`_by_nonce` for every sender, yielding to the event loop every FORMAT_SLICE."""
    listed: dict[str, Any] = {}
    done = 0
    for sender, entries in split.items():
        listed[to_checksum_address(sender)] = _by_nonce(entries, show)
        done += len(entries)
        if done >= FORMAT_SLICE:
            done = 0
            await asyncio.sleep(0)
    return listed


class TxPoolApi:
    def __init__(self, node: RpcBackend) -> None:
        self.pool = node.pool

    def methods(self) -> dict[str, Method]:
        return {
            "txpool_status": self.txpool_status,
            "txpool_content": self.txpool_content,
            "txpool_contentFrom": self.txpool_contentFrom,
            "txpool_inspect": self.txpool_inspect,
        }

    async def _listed(self, show: Callable[[PoolEntry], Any]) -> dict[str, Any]:
        pending, queued = self.pool.by_status()
        return {"pending": await _by_sender(pending, show),
                "queued": await _by_sender(queued, show)}

    async def txpool_status(self) -> dict[str, str]:
        pending, queued = self.pool.by_status()
        return {"pending": quantity(sum(map(len, pending.values()))),
                "queued": quantity(sum(map(len, queued.values())))}

    async def txpool_content(self) -> dict[str, Any]:
        return await self._listed(_transaction)

    async def txpool_contentFrom(self, address: Any) -> dict[str, Any]:  # noqa: N802
        sender = parse_address(address)
        pending, queued = self.pool.by_status()
        return {"pending": _by_nonce(pending.get(sender, []), _transaction),
                "queued": _by_nonce(queued.get(sender, []), _transaction)}

    async def txpool_inspect(self) -> dict[str, Any]:
        return await self._listed(_summary)
