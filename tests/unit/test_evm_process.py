"""chain/rpc/evm_process.py: eth_call and eth_estimateGas in a child process, against a chain
over LevelDB with the pbft engine's system contracts: the same answers as execution in the
node's own process, a child killed mid-call, and a cache that never serves an old head."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import rlp
from eth.abc import BlockHeaderAPI
from eth.vm.spoof import SpoofTransaction
from eth_abi import decode as abi_decode
from eth_hash.auto import keccak

from chain.blockchain import Blockchain
from chain.node import engine_contracts
from chain.rpc.child_process import ENTRY_BYTES, KILL_GRACE_SECONDS, ByteBoundedCache, mark_block
from chain.rpc.errors import EXECUTION_REVERTED, SERVER_ERROR, RpcError
from chain.rpc.evm_child import FINAL_KEY_PREFIX, immutable
from chain.rpc.evm_process import EvmProcesses, ExecutionRequest
from chain.system_contracts import revert_data
from pbft_engine.registry import GET_VALIDATORS, REGISTRY_ADDRESS
from storage import Database
from testkit.nodes import wait_for
from tests.unit.test_registry import ADDRESSES, BUILDER, CHAIN_ID, GWEI, KEYS, genesis

POOR = b"\x22" * 20  # no balance
FRESH = b"\x33" * 20  # receives a transfer in a new block
GAS = 30_000_000
ADD_AND_RETURN = bytes.fromhex("600260030160005260206000f3")  # 2 + 3, returned as a word
LOOP_FOREVER = bytes.fromhex("5b600056")  # JUMPDEST PUSH1 0 JUMP: until out of gas
REASON = revert_data("nope")
# CODECOPY the reason that follows the code to memory 0, then REVERT with it
REVERT_WITH_REASON = bytes.fromhex(f"60{len(REASON):02x}600c600039" f"60{len(REASON):02x}6000fd"
                                   ) + REASON


def balance_of(address: bytes) -> bytes:
    """Code returning the balance of `address` as a word."""
    return bytes.fromhex("73") + address + bytes.fromhex("3160005260206000f3")


# One chain and one child for the module: a child's start (py-evm's imports, at nice 19) took
# 20-50 s in CI, where the other suites keep both cores busy. Each test asks at the head it
# finds; one that kills the child finds the next call starting a new one.
@pytest.fixture(scope="module")
def blockchain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Blockchain]:
    chain_genesis = genesis()
    with Database(tmp_path_factory.mktemp("evm") / "chaindata") as db:
        yield Blockchain(db, chain_genesis, engine_contracts(chain_genesis))


@pytest.fixture(scope="module")
def evm(blockchain: Blockchain) -> Iterator[EvmProcesses]:
    processes = EvmProcesses(1, CHAIN_ID, blockchain.contracts, blockchain.chain_keyspace)
    processes.start()
    yield processes
    processes.close()


def request(header: BlockHeaderAPI, code: bytes, *, to: bytes = b"", sender: bytes = ADDRESSES[0],
            gas: int = GAS, value: int = 0, estimate: bool = False,
            timeout: float = 5.0) -> ExecutionRequest:
    return ExecutionRequest(estimate=estimate, header=rlp.encode(header), sender=sender, to=to,
                            data=code, gas=gas, gas_price=0, value=value, timeout=timeout)


def in_process(blockchain: Blockchain, asked: ExecutionRequest) -> Any:
    """The computation as the node's own process ran it (chain/rpc/eth.py before)."""
    header = blockchain.head()
    vm = blockchain.vm_at(header)
    with vm.in_costless_state() as state:
        unsigned = vm.get_transaction_builder().create_unsigned_transaction(
            nonce=state.get_nonce(asked.sender), gas_price=0, gas=asked.gas, to=asked.to,
            value=asked.value, data=asked.data)
        return state.costless_execute_transaction(SpoofTransaction(unsigned, from_=asked.sender))


def refusal(evm: EvmProcesses, asked: ExecutionRequest) -> RpcError:
    with pytest.raises(RpcError) as caught:
        evm.execute(asked)
    return caught.value


def test_an_output_and_an_estimate_are_the_ones_of_the_nodes_own_process(
    blockchain: Blockchain, evm: EvmProcesses
) -> None:
    head = blockchain.head()
    here = in_process(blockchain, request(head, ADD_AND_RETURN))
    assert evm.execute(request(head, ADD_AND_RETURN)) == here.output == (5).to_bytes(32, "big")
    view = blockchain.view()
    vm = view.get_vm(head)
    with vm.in_costless_state() as state:
        unsigned = vm.get_transaction_builder().create_unsigned_transaction(
            nonce=0, gas_price=0, gas=GAS, to=b"", value=0, data=ADD_AND_RETURN)
        estimate = view.gas_estimator(state, SpoofTransaction(unsigned, from_=ADDRESSES[0]))
    asked = request(head, ADD_AND_RETURN, estimate=True)
    assert int.from_bytes(evm.execute(asked), "big") == estimate


