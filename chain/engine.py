"""The consensus-engine plugin interface (shaped after geth's consensus.Engine and Sawtooth's
consensus service): the node gives an engine an `EngineContext` with what it may do; the
engine tells the node what to commit. Engines are found by name through the
`pbft_chain.engines` entry-point group (see `chain.registry`), so chain never imports one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from eth.abc import BlockHeaderAPI
from eth_keys.datatypes import PrivateKey
from prometheus_client import CollectorRegistry

from chain.blockchain import ExecutedBlock
from chain.rpc.errors import InvalidParams as InvalidParams  # for engines' RPC methods
from chain.system_contracts import ContractStorage, SystemContract
from storage import Database, Keyspace, WriteBatch

# An engine's JSON-RPC method; it raises InvalidParams for a bad argument (the client gets
# -32602 with the message).
RpcHandler = Callable[..., Awaitable[Any]]


class TimerHandle(ABC):
    @abstractmethod
    def cancel(self) -> None: ...


class EngineContext(ABC):
    """What an engine may do with its node. Block execution runs off the event loop."""

    chain_id: int
    database: Database
    validator_key: PrivateKey | None  # this node's key, if it has one (not always a validator's)
    datadir: Path  # the data directory: files beside the database that must outlive it
    fresh_validator: bool  # the operator says this validator never signed on this chain
    dialed_peers: frozenset[bytes]  # the peers this node dials (its configured --peers)
    metrics: CollectorRegistry  # the node's Prometheus registry, for the engine's own metrics

    @abstractmethod
    def head(self) -> BlockHeaderAPI:
        """The canonical head."""

    @abstractmethod
    def pending_count(self) -> int:
        """How many transactions the pool could put into the next block."""

    @abstractmethod
    async def build_block(
        self, *, coinbase: bytes, extra_data: bytes = b"", time_budget: float | None = None,
        parent: ExecutedBlock | None = None,
    ) -> ExecutedBlock:
        """Execute a candidate block from the pool (it may be empty) on the head, or on
        `parent` (executed, not committed: the pool's transactions in it and in its
        uncommitted ancestors are left out), adding transactions only while execution stays
        within `time_budget` seconds (if given)."""

    @abstractmethod
    async def validate_block(self, data: bytes, parent: ExecutedBlock | None = None
                             ) -> ExecutedBlock:
        """Decode and execute a proposed block on the head, or on `parent` (executed, not
        committed); BlockValidationError if bad."""

    @abstractmethod
    async def commit_block(
        self, executed: ExecutedBlock, extra_writes: Callable[[WriteBatch], None] | None = None
    ) -> None:
        """Make the block canonical; `extra_writes` (its certificate) lands in the same batch."""

    @abstractmethod
    async def commit_blocks(
        self, blocks: Sequence[tuple[ExecutedBlock, Callable[[WriteBatch], None]]]
    ) -> None:
        """Make consecutive blocks canonical (each executed on the one before it, the first
        on the head) in one batch, each with its `extra_writes`: a catch-up's range."""

    @abstractmethod
    def keyspace(self, prefix: bytes) -> Keyspace:
        """A keyspace for the engine's own persistent state (prefix under the engine's name)."""

    @abstractmethod
    async def canonical_blocks(self, first: int, count: int) -> list[bytes]:
        """Encoded canonical blocks from number `first` (fewer at the head), read off the loop:
        for the engine's own use (never behind a peer's or a client's work)."""

    async def peer_blocks(self, first: int, count: int) -> list[bytes]:
        """canonical_blocks for serving a peer: a node may bound and pace it (fewer or none
        when busy: the peer asks another)."""
        return await self.canonical_blocks(first, count)

    @abstractmethod
    def send(self, peer: bytes, payload: bytes) -> None:
        """Send an engine message to one validator (by address); dropped if unreachable."""

    @abstractmethod
    def broadcast(self, payload: bytes) -> None:
        """Send an engine message to every other connected validator."""

    @abstractmethod
    def send_sync(self, peer: bytes, payload: bytes) -> None:
        """Send a block-sync message to one validator (its own channel, beside consensus)."""

    @abstractmethod
    def relay_transactions(self, peer: bytes, tx_hashes: Sequence[bytes]) -> None:
        """Send these pool transactions to one validator on the gossip channel (those the
        pool no longer holds are skipped; dropped if unreachable)."""

    @abstractmethod
    def peers(self) -> frozenset[bytes]:
        """The validators connected now."""

    @abstractmethod
    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` on the event loop after `delay` seconds."""

    # State and transactions, for an engine that keeps its own in system contracts.

    @abstractmethod
    def canonical_header(self, number: int) -> BlockHeaderAPI | None:
        """The canonical header at `number` (None above the head)."""

    @abstractmethod
    def canonical_header_by_hash(self, block_hash: bytes) -> BlockHeaderAPI | None:
        """The canonical block's header with this hash (None: no canonical block has it)."""

    @abstractmethod
    def system_storage(self, block_hash: bytes, address: bytes) -> ContractStorage | None:
        """The storage of the account at `address` (a system contract's) in the state after
        the canonical block `block_hash`, read-only; None if no canonical block has it."""

    @abstractmethod
    def submit_transaction(self, raw: bytes) -> bytes:
        """Admit a signed transaction as eth_sendRawTransaction does (the pool, then gossip
        to the peers); its hash. TxPoolError, with the client's message, if refused."""

    @abstractmethod
    def pending_nonce(self, address: bytes) -> int:
        """The next nonce of `address` after its transactions in the pool (geth's
        eth_getTransactionCount "pending")."""

    @abstractmethod
    def fee_floor(self) -> int:
        """The lowest fee cap the pool admits now: the next block's base fee, or the pool's
        price limit (geth's --txpool.pricelimit) if higher."""


class ConsensusEngine(ABC):
    """A consensus engine. One instance per node, driven on the node's event loop."""

    name: ClassVar[str]
    # Keys of the genesis engine section that `pbft-node init` may change in an initialised
    # data directory (the same block 0): what a coordinated restart changes, such as PBFT's
    # `transitions`; every other key is fixed for the chain's life.
    updatable_params: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, context: EngineContext, params: Mapping[str, Any]) -> None:
        self.context = context
        self.params = params

    @classmethod
    @abstractmethod
    def check_params(cls, params: Mapping[str, Any]) -> None:
        """Raise EngineError with a clear message if the genesis engine section is invalid."""

    @classmethod
    def system_contracts(cls, chain_id: int, params: Mapping[str, Any]
                         ) -> Sequence[SystemContract]:
        """The native contracts this engine's chain executes (DESIGN.md section 10: the
        validator registry), from the genesis engine section: every node and every replay
        of the chain must run the same ones, so they are a function of the genesis only."""
        return ()

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    def on_transactions(self, tx_hashes: list[bytes]) -> None:
        """Transactions in the pool became executable at the head (a block could include
        them now): newly arrived, or a nonce gap closed."""

    def on_transactions_dropped(self, tx_hashes: list[bytes]) -> None:  # noqa: B027
        """Transactions reported by `on_transactions` left the pool other than by being
        committed (replaced, evicted, made invalid by a block) or stopped being executable
        (the base fee rose above their fee cap). Commits are reported by `commit_block`."""

    def on_message(self, sender: bytes, payload: bytes) -> None:  # noqa: B027
        """An engine message from a validator; engines without messages ignore them."""

    def on_sync_message(self, sender: bytes, payload: bytes) -> None:  # noqa: B027
        """A block-sync message from a validator; engines that do not sync ignore them."""

    def on_gossip(self, sender: bytes, admit: Callable[[], None]) -> None:
        """A transaction `sender` gossiped: `admit` decodes it for the pool. An engine that
        bounds each peer's share of the loop runs it within that share, or drops it."""
        admit()

    def is_validator(self, peer: bytes) -> bool:
        """Whether `peer` is a validator of the set in force (its gossip is then what a
        validator accepted first); an engine without peers has none but itself."""
        return False

    @abstractmethod
    def is_proposer(self) -> bool:
        """Whether this node proposes the next block."""

    def status(self) -> dict[str, Any]:
        return {"engine": self.name}

    def rpc_methods(self) -> dict[str, RpcHandler]:
        """Extra JSON-RPC methods (a namespace of the engine's own, such as pbft_*)."""
        return {}
