"""The state audit's replay (`spark_etl.audit.state_rules.StateReplay`) on the chain's own
code: the genesis state built as `pbft-node init` builds it, and every block decoded with the
bounds a node applies to a peer's block and executed by the chain's VM (with the engine's
system contracts, as a node runs them) on the state its parent left, in a throw-away LevelDB
(memory stays bounded on a long chain).

A node's import (`Blockchain.execute_block`) refuses a block whose header disagrees with its
execution, and so never tells the root it computed; here the VM's `import_block` runs alone,
and its root is the answer. Each block's own header (the certified one) is kept for the next
block's parent and for BLOCKHASH; the state it runs on is always the replayed one."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from eth.abc import BlockAPI
from eth.chains.base import Chain
from eth.exceptions import HeaderNotFound

from chain.blockchain import Blockchain, _forget_block_tries, check_body_matches_header
from chain.errors import BlockValidationError, FalseBodyError, GenesisError
from chain.genesis import Genesis, load_genesis_bytes
from chain.node import engine_contracts
from chain.registry import available_engines
from spark_etl.audit.state_rules import BlockNotExecuted, StateReplay
from spark_etl.errors import UsageError
from storage import Database, OverlayDB, StorageError


class _Replayer:
    """Blocks executed one after another on `chain`'s database, from its genesis state."""

    def __init__(self, chain: Blockchain) -> None:
        self.chain = chain
        self.state_root: bytes = chain.head().state_root  # the genesis allocation's

    def decode(self, number: int, data: bytes) -> BlockAPI:
        """The block, with a peer's block's bounds (body against header, RLP depth)."""
        try:
            check_body_matches_header(data)
            block = self.chain.decode_block(data)
        except FalseBodyError as exc:
            raise BlockNotExecuted(number, "its exported transactions are not the ones its "
                                   f"header commits to ({exc})") from None
        except BlockValidationError as exc:
            raise BlockNotExecuted(number, str(exc)) from None
        if block.number != number:
            raise BlockNotExecuted(number, f"its header says block {block.number}")
        return block

    def execute(self, number: int, data: bytes) -> bytes:
        """The state root after block `number` (encoded as `data`)."""
        block = self.decode(number, data)
        overlay = OverlayDB(self.chain.chain_keyspace)
        chain = self.chain.chain_class(overlay)
        if number > 0:
            try:
                self.state_root = self._run(chain, block)
            except (BlockNotExecuted, StorageError):
                raise
            except Exception as exc:  # noqa: BLE001 (py-evm's errors for bad input have no base)
                raise BlockNotExecuted(number, "it does not execute on the replayed state: "
                                       f"{type(exc).__name__}: {exc}") from None
            finally:
                _forget_block_tries()
        chain.chaindb.persist_header(block.header)  # the next block's parent, for BLOCKHASH
        with self.chain.db.batch() as batch:
            overlay.write_into(batch)
        return self.state_root

    def _run(self, chain: Chain, block: BlockAPI) -> bytes:
        try:
            parent = chain.chaindb.get_block_header_by_hash(
                block.header.parent_hash)
        except HeaderNotFound:
            raise BlockNotExecuted(block.number, "its parent hash is not the hash of block "
                                   f"{block.number - 1}") from None
        # The header the VM builds the block on: the parent's, on the replayed state.
        base = chain.create_header_from_parent(parent).copy(
            state_root=self.state_root)
        imported = chain.get_vm(base).import_block(block)
        root: bytes = imported.block.header.state_root
        return root


@dataclass(frozen=True)
class ChainStateReplay(StateReplay):
    """The replay from `genesis` (a genesis file's bytes), checked as a node checks it when
    made, so a file the chain would refuse is refused on the driver, not in a Spark task."""

    genesis: bytes

    def __post_init__(self) -> None:
        self.parsed()

    @classmethod
    def from_file(cls, path: Path) -> ChainStateReplay:
        """The replay from the genesis file at `path`; UsageError for one the chain refuses."""
        try:
            return cls(path.read_bytes())
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
        except GenesisError as exc:
            raise UsageError(f"{path}: {exc}") from None

    def parsed(self) -> Genesis:
        return load_genesis_bytes(self.genesis, available_engines())

    def state_roots(self, blocks: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
        with tempfile.TemporaryDirectory(prefix="pbft-state-") as directory, \
                Database(directory) as db:
            genesis = self.parsed()
            replayer = _Replayer(Blockchain(db, genesis, engine_contracts(genesis)))
            for number, data in blocks:
                yield number, replayer.execute(number, data)