def test_a_revert_carries_its_reason_and_data(blockchain: Blockchain, evm: EvmProcesses) -> None:
    error = refusal(evm, request(blockchain.head(), REVERT_WITH_REASON))
    assert (error.code, error.message, error.data) == (
        EXECUTION_REVERTED, "execution reverted: nope", "0x" + REASON.hex())
    assert in_process(blockchain, request(blockchain.head(), REVERT_WITH_REASON)).output == REASON


def test_out_of_gas_and_insufficient_funds_read_as_before(
    blockchain: Blockchain, evm: EvmProcesses
) -> None:
    head = blockchain.head()
    looping = request(head, LOOP_FOREVER, gas=60_000)
    error = refusal(evm, looping)
    assert (error.code, error.message) == (
        SERVER_ERROR, str(in_process(blockchain, looping).error))
    assert error.message.startswith("Out of gas")
    poor = refusal(evm, request(head, b"", to=FRESH, sender=POOR, value=1))
    assert (poor.code, poor.message) == (
        SERVER_ERROR, "insufficient funds for gas * price + value")


def test_a_looping_call_stops_at_its_deadline_with_geths_text(
    blockchain: Blockchain, evm: EvmProcesses
) -> None:
    evm.execute(request(blockchain.head(), ADD_AND_RETURN))  # started and ready
    started = time.monotonic()
    error = refusal(evm, request(blockchain.head(), LOOP_FOREVER, timeout=0.3))
    assert (error.code, error.message) == (SERVER_ERROR, "execution aborted (timeout = 0.3s)")
    assert 0.3 <= time.monotonic() - started < 2.0


@pytest.mark.parametrize("code", ["loop", "precompile", "short calls"])
def test_a_child_computes_within_its_share_of_a_core_while_blocks_come(
    blockchain: Blockchain, code: str
) -> None:
    """Four looping calls kept the child computing and the honest transfers' latency 1.9
    times that without them (issue 29): while the chain makes blocks a child computes at
    most its share of a core (a tenth here), paced from outside, so a loop, a precompile
    (BLAKE2F: no opcode the EVM checks; the attack review s13-rpc, finding 1) and short
    calls one after another (finding 4) alike. Unpaced, a whole core."""
    evm = EvmProcesses(1, CHAIN_ID, blockchain.contracts, blockchain.chain_keyspace,
                       cpu_share=0.1)
    try:
        head, pid = running_child(blockchain, evm)
        before, started = cpu_ticks(pid), time.monotonic()
        while time.monotonic() - started < 1.5:
            mark_block()  # blocks keep coming
            if code == "short calls":
                evm.execute(request(head, ADD_AND_RETURN))
            elif code == "loop":
                refusal(evm, request(head, LOOP_FOREVER, timeout=1.0))
            else:
                # (~3 s at a tenth of a core, more on a loaded machine: not the 5 s default)
                evm.execute(request(head, BLAKE2F_ROUNDS, to=BLAKE2F, timeout=30.0))
        computed = (cpu_ticks(pid) - before) / os.sysconf("SC_CLK_TCK")
        assert computed / (time.monotonic() - started) < 0.3
    finally:
        evm.close()


BLAKE2F = (9).to_bytes(20, "big")
# EIP-152's input: 50,000 rounds (1 gas each), h, m, t, f: ~0.3 s of pure-Python compression
BLAKE2F_ROUNDS = (50_000).to_bytes(4, "big") + bytes(64 + 128 + 16) + b"\x01"


def test_a_system_contract_answers_in_the_child(blockchain: Blockchain,
                                                evm: EvmProcesses) -> None:
    head = blockchain.head()
    views = request(head, GET_VALIDATORS, to=REGISTRY_ADDRESS)
    output = evm.execute(views)
    assert output == in_process(blockchain, views).output
    (validators,) = abi_decode(["address[]"], output)
    assert [bytes.fromhex(v[2:]) for v in validators] == ADDRESSES[:4]
    refused = refusal(evm, request(head, b"\xde\xad\xbe\xef", to=REGISTRY_ADDRESS))
    assert refused.code == EXECUTION_REVERTED and refused.message.startswith(
        "execution reverted: ")


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def running_child(blockchain: Blockchain, evm: EvmProcesses) -> tuple[BlockHeaderAPI, int]:
    """The head, and the pid of the child that has answered a call at it."""
    head = blockchain.head()
    evm.execute(request(head, ADD_AND_RETURN))
    (pid,) = evm.pids
    assert pid is not None
    return head, pid


def test_a_killed_child_fails_the_call_in_flight_and_the_next_call_works(
    blockchain: Blockchain, evm: EvmProcesses
) -> None:
    head, pid = running_child(blockchain, evm)
    before = cpu_ticks(pid)
    errors: list[RpcError] = []

    def looping() -> None:
        errors.append(refusal(evm, request(head, LOOP_FOREVER, timeout=30.0)))

    caller = threading.Thread(target=looping)
    caller.start()
    wait_for(lambda: cpu_ticks(pid) >= before + 5, 30, "the child to run the loop")
    os.kill(pid, signal.SIGKILL)
    caller.join(10)
    assert [(e.code, e.message) for e in errors] == [(
        SERVER_ERROR,
        "execution failed: the EVM process was killed by SIGKILL; the next call starts a new one")]
    assert evm.execute(request(head, ADD_AND_RETURN)) == (5).to_bytes(32, "big")
    assert evm.pids != [pid]


