"""Benchmark 1, the raw limit: pre-signed transactions applied by py-evm alone, in this process.

Each block's transactions are decoded fresh from their signed bytes (so sender recovery is
included, once per transaction, as a node must do it) and mined with `MiningChain.mine_all`
(one `apply_all_transactions`, then the transaction, receipt and state roots) on py-evm's
in-memory database, in blocks as large as a node builds them. No pool, no RPC, no
consensus, no LevelDB: what is left is the work every validator must do for every block.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from eth.chains.base import MiningChain
from eth.db.atomic import AtomicDB
from eth.vm.forks import PragueVM

from benchmarks.accounts import WORKLOAD_GAS, SignedTx, sign_workload
from chain.genesis import DEFAULT_BASE_FEE, DEFAULT_GAS_LIMIT, Genesis, parse_genesis

MAX_BLOCK_TRANSACTIONS = 1_000  # chain.node.NodeConfig.max_block_transactions
SINGLE_TX_BLOCKS = 20  # blocks of one transfer, for the latency reference


@dataclass(frozen=True)
class RawRate:
    workload: str
    transactions: int
    block_size: int
    seconds: float
    cpu_seconds: float

    @property
    def tps(self) -> float:
        return self.transactions / self.seconds

    @property
    def cpu_per_tx(self) -> float:
        return self.cpu_seconds / self.transactions

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tps": self.tps, "cpu_ms_per_tx": self.cpu_per_tx * 1000}


def block_size(workload: str) -> int:
    """How many transactions of `workload` a node puts into a block (gas limit, count cap)."""
    return min(MAX_BLOCK_TRANSACTIONS, DEFAULT_GAS_LIMIT // WORKLOAD_GAS[workload])


def bench_genesis(chain_id: int, alloc: dict[str, Any]) -> Genesis:
    document = {
        "config": {"chainId": chain_id, "dev": {}},
        "alloc": alloc,
        "gasLimit": hex(DEFAULT_GAS_LIMIT),
        "baseFeePerGas": hex(DEFAULT_BASE_FEE),
    }
    return parse_genesis(document, {"dev"})


def _fresh_chain(genesis: Genesis) -> MiningChain:
    chain_class = MiningChain.configure(
        __name__="RawChain", vm_configuration=((0, PragueVM),), chain_id=genesis.chain_id
    )
    return chain_class.from_genesis(AtomicDB(), genesis.header_params(), genesis.state())


def _mine(chain: MiningChain, blocks: list[list[SignedTx]]) -> tuple[float, float]:
    """Wall and CPU seconds to decode and mine `blocks`, one after another."""
    builder = chain.get_vm().get_transaction_builder()
    wall, cpu = time.perf_counter(), time.process_time()
    for number, block in enumerate(blocks, start=1):
        chain.mine_all([builder.decode(tx.raw) for tx in block], timestamp=number)
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(genesis: Genesis, accounts: int, workload: str, blocks: int) -> RawRate:
    """`blocks` full blocks of `workload` from `accounts` senders on a fresh chain."""
    size = block_size(workload)
    per_sender = -(-size * blocks // accounts)
    txs = sign_workload(workload, genesis.chain_id, accounts, list(range(accounts)),
                        [0] * accounts, per_sender)[: size * blocks]
    chunks = [txs[i : i + size] for i in range(0, len(txs), size)]
    seconds, cpu = _mine(_fresh_chain(genesis), chunks)
    return RawRate(workload, len(txs), size, seconds, cpu)


def single_transaction_block_seconds(genesis: Genesis, accounts: int) -> float:
    """Mean wall time of a block holding one transfer: the floor under a block's latency."""
    txs = sign_workload("transfer", genesis.chain_id, accounts, list(range(SINGLE_TX_BLOCKS)),
                        [0] * SINGLE_TX_BLOCKS, 1)
    seconds, _ = _mine(_fresh_chain(genesis), [[tx] for tx in txs])
    return seconds / SINGLE_TX_BLOCKS
