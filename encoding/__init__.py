"""Encodings every layer shares, at the bottom of the project (it imports nothing of ours):
hex quantities and data as JSON-RPC and genesis files write them (`hexcodec`), and canonical
RLP integers and the nesting check run before decoding what a peer sent (`rlp`). Each
package turns `EncodingError` into its own error at its edge (an RPC error, a genesis error,
a message error)."""

from __future__ import annotations


class EncodingError(ValueError):
    """Input that is not the encoding it claims to be; the message names what, and why."""
