"""The consensus records as JSON-RPC results (`pbft_*`): commit certificates, checkpoints,
view changes and equivocation evidence, each with the signed messages themselves, so anyone
holding only the validator set can verify them (`pbft_engine.messages`). A signer's replica
index names a member of the set of its message's height (`core.epochs.message_height`)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import rlp

from chain.rpc.child_process import ByteBoundedCache
from pbft_engine.core import RecordReader, StoreName
from pbft_engine.core.epochs import EpochSchedule, message_height
from pbft_engine.core.records import read_u64, u64, up_to
from pbft_engine.messages import (
    Checkpoint,
    MessageType,
    NewView,
    decode_commit_certificate,
    decode_signed_bytes,
)

MAX_RANGE = 10_000  # seqNos or views per pbft_getCheckpoints / pbft_getViewChanges call
# Stable checkpoints as JSON, by their stored bytes (each is permanent): making one decodes
# its Q messages (~0.2 ms), and a block bundle (chain/rpc/bundles.py) asks for every one in
# its range. Under 8 clients posting batches of bundles that was most of the node's client
# work (issue 29's hostile row); 4 MiB hold ~2,500 of them (25,000 blocks at the default
# checkpoint interval).
STABLE_CHECKPOINT_CACHE_BYTES = 4 * 1024 * 1024


def _hex(data: bytes) -> str:
    return "0x" + data.hex()


class ConsensusRecords:
    def __init__(self, store: RecordReader, schedule: Callable[[], EpochSchedule]) -> None:
        self.store = store
        self.schedule = schedule  # every epoch committed state knows
        self._stable = ByteBoundedCache(STABLE_CHECKPOINT_CACHE_BYTES)
        self._stable_lock = threading.Lock()  # read workers' threads and the loop ask

    def _address(self, replica: int, height: int) -> str | None:
        """Replica `replica` of the set of `height` (None: no such member)."""
        validators = self.schedule().set_at(height)
        return _hex(validators[replica]) if replica < len(validators) else None

    def commit_certificate(self, block_number: int) -> dict[str, Any] | None:
        """The permanent commit certificate of a block and its signers."""
        certificate = self.store.get(StoreName.COMMIT_CERTIFICATES, u64(block_number))
        if certificate is None:
            return None
        commits = decode_commit_certificate(certificate)
        return {
            "blockNumber": hex(block_number),
            "blockHash": _hex(commits[0].body.digest),
            "view": hex(commits[0].body.view),
            "epoch": hex(commits[0].body.epoch),  # what its COMMITs name (and were checked for)
            "signers": [self._address(c.body.replica, block_number) for c in commits],
            "certificate": _hex(certificate),
        }

    def checkpoint(self, seq_no: int) -> dict[str, Any] | None:
        found = self.checkpoints(seq_no, seq_no)
        return found[0] if found else None

    def checkpoints(self, first: int, last: int) -> list[dict[str, Any]]:
        """Stable checkpoints (their Q matching signed CHECKPOINTs, kept forever) and the
        not-yet-stable ones held now, for seqNos in [first, last]."""
        start, stop = u64(first), up_to(last)
        found: dict[int, dict[str, Any]] = {}
        for key, value in self.store.items(StoreName.STABLE_CHECKPOINTS, start, stop):
            if (stable := self._stable_checkpoint(value)) is not None:
                found[read_u64(key)] = stable
        pending: dict[int, list[bytes]] = {}
        for key, value in self.store.items(StoreName.CHECKPOINTS, start, stop):
            pending.setdefault(read_u64(key), []).append(value)
        for seq_no, votes in pending.items():
            found.setdefault(seq_no, self._checkpoint(votes, stable=False))
        return [found[n] for n in sorted(found)]

    def _stable_checkpoint(self, value: bytes) -> dict[str, Any] | None:
        """A stable checkpoint's entry from its stored proof (None: no proof, the block
        before an override, stable by the genesis file); a fresh dict from the cache."""
        with self._stable_lock:
            made = self._stable.get(value)
        if made is None:
            proof = rlp.decode(value)
            made = orjson.dumps(self._checkpoint(proof, stable=True) if proof else None)
            with self._stable_lock:
                self._stable.put(value, made)
        entry: dict[str, Any] | None = orjson.loads(made)
        return entry

    @staticmethod
    def _checkpoint(encoded: list[bytes], *, stable: bool) -> dict[str, Any]:
        """The entry of Q (or fewer: pending) signed CHECKPOINTs, as stored: each was stored
        canonical (`decode_signed_bytes` checks it), so its proof is its own bytes."""
        votes = [decode_signed_bytes(m, Checkpoint) for m in encoded]
        block_hash, state_root = Counter(c.body.value for c in votes).most_common(1)[0][0]
        return {
            "seqNo": hex(votes[0].body.seq_no),
            "blockHash": _hex(block_hash),
            "stateRoot": _hex(state_root),
            "stable": stable,
            "proof": [_hex(m) for m in encoded],
        }

    def view_changes(self, first: int, last: int) -> list[dict[str, Any]]:
        """Every installed view in [first, last] with its NEW-VIEW and VIEW-CHANGE messages."""
        result = []
        for _, value in self.store.items(StoreName.NEW_VIEWS, u64(first), up_to(last)):
            new_view = decode_signed_bytes(value, NewView)
            result.append({
                "view": hex(new_view.body.view),
                "primary": self._address(new_view.body.replica,
                                         message_height(new_view.body)),
                "newView": _hex(value),
                "viewChanges": [
                    {
                        "signer": self._address(vc.body.replica, message_height(vc.body)),
                        "view": hex(vc.body.view),
                        "stableSeqNo": hex(vc.body.stable_seq_no),
                        "message": _hex(vc.encode()),
                    }
                    for vc in new_view.body.view_changes
                ],
            })
        return result

    def evidence(self) -> list[dict[str, Any]]:
        """Conflicting messages signed by one validator for one (view, seqNo, phase)."""
        result = []
        for key, value in self.store.items(StoreName.EVIDENCE):
            first, second = rlp.decode(value)
            result.append({
                "signer": self._address(int.from_bytes(key[:2], "big"), read_u64(key, 11)),
                "type": MessageType(key[2]).name.lower().replace("_", "-"),
                "view": hex(read_u64(key, 3)),
                "seqNo": hex(read_u64(key, 11)),
                "first": _hex(first),
                "second": _hex(second) if second else None,
            })
        return result
