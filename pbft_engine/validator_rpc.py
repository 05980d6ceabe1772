"""JSON-RPC of validator-set votes (DESIGN.md section 10; research/membership.md 8.7).

`pbft_proposeValidatorVote(address, add)` and `pbft_discardValidatorVote(address)` sign a
registry transaction (`registry.ValidatorRegistry`) with this node's validator key, at its
pending nonce, with a fee cap of twice the next base fee (room for the base fee to rise while
it waits) and no tip, and submit it as eth_sendRawTransaction does; they return its hash. The
vote is first run through the registry's rules on the head's state as the next block would
count it, so one that would revert is refused here with the registry's reason and nothing is
sent (it could still revert if the chain moves before it is included: its receipt says so).

The reads answer from the registry's state at a block (`blockTag`: a number, "latest",
"safe", "finalized", "earliest", or "pending": the next block, counted on the head's state):
`pbft_getPendingVotes` (the network-wide tally), `pbft_getValidatorsByBlockNumber` and
`pbft_getValidatorsByBlockHash` (the set that decides that block), `pbft_getEpoch` (its
epoch, and the change scheduled after it). A block not there yet answers null. Every read of
the state runs on a bounded worker of its own (`REGISTRY_READS`), off the consensus loop.
"""

from __future__ import annotations

import logging
import reprlib
from collections.abc import Callable
from typing import Any

from eth_typing import Address

from chain.blockchain import ChainTransactionBuilder
from chain.engine import EngineContext, InvalidParams, RpcHandler
from chain.errors import TxPoolError
from chain.rpc.errors import RpcError, ServerError
from chain.rpc.hexcodec import parse_address, parse_hash, parse_quantity, quantity
from chain.rpc.served import WorkerPool
from chain.system_contracts import ContractStorage, ScratchStorage, SystemContractRevert
from pbft_engine.core.epochs import Epoch, EpochSchedule
from pbft_engine.core.params import EngineParams
from pbft_engine.registry import (
    REGISTRY_ADDRESS,
    REGISTRY_GAS,
    ValidatorRegistry,
    encode_retract,
    encode_vote,
)

INTRINSIC_GAS = 21_000
CALLDATA_BYTE_GAS = 16  # a non-zero byte's (EIP-2028): an upper bound for any calldata
HEAD_TAGS = ("latest", "safe", "finalized")  # every committed block is final (PBFT)
# Reading the registry's state (a walk of the state trie, up to n*n votes decoded) is a
# client's work: on a worker of its own, under the client-work governor, never on the loop
# that votes; bounded (one more is refused as "server busy").
REGISTRY_READS = WorkerPool(1, 64, "registry")


def _hex(address: bytes) -> str:
    return "0x" + address.hex()


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidParams(f"invalid argument 1: add must be true or false, not "
                            f"{reprlib.repr(value)}")
    return value


