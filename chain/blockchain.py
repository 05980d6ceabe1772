"""The Ethereum side of a node: py-evm's chain on LevelDB.

Blocks are executed on an `OverlayDB` (reads through to LevelDB, keeps writes in memory), so
a block that is built or validated but never committed leaves nothing on disk; committing it
writes the overlay in one LevelDB batch, together with whatever the engine adds (its commit
certificate), so a crash leaves either both or neither.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import rlp
from eth.abc import (
    BlockAndMetaWitness,
    BlockAPI,
    BlockHeaderAPI,
    BlockPersistResult,
    ReceiptAPI,
    SignedTransactionAPI,
    VirtualMachineAPI,
    WithdrawalAPI,
)
from eth.chains.base import Chain
from eth.db import trie as py_evm_trie
from eth.db.account import AccountDB
from eth.db.diff import DBDiff
from eth.db.witness import MetaWitness
from eth.exceptions import BlockNotFound, HeaderNotFound
from eth.validation import validate_canonical_address, validate_uint64, validate_uint256
from eth.vm.forks import PragueVM
from eth.vm.forks.berlin.transactions import TypedTransaction
from eth.vm.forks.prague.blocks import PragueBlock
from eth.vm.forks.prague.state import PragueState
from eth.vm.forks.prague.transactions import (
    PragueLegacyTransaction,
    PragueTransactionBuilder,
    PragueTypedTransaction,
)
from eth_typing import Address
from eth_utils import ValidationError, keccak
from lru import LRU
from rlp.sedes import CountableList
from rlp.sedes.serializable import merge_args_to_kwargs
from trie import HexaryTrie
from trie.constants import BLANK_NODE_HASH

from chain import ordered_trie, system_contracts
from chain.errors import BlockValidationError, ChainError, FalseBodyError, StaleParentError
from chain.genesis import Genesis
from chain.read_store import ReadStore, TxRecord, block_records
from encoding.rlp import check_rlp_bounds
from storage import Database, Keyspace, KeyspaceDB, OverlayDB, StorageError, WriteBatch

log = logging.getLogger(__name__)

CHAIN_PREFIX = b"chain/"  # py-evm's chain database: headers, bodies, receipts, state trie
META_PREFIX = b"meta/"  # node metadata: the genesis file the data directory was made from
GENESIS_KEY = b"genesis"
MAX_BLOCK_DEPTH = 8  # block > uncles > header (RlpTooDeep is a ValueError)
# Items in one list of a block: pyrlp's decoding of a list grows with the square of its
# length (2,000,000 one-byte items: 177 s), and no block that gas allows comes near this
# (30M gas: ~1,430 transfers, ~16,000 access-list storage keys at 1,900 gas each).
MAX_BLOCK_LIST_ITEMS = 1 << 17
BUILD_CHUNK = 16  # transactions applied between looks at a block's time budget (~25 ms)
# Of a build's time budget, the share for applying transactions: sealing (the transaction
# and receipt tries, the state root, writing the block) took 1.3 x the applying here
# (336 transfers: applied in 0.10 s, sealed in 0.13 s).
APPLY_SHARE = 0.4


HEADER_CACHE = 4_096  # decoded headers kept, by number (~50 us to decode one)
SENDER_MEMO_SIZE = 1 << 15  # more than the pool holds, so a pooled transaction stays memoized


def block_hash_of(data: bytes) -> bytes | None:
    """The hash an encoded block claims: keccak of its header's encoding, found without
    decoding the transactions (None for bytes that are no list starting with a header).
    Its body is bound to that header by the roots that execution checks."""
    try:
        _, outer_type, outer_length, start = rlp.codec.consume_length_prefix(data, 0)
        _, header_type, header_length, header_start = rlp.codec.consume_length_prefix(
            data, start)
    except (rlp.DecodingError, IndexError):
        return None
    end = header_start + header_length
    if outer_type is not list or header_type is not list or start + outer_length != len(data):
        return None
    return keccak(data[start:end]) if end <= len(data) else None

# An encoded block: [header, transactions, uncles, withdrawals]; the header's fields that
# commit to the body.
UNCLES_HASH_FIELD, TRANSACTIONS_ROOT_FIELD, WITHDRAWALS_ROOT_FIELD = 1, 4, 16
LIST_PREFIX = b"\xc0"  # an RLP list's encoding starts at or above it; a typed one below 0x80


def check_block_bounds(data: bytes) -> None:
    """RlpTooDeep or RlpTooManyItems (ValueErrors) unless an encoded block's lists are within
    what pyrlp decodes in bounded time (one walk, before the decoder)."""
    check_rlp_bounds(data, max_depth=MAX_BLOCK_DEPTH, max_items=len(data),
                     max_list_items=MAX_BLOCK_LIST_ITEMS)


def check_typed_transaction_bounds(block: object) -> None:
    """A typed transaction is one string in its block (its type, then its RLP), so the
    block's walk never reached its lists, and py-evm's pyrlp decodes them (a proposal's
    600,000-item access list: 4.7 s of the executor; the attack review s12 final, finding 2):
    each is walked alike first. `block`: the block as pyrlp decodes it untyped (bounded)."""
    transactions = block[1] if isinstance(block, list) and len(block) > 1 else ()
    for transaction in transactions if isinstance(transactions, list) else ():
        if isinstance(transaction, bytes) and transaction[:1] < b"\x80":
            check_rlp_bounds(transaction[1:], max_depth=MAX_BLOCK_DEPTH,
                             max_items=len(transaction), max_list_items=MAX_BLOCK_LIST_ITEMS)


def check_body_matches_header(data: bytes) -> None:
    """FalseBodyError unless the body of the encoded block is the one its header commits to
    (transaction and withdrawal roots, uncles hash). Checked on the raw RLP before py-evm
    decodes a transaction: whoever signed the header (by its hash) is then answerable for
    every byte of the block, and a copy with a false body is told apart from a bad block.
    A header too short to hold the roots is its signer's fault (BlockValidationError)."""
    try:
        check_block_bounds(data)
        header, transactions, uncles, withdrawals = rlp.decode(data)
        if not all(isinstance(x, list) for x in (header, transactions, uncles, withdrawals)):
            raise ValueError("a block is four lists")
        body = (
            keccak(rlp.encode(uncles)),
            ordered_trie.ordered_trie_root_and_nodes(
                [tx if isinstance(tx, bytes) else rlp.encode(tx) for tx in transactions])[0],
            ordered_trie.ordered_trie_root_and_nodes(
                [rlp.encode(withdrawal) for withdrawal in withdrawals])[0],
        )
    except (rlp.DecodingError, ValueError) as exc:
        raise FalseBodyError(f"undecodable block: {exc}") from None
    if any(isinstance(tx, bytes) and tx[:1] >= LIST_PREFIX for tx in transactions):
        # A legacy transaction is a list; the same bytes sent as a string are the same trie
        # leaf, so they pass the root and fail to decode: a copy anyone could have made.
        raise FalseBodyError("a transaction's list sent as a string")
    if len(header) <= WITHDRAWALS_ROOT_FIELD:
        raise BlockValidationError(f"a header of {len(header)} fields")
    if body != (header[UNCLES_HASH_FIELD], header[TRANSACTIONS_ROOT_FIELD],
                header[WITHDRAWALS_ROOT_FIELD]):
        raise FalseBodyError("the block's body does not match the roots in its header")


