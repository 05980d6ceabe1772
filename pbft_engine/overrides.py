"""Overrides of genesis (`config.pbft.transitions`, DESIGN.md section 10): from a block on, a
set decides without a vote, for when more than f validators are gone for good and no
change by vote can pass or take effect. Every node restarts with the same genesis file (a
coordinated restart, docs/validators.md). The core treats the block before an override as
stable by the genesis file (`EpochSchedule.stable_by_genesis`); what is checked here, at
start, is that no block at or above an override was committed before it with the old
set's certificate: an override must start above every node's head, or two certified blocks
could stand at one height."""

from __future__ import annotations

from collections.abc import Callable

from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.errors import ConfigError, MessageError
from pbft_engine.messages import verify_commit_certificate

# (block number) -> (its hash, its commit certificate) as stored here; None: not committed
CertifiedBlock = Callable[[int], tuple[bytes, bytes] | None]


def check_overrides(schedule: EpochSchedule, head: int, chain_id: int,
                    certified: CertifiedBlock) -> list[str]:
    """What to log loudly about each override; ConfigError if a block at or above one's
    first height is committed here with a certificate that is not the override set's."""
    lines = []
    for epoch in (e for e in schedule.epochs if e.override):
        members = ", ".join("0x" + v.hex() for v in epoch.validators)
        lines.append(f"OVERRIDE (config.pbft.transitions): from block {epoch.first} on, "
                     f"epoch {epoch.number} decides without a vote: {members}")
        stored = certified(epoch.first) if epoch.first <= head else None
        if stored is None:
            continue
        block_hash, certificate = stored
        try:
            verify_commit_certificate(certificate, validators=epoch.validators,
                                      epoch=epoch.number, chain_id=chain_id,
                                      block_number=epoch.first, block_hash=block_hash)
        except MessageError:
            raise ConfigError(
                f"config.pbft.transitions starts a set at block {epoch.first}, but this "
                f"node committed that block before, certified by the old set (its head is "
                f"{head}): an override must start above every node's head (use block "
                f"{head + 1} or higher in every node's genesis file)") from None
    return lines
