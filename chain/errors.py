"""The chain package's exception hierarchy: raised inside, turned into messages at the edges."""


class ChainError(Exception):
    """Something about the chain, its inputs or its configuration is wrong."""


class GenesisError(ChainError):
    """A genesis file that cannot be used."""


class BlockValidationError(ChainError):
    """A block that must not be imported; the message says why."""


class FalseBodyError(BlockValidationError):
    """A block whose body does not match its header's roots: a false copy of whatever block
    the header belongs to, not evidence against that block's proposer."""


class StaleParentError(BlockValidationError):
    """A block that does not extend the chain it was executed on (the chain moved meanwhile):
    it says nothing about the block."""


class EngineError(ChainError):
    """A consensus engine that cannot be found or configured."""


class NodeError(ChainError):
    """A node that cannot start (data directory, keys, configuration)."""


class TxPoolError(ChainError):
    """A transaction the pool refuses, with geth's JSON-RPC code and message."""

    def __init__(self, message: str, code: int = -32000) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
