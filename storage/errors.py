"""The storage package's exception hierarchy."""


class StorageError(Exception):
    """A database could not be opened, read or written."""


class DataDirLockedError(StorageError):
    """The data directory is held by another process."""


class StorageFailure(StorageError):
    """The open database failed: a write (a full disk, lost permissions, an I/O error) or a
    read of a damaged file. Every later access may fail too, so the node must stop."""
