from typing import Any

from rlp import exceptions as exceptions

def encode(
    obj: object, sedes: Any = ..., infer_serializer: bool = ..., cache: bool = ...
) -> bytes: ...
def decode(
    rlp: bytes, sedes: Any = ..., strict: bool = ..., recursive_cache: bool = ..., **kwargs: Any
) -> Any: ...
