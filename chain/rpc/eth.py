"""The web3_*, net_*, eth_* methods and geth's read-only debug_getRaw* methods."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import rlp
from eth.abc import BlockHeaderAPI
from eth_hash.auto import keccak

from chain.errors import TxPoolError
from chain.rpc.backend import CommittedBlock, RpcBackend
from chain.rpc.child_process import mark_block
from chain.rpc.errors import InvalidParams, RpcError, ServerError
from chain.rpc.evm_process import EvmProcesses, ExecutionRequest
from chain.rpc.filters import FilterManager, LogCriteria
from chain.rpc.formatters import transaction_json
from chain.rpc.hexcodec import (
    data,
    parse_address,
    parse_data,
    parse_hash,
    parse_quantity,
    parse_storage_slot,
    quantity,
)
from chain.rpc.read_process import (
    BLOCK_HASHES,
    FULL_BLOCK,
    LOGS,
    RECEIPTS,
    ReadRequest,
    ReadWorkers,
    too_many_logs,
)
from chain.rpc.served import ServedBlocks, WorkerPool

CLIENT_VERSION = "pbft-chain/v0.1.0/python3.11"
HASH_PARAM_LENGTH = 2 + 64  # "0x" and 32 bytes of hex
# A block of at most this many transactions is formatted in this process when read whole
# (~12 us a transaction, once: it is kept), a larger one in a read process.
IN_PROCESS_TRANSACTIONS = 16
# eth_getLogs over at most this many candidate blocks, each of at most IN_PROCESS_TRANSACTIONS,
# is matched in this process (the newest block or few, as dapps poll them).
IN_PROCESS_LOG_BLOCKS = 4
MAX_LOG_BLOCK_RANGE = 10_000
MAX_LOG_RESULTS = 10_000
MAX_FEE_HISTORY_BLOCKS = 1_024  # geth's: more are answered with the newest 1,024
MAX_REWARD_PERCENTILES = 100  # geth's maxQueryLimit
DEFAULT_PRIORITY_FEE = 1_000_000_000  # 1 gwei, what geth suggests on an idle chain

Method = Callable[..., Awaitable[Any]]


def _check_percentiles(percentiles: Any) -> None:
    """eth_feeHistory's rewardPercentiles: at most MAX_REWARD_PERCENTILES (counted before
    any is looked at), increasing, each in [0, 100]."""
    if isinstance(percentiles, list) and len(percentiles) > MAX_REWARD_PERCENTILES:
        raise InvalidParams(f"invalid reward percentiles: {len(percentiles)} given, at most "
                            f"{MAX_REWARD_PERCENTILES}: ask for fewer")
    if (
        not isinstance(percentiles, list)
        or not all(isinstance(p, int | float) and 0 <= p <= 100 for p in percentiles)
        or percentiles != sorted(percentiles)
    ):
        raise InvalidParams("invalid reward percentiles: want increasing numbers in [0, 100]")


class EthApi:
    """Methods by name; each takes the JSON params positionally and returns a JSON value."""

    def __init__(self, node: RpcBackend) -> None:
        self.node = node
        self.blockchain = node.blockchain
        self.filters = FilterManager()
        self.served = ServedBlocks(node.blockchain)
        # Heavy reads are answered by a process per worker (chain/rpc/read_process.py).
        self.reads = ReadWorkers(node.blockchain)
        self.gas_cap = node.rpc_settings().gas_cap
        self.evm_limits = node.rpc_settings().limits.evm
        # A thread per EVM process, each only waiting on its process and answering its
        # reads of the chain: not client work of this interpreter's, so not governed.
        self.executions = WorkerPool(
            self.evm_limits.workers, self.evm_limits.max_pending, "eth_call/eth_estimateGas",
            governed=False)
        self.evm = EvmProcesses(self.evm_limits.workers, node.chain_id,
                                self.blockchain.contracts, self.blockchain.chain_keyspace,
                                self.evm_limits.cpu_share)
        node.add_head_listener(self._on_block)

    def _on_block(self, committed: CommittedBlock) -> None:
        self.filters.on_block(committed.header, committed.records)
        mark_block()  # the children's work yields while blocks come (`_Child._pace`)

    def close(self) -> None:
        """On stop: every thread of client work ends (an EVM call within its deadline),
        then the EVM processes."""
        for pool in (self.reads, self.executions):
            pool.close()
        self.evm.close()
        self.filters.close()

    def methods(self) -> dict[str, Method]:
        return {
            name: getattr(self, name)
            for name in dir(self)
            if name.split("_", 1)[0] in ("web3", "net", "eth", "debug")
            and callable(getattr(self, name))
        }

    # Block resolution.

    def _header_for(self, block: Any, *, allow_missing: bool = False) -> BlockHeaderAPI | None:
        """A block tag, number, hash or EIP-1898 object to a canonical header."""
        if isinstance(block, str) and len(block) == HASH_PARAM_LENGTH:
            # a plain block hash (execution-apis' BlockNumberOrTagOrHash, as geth takes it):
            # a block number is at most 64 bits, so 32 bytes can only be a hash (inside an
            # EIP-1898 object, "blockNumber" stays a number)
            header = self.blockchain.header_by_hash(parse_hash(block, "block hash"))
            if header is None and not allow_missing:
                raise ServerError("header not found")
            return header
        if isinstance(block, dict):
            if ("blockHash" in block) == ("blockNumber" in block):
                raise InvalidParams(
                    "invalid argument: a block object needs exactly one of blockHash and "
                    "blockNumber"
                )
            if "blockHash" in block:
                header = self.blockchain.header_by_hash(parse_hash(block["blockHash"], "blockHash"))
                if header is None and not allow_missing:
                    raise ServerError("header for hash not found")
                return header
            block = block["blockNumber"]
        if block in ("latest", "pending", "safe", "finalized"):
            return self.blockchain.head()  # BFT finality: every committed block is final
        if block == "earliest":
            return self.blockchain.header_by_number(0)
        header = self.blockchain.header_by_number(parse_quantity(block, "block number", bits=64))
        if header is None and not allow_missing:
            raise ServerError("header not found")
        return header

    def _state_at(self, block: Any) -> Any:
        return self.blockchain.vm_at(self._header_for(block)).state

    # web3 / net.

    async def web3_clientVersion(self) -> str:  # noqa: N802
        return CLIENT_VERSION

    async def web3_sha3(self, value: Any) -> str:
        return data(keccak(parse_data(value, "data")))

    async def net_version(self) -> str:
        return str(self.node.chain_id)

    async def net_listening(self) -> bool:
        return True

    async def net_peerCount(self) -> str:  # noqa: N802
        return quantity(self.node.peer_count())

    # Chain state.

    async def eth_chainId(self) -> str:  # noqa: N802
        return quantity(self.node.chain_id)

    async def eth_blockNumber(self) -> str:  # noqa: N802
        return quantity(self.blockchain.head().block_number)

    async def eth_syncing(self) -> Any:
        return self.node.sync_status() or False

    async def eth_accounts(self) -> list[str]:
        return []

    async def eth_gasPrice(self) -> str:  # noqa: N802
        return quantity(self.node.next_base_fee() + DEFAULT_PRIORITY_FEE)

    async def eth_maxPriorityFeePerGas(self) -> str:  # noqa: N802
        return quantity(DEFAULT_PRIORITY_FEE)

    async def eth_feeHistory(
        self, block_count: Any, newest: Any, percentiles: Any = None
    ) -> dict[str, Any]:
        count = min(parse_quantity(block_count, "blockCount", bits=64), MAX_FEE_HISTORY_BLOCKS)
        if percentiles is not None:
            _check_percentiles(percentiles)
        return await self.reads.run(self._fee_history, count, newest, percentiles)

    def _fee_history(
        self, count: int, newest: Any, percentiles: list[Any] | None
    ) -> dict[str, Any]:
        newest_header = self._fee_history_newest(newest)
        oldest = max(0, newest_header.block_number - count + 1)
        newest_number = newest_header.block_number
        headers = (
            [self.blockchain.header_by_number(n) for n in range(oldest, newest_number + 1)]
            if count
            else []
        )
        view = self.blockchain.view()
        next_base_fee = view.create_header_from_parent(newest_header).base_fee_per_gas
        result: dict[str, Any] = {
            "oldestBlock": quantity(oldest if count else newest_number),
            "baseFeePerGas": [quantity(h.base_fee_per_gas) for h in headers]
            + [quantity(next_base_fee)],
            "gasUsedRatio": [h.gas_used / h.gas_limit for h in headers],
            "baseFeePerBlobGas": [quantity(0)] * (len(headers) + 1),
            "blobGasUsedRatio": [0.0] * len(headers),
        }
        if percentiles is not None:
            result["reward"] = [[quantity(0)] * len(percentiles) for _ in headers]
        return result

    def _fee_history_newest(self, newest: Any) -> BlockHeaderAPI:
        """A block number or tag (as geth, no EIP-1898 object); beyond the head is an error."""
        if isinstance(newest, dict):
            raise InvalidParams("invalid argument 1: want a block number or tag")
        header = self._header_for(newest, allow_missing=True)
        if header is None:
            requested = parse_quantity(newest, "block number", bits=64)
            head = self.blockchain.head().block_number
            raise ServerError(f"request beyond head block: requested {requested}, head {head}")
        return header

    async def eth_getBalance(self, address: Any, block: Any = "latest") -> str:  # noqa: N802
        return quantity(self._state_at(block).get_balance(parse_address(address)))

    async def eth_getTransactionCount(self, address: Any, block: Any = "latest") -> str:  # noqa: N802
        sender = parse_address(address)
        if block == "pending":
            return quantity(self.node.pool.pending_nonce(sender))
        return quantity(self._state_at(block).get_nonce(sender))

    async def eth_getCode(self, address: Any, block: Any = "latest") -> str:  # noqa: N802
        return data(self._state_at(block).get_code(parse_address(address)))

    async def eth_getStorageAt(  # noqa: N802
        self, address: Any, slot: Any, block: Any = "latest"
    ) -> str:
        key = parse_storage_slot(slot)
        value = self._state_at(block).get_storage(parse_address(address), key)
        return data(value.to_bytes(32, "big"))

    # Execution.

    def _request(self, call: Any, block: Any, *, estimate: bool) -> ExecutionRequest:
        """The call parsed and bounded for an EVM process (on an execution thread)."""
        header = self._header_for(block)
        assert header is not None
        if not isinstance(call, dict):
            raise InvalidParams("invalid argument 0: call object expected")
        sender = parse_address(call["from"], "from") if call.get("from") else b"\x00" * 20
        to = parse_address(call["to"], "to") if call.get("to") else b""
        if "input" in call and "data" in call and call["input"] != call["data"]:
            raise InvalidParams('both "data" and "input" are set and not equal. Please use "input"')
        payload = parse_data(call.get("input", call.get("data", "0x")), "input")
        gas_cap = min(header.gas_limit, self.gas_cap)
        gas = parse_quantity(call["gas"], "gas", bits=64) if call.get("gas") else gas_cap
        return ExecutionRequest(
            estimate=estimate,
            header=rlp.encode(header),
            sender=sender,
            to=to,
            data=payload,
            gas=min(gas, gas_cap),
            gas_price=parse_quantity(call.get("gasPrice") or "0x0", "gasPrice"),
            value=parse_quantity(call.get("value") or "0x0", "value"),
            timeout=self.evm_limits.timeout,
        )

    async def eth_call(self, call: Any, block: Any = "latest", overrides: Any = None) -> str:
        if overrides is not None:
            raise InvalidParams("state overrides are not supported")
        return data(await self._execute(call, block, estimate=False))

    async def eth_estimateGas(self, call: Any, block: Any = "latest") -> str:  # noqa: N802
        return quantity(int.from_bytes(await self._execute(call, block, estimate=True), "big"))

    async def _execute(self, call: Any, block: Any, *, estimate: bool) -> bytes:
        """The call in an EVM process (chain/rpc/evm_process.py), all its executions within
        one deadline (geth's): its output, or for an estimate the gas."""
        def ask() -> bytes:
            return self.evm.execute(self._request(call, block, estimate=estimate))

        return await self.executions.run(ask)

    async def eth_sendRawTransaction(self, raw: Any) -> str:  # noqa: N802
        try:
            return data(self.node.submit_raw_transaction(parse_data(raw, "transaction")))
        except TxPoolError as exc:
            raise RpcError(exc.code, exc.message) from None

    # Transactions and receipts.

    async def eth_getTransactionByHash(self, tx_hash: Any) -> Any:  # noqa: N802
        return self._transaction_by_hash(parse_hash(tx_hash))

    def _transaction_by_hash(self, tx_hash: bytes) -> Any:
        located = self.served.locate(tx_hash)
        if located is not None:
            return self.served.transaction(located)
        pending = self.node.pool.get(tx_hash)
        if pending is None:
            return None
        return transaction_json(pending.tx.encode(), tx_hash, pending.sender)

    def _transaction_by_index(self, header: BlockHeaderAPI | None, index: Any) -> Any:
        position = parse_quantity(index, "index", bits=64)
        return None if header is None else self.served.transaction_at(header, position)

    async def eth_getTransactionByBlockNumberAndIndex(self, block: Any, index: Any) -> Any:  # noqa: N802
        return self._transaction_by_index(self._header_for(block, allow_missing=True), index)

    async def eth_getTransactionByBlockHashAndIndex(self, block_hash: Any, index: Any) -> Any:  # noqa: N802
        return self._transaction_by_index(self._header_by_hash(block_hash), index)

    async def eth_getTransactionReceipt(self, tx_hash: Any) -> Any:  # noqa: N802
        located = self.served.locate(parse_hash(tx_hash, "transaction hash"))
        return None if located is None else self.served.receipt(located)

    def _whole_block(self, kind: str, header: BlockHeaderAPI | None) -> Any:
        """On a read worker: a small block's JSON, made here and kept (chain/rpc/served.py: a
        client polling the head's receipts is answered at once, not after a nice-19
        process's turn), else the ReadRequest for a read process."""
        if header is None:
            return None
        if self.served.transaction_count(header) <= IN_PROCESS_TRANSACTIONS:
            served = self.served.block(header)
            return served.receipts if kind == RECEIPTS else served.json(kind == FULL_BLOCK)
        number = header.block_number  # committed: the head is at least this
        return ReadRequest(kind, head=number, first=number)

    async def eth_getBlockReceipts(self, block: Any) -> Any:  # noqa: N802
        def receipts() -> Any:
            return self._whole_block(RECEIPTS, self._header_for(block, allow_missing=True))

        return await self.reads.read(receipts)

    # Blocks.

    def _header_by_hash(self, block_hash: Any) -> BlockHeaderAPI | None:
        return self.blockchain.header_by_hash(parse_hash(block_hash, "block hash"))

    async def _block(self, find_header: Callable[[], BlockHeaderAPI | None], full: Any) -> Any:
        if not isinstance(full, bool):
            raise InvalidParams("invalid argument 1: want a boolean for full transactions")

        def block() -> Any:
            return self._whole_block(FULL_BLOCK if full else BLOCK_HASHES, find_header())

        return await self.reads.read(block)

    async def eth_getBlockByNumber(self, block: Any, full: Any = False) -> Any:  # noqa: N802
        return await self._block(lambda: self._header_for(block, allow_missing=True), full)

    async def eth_getBlockByHash(self, block_hash: Any, full: Any = False) -> Any:  # noqa: N802
        return await self._block(lambda: self._header_by_hash(block_hash), full)

    def _transaction_count(self, header: BlockHeaderAPI | None) -> Any:
        return None if header is None else quantity(self.served.transaction_count(header))

    async def eth_getBlockTransactionCountByNumber(self, block: Any) -> Any:  # noqa: N802
        return self._transaction_count(self._header_for(block, allow_missing=True))

    async def eth_getBlockTransactionCountByHash(self, block_hash: Any) -> Any:  # noqa: N802
        return self._transaction_count(self._header_by_hash(block_hash))

    # Logs and filters.

    def _log_range(self, query: dict[str, Any]) -> tuple[int, int]:
        """The first and last block numbers a log query covers (first > last: none)."""
        if query.get("blockHash") is not None:
            if query.get("fromBlock") is not None or query.get("toBlock") is not None:
                raise InvalidParams(
                    "invalid argument 0: cannot specify both BlockHash and FromBlock/ToBlock"
                )
            header = self.blockchain.header_by_hash(parse_hash(query["blockHash"], "blockHash"))
            if header is None:
                raise ServerError("unknown block")
            return header.block_number, header.block_number
        head = self.blockchain.head().block_number
        first = self._header_for(query.get("fromBlock") or "latest", allow_missing=True)
        last = self._header_for(query.get("toBlock") or "latest", allow_missing=True)
        start = first.block_number if first else head + 1
        end = last.block_number if last else head
        if end - start + 1 > MAX_LOG_BLOCK_RANGE:
            raise RpcError(-32005, f"query exceeds max block range {MAX_LOG_BLOCK_RANGE}")
        return start, end

    def _logs(self, query: Any) -> Any:
        """On a read worker: the logs of the blocks the bloom-bits index names (the index
        changes with each block: read here), matched here when they are a few small blocks
        (a dapp polling the newest block's logs), else the ReadRequest for a read process."""
        if not isinstance(query, dict):
            raise InvalidParams("invalid argument 0: filter object expected")
        criteria = LogCriteria.parse(query)
        first, last = self._log_range(query)
        candidates = tuple(self.served.store.bloom_index.candidates(
            first, last, criteria.bloom_groups()))
        if not candidates:
            return []
        if self._small_blocks(candidates):
            return self._logs_in_process(criteria, candidates)
        return ReadRequest(  # last: at most the head, all committed
            LOGS, head=last, first=first, numbers=candidates, criteria=criteria,
            max_results=MAX_LOG_RESULTS)

    def _small_blocks(self, numbers: tuple[int, ...]) -> bool:
        """At most IN_PROCESS_LOG_BLOCKS blocks of at most IN_PROCESS_TRANSACTIONS each:
        matching them costs less than a read process's round trip."""
        if len(numbers) > IN_PROCESS_LOG_BLOCKS:
            return False
        headers = [self.blockchain.header_by_number(n) for n in numbers]
        return all(h is None or self.served.transaction_count(h) <= IN_PROCESS_TRANSACTIONS
                   for h in headers)

    def _logs_in_process(self, criteria: LogCriteria, numbers: tuple[int, ...]) -> list[Any]:
        logs: list[Any] = []
        for log in self.served.logs_of(criteria, numbers):
            if len(logs) == MAX_LOG_RESULTS:
                raise too_many_logs(MAX_LOG_RESULTS)
            logs.append(log)
        return logs

    async def eth_getLogs(self, query: Any) -> Any:  # noqa: N802
        return await self.reads.read(self._logs, query)

    async def eth_newFilter(self, query: Any) -> str:  # noqa: N802
        if not isinstance(query, dict):
            raise InvalidParams("invalid argument 0: filter object expected")
        criteria = await self.reads.run(LogCriteria.parse, query)  # up to 5,000 values
        return self.filters.install("logs", criteria, query)

    async def eth_newBlockFilter(self) -> str:  # noqa: N802
        return self.filters.install("blocks", None)

    async def eth_getFilterChanges(self, filter_id: Any) -> list[Any]:  # noqa: N802
        return await self.filters.take_changes(filter_id)

    async def eth_getFilterLogs(self, filter_id: Any) -> Any:  # noqa: N802
        installed = self.filters.get(filter_id)
        if installed.kind != "logs":
            raise ServerError("filter not found")
        return await self.reads.read(self._logs, installed.query)

    async def eth_uninstallFilter(self, filter_id: Any) -> bool:  # noqa: N802
        return self.filters.uninstall(filter_id)

    # Raw encodings (geth's debug namespace; read-only).

    async def debug_getRawBlock(self, block: Any) -> str:  # noqa: N802
        """The RLP block [header, transactions, ommers, withdrawals], as it hashes and as
        the audit ETL recomputes the transactions root from it."""
        return await self.reads.run(lambda: data(self.served.raw_block(self._header_for(block))))
