"""`pbft-node` that kills itself with SIGKILL at a chosen database write, for crash tests.

Run as `python crashing_node.py POINT COUNT WHEN ARGS...` in place of `python -m cli.node
ARGS...`. POINT is `commit` (the batch that makes a block canonical: a commit in view or a
catch-up import) or `gc` (a consensus batch that moves the low watermark: it range-deletes
the certificate store below the new stable checkpoint). At the COUNT-th such batch the process
kills itself, WHEN: `before` the batch is written, `during` (a thread fires the signal 0 to
2 ms after the write starts, while LevelDB appends and syncs its log) or `after` it returned
(before the engine's next step persists anything).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from chain.blockchain import Blockchain
from cli.node import main
from pbft_engine.core.records import DeleteRange, StoreName, StoreOp
from pbft_engine.record_store import LevelDBConsensusStore
from storage import WriteBatch

POINTS = ("commit", "gc")
WHENS = ("before", "during", "after")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _install(point: str, count: int, when: str) -> None:
    marked: set[int] = set()  # ids of the batches that are writes of the chosen kind
    seen = [0]

    original_commit_chain = Blockchain.commit_chain
    original_store_write = LevelDBConsensusStore.write
    original_exit = WriteBatch.__exit__

    # Every block that becomes canonical does so here: a commit in view (`Blockchain.commit`)
    # and a catch-up range, whose blocks are written in one batch.
    def commit_chain(self: Blockchain, blocks: Sequence[Any], batch: WriteBatch) -> None:
        original_commit_chain(self, blocks, batch)
        if point == "commit":
            marked.add(id(batch))

    def store_write(self: LevelDBConsensusStore, batch: WriteBatch, ops: Sequence[StoreOp]
                    ) -> None:
        original_store_write(self, batch, ops)
        if point == "gc" and any(isinstance(op, DeleteRange) and op.store is
                                 StoreName.CERT_STORE for op in ops):
            marked.add(id(batch))

    def exit_(self: WriteBatch, *exc_info: Any) -> None:
        if id(self) not in marked or exc_info[0] is not None:
            return original_exit(self, *exc_info)
        marked.discard(id(self))
        seen[0] += 1
        if seen[0] == count:
            if when == "before":
                _die()
            if when == "during":
                timer = threading.Timer(random.uniform(0, 0.002), _die)
                timer.start()
        original_exit(self, *exc_info)
        if seen[0] == count:
            _die()  # `after`, or `during` when the write beat the timer

    Blockchain.commit_chain = commit_chain  # type: ignore[method-assign]
    LevelDBConsensusStore.write = store_write  # type: ignore[method-assign]
    WriteBatch.__exit__ = exit_  # type: ignore[method-assign]


if __name__ == "__main__":
    point, count, when, *args = sys.argv[1:]
    if point not in POINTS or when not in WHENS:
        sys.exit(f"usage: crashing_node.py {'|'.join(POINTS)} COUNT {'|'.join(WHENS)} ARGS...")
    _install(point, int(count), when)
    sys.exit(main(args))
