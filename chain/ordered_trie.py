"""The root and nodes of a block's transaction or receipt trie, built in one pass.

Both tries map rlp(index) to the item's encoding for indices 0..n-1. py-evm builds them by
inserting the items one by one into a `HexaryTrie` (`eth.db.trie.make_trie_root_and_nodes`),
which reads, decodes, re-encodes and hashes the path to each new leaf again: about 0.3 ms a
transaction for the two tries of a full block of transfers, a fifth of executing the block.
All keys are known up front and RLP is prefix-free, so the trie can instead be built bottom
up from the sorted keys, each node encoded and hashed once. The result is the same root and
the same node database (`tests/unit/test_ordered_trie.py` compares the two).

A node whose encoding is shorter than 32 bytes is embedded in its parent rather than stored
by hash, and the root is always hashed and stored (the Yellow Paper, appendix D).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import rlp
from eth.db import trie as py_evm_trie
from eth_hash.auto import keccak
from trie.constants import BLANK_NODE_HASH
from trie.utils.nibbles import bytes_to_nibbles
from trie.utils.nodes import compute_extension_key, compute_leaf_key

Nibbles = tuple[int, ...]
Node = list[Any]
BRANCH_WIDTH = 16
# py-evm recomputes a block's transaction root when it validates and persists the block it
# just built or imported: the last few results are kept, so that costs no second build.
RECENT_TRIES = 4


def install() -> None:
    """Have py-evm build every block's transaction, receipt and withdrawal tries here (the
    same roots and nodes), in this process. The node does it when it is constructed; the raw
    benchmark, which measures py-evm alone, never constructs one."""
    built = functools.lru_cache(RECENT_TRIES)(ordered_trie_root_and_nodes)
    setattr(py_evm_trie, "_make_trie_root_and_nodes", built)  # noqa: B010 (py-evm's own name)


def ordered_trie_root_and_nodes(items: Sequence[bytes]) -> tuple[bytes, dict[bytes, bytes]]:
    """keccak of the root node, and every node stored by hash (the root included)."""
    if not items:
        return BLANK_NODE_HASH, {}
    nodes: dict[bytes, bytes] = {}
    pairs = sorted((bytes_to_nibbles(rlp.encode(index)), item)
                   for index, item in enumerate(items))
    encoded_root = rlp.encode(_node(pairs, 0, nodes))
    root_hash = keccak(encoded_root)
    nodes[root_hash] = encoded_root
    return root_hash, nodes


def _node(pairs: list[tuple[Nibbles, bytes]], depth: int, nodes: dict[bytes, bytes]) -> Node:
    """The node holding `pairs` (sorted, sharing their first `depth` nibbles)."""
    first_key, first_value = pairs[0]
    if len(pairs) == 1:
        return [compute_leaf_key(first_key[depth:]), first_value]
    shared = _shared_prefix(first_key, pairs[-1][0], depth)  # sorted: first and last suffice
    if shared > depth:
        return [compute_extension_key(first_key[depth:shared]),
                _reference(_branch(pairs, shared, nodes), nodes)]
    return _branch(pairs, depth, nodes)


def _branch(pairs: list[tuple[Nibbles, bytes]], depth: int, nodes: dict[bytes, bytes]) -> Node:
    branch: Node = [b""] * (BRANCH_WIDTH + 1)
    start = 0
    if len(pairs[0][0]) == depth:  # a key that ends here (never for rlp indices) sorts first
        branch[BRANCH_WIDTH] = pairs[0][1]
        start = 1
    while start < len(pairs):
        nibble = pairs[start][0][depth]
        end = start + 1
        while end < len(pairs) and pairs[end][0][depth] == nibble:
            end += 1
        branch[nibble] = _reference(_node(pairs[start:end], depth + 1, nodes), nodes)
        start = end
    return branch


def _reference(node: Node, nodes: dict[bytes, bytes]) -> Node | bytes:
    """How a parent refers to `node`: embedded if its encoding is short, else by hash."""
    encoded = rlp.encode(node)
    if len(encoded) < 32:
        return node
    node_hash = keccak(encoded)
    nodes[node_hash] = encoded
    return node_hash


def _shared_prefix(left: Nibbles, right: Nibbles, depth: int) -> int:
    """The length of the common prefix of two keys that agree on their first `depth`."""
    end = min(len(left), len(right))
    while depth < end and left[depth] == right[depth]:
        depth += 1
    return depth
