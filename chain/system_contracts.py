"""System contracts: native handlers at fixed addresses that the chain's VM runs for a call
to their address, with storage in the state trie (DESIGN.md section 10).

A system contract is a precompile with storage and a revert reason. py-evm runs a precompile
for any message whose code address is one of its computation's `precompiles` (transactions
and CALLs alike: `BaseComputation.apply_computation`, py-evm 0.12); the chain's VM adds each
engine's contracts there (`chain.blockchain.chain_class`). A call costs the transaction's
intrinsic gas (21,000 and its calldata) plus the contract's fixed `gas`; its storage is the
account's own storage, so the state root (and every checkpoint that signs it) commits to it;
a refusal is a REVERT with standard `Error(string)` data, so web3 and cast show the reason,
and the call's writes are undone with it. Chain stays generic: the engine class provides its
contracts (`ConsensusEngine.system_contracts`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

from eth.abc import ComputationAPI, StateAPI
from eth.exceptions import Revert, WriteProtection
from eth_typing import Address
from eth_utils import keccak

WORD = 32
ERROR_SELECTOR = keccak(b"Error(string)")[:4]  # Solidity's revert reason (0x08c379a0)


class SystemContractRevert(Exception):
    """The call is refused: it reverts with `reason` (its writes undone, its gas paid)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ContractStorage(ABC):
    """A system contract's 32-byte storage slots (ints, as the EVM's SLOAD/SSTORE see them)."""

    @abstractmethod
    def get(self, slot: int) -> int: ...

    @abstractmethod
    def set(self, slot: int, value: int) -> None: ...


class StateStorage(ContractStorage):
    """The storage of `address` in a py-evm state; read-only unless `writable`."""

    def __init__(self, state: StateAPI, address: bytes, *, writable: bool) -> None:
        self._state = state
        self._address = Address(address)
        self._writable = writable

    def get(self, slot: int) -> int:
        return self._state.get_storage(self._address, slot)

    def set(self, slot: int, value: int) -> None:
        if not self._writable:
            raise WriteProtection("a system contract's storage is read-only in a static call")
        if self._state.get_nonce(self._address) == 0:
            # EIP-161 deletes a touched account with no code, nonce or balance, storage and
            # all, at the end of the transaction; a contract's account starts at nonce 1.
            self._state.set_nonce(self._address, 1)
        self._state.set_storage(self._address, slot, value)


class ScratchStorage(ContractStorage):
    """Writes kept in memory over a read-only `base` (none: empty storage): a dry run's."""

    def __init__(self, base: ContractStorage | None = None) -> None:
        self._base = base
        self.slots: dict[int, int] = {}

    def get(self, slot: int) -> int:
        if slot in self.slots:
            return self.slots[slot]
        return 0 if self._base is None else self._base.get(slot)

    def set(self, slot: int, value: int) -> None:
        self.slots[slot] = value


class SystemContract(ABC):
    """A native contract at `address`; each call costs `gas` beyond the intrinsic gas."""

    address: bytes
    gas: int

    @abstractmethod
    def call(self, storage: ContractStorage, sender: bytes, data: bytes,
             block_number: int) -> bytes:
        """The output of a call by `sender` with calldata `data`, executed in block
        `block_number`; raises SystemContractRevert to refuse it."""


def revert_data(reason: str) -> bytes:
    """ABI `Error(string)`: what Solidity's `revert(reason)` returns."""
    text = reason.encode()
    padded = text + b"\0" * (-len(text) % WORD)
    return ERROR_SELECTOR + WORD.to_bytes(WORD, "big") + len(text).to_bytes(WORD, "big") + padded


def _run(contract: SystemContract, computation: ComputationAPI) -> ComputationAPI:
    computation.consume_gas(contract.gas, reason=f"system contract 0x{contract.address.hex()}")
    message = computation.msg
    try:
        if message.storage_address != contract.address:
            raise SystemContractRevert("a system contract runs only by CALL (not DELEGATECALL "
                                       "or CALLCODE)")
        if message.value:
            raise SystemContractRevert("a system contract takes no value")
        storage = StateStorage(computation.state, contract.address, writable=not message.is_static)
        computation.output = contract.call(storage, message.sender, message.data_as_bytes,
                                           computation.state.block_number)
    except SystemContractRevert as exc:
        computation.output = revert_data(exc.reason)
        raise Revert(computation.output) from None
    return computation


def precompiles(contracts: Sequence[SystemContract]
                ) -> Mapping[Address, Callable[[ComputationAPI], ComputationAPI]]:
    """The contracts as py-evm precompiles, by address."""
    def runner(contract: SystemContract) -> Callable[[ComputationAPI], ComputationAPI]:
        return lambda computation: _run(contract, computation)

    return {Address(contract.address): runner(contract) for contract in contracts}


# A blob of bytes over consecutive slots: its length at `base`, its 32-byte words after it.

def read_blob(storage: ContractStorage, base: int) -> bytes:
    length = storage.get(base)
    words = b"".join(storage.get(base + 1 + i).to_bytes(WORD, "big")
                     for i in range(-(-length // WORD)))
    return words[:length]


def write_blob(storage: ContractStorage, base: int, data: bytes) -> None:
    """`data` at `base`; the words of a longer blob there before are cleared (an empty blob
    leaves no slot set: the storage is as if nothing was ever written)."""
    old_words = -(-storage.get(base) // WORD)
    padded = data + b"\0" * (-len(data) % WORD)
    words = [int.from_bytes(padded[i:i + WORD], "big") for i in range(0, len(padded), WORD)]
    storage.set(base, len(data))
    for i in range(max(len(words), old_words)):
        storage.set(base + 1 + i, words[i] if i < len(words) else 0)
