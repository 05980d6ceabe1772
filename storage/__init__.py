"""LevelDB storage: one database per data directory, prefixed keyspaces, atomic batches.

Imports nothing of ours (docs/ARCHITECTURE.md, section 1).
"""

from storage.errors import DataDirLockedError, StorageError, StorageFailure
from storage.evm_db import KeyspaceDB, OverlayDB
from storage.kv import Database, Keyspace, WriteBatch

__all__ = [
    "DataDirLockedError",
    "Database",
    "Keyspace",
    "KeyspaceDB",
    "OverlayDB",
    "StorageError",
    "StorageFailure",
    "WriteBatch",
]
