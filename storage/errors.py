"""The storage package's exception hierarchy."""


class StorageError(Exception):
    """A database could not be opened, read or written."""


class DataDirLockedError(StorageError):
    """The data directory is held by another process."""


class StorageWriteError(StorageError):
    """A write failed (a full disk, lost permissions, an I/O error); the node must stop."""
