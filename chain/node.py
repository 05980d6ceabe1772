"""A node: the database, the chain, the pool, the consensus engine and JSON-RPC, wired."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import rlp
from eth.abc import BlockHeaderAPI, StateAPI
from eth_keys.datatypes import PrivateKey
from eth_utils import ValidationError
from prometheus_client.core import Metric

from chain import ordered_trie
from chain.blockchain import Blockchain, ExecutedBlock
from chain.collector import CycleCollector
from chain.engine import ConsensusEngine, EngineContext, RpcHandler, TimerHandle
from chain.errors import NodeError, TxPoolError
from chain.genesis import Genesis, load_genesis_bytes
from chain.metrics import CallbackCollector, MetricsServer, NodeMetrics, labelled_counter
from chain.p2p import Channel, Transport
from chain.read_store import encode_block
from chain.registry import available_engines, load_engine_class
from chain.rpc.backend import CommittedBlock, RpcBackend, RpcSettings
from chain.rpc.errors import RpcError
from chain.rpc.limits import RpcLimits
from chain.rpc.served import WorkerPool, paced
from chain.rpc.server import RpcServer
from chain.system_contracts import ContractStorage, SystemContract
from chain.txpool import (
    DROP_REASONS,
    AccountReader,
    Candidate,
    GossipBacklog,
    PoolEntry,
    PoolLimits,
    TxPool,
    decode_raw_transaction,
    recover_sender,
)
from storage import Database, Keyspace, StorageFailure, WriteBatch

log = logging.getLogger(__name__)

T = TypeVar("T")

CHAINDATA = "chaindata"
NODEKEY = "nodekey"  # an observer's transport key when it has no keystore (geth's nodekey)
# Candidate transactions are admitted this many at a time, the event loop serving consensus
# messages and block results in between: a burst gossiped by the other validators would
# otherwise hold the loop for seconds and delay this node's votes past the request timer.
GOSSIP_SLICE = 32
EVICTION_INTERVAL = 60.0  # seconds between sweeps of expired queued transactions (geth's)
EXECUTABLE_COUNTED = 1_000  # txpool_executable counts up to this (a scrape must stay cheap)
ACCOUNT_CACHE = 1 << 16  # accounts whose nonce and balance the pool keeps (~10 MB)
# Peers' block ranges read at once or waiting (each peer has one served at a time): one
# thread, as the disk and the interpreter are shared with consensus and clients.
MAX_PENDING_SYNC_READS = 64
SYNC_READS = WorkerPool(1, MAX_PENDING_SYNC_READS, "block-sync")


@dataclass
class NodeConfig:
    datadir: Path
    validator_key: PrivateKey | None = None
    fresh_validator: bool = False  # the operator's word: this validator never voted here
    p2p_addr: str = "127.0.0.1"
    p2p_port: int = 30303
    peers: dict[bytes, tuple[str, int]] = field(default_factory=dict)  # address -> host, port
    # node keys of observers allowed to connect in (a validator's list; they dial it)
    observers: frozenset[bytes] = frozenset()
    http_addr: str = "127.0.0.1"
    http_port: int = 8545
    http_enabled: bool = True
    host_allowlist: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
    cors_origins: tuple[str, ...] = ()
    max_block_transactions: int = 1_000
    pool_limits: PoolLimits = field(default_factory=PoolLimits)
    rpc_gas_cap: int = 50_000_000  # geth's RPCGasCap: eth_call and eth_estimateGas
    rpc_limits: RpcLimits = field(default_factory=RpcLimits)
    metrics_addr: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no metrics server


def open_database(datadir: Path) -> Database:
    return Database(Path(datadir) / CHAINDATA)


def initialize_datadir(datadir: Path, genesis: Genesis) -> BlockHeaderAPI:
    """Write the genesis block into a new (or same-genesis) data directory; in one holding
    a chain, take a genesis that changes only what its engine lets change (`geth init` on
    a chain does the same for its future fork blocks), and say so loudly."""
    with open_database(datadir) as db:
        stored = Blockchain.stored_genesis(db)
        if stored is not None and stored != genesis.source:
            old = load_genesis_bytes(stored, available_engines(), origin="stored genesis")
            if _updates_only(old, genesis):
                Blockchain.replace_genesis_source(db, genesis.source)
                changed = sorted(k for k in {*old.engine_params, *genesis.engine_params}
                                 if old.engine_params.get(k) != genesis.engine_params.get(k))
                if changed:
                    log.warning("updated the genesis of %s: config.%s.%s changed (block 0 "
                                "and the rest as before)", datadir, genesis.engine,
                                ", ".join(changed))
        return Blockchain(db, genesis).head()


def _updates_only(stored: Genesis, new: Genesis) -> bool:
    """`new` is `stored` but for the engine section's keys its engine may update."""
    updatable = load_engine_class(new.engine).updatable_params
    def fixed(genesis: Genesis) -> Genesis:
        params = {k: v for k, v in genesis.engine_params.items() if k not in updatable}
        return dataclasses.replace(genesis, engine_params=params, source=b"")
    return stored.engine == new.engine and fixed(stored) == fixed(new)