def test_a_child_that_stops_answering_is_killed_after_its_grace(
    blockchain: Blockchain, evm: EvmProcesses
) -> None:
    """A child starved or stuck past its deadline (here stopped) cannot hold the call."""
    head, pid = running_child(blockchain, evm)
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    error = refusal(evm, request(head, ADD_AND_RETURN, timeout=0.3))
    assert (error.code, error.message) == (SERVER_ERROR, "execution aborted (timeout = 0.3s)")
    assert 0.3 + KILL_GRACE_SECONDS <= time.monotonic() - started < 0.3 + KILL_GRACE_SECONDS + 2
    assert gone(pid)
    assert evm.execute(request(head, ADD_AND_RETURN)) == (5).to_bytes(32, "big")


def test_a_child_that_died_idle_is_replaced_without_an_error(
    blockchain: Blockchain, evm: EvmProcesses
) -> None:
    evm.execute(request(blockchain.head(), ADD_AND_RETURN))
    (pid,) = evm.pids
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: gone(pid), 10, "the child to die")
    assert evm.execute(request(blockchain.head(), ADD_AND_RETURN)) == (5).to_bytes(32, "big")


def test_a_call_at_the_new_head_sees_the_new_block(blockchain: Blockchain,
                                                   evm: EvmProcesses) -> None:
    """The child keeps what it read at the old head; the new head's state is all new keys."""
    reading = balance_of(FRESH)
    assert evm.execute(request(blockchain.head(), reading)) == bytes(32)
    transfer = BUILDER.create_unsigned_transaction(
        nonce=0, gas_price=10 * GWEI, gas=21_000, to=FRESH, value=12345, data=b""
    ).as_signed_transaction(KEYS[0], chain_id=CHAIN_ID)
    head = blockchain.head()
    executed, left_out = blockchain.build_block([transfer], timestamp=head.timestamp + 1,
                                                coinbase=ADDRESSES[1])
    assert left_out == ()
    blockchain.commit(executed)
    assert evm.execute(request(blockchain.head(), reading)) == (12345).to_bytes(32, "big")
    assert evm.execute(request(head, reading)) == bytes(32)  # the old block's state stays


def test_the_cache_keeps_only_what_cannot_change_within_its_bytes() -> None:
    node = b"\xc2\x80\x80"
    assert immutable(keccak(node), node)
    assert immutable(FINAL_KEY_PREFIX + b"7", b"\xa0" + b"\x01" * 32)
    assert not immutable(b"v1:canonical_head_hash", b"\x01" * 32)
    assert not immutable(b"\x01" * 32, node)  # a 32-byte key that is not its value's hash
    cache = ByteBoundedCache(limit=3 * (32 + 100 + ENTRY_BYTES))
    for i in range(5):
        cache.put(bytes([i]) * 32, bytes(100))
    assert cache.bytes <= cache.limit
    assert [cache.get(bytes([i]) * 32) is not None for i in range(5)] == [False, False,
                                                                          True, True, True]


def test_two_workers_execute_two_calls_at_once(blockchain: Blockchain) -> None:
    processes = EvmProcesses(2, CHAIN_ID, blockchain.contracts, blockchain.chain_keyspace)
    processes.start()
    head = blockchain.head()
    try:
        with ThreadPoolExecutor(2) as pool:
            # both started and ready: neither process is free before 0.3 s
            list(pool.map(lambda _: refusal(processes, request(head, LOOP_FOREVER, timeout=0.3)),
                          range(2)))
            started = time.monotonic()
            errors = list(pool.map(
                lambda _: refusal(processes, request(head, LOOP_FOREVER, timeout=1.0)), range(2)))
        assert time.monotonic() - started < 2.0  # one after the other would take 2 s
        assert [e.message for e in errors] == ["execution aborted (timeout = 1s)"] * 2
        assert len(set(processes.pids)) == 2
    finally:
        processes.close()


ORPHANING = """import sys, time
from chain.rpc.child_process import _Child
child = _Child("chain.rpc.evm_child", "EVM process", 1 << 20, 1.0)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_child_dies_with_its_parent_even_stopped() -> None:
    """A node killed while its child was stopped (the parent's pacing) would leave the
    child stopped for good, holding its memory: it is killed with its parent."""
    parent = subprocess.Popen([sys.executable, "-c", ORPHANING], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    # past its first line (the prctl) once it computes its imports
    wait_for(lambda: gone(pid) or cpu_ticks(pid) >= 5, 30, "the child importing")
    os.kill(pid, signal.SIGSTOP)  # as `_Child._pace` does
    parent.kill()
    parent.wait()
    wait_for(lambda: gone(pid), 10, "the stopped child gone with its parent")