@dataclass(frozen=True)
class CommittedBlock:
    """What a consensus engine reads back of a canonical block."""

    hash: bytes
    state_root: bytes
    tx_hashes: tuple[bytes, ...]


STATE_ROOT_FIELD = 3


def committed_block(data: bytes) -> CommittedBlock:
    """Hash, state root and transaction hashes of an encoded block from our own chain."""
    header, transactions = rlp.decode(data)[:2]
    return CommittedBlock(
        keccak(rlp.encode(header)), header[STATE_ROOT_FIELD],
        tuple(keccak(tx if isinstance(tx, bytes) else rlp.encode(tx)) for tx in transactions))


class _SenderMemo:
    """Transaction senders by transaction hash, for this process.

    py-evm recovers the sender (an ECDSA public-key recovery, ~55 us) on every `tx.sender`,
    and a transaction's sender is read when the pool admits it, when the block is executed
    (built or imported) and when the pool is pruned. The hash commits to every signed field,
    so a sender recovered once stands for every decoding of the same bytes: a replica that
    pooled a gossiped transaction does not recover it again when the block arrives.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._senders: OrderedDict[bytes, Address] = OrderedDict()

    def sender(self, tx_hash: bytes, recover: Callable[[], Address]) -> Address:
        sender = self._senders.get(tx_hash)
        if sender is None:
            sender = recover()
            if len(self._senders) >= self._size:
                self._senders.popitem(last=False)  # atomic: the pool and the block thread share it
            self._senders[tx_hash] = sender
        return sender


SENDERS = _SenderMemo(SENDER_MEMO_SIZE)


class ChainLegacyTransaction(PragueLegacyTransaction):
    def get_sender(self) -> Address:
        return SENDERS.sender(self.hash, super().get_sender)


class ChainTypedTransaction(PragueTypedTransaction):
    def get_sender(self) -> Address:
        return SENDERS.sender(self.hash, super().get_sender)


class ChainTransactionBuilder(PragueTransactionBuilder):
    """Prague's transaction types, decoded into the classes that memoize their sender."""

    legacy_signed = ChainLegacyTransaction
    typed_transaction = ChainTypedTransaction

    @classmethod
    def serialize(cls, obj: SignedTransactionAPI) -> rlp.sedes.raw.DecodedZeroOrOneLayerRLP:
        # Any fork's typed transaction encodes the same way (signing returns London's class).
        if isinstance(obj, TypedTransaction):
            return cls.typed_transaction.serialize(obj)
        return cls.legacy_signed.serialize(obj)


