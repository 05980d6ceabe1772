"""The process that executes a node's eth_call and eth_estimateGas (`python -m
chain.rpc.evm_child`, started by chain/rpc/evm_process.py, which describes the conversation).

It runs at nice 19 and reads the chain keyspace through its parent (`ParentDB`), keeping in a
cache bounded in bytes what can never change: values whose key is their keccak (trie nodes,
code, headers by hash) and canonical block numbers' hashes (BFT finality: a committed block is
never replaced). Nothing else is kept, a missing key neither (it may be written later), so the
cache is never stale; the head it never reads (each request carries its block's header).
Each execution runs on a fresh overlay, so its writes stay in memory and are dropped.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import rlp
from eth.abc import ComputationAPI, StateAPI, VirtualMachineAPI
from eth.chains.base import Chain
from eth.db.atomic import AtomicDB
from eth.db.backends.base import BaseDB
from eth.db.batch import BatchDB
from eth.exceptions import Revert, VMError
from eth.vm.header import HeaderSedes
from eth.vm.spoof import SpoofTransaction
from eth_abi import decode as abi_decode
from eth_hash.auto import keccak
from eth_typing import Address
from eth_utils import ValidationError

from chain.blockchain import chain_class
from chain.rpc.child_process import (
    FOUND,
    ByteBoundedCache,
    Channel,
    child_main,
    error_message,
)
from chain.rpc.errors import EXECUTION_REVERTED, RpcError, ServerError
from chain.rpc.evm_process import GET, MAX_FRAME_BYTES, OUTPUT, ExecutionRequest, timeout_error
from chain.rpc.hexcodec import data
from chain.rpc.served import ExecutionTimeout, evm_deadline, with_deadline
from chain.system_contracts import ERROR_SELECTOR

CACHE_BYTES = 64 * 1024 * 1024
FINAL_KEY_PREFIX = b"block-number-to-hash:"  # py-evm's canonical number -> hash
MAX_INITCODE_SIZE = 49_152  # EIP-3860


def immutable(key: bytes, value: bytes) -> bool:
    """Whether `key` can only ever hold `value` (see the module's docstring)."""
    return key.startswith(FINAL_KEY_PREFIX) or keccak(value) == key


class ParentDB(BaseDB):
    """The parent's chain keyspace, read-only, through the channel and the cache."""

    def __init__(self, channel: Channel, cache: ByteBoundedCache) -> None:
        self._channel = channel
        self._cache = cache

    def __getitem__(self, key: bytes) -> bytes:
        value = self._cache.get(key)
        if value is None:
            value = self._ask(key)
            if value is None:
                raise KeyError(key)
            if immutable(key, value):
                self._cache.put(key, value)
        return value

    def _ask(self, key: bytes) -> bytes | None:
        answer = self._channel.ask([GET, key])
        return answer[1:] if answer[:1] == FOUND else None

    def _exists(self, key: bytes) -> bool:
        try:
            self[key]
        except KeyError:
            return False
        return True

    def __setitem__(self, key: bytes, value: bytes) -> None:
        raise TypeError("the chain is read-only here: executions write to an overlay")

    def __delitem__(self, key: bytes) -> None:
        raise TypeError("the chain is read-only here: executions write to an overlay")


def _revert_error(computation: ComputationAPI) -> RpcError:
    output = computation.output
    message = "execution reverted"
    if output[:4] == ERROR_SELECTOR:
        try:
            (reason,) = abi_decode(["string"], output[4:])
            message += f": {reason}"
        except Exception:  # a malformed reason still reverts, just without the text
            pass
    return RpcError(EXECUTION_REVERTED, message, data(output))


def _raise_if_failed(computation: ComputationAPI) -> None:
    if not computation.is_error:
        return
    if isinstance(computation.error, Revert):
        raise _revert_error(computation)
    raise ServerError(str(computation.error) or type(computation.error).__name__)


def _vm_message(exc: VMError, request: ExecutionRequest) -> str:
    """What a VM error raised outside the computation says: init code over EIP-3860's
    limit is py-evm's OutOfGas there (the attack review s11-rpc, finding 1: answered as a
    bug, the child was killed and started again at every such call); geth's words."""
    if not request.to and len(request.data) > MAX_INITCODE_SIZE:
        return "max initcode size exceeded"
    return str(exc) or type(exc).__name__


def _execution_message(exc: ValidationError) -> str:
    text = str(exc)
    if "balance" in text.lower():
        return "insufficient funds for gas * price + value"
    if "intrinsic" in text.lower() or "insufficient gas" in text.lower():
        return "intrinsic gas too low"
    return text


def _transaction(vm: VirtualMachineAPI, state: StateAPI,
                 request: ExecutionRequest) -> SpoofTransaction:
    unsigned = vm.get_transaction_builder().create_unsigned_transaction(
        nonce=state.get_nonce(Address(request.sender)),
        gas_price=request.gas_price,
        gas=request.gas,
        to=Address(request.to),
        value=request.value,
        data=request.data,
    )
    return SpoofTransaction(unsigned, from_=request.sender)


class Executor:
    """Runs requests on the chain class over the parent's database."""

    def __init__(self, chain: type[Chain], db: ParentDB) -> None:
        self._chain_class = chain
        self._db = db

    def answer(self, request: ExecutionRequest) -> list[bytes]:
        try:
            with evm_deadline(request.timeout):
                output = self._execute(request)
        except ExecutionTimeout:
            return error_message(timeout_error(request.timeout))
        except RpcError as exc:
            return error_message(exc)
        if len(output) > MAX_FRAME_BYTES - 64:
            return error_message(ServerError(f"the output of {len(output)} bytes is over the limit "
                                      f"of {MAX_FRAME_BYTES - 64}"))
        return [OUTPUT, output]

    def _execute(self, request: ExecutionRequest) -> bytes:
        header = rlp.decode(request.header, sedes=HeaderSedes)
        chain = self._chain_class(AtomicDB(BatchDB(self._db)))
        vm = chain.get_vm(header)
        with vm.in_costless_state() as state:
            tx = _transaction(vm, state, request)
            try:
                computation = with_deadline(state).costless_execute_transaction(tx)
            except ValidationError as exc:
                raise ServerError(_execution_message(exc)) from None
            except VMError as exc:  # raised before the computation: the call's, not a bug
                raise ServerError(_vm_message(exc, request)) from None
        _raise_if_failed(computation)
        if not request.estimate:
            return computation.output
        vm = chain.get_vm(header)
        with vm.in_costless_state() as state:
            gas = chain.gas_estimator(with_deadline(state), _transaction(vm, state, request))
        return gas.to_bytes(8, "big")


def start(chain: bytes, channel: Channel) -> Callable[[ExecutionRequest], list[bytes]]:
    """The executor of the chain the parent described (its id and system contracts)."""
    chain_id, contracts = pickle.loads(chain)
    return Executor(chain_class(chain_id, contracts),
                    ParentDB(channel, ByteBoundedCache(CACHE_BYTES))).answer


def main() -> None:
    child_main(start, MAX_FRAME_BYTES)


if __name__ == "__main__":
    main()
