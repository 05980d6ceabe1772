"""The BFT client: a transaction counts as done when f+1 validators report the same receipt.

The f+1 reply rule (docs/ARCHITECTURE.md, section 2): the client signs a transaction, submits
it to one node, then polls every validator for its receipt until f+1 distinct validators
(f = (N-1)//3) report the same (block hash, status, gas used, block number); at most f
validators are faulty, so at least one of them is correct and the transaction really
committed in that block. N is the set that decided that block: the agreeing validators' word
about it is checked against the commitment of the block before (`block_set`), and if a set
change made it another set than the configured one, f+1 of that set are needed (those of
its members configured here). If that does not
happen within `Timeouts.resend_after` seconds the raw transaction is re-sent to every validator
(the node it went to may be down or faulty), again after twice as long, and so on, until
`Timeouts.deadline`.

A validator's identity is the address this client was configured with for its URL: a node's
word about who it is counts for nothing, and each validator's latest answer is one vote.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

import rlp
from eth_hash.auto import keccak
from eth_keys.datatypes import PrivateKey
from eth_utils import is_hex_address, to_canonical_address, to_checksum_address

from bft_client.block_set import BlockSet, block_set, proven_set
from bft_client.errors import (
    BftClientError,
    NoAgreement,
    RpcReplyError,
    RpcUnreachable,
    TransactionRejected,
)
from bft_client.tally import ReceiptKey, ReplyTally, fault_tolerance, quantity, receipt_key
from bft_client.transport import HttpTransport, RpcTransport

MIN_CALL_TIMEOUT = 0.1  # the shortest time a call gets, even right before the deadline
ALREADY_KNOWN = "already known"  # the pool's answer for a transaction it holds (not an error)
DYNAMIC_FEE_TYPE = b"\x02"  # EIP-1559's transaction type


@dataclass(frozen=True)
class Timeouts:
    """Seconds. Polls start at `poll_interval` and double up to `max_poll_interval`."""

    request: float = 5.0  # one JSON-RPC call
    poll_interval: float = 0.2
    max_poll_interval: float = 2.0
    resend_after: float = 10.0  # first re-send to every validator; the interval then doubles
    deadline: float = 60.0  # give up (NoAgreement)

    def max_rounds(self) -> int:
        """A hard cap on polling rounds, whatever the clock does."""
        return int(self.deadline / self.poll_interval) + 2


@dataclass(frozen=True)
class TxRequest:
    """An EIP-1559 transaction; fields left None are filled from a node."""

    to: str | None = None  # None deploys `data`
    value: int = 0
    data: bytes = b""
    gas: int | None = None
    nonce: int | None = None
    max_fee_per_gas: int | None = None
    max_priority_fee_per_gas: int | None = None
    chain_id: int | None = None


@dataclass(frozen=True)
class ConfirmedReceipt:
    tx_hash: str
    receipt: dict[str, Any]  # as the first agreeing validator reported it
    key: ReceiptKey
    agreeing: tuple[str, ...]  # validator addresses, in configured order
    disagreeing: dict[str, ReceiptKey]  # validators that reported a different receipt
    validators: int  # N of the set that decided the block
    needed: int  # its f+1
    resends: int  # how many times the transaction was re-sent to every validator

    @property
    def block_number(self) -> int:
        return quantity(self.receipt.get("blockNumber"), "receipt blockNumber")


def sign_transaction(key: PrivateKey, request: TxRequest) -> bytes:
    """The raw EIP-1559 transaction (type 2, EIP-2718 envelope); every field of `request`
    must be filled. Signed over keccak(0x02 || rlp(fields)), as EIP-1559 specifies."""
    fields: list[object] = [request.chain_id, request.nonce, request.max_priority_fee_per_gas,
              request.max_fee_per_gas, request.gas,
              to_canonical_address(request.to) if request.to else b"", request.value,
              request.data, []]
    signature = key.sign_msg_hash(keccak(DYNAMIC_FEE_TYPE + rlp.encode(fields)))
    return DYNAMIC_FEE_TYPE + rlp.encode([*fields, signature.v, signature.r, signature.s])


def _checked_validators(validators: Mapping[str, str]) -> dict[str, str]:
    """Checksummed address -> URL; every address valid, every URL a different node."""
    if not validators:
        raise BftClientError("no validators configured")
    checked: dict[str, str] = {}
    for address, url in validators.items():
        if not is_hex_address(address):
            raise BftClientError(f"validator {address!r} is not an address")
        checked[to_checksum_address(address)] = url.rstrip("/")
    if len(set(checked.values())) != len(checked):
        raise BftClientError("two validators share one URL: each validator needs its own node")
    return checked


@dataclass
class _ResendTimer:
    """When to re-send to every validator: after `resend_after`, then twice as long each time."""

    every: float
    due_at: float
    count: int = 0

    def take(self, now: float) -> bool:
        """Whether a re-send is due now; if so, the next one is due twice as long later."""
        if now < self.due_at:
            return False
        self.count += 1
        self.every *= 2
        self.due_at = now + self.every
        return True


class BftClient:
    """Sends transactions to a validator set and confirms them by f+1 matching receipts."""

    def __init__(
        self,
        validators: Mapping[str, str],
        *,
        transport: RpcTransport | None = None,
        timeouts: Timeouts | None = None,
    ) -> None:
        self.validators = _checked_validators(validators)
        self.needed = fault_tolerance(len(self.validators)) + 1
        self.timeouts = timeouts or Timeouts()
        self._transport = transport or HttpTransport()
        self._checked_node: str | None = None

    async def __aenter__(self) -> BftClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._transport.close()

    async def _call(
        self, validator: str, method: str, params: list[Any], deadline: float | None = None
    ) -> Any:
        timeout = self.timeouts.request
        if deadline is not None:
            timeout = max(MIN_CALL_TIMEOUT, min(timeout, deadline - time.monotonic()))
        # a node that is no validator (an observer `via`) is named by its URL
        url = self.validators.get(validator, validator)
        return await self._transport.call(url, method, params, timeout)

    async def check_validators(self) -> str:
        """The first reachable validator, once its `pbft_getValidators` equals the configured
        set (a check against misconfiguration, not against a lying node)."""
        if self._checked_node is not None:
            return self._checked_node
        failures = []
        for validator in self.validators:
            try:
                reported = await self._call(validator, "pbft_getValidators", [])
            except RpcUnreachable as exc:
                failures.append(f"{validator}: {exc}")
                continue
            except RpcReplyError as exc:
                raise BftClientError(
                    f"{validator} answered pbft_getValidators with an error ({exc.message}): "
                    "is it a PBFT validator?"
                ) from None
            self._compare_validator_set(validator, reported)
            self._checked_node = validator
            return validator
        raise BftClientError("no validator is reachable: " + "; ".join(failures))

    def _compare_validator_set(self, validator: str, reported: Any) -> None:
        if not isinstance(reported, list) or not all(is_hex_address(a) for a in reported):
            raise BftClientError(f"{validator} answered pbft_getValidators with {reported!r}")
        if {to_checksum_address(a) for a in reported} != set(self.validators):
            raise BftClientError(
                f"the configured validators are not the chain's: {validator} reports "
                f"{', '.join(to_checksum_address(a) for a in reported)}"
            )

    def resolve_via(self, via: str | None) -> str | None:
        """The validator named by address or URL (None: the first reachable one), or the URL
        of another node (an observer: it forwards the transaction to the validators, whose
        receipts confirm it all the same)."""
        if via is None:
            return None
        for validator, url in self.validators.items():
            if via.rstrip("/") == url or via.lower() == validator.lower():
                return validator
        if via.startswith(("http://", "https://")):
            return via.rstrip("/")
        raise BftClientError(f"{via} is not one of the configured validators, nor a URL")

    async def _query(self, node: str, method: str, params: list[Any]) -> Any:
        """A call whose failure ends the send, with the method and node in the message."""
        try:
            return await self._call(node, method, params)
        except BftClientError as exc:
            raise BftClientError(f"{method} on {node}: {exc}") from None

    async def fill(self, sender: str, request: TxRequest) -> TxRequest:
        """`request` with chain id, nonce (pending), fees and gas filled from a node."""
        node = await self.check_validators()
        chain_id = request.chain_id
        if chain_id is None:
            chain_id = quantity(await self._query(node, "eth_chainId", []), "eth_chainId")
        nonce = request.nonce
        if nonce is None:
            count = await self._query(node, "eth_getTransactionCount", [sender, "pending"])
            nonce = quantity(count, "eth_getTransactionCount")
        priority, max_fee = await self._fees(node, request)
        filled = replace(
            request,
            chain_id=chain_id,
            nonce=nonce,
            max_priority_fee_per_gas=priority,
            max_fee_per_gas=max_fee,
        )
        if request.gas is not None:
            return filled
        return replace(filled, gas=await self._estimate_gas(node, sender, filled))

    async def _fees(self, node: str, request: TxRequest) -> tuple[int, int]:
        """(max priority fee, max fee): the node's tip, and twice the base fee plus the tip."""
        priority = request.max_priority_fee_per_gas
        if priority is None:
            tip = await self._query(node, "eth_maxPriorityFeePerGas", [])
            priority = quantity(tip, "eth_maxPriorityFeePerGas")
        if request.max_fee_per_gas is not None:
            return priority, request.max_fee_per_gas
        head = await self._query(node, "eth_getBlockByNumber", ["latest", False])
        base = head.get("baseFeePerGas") if isinstance(head, dict) else None
        base_fee = quantity(base, "latest block baseFeePerGas")
        return priority, 2 * base_fee + priority

    async def _estimate_gas(self, node: str, sender: str, request: TxRequest) -> int:
        call: dict[str, Any] = {
            "from": sender,
            "value": hex(request.value),
            "data": "0x" + request.data.hex(),
        }
        if request.to:
            call["to"] = request.to
        return quantity(await self._query(node, "eth_estimateGas", [call]), "eth_estimateGas")

    async def send_transaction(
        self, key: PrivateKey, request: TxRequest, via: str | None = None
    ) -> ConfirmedReceipt:
        """Fill, sign, submit and confirm."""
        filled = await self.fill(key.public_key.to_checksum_address(), request)
        return await self.send_raw_transaction(sign_transaction(key, filled), via)

    async def send_raw_transaction(self, raw: bytes, via: str | None = None) -> ConfirmedReceipt:
        """Submit `raw` through `via` (a validator address or URL) and wait for f+1 receipts."""
        first_reachable = await self.check_validators()
        submit_to = self.resolve_via(via) or first_reachable
        tx_hash = "0x" + keccak(raw).hex()
        start = time.monotonic()
        tally = ReplyTally(list(self.validators), self.needed)
        # the submission gets no longer than the first re-send would: then all are tried
        submit_by = start + min(self.timeouts.resend_after, self.timeouts.deadline)
        await self._submit(submit_to, raw, tally, submit_by)
        return await self._confirm(raw, tx_hash, tally, start)

    async def _push_raw(self, validator: str, raw: bytes, deadline: float) -> None:
        await self._call(validator, "eth_sendRawTransaction", ["0x" + raw.hex()], deadline)

    async def _submit(self, validator: str, raw: bytes, tally: ReplyTally, deadline: float) -> None:
        try:
            await self._push_raw(validator, raw, deadline)
        except RpcReplyError as exc:
            if exc.message != ALREADY_KNOWN:
                raise TransactionRejected(
                    f"{validator} rejected the transaction: {exc.message}"
                ) from None
        except RpcUnreachable as exc:  # the re-send timer will reach the others
            tally.record_note(validator, f"submission failed: {exc}")

    async def _confirm(
        self, raw: bytes, tx_hash: str, tally: ReplyTally, start: float
    ) -> ConfirmedReceipt:
        """Watch every validator at once (a slow one delays nobody) until f+1 agree."""
        changed = asyncio.Event()
        deadline = start + self.timeouts.deadline
        timer = _ResendTimer(self.timeouts.resend_after, start + self.timeouts.resend_after)
        tasks = [
            asyncio.create_task(self._watch(v, tx_hash, tally, changed, deadline))
            for v in self.validators
        ]
        try:
            agreed = await self._await_agreement(raw, tally, changed, timer, deadline, tasks)
        finally:
            for task in tasks:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        if agreed is None:
            raise NoAgreement(
                f"no {tally.needed} of {len(tally.validators)} validators agreed on a receipt for "
                f"{tx_hash} within {self.timeouts.deadline:g}s: {tally.describe()}"
            )
        return self._confirmed(tx_hash, tally, agreed, timer.count)

    async def _await_agreement(
        self,
        raw: bytes,
        tally: ReplyTally,
        changed: asyncio.Event,
        timer: _ResendTimer,
        deadline: float,
        tasks: list[asyncio.Task[None]],
    ) -> tuple[ReceiptKey, tuple[str, ...]] | None:
        """Re-count after every answer, re-send to all when the timer fires; None at the
        deadline. The re-sends join `tasks`."""
        proven: dict[ReceiptKey, tuple[str, ...]] = {}
        for _ in range((len(self.validators) + 1) * self.timeouts.max_rounds()):
            agreed = await self._settled(tally, proven, deadline)
            now = time.monotonic()
            if agreed is not None or now >= deadline:
                return agreed
            if timer.take(now):
                tasks.extend(
                    asyncio.create_task(self._push_quietly(v, raw, deadline))
                    for v in self.validators
                )
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(timer.due_at, deadline) - now)
        return await self._settled(tally, proven, deadline)

    async def _settled(
        self, tally: ReplyTally, proven: dict[ReceiptKey, tuple[str, ...]], deadline: float
    ) -> tuple[ReceiptKey, tuple[str, ...]] | None:
        """The receipt f+1 of the counted validators agree on, once they are the set that
        decided its block (DESIGN.md section 10: a set change moves the count to the new
        set). If another set decided it, its members are counted from now on (None)."""
        agreed = tally.agreement()
        if agreed is None:
            return None
        key, agreeing = agreed
        if key not in proven:
            decided = await self._deciding_set(key.block_number, agreeing, deadline)
            if decided is None:
                return None
            proven[key] = decided
        if set(proven[key]) == set(tally.validators):
            return agreed
        tally.count_among(proven[key])
        return None

    async def _deciding_set(
        self, number: int, agreeing: tuple[str, ...], deadline: float
    ) -> tuple[str, ...] | None:
        """The set that decided block `number`, as the validators that agree on a receipt in
        it all answer (`block_set`); None while one of them does not answer."""

        async def ask(validator: str) -> BlockSet:
            validators = await self._call(validator, "pbft_getValidatorsByBlockNumber",
                                          [hex(number)], deadline)
            parent = await self._call(validator, "eth_getBlockByNumber",
                                      [hex(number - 1), False], deadline)
            return block_set(number, validators, parent)

        try:
            answers = await asyncio.gather(*(ask(v) for v in agreeing))
        except (RpcUnreachable, RpcReplyError):
            return None
        return proven_set(dict(zip(agreeing, answers, strict=True)), list(self.validators))

    async def _push_quietly(self, validator: str, raw: bytes, deadline: float) -> None:
        """A re-send: "already known", "nonce too low" or no answer do not matter, receipts do."""
        with contextlib.suppress(BftClientError):
            await self._push_raw(validator, raw, deadline)

    async def _watch(
        self,
        validator: str,
        tx_hash: str,
        tally: ReplyTally,
        changed: asyncio.Event,
        deadline: float,
    ) -> None:
        """Poll one validator for the receipt, pausing longer each time (capped)."""
        pause = self.timeouts.poll_interval
        for _ in range(self.timeouts.max_rounds()):
            await self._ask_receipt(validator, tx_hash, tally, deadline)
            changed.set()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await asyncio.sleep(min(pause, remaining))
            pause = min(2 * pause, self.timeouts.max_poll_interval)

    async def _ask_receipt(
        self, validator: str, tx_hash: str, tally: ReplyTally, deadline: float
    ) -> None:
        try:
            receipt = await self._call(validator, "eth_getTransactionReceipt", [tx_hash], deadline)
            if receipt is None:
                tally.record_note(validator, "no receipt yet")
            else:
                tally.record_receipt(validator, receipt_key(receipt, tx_hash), receipt)
        except BftClientError as exc:
            tally.record_note(validator, str(exc))

    def _confirmed(
        self,
        tx_hash: str,
        tally: ReplyTally,
        agreed: tuple[ReceiptKey, tuple[str, ...]],
        resends: int,
    ) -> ConfirmedReceipt:
        key, agreeing = agreed
        return ConfirmedReceipt(
            tx_hash=tx_hash,
            receipt=tally.receipt_of(agreeing[0]),
            key=key,
            agreeing=agreeing,
            disagreeing=tally.disagreeing(key),
            validators=len(tally.validators),
            needed=tally.needed,
            resends=resends,
        )
