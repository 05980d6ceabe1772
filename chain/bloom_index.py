"""The bloom-bits index: which blocks' log blooms have a given bit, by section.

A query over a long range (`eth_getLogs`, log filters) would otherwise read every header to
test its bloom. As geth's bloombits, the blooms are stored transposed: per section of
SECTION_BLOCKS blocks and per bloom bit, a bit vector of the section's blocks whose bloom
has that bit. An address or topic sets 3 bits of a bloom, so the blocks that may hold it
are the AND of 3 vectors; a query reads 3 vectors per wanted value per section, whatever
the blocks hold. Unlike geth, the open section is indexed too, block by block (in the
block's commit batch), so a query never falls back to reading headers; sections are short
(256 blocks, 32-byte vectors) to keep that per-block write small.

The index gives candidates: a false positive costs one block's records, never a wrong
answer, so a vector may be a superset of the truth but never miss a block.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from eth_hash.auto import keccak

from storage import Keyspace, WriteBatch

SECTION_BLOCKS = 256
VECTOR_BYTES = SECTION_BLOCKS // 8
BLOOM_BITS = 2048
HAS_LOGS_BIT = BLOOM_BITS  # one more vector: the blocks with any log at all


def bloom_bits(value: bytes) -> tuple[int, int, int]:
    """The 3 bit positions (of 2048) that `value` sets in a bloom (the yellow paper's M3:2048)."""
    digest = keccak(value)
    return tuple(  # type: ignore[return-value]
        ((digest[i] << 8) | digest[i + 1]) & (BLOOM_BITS - 1) for i in (0, 2, 4)
    )


def _set_bits(bloom: int) -> Iterator[int]:
    while bloom:
        low = bloom & -bloom
        yield low.bit_length() - 1
        bloom ^= low


def _key(section: int, bit: int) -> bytes:
    return section.to_bytes(8, "big") + bit.to_bytes(2, "big")


class BloomIndex:
    def __init__(self, keyspace: Keyspace) -> None:
        self.keyspace = keyspace
        # The vectors of the section being filled, as written so far (the next block's bits
        # are ORed into them without reading them back).
        self._open_section = -1
        self._open: dict[int, int] = {}

    def add(self, batch: WriteBatch, number: int, bloom: int) -> None:
        """Index block `number`'s bloom in `batch`. Blocks are added in increasing order."""
        if not bloom:
            return
        section, offset = divmod(number, SECTION_BLOCKS)
        if section != self._open_section:
            self._open = self._stored_section(section)
            self._open_section = section
        mark = 1 << offset
        for bit in (*_set_bits(bloom), HAS_LOGS_BIT):
            vector = self._open.get(bit, 0) | mark
            self._open[bit] = vector
            batch.put(self.keyspace, _key(section, bit), vector.to_bytes(VECTOR_BYTES, "big"))

    def _stored_section(self, section: int) -> dict[int, int]:
        start = section.to_bytes(8, "big")
        return {
            int.from_bytes(key[8:], "big"): int.from_bytes(value, "big")
            for key, value in self.keyspace.items(start, (section + 1).to_bytes(8, "big"))
        }

    def _vector(self, section: int, bit: int) -> int:
        value = self.keyspace.get(_key(section, bit))
        return 0 if value is None else int.from_bytes(value, "big")

    def candidates(
        self, first: int, last: int, groups: Sequence[Sequence[bytes]]
    ) -> Iterator[int]:
        """Block numbers in [first, last], ascending, whose bloom may match: for every group,
        at least one of its values (an empty group list: any block with a log)."""
        for section in range(first // SECTION_BLOCKS, last // SECTION_BLOCKS + 1):
            matched = self._section_matches(section, groups)
            base = section * SECTION_BLOCKS
            for offset in _set_bits(matched):
                if first <= base + offset <= last:
                    yield base + offset

    def _section_matches(self, section: int, groups: Sequence[Sequence[bytes]]) -> int:
        matched = self._vector(section, HAS_LOGS_BIT)
        for group in groups:
            if not matched:
                break
            any_value = 0
            for value in group:
                vector = matched
                for bit in bloom_bits(value):
                    vector &= self._vector(section, bit)
                    if not vector:
                        break
                any_value |= vector
            matched &= any_value
        return matched