def _shallow_copy(item: Any, **changes: Any) -> Any:
    """An RLP object with some fields changed, sharing the others. pyrlp's `copy` deep-copies
    every field it keeps, though RLP objects are immutable: py-evm copies a block three times
    as it seals it, every transaction of it each time, and an account for every balance or
    nonce it sets (together 10% of a validator's CPU in a burst of transfers)."""
    return type(item)(**{**item.as_dict(), **changes})


class ChainBlock(PragueBlock):
    transaction_builder = ChainTransactionBuilder
    fields = [
        (name, CountableList(ChainTransactionBuilder) if name == "transactions" else sedes)
        for name, sedes in PragueBlock._meta.fields
    ]

    def copy(self, *args: Any, **kwargs: Any) -> ChainBlock:
        return _shallow_copy(self, **merge_args_to_kwargs(args, kwargs, self._meta.field_names,
                                                          allow_missing=True))


class BlockWitness(MetaWitness):
    """py-evm's witness of a block's execution, with the accounts the block changed (from its
    state) and its receipts (from its VM, `ChainVM.finalize_block`)."""

    def __init__(self, hashes: Any, queried: Any, changed_accounts: dict[bytes, bytes]) -> None:
        super().__init__(hashes, queried)
        self.changed_accounts = changed_accounts
        self.receipts: tuple[ReceiptAPI, ...] = ()


STATE_TRIE_NODES = 16_384  # decoded state-trie nodes kept by hash (~1.5 kB a branch node)


class NodeCachingTrie(HexaryTrie):  # type: ignore[misc]
    """The state trie, with its decoded nodes kept by hash across blocks.

    py-evm starts every block's state on a fresh trie and walks it from the root for every
    account a transaction touches, then again to write it back: each node a LevelDB read and
    an RLP decode, 12% of a validator's CPU in a burst of transfers. A node's hash is its
    content, so a node decoded once serves every later block for as long as it is kept. The
    trie changes the nodes it reads in place, so each read gets its own copy.
    """

    def get_node(self, node_hash: Any) -> Any:
        if not isinstance(node_hash, bytes) or len(node_hash) != len(BLANK_NODE_HASH):
            return super().get_node(node_hash)  # an embedded node
        node = _TRIE_NODES.get(node_hash)
        if node is None:
            node = super().get_node(node_hash)
            if isinstance(node, list):  # not the blank node
                _TRIE_NODES[node_hash] = _copy_node(node)
            return node
        return _copy_node(node)


