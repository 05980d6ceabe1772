"""The exception hierarchy of the pbft_engine package."""


class PbftError(Exception):
    """Base class of every error raised by the PBFT engine."""


class ConfigError(PbftError):
    """The engine parameters (genesis `config.pbft`) are missing or inconsistent."""


class MessageError(PbftError):
    """A consensus message is malformed, not canonical or structurally invalid."""


class SignatureError(MessageError):
    """A signature does not recover to the validator the message claims to come from."""


class EpochMismatch(MessageError):
    """A message names another epoch than the one its height belongs to here: from a set
    this node does not know yet (it learns of changes from committed state), or a forgery."""


class CertificateError(MessageError):
    """A certificate (commit, checkpoint, prepared, view-change set) is not a valid quorum."""


class StoreError(PbftError):
    """A persisted consensus record cannot be decoded: the data directory is damaged."""


class LostRecordsError(StoreError):
    """The consensus records are gone and nothing says what this validator signed before."""


class SafetyError(PbftError):
    """The replica was asked to do something that would break safety (e.g. sign twice)."""
