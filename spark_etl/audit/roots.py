"""transaction-hash, transactions-root, receipts-root: each block's tries rebuilt with py-trie
from the exported rows (key rlp(index), value the consensus encoding) and compared with the
header. Receipts are re-encoded from the receipts and logs tables (EIP-658 status,
cumulative gas, bloom, logs; EIP-2718 type prefix), so a changed receipt or log shows.

They run in the column rules' pass over each block (`column_rules.check_block`), which
decodes the block's rows once for every rule: a value these encodings need that does not
parse leaves its trie unchecked, and `malformed-value` reports it (a root is never computed
from a guess)."""

from __future__ import annotations

from spark_etl.audit.column_rules import (
    RECEIPTS_ROOT,
    TRANSACTION_HASH,
    TRANSACTIONS_ROOT,
    rule_of,
)

trie_roots = rule_of(TRANSACTION_HASH, TRANSACTIONS_ROOT, RECEIPTS_ROOT)