_TRIE_NODES: LRU = LRU(STATE_TRIE_NODES)  # every state trie of this process (content-keyed)


def _copy_node(node: Any) -> Any:
    return [_copy_node(item) if isinstance(item, list) else item for item in node]


class ChainAccountDB(AccountDB):
    """py-evm's account database, remembering the accounts a block changes.

    Every account write reaches the state trie through the account diff that
    `make_state_root` applies; its pending items are the changed accounts' new encodings (a
    deleted account: b""). `persist` hands them out with the witness, so whoever keeps
    account values at the head (the pool's `HeadAccounts`) updates exactly those, instead of
    reading every account again from the trie after each block (~0.1 ms an account).
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        trie = self._trie._db  # the HexaryTrie under py-evm's keccak-keyed HashTrie
        self._trie._db = NodeCachingTrie(trie.db, trie.root_hash, prune=True)
        self._changed_accounts: dict[bytes, bytes] = {}

    def set_balance(self, address: Address, balance: int) -> None:
        validate_canonical_address(address, title="Storage Address")
        validate_uint256(balance, title="Account Balance")
        self._set_account(address, _shallow_copy(self._get_account(address), balance=balance))

    def set_nonce(self, address: Address, nonce: int) -> None:
        validate_canonical_address(address, title="Storage Address")
        validate_uint64(nonce, title="Nonce")  # up to 2**64 - 1, as py-evm allows
        self._set_account(address, _shallow_copy(self._get_account(address), nonce=nonce))

    def _apply_account_diff_without_proof(self, diff: DBDiff, trie: object) -> None:
        self._changed_accounts.update(diff.pending_items())
        self._changed_accounts.update(dict.fromkeys(diff.deleted_keys(), b""))
        super()._apply_account_diff_without_proof(diff, trie)  # type: ignore[arg-type]

    def _get_meta_witness(self) -> MetaWitness:
        changed, self._changed_accounts = self._changed_accounts, {}
        return BlockWitness(self._get_accessed_node_hashes(), self._get_access_list(), changed)


class ChainState(PragueState):
    account_db_class = ChainAccountDB


def block_witness(witness: object) -> BlockWitness:
    assert isinstance(witness, BlockWitness), "executed by ChainVM"
    return witness


class _BlockWithReceipts:
    """A block as py-evm's deposit-request scan reads it (its requests and its receipts),
    with the receipts its execution just made: py-evm reads them back from the database."""

    def __init__(self, block: BlockAPI, receipts: tuple[ReceiptAPI, ...]) -> None:
        self.block_requests = block.block_requests  # type: ignore[attr-defined]
        self._receipts = receipts

    def get_receipts(self, chaindb: object) -> tuple[ReceiptAPI, ...]:
        return self._receipts


class ChainVM(PragueVM):
    """Prague with one relaxation: a block's timestamp may equal its parent's.

    PBFT commits many blocks per second; with Ethereum's strictly increasing one-second
    timestamps the chain's clock would run ahead of real time under load (IBFT and QBFT avoid
    this with a block period of at least a second, which is what we do not want to pay).
    Its block class decodes transactions into ones that memoize their sender (`_SenderMemo`);
    its witness of a block (`BlockWitness`) holds the accounts the block changed
    (`ChainAccountDB`) and its receipts, which py-evm would otherwise read back from the
    database and decode twice per imported block (once for Prague's deposit requests, once
    for the caller): imports cost 1.19 x a build with the read-backs, 1.0x without.
    """

    block_class = ChainBlock
    _state_class = ChainState
    _block_receipts: tuple[ReceiptAPI, ...] = ()

    def set_block_transactions_and_withdrawals(
        self,
        base_block: BlockAPI,
        new_header: BlockHeaderAPI,
        transactions: Sequence[SignedTransactionAPI],
        receipts: Sequence[ReceiptAPI],
        withdrawals: Sequence[WithdrawalAPI] | None = None,
    ) -> BlockAPI:
        self._block_receipts = tuple(receipts)
        return super().set_block_transactions_and_withdrawals(
            base_block, new_header, transactions, receipts, withdrawals)  # type: ignore[arg-type]

    def process_deposit_request_data(self, block: BlockAPI) -> None:
        super().process_deposit_request_data(
            _BlockWithReceipts(block, self._block_receipts))  # type: ignore[arg-type]

    def finalize_block(self, block: BlockAPI) -> BlockAndMetaWitness:
        finalized = super().finalize_block(block)
        block_witness(finalized.meta_witness).receipts = self._block_receipts
        return finalized

    @classmethod
    def validate_header(cls, header: BlockHeaderAPI, parent_header: BlockHeaderAPI) -> None:
        if parent_header is not None and header.timestamp == parent_header.timestamp:
            parent_header = parent_header.copy(timestamp=parent_header.timestamp - 1)
        super().validate_header(header, parent_header)


def _forget_block_tries() -> None:
    """Drop py-evm's memo of transaction and receipt tries once a block is executed.

    py-evm memoizes its last 128 `make_trie_root_and_nodes` inputs and results (each full
    block's encoded transactions and receipts and their trie nodes, ~1 MB), which only pays
    off within one block's execution; kept, they grow a node's memory by ~70 MB over its
    first ~64 full blocks.
    """
    py_evm_trie._make_trie_root_and_nodes.cache_clear()


class NodeChain(Chain):
    """py-evm's Chain without one waste: having persisted a block, py-evm decodes that same
    block back from the database (every transaction) to report it as the new canonical one,
    and keeps it in an LRU cache; a block built or imported here is reported as it is."""

    def persist_block(
        self, block: BlockAPI, perform_validation: bool = True
    ) -> BlockPersistResult:
        if perform_validation:
            self.validate_block(block)
        new_hashes, old_hashes = self.chaindb.persist_block(block)
        return BlockPersistResult(
            imported_block=block,
            new_canonical_blocks=tuple(
                block if h == block.hash else self.get_block_by_hash(h) for h in new_hashes
            ),
            old_canonical_blocks=tuple(self.get_block_by_hash(h) for h in old_hashes),
        )


def chain_class(chain_id: int,
                contracts: Sequence[system_contracts.SystemContract] = ()) -> type[Chain]:
    """The chain's py-evm class; its VM runs `contracts` as precompiles with storage
    (`chain.system_contracts`)."""
    vm: type[ChainVM] = ChainVM
    if contracts:
        computation = ChainState.computation_class
        state = ChainState.configure(
            __name__="SystemContractState",
            computation_class=computation.configure(
                __name__="SystemContractComputation",
                _precompiles={**computation.get_precompiles(),
                              **system_contracts.precompiles(contracts)}))
        vm = ChainVM.configure(__name__="SystemContractVM", _state_class=state)
    return NodeChain.configure(
        __name__="PbftChain", vm_configuration=((0, vm),), chain_id=chain_id
    )


@dataclass
class ExecutedBlock:
    """A block executed on an overlay: its writes are pending until `Blockchain.commit`."""

    block: BlockAPI
    receipts: tuple[ReceiptAPI, ...]
    overlay: OverlayDB
    # address -> its encoding after the block (b"": deleted), for every account it changed
    changed_accounts: Mapping[bytes, bytes]
    # The uncommitted block it was executed on (None: the head); cut when it is committed.
    parent: ExecutedBlock | None = None

    @property
    def hash(self) -> bytes:
        return self.block.hash

    @property
    def number(self) -> int:
        return self.block.number

    @property
    def state_root(self) -> bytes:
        return self.block.header.state_root

    @cached_property
    def tx_hashes(self) -> tuple[bytes, ...]:
        """Computed once: py-evm rehashes a legacy transaction on every `.hash`."""
        return tuple(tx.hash for tx in self.block.transactions)

    @cached_property
    def records(self) -> tuple[TxRecord, ...]:
        """Its transactions in the read store's form (computed once, at commit)."""
        return block_records(self.block, self.receipts)

    def encode(self) -> bytes:
        return rlp.encode(self.block)


class Blockchain:
    """A chain in one data directory's database, created from a genesis; its VM runs the
    engine's system contracts (`ConsensusEngine.system_contracts`)."""

    def __init__(self, db: Database, genesis: Genesis,
                 contracts: Sequence[system_contracts.SystemContract] = ()) -> None:
        self.db = db
        self.genesis = genesis
        self.chain_keyspace: Keyspace = db.keyspace(CHAIN_PREFIX)
        self.meta_keyspace: Keyspace = db.keyspace(META_PREFIX)
        self.contracts = tuple(contracts)  # what a process executing eth_call builds it from
        self.chain_class = chain_class(genesis.chain_id, contracts)
        # Headers and the transaction index read straight from LevelDB: building a chain
        # view (and its overlay) for each of these reads cost more than the read.
        self._chaindb = self.chain_class.get_chaindb_class()(KeyspaceDB(self.chain_keyspace))
        # Decoded canonical headers by number (a committed block is never replaced; a number
        # not committed yet raises, and exceptions are not cached).
        self._canonical_header = functools.lru_cache(maxsize=HEADER_CACHE)(
            self._chaindb.get_canonical_block_header_by_number)
        self.read_store = ReadStore(db)
        self._initialize()
        self._index_unread_blocks()

    def _initialize(self) -> None:
        stored = self.meta_keyspace.get(GENESIS_KEY)
        if stored is None:
            overlay = OverlayDB(self.chain_keyspace)
            self.chain_class.from_genesis(
                overlay, self.genesis.header_params(), self.genesis.state()
            )
            with self.db.batch(sync=True) as batch:
                overlay.write_into(batch)
                batch.put(self.meta_keyspace, GENESIS_KEY, self.genesis.source)
        elif stored != self.genesis.source:
            raise ChainError(
                f"data directory {self.db.path} was initialised with another genesis; "
                "use an empty --datadir for this genesis"
            )

    def _index_unread_blocks(self) -> None:
        """Write the read store's records of blocks committed before it existed (a data
        directory from an older version), one batch per block, as any block is written."""
        first = self.read_store.indexed_height() + 1
        head = self.head().block_number
        if first > head:
            return
        if head > 0:  # a new chain's genesis block is no news
            log.info("indexing blocks %d..%d for JSON-RPC reads (a data directory from an "
                     "earlier version)", first, head)
        for number in range(first, head + 1):
            header = self.header_by_number(number)
            assert header is not None  # canonical up to the head
            block = self.block_by_header(header)
            with self.db.batch(sync=False) as batch:
                self.read_store.write_block(
                    batch, header, block_records(block, self.receipts(header)))

    @staticmethod
    def stored_genesis(db: Database) -> bytes | None:
        return db.keyspace(META_PREFIX).get(GENESIS_KEY)

    @staticmethod
    def replace_genesis_source(db: Database, source: bytes) -> None:
        """The genesis document kept in the data directory, replaced (the same block 0: the
        caller checked)."""
        with db.batch(sync=True) as batch:
            batch.put(db.keyspace(META_PREFIX), GENESIS_KEY, source)

    # Reads. Each view is a chain over a fresh overlay: anything a read executes (eth_call)
    # writes only to memory.

    def view(self) -> Chain:
        return self.chain_class(OverlayDB(self.chain_keyspace))

    def head(self) -> BlockHeaderAPI:
        return self._chaindb.get_canonical_head()

    @property
    def genesis_hash(self) -> bytes:
        return self._chaindb.get_canonical_block_hash(0)

    def header_by_number(self, number: int) -> BlockHeaderAPI | None:
        try:
            return self._canonical_header(number)
        except HeaderNotFound:
            return None

    def header_by_hash(self, block_hash: bytes) -> BlockHeaderAPI | None:
        try:
            header = self._chaindb.get_block_header_by_hash(block_hash)
        except HeaderNotFound:
            return None
        canonical = self.header_by_number(header.block_number)
        return header if canonical is not None and canonical.hash == block_hash else None

    def block_by_header(self, header: BlockHeaderAPI) -> BlockAPI:
        try:
            return self.view().get_block_by_header(header)
        except BlockNotFound as exc:
            raise ChainError(f"block {header.block_number} body missing: {exc}") from None

    def vm_at(self, header: BlockHeaderAPI) -> VirtualMachineAPI:
        return self.view().get_vm(header)

    def system_storage(self, header: BlockHeaderAPI, address: bytes
                       ) -> system_contracts.ContractStorage:
        """The storage of the account at `address` in the state after block `header`,
        read-only."""
        return system_contracts.StateStorage(self.vm_at(header).state, address, writable=False)

    def receipts(self, header: BlockHeaderAPI) -> tuple[ReceiptAPI, ...]:
        view = self.view()
        receipt_class = view.get_vm(header).get_receipt_builder()
        return tuple(view.chaindb.get_receipts(header, receipt_class))

    def transaction_location(self, tx_hash: bytes) -> tuple[int, int] | None:
        """(block number, index) of a committed transaction, or None."""
        return self.read_store.location(tx_hash)

    # Writes.

    def build_block(
        self,
        transactions: Sequence[SignedTransactionAPI],
        *,
        timestamp: int,
        coinbase: bytes,
        extra_data: bytes = b"",
        time_budget: float | None = None,
        parent: ExecutedBlock | None = None,
    ) -> tuple[ExecutedBlock, tuple[SignedTransactionAPI, ...]]:
        """Execute `transactions` on the head (or on `parent`, executed and not committed), in
        order, and seal the block.

        With a `time_budget` (seconds) for the whole build, transactions are added in chunks
        only while applying them stays within its APPLY_SHARE (at least one chunk), because
        sealing the block costs about as much again; the rest wait for the next block.
        Returns the executed block and the transactions that were left out because they
        turned out invalid at execution (the pool checks them first, so this is rare).
        """
        deadline = (None if time_budget is None
                    else time.perf_counter() + time_budget * APPLY_SHARE)
        overlay = self._overlay_on(parent)
        chain = self.chain_class(overlay)
        parent_header = chain.get_canonical_head()
        header = chain.create_header_from_parent(
            parent_header,
            timestamp=max(timestamp, parent_header.timestamp),
            coinbase=coinbase,
            gas_limit=parent_header.gas_limit,
            extra_data=extra_data,
        )
        included = tuple(transactions)
        try:
            block, receipts, changed = self._execute_batch(chain, header, included, deadline)
            left_out: tuple[SignedTransactionAPI, ...] = ()
        except ValidationError:
            kept, tried = self._executable_subset(chain, header, included, deadline)
            left_out = tuple(tx for tx in tried if tx not in kept)
            block, receipts, changed = self._execute_batch(chain, header, kept, None)
        chain.persist_block(block)
        _forget_block_tries()
        return ExecutedBlock(block, receipts, overlay, changed, parent), left_out

    def _overlay_on(self, parent: ExecutedBlock | None) -> OverlayDB:
        return OverlayDB(self.chain_keyspace, None if parent is None else parent.overlay)

    def next_base_fee(self, parent: BlockHeaderAPI) -> int:
        """The base fee of the block after `parent` (EIP-1559: a function of the parent)."""
        header = self.chain_class.get_vm_class_for_block_number(
            parent.block_number + 1).create_header_from_parent(parent)
        return int(header.base_fee_per_gas)

    @staticmethod
    def _execute_batch(
        chain: Chain,
        header: BlockHeaderAPI,
        transactions: tuple[SignedTransactionAPI, ...],
        deadline: float | None,
    ) -> tuple[BlockAPI, tuple[ReceiptAPI, ...], dict[bytes, bytes]]:
        """Apply `transactions` in chunks until the deadline passes, then seal the block;
        returns it, its receipts and the accounts it changed."""
        vm = chain.get_vm(header)
        new_header, receipts, included = header, [], 0
        chunk = len(transactions) if deadline is None else BUILD_CHUNK
        while included < len(transactions):
            if included and deadline is not None and time.perf_counter() >= deadline:
                break
            batch = transactions[included: included + chunk]
            new_header, batch_receipts, _ = vm.apply_all_transactions(batch, new_header)
            receipts += batch_receipts
            included += len(batch)
        filled = vm.set_block_transactions_and_withdrawals(
            vm.get_block(), new_header, transactions[:included], tuple(receipts)
        )
        mined = vm.mine_block(filled)
        return mined.block, tuple(receipts), block_witness(mined.meta_witness).changed_accounts

    @staticmethod
    def _executable_subset(
        chain: Chain,
        header: BlockHeaderAPI,
        transactions: tuple[SignedTransactionAPI, ...],
        deadline: float | None,
    ) -> tuple[tuple[SignedTransactionAPI, ...], tuple[SignedTransactionAPI, ...]]:
        """The transactions that execute one after another, skipping each one that fails,
        until the deadline passes; and the ones tried (the rest wait for a later block)."""
        vm = chain.get_vm(header)
        kept: list[SignedTransactionAPI] = []
        tried = 0
        for tx in transactions:
            if kept and deadline is not None and time.perf_counter() >= deadline:
                break
            tried += 1
            snapshot = vm.state.snapshot()
            try:
                vm.state.apply_transaction(tx)
            except ValidationError:
                vm.state.revert(snapshot)
                continue
            kept.append(tx)
        return tuple(kept), transactions[:tried]

    def decode_block(self, data: bytes) -> BlockAPI:
        block_class = self.view().get_vm().get_block_class()
        try:
            check_block_bounds(data)
            check_typed_transaction_bounds(rlp.decode(data))
            return rlp.decode(data, sedes=block_class)
        except (rlp.DecodingError, rlp.DeserializationError, ValueError, TypeError) as exc:
            raise BlockValidationError(f"undecodable block: {exc}") from None

    def validate_encoded(self, data: bytes, parent: ExecutedBlock | None = None
                         ) -> ExecutedBlock:
        """A block from a peer, from its bytes: its body checked against its header, then
        decoded and executed (`execute_block`). Whatever py-evm raises for bytes it cannot
        take (an unknown transaction type, an impossible signature) is a
        BlockValidationError: a refusal of the block, never a failure of the caller."""
        check_body_matches_header(data)
        try:
            return self.execute_block(self.decode_block(data), parent)
        except (BlockValidationError, StorageError):
            raise
        except Exception as exc:  # noqa: BLE001 (py-evm's errors for bad input have no base)
            raise BlockValidationError(
                f"invalid block: {type(exc).__name__}: {exc}") from None

    def execute_block(self, block: BlockAPI, parent: ExecutedBlock | None = None
                      ) -> ExecutedBlock:
        """Validate `block` completely by executing it on the head (or on `parent`, executed
        and not committed); nothing is written."""
        overlay = self._overlay_on(parent)
        chain = self.chain_class(overlay)
        head = chain.get_canonical_head()
        if block.header.parent_hash != head.hash:
            raise StaleParentError(
                f"block {block.number} does not extend the head "
                f"(parent {block.header.parent_hash.hex()}, head {head.hash.hex()})"
            )
        try:
            result = chain.import_block(block)
        except ValidationError as exc:
            raise BlockValidationError(f"invalid block {block.number}: {exc}") from None
        finally:
            _forget_block_tries()
        witness = block_witness(result.meta_witness)
        return ExecutedBlock(result.imported_block, witness.receipts, overlay,
                             witness.changed_accounts, parent)

    def commit(self, executed: ExecutedBlock, batch: WriteBatch | None = None) -> None:
        """Make an executed block canonical: in `batch` if given (the caller writes it),
        else in a synced batch of its own."""
        if batch is not None:
            self.commit_chain([executed], batch)
            return
        with self.db.batch(sync=True) as own:
            self.commit_chain([executed], own)

    def commit_chain(self, blocks: Sequence[ExecutedBlock], batch: WriteBatch) -> None:
        """Make consecutive executed blocks (each executed on the one before, the first on
        the head) canonical in `batch`, which the caller writes."""
        head = self.head()
        parent_hash, number = head.hash, head.block_number
        for executed in blocks:
            if executed.block.header.parent_hash != parent_hash:
                raise BlockValidationError(
                    f"block {executed.number} no longer extends the head (block {number})")
            self._write_committed(executed, batch)
            parent_hash, number = executed.hash, executed.number

    def _write_committed(self, executed: ExecutedBlock, batch: WriteBatch) -> None:
        executed.overlay.write_into(batch)
        executed.parent = None  # committed before it: the chain of uncommitted blocks ends here
        self.read_store.write_block(batch, executed.block.header, executed.records)
