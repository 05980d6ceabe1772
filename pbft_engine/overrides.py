"""Overrides of genesis (`config.pbft.transitions`, DESIGN.md section 10): from a block on, a
set decides without a vote, for when more than f validators are gone for good and no
change by vote can pass or take effect. Every node restarts with the same genesis file (a
coordinated restart, docs/validators.md). The core treats the block before an override as
stable by the genesis file (`EpochSchedule.stable_by_genesis`); what is checked here, at
start, is that the chain held here agrees with the file: each override's first block and the
block before it, and the head, carry certificates of the sets the file gives them. So an
override must start above every block this node holds a certificate for (executed or not:
two certified blocks would stand at one height), and one in force cannot move or go."""

from __future__ import annotations

from collections.abc import Callable

from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.errors import ConfigError, MessageError
from pbft_engine.messages import decode_commit_certificate, verify_commit_certificate

# (block number) -> its commit certificate as stored here (None: none)
StoredCertificate = Callable[[int], bytes | None]


def check_overrides(schedule: EpochSchedule, head: int, chain_id: int,
                    certificate_at: StoredCertificate) -> list[str]:
    """What to log loudly about each override; ConfigError if a certificate held here at a
    boundary (or the head) is not of the set the schedule gives its height."""
    overrides = [e for e in schedule.epochs if e.override]
    boundaries = sorted({head, *(n for e in overrides for n in (e.first - 1, e.first))})
    for number in (n for n in boundaries if n >= 1):
        certificate = certificate_at(number)
        if certificate is not None and not _certifies(schedule, chain_id, number, certificate):
            raise ConfigError(
                f"config.pbft.transitions does not fit the chain held here: block {number}'s "
                f"certificate is not epoch {schedule.epoch_at(number).number}'s (its head is "
                f"{head}). An override must start above every block a node holds a "
                "certificate for, in every node's genesis file, and one in force cannot "
                "move or go")
    return [f"OVERRIDE (config.pbft.transitions): from block {e.first} on, epoch {e.number} "
            f"decides without a vote: {', '.join('0x' + v.hex() for v in e.validators)}"
            for e in overrides]


def _certifies(schedule: EpochSchedule, chain_id: int, number: int, certificate: bytes) -> bool:
    epoch = schedule.epoch_at(number)
    try:
        commits = decode_commit_certificate(certificate)
        if not commits:
            return False
        verify_commit_certificate(certificate, validators=epoch.validators,
                                  epoch=epoch.number, chain_id=chain_id, block_number=number,
                                  block_hash=commits[0].body.digest)
    except MessageError:
        return False
    return True
