"""What JSON-RPC uses of a node: `RpcBackend`, the one thing chain/rpc knows of it.

Interfaces first, as py-evm's `eth/abc.py`: the node (a validator or an observer, the same
class) implements this, and the RPC layer imports nothing else of the node, so the two do not
import each other and a test can serve the RPC from anything that keeps the contract.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from eth.abc import BlockHeaderAPI

from chain.blockchain import Blockchain
from chain.engine import RpcHandler
from chain.metrics import NodeMetrics
from chain.read_store import TxRecord
from chain.rpc.limits import RpcLimits
from chain.txpool import TxPool


@dataclass(frozen=True)
class CommittedBlock:
    """What listeners (filters, subscriptions) hear about each new head."""

    header: BlockHeaderAPI
    records: tuple[TxRecord, ...]


@dataclass(frozen=True)
class RpcSettings:
    """Where the RPC listens and what it allows (the node's `[http]` and `[rpc]` settings)."""

    http_addr: str
    http_port: int
    host_allowlist: tuple[str, ...]
    cors_origins: tuple[str, ...]
    limits: RpcLimits
    gas_cap: int  # geth's RPCGasCap: eth_call and eth_estimateGas


class RpcBackend(ABC):
    """A node as its JSON-RPC sees it."""

    chain_id: int
    blockchain: Blockchain  # the chain and its read store (reads run on the RPC's threads)
    pool: TxPool  # read by eth_getTransactionCount("pending"), txpool_*; written by submit
    metrics: NodeMetrics  # the RPC's own gauges and counters go on the node's registry

    @abstractmethod
    def rpc_settings(self) -> RpcSettings:
        """The listening address, allowlists and limits."""

    @abstractmethod
    def add_head_listener(self, listener: Callable[[CommittedBlock], None]) -> None:
        """Call `listener` on the event loop with every block that becomes the head."""

    @abstractmethod
    def submit_raw_transaction(self, raw: bytes) -> bytes:
        """Admit a signed transaction (TxPoolError if refused) and send it on; its hash."""

    @abstractmethod
    def next_base_fee(self) -> int:
        """The base fee of the block after the head."""

    @abstractmethod
    def peer_count(self) -> int:
        """Peers with an authenticated connection now."""

    @abstractmethod
    def sync_status(self) -> dict[str, str] | None:
        """eth_syncing's object, or None when not syncing."""

    @abstractmethod
    def engine_rpc_methods(self) -> dict[str, RpcHandler]:
        """The consensus engine's namespace (pbft_*), by method name."""
