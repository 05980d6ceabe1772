"""Issue 29, "no client can slow consensus": every client-driven computation of the JSON-RPC
side is bounded before it starts and runs off the event loop that carries consensus. Each
class of hostile input (a big JSON body, huge or many filters, a looping execution) is tried
here against the real parts while a ticker measures how long the event loop was held."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from eth.vm.spoof import SpoofTransaction
from eth_bloom import BloomFilter

from chain.blockchain import Blockchain
from chain.genesis import Genesis, GenesisAccount
from chain.read_store import StoredLog, TxRecord
from chain.rpc import dispatcher as dispatcher_module
from chain.rpc.dispatcher import (
    INLINE_DECODE_BYTES,
    MAX_DIGITS,
    MAX_JSON_VALUES,
    MAX_NUMBER_DIGITS,
    Dispatcher,
    decode_json,
)
from chain.rpc.errors import LIMIT_EXCEEDED, InvalidParams, RpcError
from chain.rpc.filters import (
    MAX_ADDRESSES,
    MAX_TOPIC_ALTERNATIVES,
    BlockLogs,
    FilterManager,
    LogCriteria,
    matching_logs,
)
from chain.rpc.served import ExecutionTimeout, WorkerPool, evm_deadline, with_deadline
from storage import Database

T = TypeVar("T")
MIB = 1024 * 1024
# The longest the event loop may be held by one hostile request here: generous for a shared
# two-core machine; the code before issue 29 held it 0.8 s to 9 s.
LOOP_HELD_AT_MOST = 0.25
# The same for log matching on its thread, which holds the interpreter the loop needs: on a
# loaded machine the scheduler stretches that (0.38-1.05 s seen beside make test's other
# suites, session 16); matched on the loop, 1,000 filters held it 5.7-8.8 s.
MATCHING_HELD_AT_MOST = 2.0


async def loop_held(work: Awaitable[T]) -> tuple[T, float]:
    """`work`'s result, and the longest a ticker on the same loop waited for its turn."""
    longest = 0.0
    stop = False

    async def tick() -> None:
        nonlocal longest
        last = time.monotonic()
        while not stop:
            await asyncio.sleep(0.001)
            now = time.monotonic()
            longest = max(longest, now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)  # the ticker runs
    try:
        return await work, longest
    finally:
        stop = True
        await ticker


# Big bodies.


def _body(unit: bytes, count: int) -> bytes:
    return (b'{"jsonrpc":"2.0","id":1,"method":"test_count","params":[['
            + b",".join([unit] * count) + b"]]}")


