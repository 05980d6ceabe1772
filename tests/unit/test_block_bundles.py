"""chain.rpc.bundles (`pbft_getBlockBundles`): each block's bytes equal py-evm's own (the RLP
block, every receipt's consensus encoding), the senders the transactions were signed by, the
engine's certificate and checkpoints beside them; the range is bounded before any work, and
the answer is a prefix within the byte limit, never empty while the first block exists."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import rlp

from chain.blockchain import Blockchain
from chain.rpc.bundles import MAX_BUNDLE_BLOCKS, METHOD, BlockBundles
from chain.rpc.errors import INVALID_PARAMS, RpcError
from chain.rpc.served import WorkerPool
from tests.unit.test_read_store import chain as read_store_chain  # noqa: F401 (a fixture)

CHECKPOINTED = 2  # the block the fake engine holds a checkpoint for
LIMIT = 25 * 1000 * 1000


@pytest.fixture
def read_chain(read_store_chain: Blockchain) -> Blockchain:  # noqa: F811
    """The read store's tests' chain: the ETL tests' (every transaction type, logs)."""
    return read_store_chain


async def _certificate(number: str) -> dict[str, Any]:
    return {"blockNumber": number}


async def _checkpoints(first: str, last: str) -> list[dict[str, Any]]:
    held = [{"seqNo": hex(CHECKPOINTED)}, {"seqNo": hex(CHECKPOINTED), "second": True}]
    return [c for c in held if int(first, 16) <= CHECKPOINTED <= int(last, 16)]


ENGINE = {"pbft_getCommitCertificate": _certificate, "pbft_getCheckpoints": _checkpoints}


def _ask(chain: Blockchain, first: Any, last: Any, limit: int = LIMIT) -> list[dict[str, Any]]:
    reads = WorkerPool(1, 4, "read")
    try:
        method = BlockBundles.methods_for(chain, reads, limit, ENGINE)[METHOD]
        answer: list[dict[str, Any]] = asyncio.run(method(first, last))
        return answer
    finally:
        reads.close()


def test_each_block_is_served_as_its_bytes(read_chain: Blockchain) -> None:
    head = read_chain.head().block_number
    answer = _ask(read_chain, "0x0", hex(head))
    assert [b["number"] for b in answer] == [hex(n) for n in range(head + 1)]
    for bundle in answer:
        header = read_chain.header_by_number(int(bundle["number"], 16))
        assert header is not None
        block = read_chain.block_by_header(header)
        assert bundle["block"] == "0x" + rlp.encode(block).hex()
        receipts = read_chain.receipts(header)
        assert bundle["receipts"] == ["0x" + r.encode().hex() for r in receipts]
        assert bundle["senders"] == ["0x" + tx.sender.hex() for tx in block.transactions]
        assert bundle["certificate"] == {"blockNumber": bundle["number"]}
        expected = 2 if header.block_number == CHECKPOINTED else 0
        assert len(bundle["checkpoints"]) == expected
    assert any(len(b["receipts"]) > 1 for b in answer)


def test_the_answer_stops_at_the_head(read_chain: Blockchain) -> None:
    head = read_chain.head().block_number
    assert len(_ask(read_chain, hex(head - 1), hex(head + 10))) == 2
    assert _ask(read_chain, hex(head + 1), hex(head + 10)) == []


@pytest.mark.parametrize(("first", "last"), [
    ("0x5", "0x4"),  # descending
    ("0x0", hex(MAX_BUNDLE_BLOCKS)),  # one block more than the limit
    ("0x01", "0x2"),  # not a quantity
    ("0x0", "0x" + "f" * 17),  # beyond 64 bits
])
def test_a_range_is_bounded_before_any_work(read_chain: Blockchain, first: str,
                                            last: str) -> None:
    with pytest.raises(RpcError) as refused:
        _ask(read_chain, first, last)
    assert refused.value.code == INVALID_PARAMS


def test_an_answer_within_the_byte_limit_is_a_prefix(read_chain: Blockchain) -> None:
    """A limit below one block's bytes still answers that block (the client continues from
    the next one); asked again from there, the rest comes block by block."""
    head = read_chain.head().block_number
    got: list[str] = []
    while len(got) <= head:
        answer = _ask(read_chain, hex(len(got)), hex(head), limit=1)
        assert len(answer) == 1
        got.extend(b["number"] for b in answer)
    assert got == [hex(n) for n in range(head + 1)]


def test_served_only_beside_the_engines_certificates(read_chain: Blockchain) -> None:
    reads = WorkerPool(1, 4, "read")
    try:
        assert BlockBundles.methods_for(read_chain, reads, LIMIT, {}) == {}
    finally:
        reads.close()