def write_node_key(datadir: Path, key: PrivateKey) -> PrivateKey:
    """Writes `key` to DATADIR/nodekey (hex), readable by its owner only; never replaces one."""
    descriptor = os.open(Path(datadir) / NODEKEY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(key.to_hex() + "\n")
    return key


def load_node_key(datadir: Path) -> PrivateKey:
    """The key in DATADIR/nodekey (hex), made on first use: the identity of a node that runs
    without a keystore, which the validators list in their `observers`."""
    path = Path(datadir) / NODEKEY
    try:
        if not path.exists():
            key = write_node_key(datadir, PrivateKey(secrets.token_bytes(32)))
            log.info("made node key %s in %s", key.public_key.to_checksum_address(), path)
            return key
        return PrivateKey(bytes.fromhex(path.read_text().strip().removeprefix("0x")))
    except OSError as exc:
        raise NodeError(f"cannot use node key {path}: {exc.strerror or exc}") from None
    except (ValueError, ValidationError):  # not hex; not 32 bytes or not a secp256k1 key
        raise NodeError(f"{path} does not hold a 32-byte hex private key") from None


def load_datadir_genesis(db: Database) -> Genesis:
    source = Blockchain.stored_genesis(db)
    if source is None:
        raise NodeError(
            f"data directory {db.path.parent} is not initialised; "
            f"run: pbft-node init --genesis FILE --datadir {db.path.parent}"
        )
    return load_genesis_bytes(source, available_engines(), origin="stored genesis")


def engine_contracts(genesis: Genesis) -> Sequence[SystemContract]:
    """The system contracts of the genesis's engine: what every node's VM and every replay
    of the chain executes."""
    return load_engine_class(genesis.engine).system_contracts(genesis.chain_id,
                                                              genesis.engine_params)


class HeadAccounts(AccountReader):
    """Account nonces and balances at the head, for the pool.

    A read from the state trie costs ~0.1 ms an account on the event loop, and the pool reads
    every sender on admission and again when its block commits; so each account read is kept
    (up to ACCOUNT_CACHE entries, least recently used out first), and a committed block
    updates exactly the accounts its execution changed (`ExecutedBlock.changed_accounts`),
    which leaves every other kept value true at the new head.
    """

    def __init__(self, blockchain: Blockchain, size: int = ACCOUNT_CACHE) -> None:
        self._blockchain = blockchain
        self._size = size
        self._state: StateAPI = blockchain.vm_at(blockchain.head()).state
        self._accounts: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # nonce, balance

    def advance(self, changed_accounts: Mapping[bytes, bytes]) -> None:
        """The head moved by one block that changed these accounts (address -> encoding)."""
        self._state = self._blockchain.vm_at(self._blockchain.head()).state
        for address, encoded in changed_accounts.items():
            if address in self._accounts:
                self._keep(address, _nonce_and_balance(encoded))

    def nonce(self, address: bytes) -> int:
        return self._account(address)[0]

    def balance(self, address: bytes) -> int:
        return self._account(address)[1]

    def _account(self, address: bytes) -> tuple[int, int]:
        account = self._accounts.get(address)
        if account is None:
            account = self._state.get_nonce(address), self._state.get_balance(address)
            self._keep(address, account)
        else:
            self._accounts.move_to_end(address)
        return account

    def _keep(self, address: bytes, account: tuple[int, int]) -> None:
        self._accounts[address] = account
        self._accounts.move_to_end(address)
        if len(self._accounts) > self._size:
            self._accounts.popitem(last=False)


def _nonce_and_balance(encoded: bytes) -> tuple[int, int]:
    if not encoded:
        return 0, 0  # deleted
    # py-evm's own encoding of an account it just wrote: decoded without building an
    # Account (a fifth of the cost, paid for every account every block changes)
    nonce, balance, _storage_root, _code_hash = rlp.decode(encoded)
    return int.from_bytes(nonce, "big"), int.from_bytes(balance, "big")


class _LoopTimer(TimerHandle):
    def __init__(self, handle: asyncio.TimerHandle) -> None:
        self._handle = handle

    def cancel(self) -> None:
        self._handle.cancel()


def _quiet_storage_failures(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A callback that failed on the database needs no traceback: the database reported it
    and the node is stopping. Anything else is logged as asyncio would."""
    if not isinstance(context.get("exception"), StorageFailure):
        loop.default_exception_handler(context)


class Node(RpcBackend):
    """One node process's state. `start()` and `stop()` run on its event loop."""

    def __init__(self, config: NodeConfig) -> None:
        ordered_trie.install()
        self.config = config
        self.rpc_server: RpcServer | None = None
        self.transport: Transport | None = None
        self.metrics_server: MetricsServer | None = None
        self.db = open_database(config.datadir)
        try:
            self._assemble()
        except Exception:
            self.db.close()  # a node that cannot start leaves its data directory free
            raise

    def _assemble(self) -> None:
        config = self.config
        # the transport's identity: the validator key, else (peers set) the datadir's nodekey
        self.node_key = config.validator_key
        if self.node_key is None and (config.peers or config.observers):
            self.node_key = load_node_key(config.datadir)
        self.genesis = load_datadir_genesis(self.db)
        self.blockchain = Blockchain(self.db, self.genesis, engine_contracts(self.genesis))
        self.chain_id = self.genesis.chain_id
        self.accounts = HeadAccounts(self.blockchain)
        self.pool = TxPool(self.chain_id, self.accounts, self.genesis.gas_limit, config.pool_limits)
        self._next_base_fee: int | None = None  # for the block after the head; None: unknown
        # Candidate transactions waiting for admission, bounded like the pool itself.
        self._gossip = GossipBacklog(config.pool_limits)
        self._gossip_waiting = asyncio.Event()
        self._gossip_task: asyncio.Task[None] | None = None
        self._eviction_task: asyncio.Task[None] | None = None
        self._collector = CycleCollector()
        self.tx_builder = self.blockchain.vm_at(self.blockchain.head()).get_transaction_builder()
        self.head_listeners: list[Callable[[CommittedBlock], None]] = []
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="block-exec")
        self.metrics = NodeMetrics()
        self.metrics.head_block.set(self.blockchain.head().block_number)
        self.metrics.pool_size.set_function(lambda: len(self.pool))
        self.metrics.gossip_backlog.set_function(lambda: len(self._gossip))
        self.metrics.gossip_backlog_bytes.set_function(lambda: self._gossip.size_bytes)
        self.metrics.pool_queued.set_function(self.pool.queued_count)
        self.metrics.peers.set_function(self.dialed_peer_count)
        self.metrics.executable.set_function(lambda: self.executable_count(EXECUTABLE_COUNTED))
        self.metrics.registry.register(CallbackCollector(self._transport_metrics))
        self.metrics.registry.register(CallbackCollector(self._pool_metrics))
        self.context = NodeContext(self)
        engine_class = load_engine_class(self.genesis.engine)
        self.engine: ConsensusEngine = engine_class(self.context, self.genesis.engine_params)

    async def start(self) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        self.failed: asyncio.Future[StorageFailure] = loop.create_future()
        self.db.on_failure = lambda error: loop.call_soon_threadsafe(self._fail, error)
        loop.set_exception_handler(_quiet_storage_failures)
        if self.node_key is not None and (config.peers or config.observers):
            self.transport = Transport(
                self.node_key,
                self.chain_id,
                config.peers,
                config.p2p_addr,
                config.p2p_port,
                self._on_peer_message,
                observers=config.observers,
            )
            await self.transport.start()
        if self.config.http_enabled:
            self.rpc_server = RpcServer(self)
            await self.rpc_server.start()
        if config.metrics_port is not None:
            self.metrics_server = MetricsServer(self.metrics, config.metrics_addr,
                                                config.metrics_port)
            await self.metrics_server.start()
        self._gossip_task = loop.create_task(self._admit_gossip(), name="gossip admission")
        self._eviction_task = loop.create_task(self._evict_expired(), name="pool eviction")
        await self.engine.start()
        self._collector.start()
        if config.validator_key is not None and self.engine.status().get("role") == "observer":
            log.warning("the key %s is not in the validator set: running as an observer",
                        config.validator_key.public_key.to_checksum_address())
        head = self.blockchain.head()
        log.info("node started: chain id %d, head #%d", self.chain_id, head.block_number)

    def _fail(self, error: StorageFailure) -> None:
        """A write or read failed: later ones may too, so the node stops (`failed` is done)."""
        if not self.failed.done():
            log.error("the database failed; stopping the node")
            self.failed.set_result(error)

    async def stop(self) -> None:
        tasks = [t for t in (self._gossip_task, self._eviction_task) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._collector.stop()
        await self.engine.stop()
        if self.transport is not None:
            await self.transport.stop()
        if self.rpc_server is not None:
            await self.rpc_server.stop()
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        self._executor.shutdown(wait=True)
        self.db.close()
        log.info("node stopped; database closed")

    async def run_in_executor(self, function: Callable[[], T]) -> T:
        """Block execution and commits: one worker thread, so the loop keeps serving."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, function)

    # Transactions.

    def submit_raw_transaction(self, raw: bytes) -> bytes:
        """Admit a raw transaction to the pool (TxPoolError if refused); returns its hash."""
        entry = self._admit(self._decode(raw))
        if self.transport is not None:
            self.transport.broadcast(Channel.TX_GOSSIP, raw)
        self.report_ready()
        return entry.tx.hash

    def _decode(self, raw: bytes, *, gossiped: bool = False) -> Candidate:
        """Bounded in bytes and RLP items before decoding; checked alone (geth's order of
        messages), then its sender recovered."""
        tx = decode_raw_transaction(self.tx_builder, raw,
                                    self.config.pool_limits.max_transaction_size)
        self.pool.check_static(tx)
        return Candidate(tx, recover_sender(tx), len(raw), gossiped)

    def _admit(self, item: Candidate) -> PoolEntry:
        """Admit a transaction after its sender's lower nonces waiting in the gossip backlog:
        a gap that gossip already brought here is filled before the transaction is judged
        (a load balancer sends one account's consecutive nonces to different validators).
        At most GOSSIP_SLICE of them on this call (a client's): the rest are admitted by
        the backlog's own slices, and this one waits queued meanwhile."""
        self._gossip.discard(item.tx.hash)
        for earlier in self._gossip.take_before(item.sender, item.tx.nonce, GOSSIP_SLICE):
            self._admit_gossiped(earlier)
        return self.pool.add(item.tx, item.size, base_fee=self.next_base_fee(),
                             gossiped=item.gossiped)

    def _on_peer_message(self, sender: bytes, channel: int, payload: bytes) -> None:
        if channel == Channel.ENGINE:
            self.engine.on_message(sender, payload)
        elif channel == Channel.TX_GOSSIP:
            self.engine.on_gossip(sender, partial(self._queue_gossip, payload,
                                                  self.engine.is_validator(sender)))
        elif channel == Channel.BLOCK_SYNC:
            self.engine.on_sync_message(sender, payload)

    def _queue_gossip(self, raw: bytes, from_validator: bool) -> None:
        """A transaction another validator accepted, or an observer forwards for its client
        (then counted as a client's here: no validator holds it yet); every validator gets
        it from its origin, so it is not forwarded again. Decoded here (bounded before
        decoding, like a client's), so the backlog knows its sender; admitted later, a slice
        at a time (GOSSIP_SLICE)."""
        try:
            item = self._decode(raw, gossiped=from_validator)
        except TxPoolError as exc:
            self.metrics.gossip_refused.inc()
            log.debug("gossiped transaction refused: %s", exc.message)
            return
        except Exception:  # a decoder's bug must not stop the peer's link (counted, quiet)
            self.metrics.gossip_refused.inc()
            log.debug("gossiped transaction could not be decoded", exc_info=True)
            return
        if item.tx.hash in self.pool or item.tx.hash in self._gossip:
            return  # from its origin and relayed to the primary by another validator
        if not self._gossip.push(item):
            self.metrics.gossip_dropped.inc()
            return
        self._gossip_waiting.set()

    async def _admit_gossip(self) -> None:
        while True:
            await self._gossip_waiting.wait()
            for _ in range(GOSSIP_SLICE):  # one admission each (`GossipBacklog.pop`)
                if not self._gossip:
                    break
                self._admit_gossiped(self._gossip.pop())
            self.report_ready()
            if self._gossip:
                await asyncio.sleep(0)  # let consensus messages and block results through
            else:
                self._gossip_waiting.clear()

    def _admit_gossiped(self, item: Candidate) -> None:
        try:
            self._admit(item)
        except TxPoolError as exc:
            self.metrics.gossip_refused.inc()
            log.debug("gossiped transaction refused: %s", exc.message)
        except Exception:  # a bug here must not stop admitting the gossip that follows
            log.exception("gossiped transaction could not be admitted")

    async def _evict_expired(self) -> None:
        """geth's lifetime: queued transactions of senders inactive for the pool's lifetime
        are dropped, and what the pool dropped since the last sweep is logged in one line."""
        reported = dict(self.pool.dropped)
        while True:
            await asyncio.sleep(EVICTION_INTERVAL)
            self.pool.evict_expired()
            dropped = {reason: n - reported.get(reason, 0)
                       for reason, n in self.pool.dropped.items() if n > reported.get(reason, 0)}
            if dropped:
                log.info("txpool dropped queued transactions (behind a nonce gap): %s",
                         ", ".join(f"{n} {reason}" for reason, n in sorted(dropped.items())))
                reported = dict(self.pool.dropped)
                self.report_ready()

    def report_ready(self) -> None:
        """Tell the engine which pool transactions became executable at the head and which
        stopped being executable, so it waits only for what a block could include."""
        changes = self.pool.ready_changes(self.next_base_fee())
        if changes.unready:
            self.engine.on_transactions_dropped(list(changes.unready))
        if changes.ready:
            self.engine.on_transactions(list(changes.ready))

    def next_base_fee(self) -> int:
        if self._next_base_fee is None:
            view = self.blockchain.view()
            head = view.get_canonical_head()
            self._next_base_fee = view.create_header_from_parent(head).base_fee_per_gas
        return self._next_base_fee

    def nonces_after(self, parent: ExecutedBlock | None) -> dict[bytes, int]:
        """The nonces of the pool's senders after `parent` and its uncommitted ancestors,
        where those blocks changed them (the head's are read as usual)."""
        uncommitted: list[ExecutedBlock] = []
        head = self.blockchain.head().block_number
        while parent is not None and parent.number > head:
            uncommitted.append(parent)
            parent = parent.parent
        nonces: dict[bytes, int] = {}
        for block in reversed(uncommitted):
            for address, encoded in block.changed_accounts.items():
                if self.pool.holds_sender(address):
                    nonces[address] = _nonce_and_balance(encoded)[0]
        return nonces

    def executable_count(self, limit: int) -> int:
        """Pool transactions the next block could include now, counted up to `limit`."""
        return len(self.pool.executable(base_fee=self.next_base_fee(),
                                        gas_limit=self.genesis.gas_limit, max_count=limit))

    def peer_count(self) -> int:
        return len(self.transport.connected_peers()) if self.transport else 0

    def dialed_peer_count(self) -> int:
        """Connected peers but the observers that dialed in (a validator's: validators)."""
        transport = self.transport
        if transport is None:
            return 0
        return len(transport.connected_peers()) - len(transport.connected_observers())

    def _pool_metrics(self) -> list[Metric]:
        return [labelled_counter(
            "txpool_dropped", "Queued transactions the pool dropped, by reason",
            ["reason"], {(r,): self.pool.dropped[r] for r in DROP_REASONS})]

    def _transport_metrics(self) -> list[Metric]:
        if self.transport is None:
            return []
        stats: dict[str, Any] = self.transport.stats()
        frames = {("in", channel): n for channel, n in stats["frames_in"].items()}
        frames.update({("out", channel): n for channel, n in stats["frames_out"].items()})
        return [
            labelled_counter("p2p_frames", "Frames by direction and channel",
                             ["direction", "channel"], frames),
            labelled_counter("p2p_dropped_frames", "Frames dropped by the transport, by reason",
                             ["reason"], {(r,): n for r, n in stats["dropped"].items()}),
            labelled_counter("p2p_handshakes_refused", "Refused handshakes, by reason",
                             ["reason"],
                             {(r,): n for r, n in stats["handshakes_refused"].items()}),
        ]

    def sync_status(self) -> dict[str, str] | None:
        return None  # a node follows its engine; catching up is reported by pbft_status

    # What its JSON-RPC uses besides (RpcBackend).

    def rpc_settings(self) -> RpcSettings:
        config = self.config
        return RpcSettings(config.http_addr, config.http_port, config.host_allowlist,
                           config.cors_origins, config.rpc_limits, config.rpc_gas_cap)

    def add_head_listener(self, listener: Callable[[CommittedBlock], None]) -> None:
        self.head_listeners.append(listener)

    def engine_rpc_methods(self) -> dict[str, RpcHandler]:
        return self.engine.rpc_methods()

    # Blocks.

    def on_committed(self, executed: ExecutedBlock) -> None:
        transactions = executed.block.transactions
        self.pool.remove(executed.tx_hashes, committed=True)
        self.accounts.advance(executed.changed_accounts)
        self._next_base_fee = None
        self.pool.prune(tx.sender for tx in transactions)
        self.report_ready()
        self.metrics.head_block.set(executed.number)
        self.metrics.transactions_committed.inc(len(executed.tx_hashes))
        committed = CommittedBlock(executed.block.header, executed.records)
        for listener in list(self.head_listeners):
            try:
                listener(committed)
            except Exception:
                log.exception("head listener failed")
        log.info(
            "committed block #%d %s with %d transactions",
            executed.number,
            executed.hash.hex()[:12],
            len(transactions),
        )


class NodeContext(EngineContext):
    """The node as its engine sees it."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self.chain_id = node.chain_id
        self.database = node.db
        self.validator_key = node.node_key
        self.datadir = node.config.datadir
        self.fresh_validator = node.config.fresh_validator
        self.dialed_peers = frozenset(node.config.peers)
        self.metrics = node.metrics.registry

    def head(self) -> BlockHeaderAPI:
        return self._node.blockchain.head()

    def pending_count(self) -> int:
        return self._node.executable_count(1)

    async def build_block(
        self, *, coinbase: bytes, extra_data: bytes = b"", time_budget: float | None = None,
        parent: ExecutedBlock | None = None,
    ) -> ExecutedBlock:
        node = self._node
        transactions = node.pool.executable(
            base_fee=(node.next_base_fee() if parent is None
                      else node.blockchain.next_base_fee(parent.block.header)),
            gas_limit=node.genesis.gas_limit,
            max_count=node.config.max_block_transactions,
            nonces=node.nonces_after(parent),
        )
        def build() -> tuple[ExecutedBlock, tuple[Any, ...]]:
            with node.metrics.timing("build"):
                return node.blockchain.build_block(
                    transactions, timestamp=int(time.time()), coinbase=coinbase,
                    extra_data=extra_data, time_budget=time_budget, parent=parent)

        executed, left_out = await node.run_in_executor(build)
        if left_out and parent is None:  # on uncommitted blocks they may yet be valid
            log.warning("dropped %d transactions that failed at execution", len(left_out))
            node.pool.remove(tx.hash for tx in left_out)
            node.report_ready()
        return executed

    async def validate_block(self, data: bytes, parent: ExecutedBlock | None = None
                             ) -> ExecutedBlock:
        node = self._node

        def validate() -> ExecutedBlock:
            with node.metrics.timing("validate"):
                return node.blockchain.validate_encoded(data, parent)

        return await node.run_in_executor(validate)

    async def commit_block(
        self, executed: ExecutedBlock, extra_writes: Callable[[WriteBatch], None] | None = None
    ) -> None:
        node = self._node

        def write() -> None:
            with node.db.batch(sync=True) as batch:
                node.blockchain.commit(executed, batch)
                if extra_writes is not None:
                    extra_writes(batch)

        await node.run_in_executor(write)
        node.on_committed(executed)

    async def commit_blocks(
        self, blocks: Sequence[tuple[ExecutedBlock, Callable[[WriteBatch], None]]]
    ) -> None:
        node = self._node

        def write() -> None:
            with node.db.batch(sync=True) as batch:
                node.blockchain.commit_chain([executed for executed, _ in blocks], batch)
                for _, extra_writes in blocks:
                    extra_writes(batch)

        await node.run_in_executor(write)
        for executed, _ in blocks:
            node.on_committed(executed)

    def keyspace(self, prefix: bytes) -> Keyspace:
        return self._node.db.keyspace(b"engine/" + prefix)

    def _read_blocks(self, numbers: Iterable[int]) -> list[bytes]:
        blockchain = self._node.blockchain
        blocks = []
        for number in numbers:
            header = blockchain.header_by_number(number)
            if header is None:
                break
            blocks.append(encode_block(header, blockchain.read_store.records(number)))
        return blocks

    async def canonical_blocks(self, first: int, count: int) -> list[bytes]:
        """The engine's own reads (a committed block's reply to its CommitBlock): on a
        thread of their own, never behind a peer's or a client's work."""
        return await asyncio.to_thread(self._read_blocks, range(first, first + count))

    async def peer_blocks(self, first: int, count: int) -> list[bytes]:
        """Read and encoded on the block-sync read worker, a unit of the client-work
        governor's (`served.GOVERNOR`: turns handed on between blocks, rests while the loop
        is late), not behind block execution. A worker with `MAX_PENDING_SYNC_READS`
        already waiting answers as a node without those blocks: the asker tries another."""
        try:
            return await SYNC_READS.run(self._read_blocks, paced(range(first, first + count)))
        except RpcError:  # busy
            return []

    def send(self, peer: bytes, payload: bytes) -> None:
        self._send(peer, Channel.ENGINE, payload)

    def broadcast(self, payload: bytes) -> None:
        if self._node.transport is not None:
            self._node.transport.broadcast(Channel.ENGINE, payload)

    def send_sync(self, peer: bytes, payload: bytes) -> None:
        self._send(peer, Channel.BLOCK_SYNC, payload)

    def relay_transactions(self, peer: bytes, tx_hashes: Sequence[bytes]) -> None:
        for tx_hash in tx_hashes:
            entry = self._node.pool.get(tx_hash)
            if entry is not None:
                self._send(peer, Channel.TX_GOSSIP, entry.tx.encode())

    def _send(self, peer: bytes, channel: Channel, payload: bytes) -> None:
        if self._node.transport is not None:
            self._node.transport.send(peer, channel, payload)

    def peers(self) -> frozenset[bytes]:
        transport = self._node.transport
        return frozenset(transport.connected_peers()) if transport is not None else frozenset()

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return _LoopTimer(asyncio.get_running_loop().call_later(delay, callback))

    def canonical_header(self, number: int) -> BlockHeaderAPI | None:
        return self._node.blockchain.header_by_number(number)

    def canonical_header_by_hash(self, block_hash: bytes) -> BlockHeaderAPI | None:
        return self._node.blockchain.header_by_hash(block_hash)

    def system_storage(self, block_hash: bytes, address: bytes) -> ContractStorage | None:
        blockchain = self._node.blockchain
        header = blockchain.header_by_hash(block_hash)
        return None if header is None else blockchain.system_storage(header, address)

    def submit_transaction(self, raw: bytes) -> bytes:
        return self._node.submit_raw_transaction(raw)

    def pending_nonce(self, address: bytes) -> int:
        return self._node.pool.pending_nonce(address)

    def fee_floor(self) -> int:
        return max(self._node.next_base_fee(), self._node.pool.limits.price_limit)