def _filling(unit: bytes, size: int) -> bytes:
    """A body of about `size` bytes: as many `unit` as fit."""
    return _body(unit, size // (len(unit) + 1))


async def _count(values: list[Any]) -> int:
    return len(values)


def _dispatch(body: bytes, runs: int = 3) -> tuple[dict[str, Any], float]:
    """The answer, and the least the loop was held over `runs` dispatches: other processes
    on the machine only add to what the request itself holds (a CI phase shares two cores
    with two other suites: 0.37 s once for 0.1 s of work), and a request that holds it too
    long holds it so every time."""
    dispatcher = Dispatcher({"test_count": _count})
    helds = []
    for _ in range(runs):
        answer, held = asyncio.run(loop_held(dispatcher.handle_payload(body)))
        assert answer is not None
        helds.append(held)
    return json.loads(answer), min(helds)


@pytest.mark.parametrize(
    "unit", [b"[" * 30 + b"]" * 30, b"[]", b'""', b"{}", b"0"],
    ids=["nested-arrays", "arrays", "strings", "objects", "numbers"])
def test_a_body_of_many_values_is_refused_before_it_is_parsed(unit: bytes) -> None:
    answer, held = _dispatch(_filling(unit, 5 * MIB))
    assert answer["error"] == {
        "code": -32700,
        "message": f"parse error: more than {MAX_JSON_VALUES} values: send it as smaller requests",
    }
    assert held < LOOP_HELD_AT_MOST


def test_long_numbers_are_refused_before_they_are_converted() -> None:
    answer, held = _dispatch(_filling(b"9" * 4_300, 5 * MIB))
    assert answer["error"]["message"] == (
        f"parse error: a number of more than {MAX_NUMBER_DIGITS} digits: send a hex quantity")
    assert held < LOOP_HELD_AT_MOST
    assert decode_json(b"[" + b"9" * MAX_NUMBER_DIGITS + b"]") == [int("9" * MAX_NUMBER_DIGITS)]
    floats, held = _dispatch(_body(b"1." + b"9" * 98, 40_000))  # 4 MB: each digit costs
    assert floats["error"]["message"] == (
        f"parse error: numbers of more than {MAX_DIGITS} digits in all: send it as smaller "
        "requests")
    assert held < LOOP_HELD_AT_MOST
    assert decode_json(b'["' + b"9" * 10_000 + b'"]') == ["9" * 10_000]  # digits in a string


@pytest.mark.parametrize(
    ("unit", "count"),
    [(b'"0x' + b"ab" * (2 * MIB) + b'"', 1),  # a big hex string, as a huge raw transaction
     (b'"0x' + b"ab" * 32 + b'"', MAX_JSON_VALUES - 100),  # hashes, all the bound allows
     (b"[1,[2,{}]]", (MAX_JSON_VALUES - 100) // 6)],  # six separators a unit
    ids=["hex", "hashes", "values"])
def test_large_bodies_within_the_bounds_are_decoded_off_the_loop(unit: bytes, count: int) -> None:
    body = _body(unit, count)
    answer, held = _dispatch(body)
    assert answer["result"] == count, answer
    assert held < LOOP_HELD_AT_MOST


@pytest.mark.parametrize(("character", "inline"), [("a", True), ("\u00e9", False),
                                                  ("\U0001f600", False)])
def test_text_is_decoded_on_the_loop_by_its_utf_8_size(
    monkeypatch: pytest.MonkeyPatch, character: str, inline: bool
) -> None:
    """A WebSocket text frame comes as text: INLINE_DECODE_BYTES bounds its UTF-8 bytes, not
    its characters (2 or 4 bytes each here: twice or four times the bound on the loop)."""
    decoded_on: list[bool] = []  # whether each decoding ran on the loop's thread

    def recorded(body: bytes | str) -> Any:
        decoded_on.append(threading.current_thread() is threading.main_thread())
        return decode_json(body)

    monkeypatch.setattr(dispatcher_module, "decode_json", recorded)
    head, tail = '{"jsonrpc":"2.0","id":1,"method":"test_count","params":["', '"]}'
    characters = INLINE_DECODE_BYTES - len(head) - len(tail)
    text = head + character * characters + tail  # INLINE_DECODE_BYTES characters

    async def length(value: str) -> int:
        return len(value)

    answer = asyncio.run(Dispatcher({"test_count": length}).handle_payload(text))
    assert answer is not None and json.loads(answer)["result"] == characters
    assert decoded_on == [inline]


def test_a_batch_of_a_thousand_calls_is_within_the_value_bound() -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "eth_call",
            "params": [{"from": "0x" + "11" * 20, "to": "0x" + "22" * 20,
                        "data": "0x" + "33" * 100}, "latest"]}
    assert len(decode_json(json.dumps([call] * 1_000))) == 1_000


# Filters.


@dataclass
class _Header:
    block_number: int
    hash: bytes
    timestamp: int
    bloom: int


TRANSFER = b"\xdd" * 32


def _log_block(logs: int, addresses: int) -> tuple[_Header, list[TxRecord]]:
    """A block of `logs` logs, one a transaction, from `addresses` contracts."""
    records, bloom = [], BloomFilter()
    for i in range(logs):
        address = (i % addresses).to_bytes(20, "big")
        topics = (TRANSFER, i.to_bytes(32, "big"), (i % 7).to_bytes(32, "big"))[: 1 + i % 3]
        for value in (address, *topics):
            bloom.add(value)
        records.append(TxRecord(b"\x01", i.to_bytes(32, "big"), b"\x02" * 20, 1, 21_000 * i,
                                21_000, 1, None, i, (StoredLog(address, topics, b"\x00" * 64),)))
    return _Header(1, b"\xab" * 32, 1_700_000_000, int(bloom)), records


def _hex(value: int, size: int) -> str:
    return "0x" + value.to_bytes(size, "big").hex()


def test_filter_criteria_are_bounded_before_they_are_parsed() -> None:
    addresses = [_hex(i, 20) for i in range(MAX_ADDRESSES)]
    assert len(LogCriteria.parse({"address": addresses}).addresses) == MAX_ADDRESSES
    with pytest.raises(InvalidParams, match=f"1001 addresses, at most {MAX_ADDRESSES}"):
        LogCriteria.parse({"address": [*addresses, "not even an address"]})
    topics = [_hex(i, 32) for i in range(MAX_TOPIC_ALTERNATIVES + 1)]
    with pytest.raises(InvalidParams, match="1001 topics in one position, at most 1000"):
        LogCriteria.parse({"topics": [None, topics]})


QUERIES: list[dict[str, Any]] = [
    {},
    {"address": _hex(3, 20)},
    {"address": [_hex(1, 20), _hex(2, 20), _hex(999, 20)]},
    {"topics": ["0x" + TRANSFER.hex()]},
    {"topics": [None, None]},
    {"topics": [None, None, None]},
    {"topics": [None, None, [_hex(2, 32), _hex(5, 32)]]},
    {"address": [_hex(2, 20), _hex(5, 20)], "topics": [None, [_hex(5, 32), _hex(12, 32)]]},
    {"topics": [None, None, None, None]},
    {"address": _hex(1234, 20)},
]


@pytest.mark.parametrize("query", QUERIES)
def test_block_logs_match_as_each_log_is_matched(query: dict[str, Any]) -> None:
    header, records = _log_block(60, 7)
    criteria = LogCriteria.parse(query)
    expected = list(matching_logs(criteria, header, records))  # type: ignore[arg-type]
    assert BlockLogs(header, records).matching(criteria) == expected  # type: ignore[arg-type]


def test_a_thousand_filters_on_a_thousand_log_block_stay_off_the_loop() -> None:
    """500 catch-all filters and 500 that each name 1,000 addresses: before issue 29,
    matching 1,000 of either held the loop 8.8 s or 5.7 s, formatting every log once per
    filter (1.4 GB)."""
    header, records = _log_block(1_000, 1_000)
    manager = FilterManager()
    everything = [manager.install("logs", LogCriteria(), {}) for _ in range(500)]
    addresses = LogCriteria.parse({"address": [_hex(i, 20) for i in range(1_000)]}).addresses
    narrow = [manager.install("logs", LogCriteria(addresses, (
        None, None, frozenset({(7 + i).to_bytes(32, "big")}))), {})  # none matches
        for i in range(500)]

    async def commit_and_poll() -> list[list[Any]]:
        manager.on_block(header, records)  # type: ignore[arg-type]
        return [await manager.take_changes(i) for i in everything + narrow]

    changes, held = asyncio.run(loop_held(commit_and_poll()))
    assert held < MATCHING_HELD_AT_MOST
    first = changes[0]
    assert [log["logIndex"] for log in first] == [hex(i) for i in range(1_000)]
    assert all(c == [] for c in changes[500:])
    assert all(a is b for c in changes[1:500] for a, b in zip(c, first, strict=True))


def test_a_poll_sees_every_block_committed_before_it() -> None:
    header, records = _log_block(10, 2)
    manager = FilterManager()
    logs = manager.install("logs", LogCriteria.parse({"address": _hex(1, 20)}), {})
    blocks = manager.install("blocks", None)

    async def commit_and_poll() -> tuple[list[Any], list[Any]]:
        for _ in range(3):
            manager.on_block(header, records)  # type: ignore[arg-type]
        return await manager.take_changes(logs), await manager.take_changes(blocks)

    found, hashes = asyncio.run(commit_and_poll())
    assert len(found) == 3 * 5 and hashes == ["0x" + "ab" * 32] * 3


# Workers and the EVM deadline.


def test_a_full_worker_pool_answers_busy_at_once() -> None:
    release = threading.Event()

    async def scenario() -> tuple[list[Any], str]:
        pool = WorkerPool(1, 2, "test")
        held = [asyncio.ensure_future(pool.run(release.wait)) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(RpcError) as busy:
            await pool.run(time.monotonic)
        assert busy.value.code == LIMIT_EXCEEDED
        release.set()
        results = await asyncio.gather(*held)
        await pool.run(time.monotonic)  # a slot is free again
        pool.close()
        return results, busy.value.message

    results, message = asyncio.run(scenario())
    assert results == [True, True]
    assert message == "server busy: 2 test requests are already running or waiting; retry later"


SENDER = b"\x11" * 20
LOOP_FOREVER = bytes.fromhex("5b600056")  # JUMPDEST PUSH1 0 JUMP: until out of gas
ADD_AND_RETURN = bytes.fromhex("600260030160005260206000f3")  # 2 + 3, returned as a word


@pytest.fixture(scope="module")
def blockchain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Blockchain]:
    genesis = Genesis(chain_id=1337, engine="dev", engine_params={},
                      alloc={SENDER: GenesisAccount(balance=10**24)}, timestamp=1_700_000_000)
    with Database(Path(tmp_path_factory.mktemp("evm")) / "chaindata") as db:
        yield Blockchain(db, genesis)


def _execute(blockchain: Blockchain, code: bytes, deadline: float | None) -> Any:
    """Runs `code` as a contract creation in a throwaway state, within `deadline` seconds."""
    vm = blockchain.vm_at(blockchain.head())
    unsigned = vm.get_transaction_builder().create_unsigned_transaction(
        nonce=0, gas_price=0, gas=30_000_000, to=b"", value=0, data=code)
    with vm.in_costless_state() as state:
        tx = SpoofTransaction(unsigned, from_=SENDER)
        if deadline is None:
            return state.costless_execute_transaction(tx)
        with evm_deadline(deadline):
            return with_deadline(state).costless_execute_transaction(tx)


def test_an_execution_stops_at_its_deadline(blockchain: Blockchain) -> None:
    started = time.monotonic()
    with pytest.raises(ExecutionTimeout):
        _execute(blockchain, LOOP_FOREVER, 0.2)  # 30M gas of looping: ~10 s without it
    assert 0.2 <= time.monotonic() - started < 1.5


def test_the_deadline_changes_no_result(blockchain: Blockchain) -> None:
    plain, timed = (_execute(blockchain, ADD_AND_RETURN, d) for d in (None, 5.0))
    assert timed.output == plain.output == (5).to_bytes(32, "big")
    assert timed.get_gas_used() == plain.get_gas_used()
    assert type(plain).opcodes[0x56] is not type(timed).opcodes[0x56]  # only RPC's are checked
