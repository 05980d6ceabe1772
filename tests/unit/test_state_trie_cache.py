"""The state trie's node cache (`NodeCachingTrie`): tries that read their nodes from it write
the same roots and read the same values as py-evm's plain `HexaryTrie`, block after block,
although the trie changes the nodes it reads in place."""

from __future__ import annotations

import random

from trie import HexaryTrie
from trie.constants import BLANK_NODE_HASH

from chain.blockchain import NodeCachingTrie


def test_cached_tries_write_the_roots_and_read_the_values_of_plain_ones() -> None:
    rng = random.Random(5)
    keys = [rng.randbytes(32) for _ in range(300)]
    plain_db: dict[bytes, bytes] = {}
    cached_db: dict[bytes, bytes] = {}
    plain_root = cached_root = BLANK_NODE_HASH
    for _ in range(40):  # blocks: each a fresh trie on the last root, as py-evm's state
        plain = HexaryTrie(plain_db, plain_root)
        cached = NodeCachingTrie(cached_db, cached_root)
        for key in rng.sample(keys, 60):
            value = rng.choice([b"", rng.randbytes(rng.choice((1, 10, 30, 70)))])
            for trie in (plain, cached):
                with trie.squash_changes() as batch:
                    batch[key] = value  # an empty value deletes
        plain_root, cached_root = plain.root_hash, cached.root_hash
        assert cached_root == plain_root
        for key in rng.sample(keys, 30):
            assert cached[key] == plain[key]