class ValidatorRpc:
    """The methods, on the node's context and the chain's parameters."""

    def __init__(self, context: EngineContext, params: EngineParams,
                 log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self.context = context
        self.registry = ValidatorRegistry(params)
        self.log = log

    def methods(self) -> dict[str, RpcHandler]:
        return {
            "pbft_proposeValidatorVote": self.propose,
            "pbft_discardValidatorVote": self.discard,
            "pbft_getPendingVotes": self.pending_votes,
            "pbft_getValidatorsByBlockNumber": self.validators_by_number,
            "pbft_getValidatorsByBlockHash": self.validators_by_hash,
            "pbft_getEpoch": self.epoch,
        }

    # Reads.

    def _number(self, tag: Any) -> int:
        """The block a tag names ("pending": the one after the head)."""
        head = self.context.head().block_number
        if tag in HEAD_TAGS:
            return head
        if tag == "earliest":
            return 0
        if tag == "pending":
            return head + 1
        if isinstance(tag, str) and tag.startswith("0x"):
            return parse_quantity(tag, "block number", bits=64)
        # reprlib: a client's 100 KB argument is not echoed back whole
        raise InvalidParams(f"invalid argument 0: {reprlib.repr(tag)} is not a block number "
                            f"or tag (latest, safe, finalized, earliest, pending)")

    def _state(self, number: int) -> ContractStorage | None:
        """The registry's storage as block `number` sees it: after it (what decides it was
        fixed before it), the head's for the next block; None above that."""
        head = self.context.head().block_number
        if number > head + 1:
            return None
        header = self.context.canonical_header(min(number, head))
        assert header is not None  # canonical up to the head
        return self.context.system_storage(header.hash, REGISTRY_ADDRESS)

    async def pending_votes(self, tag: Any = "latest") -> dict[str, Any] | None:
        return await REGISTRY_READS.run(self._pending_votes, tag)

    def _pending_votes(self, tag: Any) -> dict[str, Any] | None:
        number = self._number(tag)
        storage = self._state(number)
        if storage is None:
            return None
        counted_in = min(number, self.context.head().block_number) + 1
        return {_hex(t.subject): {"add": t.add, "voters": [_hex(v) for v in t.voters],
                                  "threshold": quantity(t.threshold),
                                  "expiresAt": quantity(t.expires_at)}
                for t in self.registry.pending(storage, counted_in)}

    def _schedule_for(self, number: int) -> EpochSchedule | None:
        """Every epoch the head's state knows, for a height up to the next block (a change
        passed after block n never decides n, so the head's history answers for every
        height below it, and knows where a past epoch ended); None above the next block."""
        if number > self.context.head().block_number + 1:
            return None
        storage = self._state(self.context.head().block_number)
        return None if storage is None else self.registry.schedule(storage)

    def _validators_of(self, number: int) -> list[str] | None:
        schedule = self._schedule_for(number)
        return None if schedule is None else [_hex(v) for v in schedule.set_at(number)]

    async def validators_by_number(self, tag: Any) -> list[str] | None:
        return await REGISTRY_READS.run(lambda: self._validators_of(self._number(tag)))

    async def validators_by_hash(self, block_hash: Any) -> list[str] | None:
        return await REGISTRY_READS.run(self._validators_by_hash, block_hash)

    def _validators_by_hash(self, block_hash: Any) -> list[str] | None:
        header = self.context.canonical_header_by_hash(parse_hash(block_hash, "block hash"))
        return None if header is None else self._validators_of(header.block_number)

    async def epoch(self, tag: Any = "latest") -> dict[str, Any] | None:
        return await REGISTRY_READS.run(self._epoch, tag)

    def _epoch(self, tag: Any) -> dict[str, Any] | None:
        number = self._number(tag)
        schedule = self._schedule_for(number)
        if schedule is None:
            return None
        epoch = schedule.epoch_at(number)
        later = schedule.epochs[epoch.number + 1:]
        scheduled = None
        if later:
            scheduled = {**_epoch_fields(later[0]), "passedAt": quantity(later[0].passed_at or 0)}
        return {**_epoch_fields(epoch),
                "lastBlock": quantity(later[0].first - 1) if later else None,
                "scheduled": scheduled}

    # Votes.

    async def propose(self, address: Any, add: Any) -> str:
        subject = parse_address(address, "address")
        adding = _flag(add)
        data = await REGISTRY_READS.run(
            self._checked, lambda epoch: encode_vote(subject, adding, epoch))
        if adding and subject not in self.context.peers():
            self.log.warning("voting to add 0x%s, which is not connected to this node: an "
                             "added validator must have followed the chain as an observer, "
                             "or the new set may not reach its quorum", subject.hex())
        return self._submit(data)

    async def discard(self, address: Any) -> str:
        subject = parse_address(address, "address")
        return self._submit(await REGISTRY_READS.run(
            self._checked, lambda epoch: encode_retract(subject, epoch)))

    def _me(self) -> bytes:
        key = self.context.validator_key
        if key is None:
            raise ServerError("this node has no validator key: only a validator votes")
        return key.public_key.to_canonical_address()

    def _checked(self, calldata: Callable[[int], bytes]) -> bytes:
        """The calldata for the next block's epoch, run through the registry's rules on the
        head's state as the next block would (a ServerError with its reason if it would
        revert; nothing is written)."""
        me = self._me()
        head = self.context.head()
        storage = self.context.system_storage(head.hash, REGISTRY_ADDRESS)
        assert storage is not None  # the head is canonical
        next_block = head.block_number + 1
        epoch = self.registry.schedule(storage).epoch_at(next_block)
        if me not in epoch.validators:
            raise ServerError(f"this node ({_hex(me)}) is not a validator of epoch "
                              f"{epoch.number}, the set deciding the next block")
        data = calldata(epoch.number)
        try:
            self.registry.call(ScratchStorage(storage), me, data, next_block)
        except SystemContractRevert as exc:
            raise ServerError(exc.reason) from None
        return data

    def _submit(self, data: bytes) -> str:
        """Signed and admitted on the loop (the pool is the loop's)."""
        key = self.context.validator_key
        assert key is not None  # checked by _checked
        unsigned = ChainTransactionBuilder.new_unsigned_dynamic_fee_transaction(
            chain_id=self.context.chain_id,
            nonce=self.context.pending_nonce(key.public_key.to_canonical_address()),
            max_priority_fee_per_gas=0,
            max_fee_per_gas=2 * self.context.fee_floor(),
            gas=INTRINSIC_GAS + CALLDATA_BYTE_GAS * len(data) + REGISTRY_GAS,
            to=Address(REGISTRY_ADDRESS), value=0, data=data, access_list=())
        try:
            tx_hash = self.context.submit_transaction(unsigned.as_signed_transaction(key).encode())
        except TxPoolError as exc:
            raise RpcError(exc.code, exc.message) from None
        return "0x" + tx_hash.hex()


def _epoch_fields(epoch: Epoch) -> dict[str, Any]:
    return {"epoch": quantity(epoch.number), "firstBlock": quantity(epoch.first),
            "validators": [_hex(v) for v in epoch.validators], "n": quantity(epoch.n),
            "f": quantity(epoch.f), "quorum": quantity(epoch.quorum)}


def validator_rpc_methods(context: EngineContext, params: EngineParams,
                          log: logging.Logger | logging.LoggerAdapter[Any]
                          ) -> dict[str, RpcHandler]:
    """What the pbft engine's `rpc_methods` merges."""
    return ValidatorRpc(context, params, log).methods()
