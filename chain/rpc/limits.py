"""What one JSON-RPC client can make the node hold: geth's defaults where geth has one, set
in the `[http]` and `[rpc]` sections of the node's config (cli/config.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BatchLimits:
    max_items: int = 1_000  # geth's BatchRequestLimit
    max_response_bytes: int = 25 * 1000 * 1000  # geth's BatchResponseMaxSize


@dataclass(frozen=True)
class EvmLimits:
    """eth_call and eth_estimateGas: they run in child processes at nice 19 (each with a
    thread of the node's waiting on it and answering its reads of the chain), and each is
    stopped at its deadline (its gas is capped by NodeConfig.rpc_gas_cap, geth's RPCGasCap)."""

    timeout: float = 5.0  # geth's --rpc.evmtimeout: "execution aborted (timeout = 5s)" beyond
    workers: int = 1  # processes, each executing one call at a time
    max_pending: int = 8  # calls running or waiting; one more gets -32005 "server busy"
    # Of a core, at most, while the chain makes blocks (child_process.py's `_Child._pace`):
    # four looping calls kept their process computing and the honest transfers' latency 1.9
    # times that without them (issue 29's hostile row). Such a call may compute timeout x
    # cpu_share seconds.
    cpu_share: float = 0.25


@dataclass(frozen=True)
class RpcLimits:
    """Header sizes are aiohttp's (request line and each header up to 8190 bytes, at most 128
    headers: 400 beyond)."""

    max_body_bytes: int = 5 * 1024 * 1024  # geth's 5 MiB: 413 beyond
    # Bytes a second of HTTP request bodies and WebSocket input the node reads, all clients
    # together (a `BodyBudget`; each chunk or frame costs PIECE_COST more): two clients
    # posting 5 MiB bodies pushed 590 MB/s and took 60% of the event loop that votes; at
    # this rate reading costs it ~2%. One whole body at once.
    max_body_rate: int = 16 * 1024 * 1024
    # Bytes a second of answers the node writes, all clients together (a `BodyBudget` too,
    # its burst the largest answer): a client's answer is paid before it is written, and
    # its connection is not read meanwhile. The work behind an answer (reading, closing and
    # copying it) is on the node's interpreter, which the loop that votes shares: 8 clients
    # reading batches of block bundles took ~80 MB/s and tripled the honest transfers'
    # latency (issue 29's hostile row). The audit ETL's export reads ~4 MB/s.
    max_answer_rate: int = 16 * 1024 * 1024
    batch: BatchLimits = field(default_factory=BatchLimits)
    read_timeout: float = 30.0  # the whole body, as geth's ReadTimeout: 408 beyond
    idle_timeout: float = 120.0  # a connection without a request (headers too), geth's IdleTimeout
    max_connections: int = 256  # HTTP and WebSocket together: 503 beyond
    # After refusing a body (408, 413) the rest is read and dropped this long, so the client
    # reads the answer rather than a reset; the connection holds its slot meanwhile.
    linger_time: float = 2.0
    evm: EvmLimits = field(default_factory=EvmLimits)
