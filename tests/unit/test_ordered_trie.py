"""A block's transaction and receipt tries built in one pass: the same root and the same node
database as py-evm's item-by-item `HexaryTrie`, for every size and item length."""

from __future__ import annotations

import random

import pytest
import rlp
from eth.constants import BLANK_ROOT_HASH
from eth.db import trie as py_evm_trie
from trie import HexaryTrie

from chain.ordered_trie import install, ordered_trie_root_and_nodes

# Item lengths around the 32-byte line under which a node is embedded in its parent, and
# those of real transactions (~110 bytes) and receipts (~270 bytes); never empty (to a
# HexaryTrie an empty value deletes its key), as no encoding is.
LENGTHS = (1, 5, 20, *range(26, 34), 40, 110, 270)


def hexary_root_and_nodes(items: tuple[bytes, ...]) -> tuple[bytes, dict[bytes, bytes]]:
    """py-evm's way (`eth.db.trie`): insert rlp(index) -> item one by one."""
    nodes: dict[bytes, bytes] = {}
    trie = HexaryTrie(nodes, BLANK_ROOT_HASH)
    with trie.squash_changes() as batch:
        for index, item in enumerate(items):
            batch[rlp.encode(index)] = item
    return trie.root_hash, nodes


def random_items(rng: random.Random, count: int) -> tuple[bytes, ...]:
    return tuple(rng.randbytes(rng.choice(LENGTHS)) for _ in range(count))


@pytest.mark.parametrize("count", [*range(0, 40), 127, 128, 129, 255, 256, 257, 1_000, 1_100])
def test_the_same_root_and_nodes_as_py_evm(count: int) -> None:
    items = random_items(random.Random(count), count)
    assert ordered_trie_root_and_nodes(items) == hexary_root_and_nodes(items)


def test_installed_py_evm_builds_its_tries_here(monkeypatch: pytest.MonkeyPatch) -> None:
    items = random_items(random.Random(7), 300)
    monkeypatch.setattr(py_evm_trie, "_make_trie_root_and_nodes",
                        py_evm_trie._make_trie_root_and_nodes)  # py-evm's again afterwards
    install()
    assert py_evm_trie._make_trie_root_and_nodes.__wrapped__ is ordered_trie_root_and_nodes
    built = py_evm_trie.make_trie_root_and_nodes([_Encoded(item) for item in items])
    assert built == hexary_root_and_nodes(items)


class _Encoded:
    """An item as py-evm's block tries take it: anything with `encode()`."""

    def __init__(self, encoded: bytes) -> None:
        self.encoded = encoded

    def encode(self) -> bytes:
        return self.encoded
