"""Engine parameters: the genesis `config.pbft` section, validated (the quorum arithmetic of
each validator set is the epoch schedule's, `core.epochs`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pbft_engine.errors import ConfigError

ADDRESS_SIZE = 20
BLOCK_BUDGET_SHARE = 5  # the block's execution budget is request_timeout / 5
MAX_DOUBLINGS = 32  # beyond any cap: keeps the shift small
DEFAULT_MAX_IN_FLIGHT = 2
FUTURE_BLOCK_BYTES = 64 * 2**20  # four of the transport's largest frames
# The smallest set that tolerates a fault (research/membership.md 8.2); a smaller genesis set
# is a development chain, and its own size is its floor.
MIN_FAULT_TOLERANT_SET = 4
DEFAULT_VOTE_TTL = 30_000  # blocks a validator-set vote stays live (Besu's epochlength)
# How long block sync waits for one peer's answer to a range (`sync.BlockSync`), here since
# the core judges a fetch by it (`catch_up.stalled_after`): an answer still on its way over a
# slow link must never be cut, whatever the request timeout a genesis configures.
FETCH_ANSWER_WAIT_MS = 10_000


@dataclass(frozen=True)
class EngineParams:
    """Static parameters shared by every replica of one chain. Durations are in milliseconds."""

    chain_id: int
    validators: tuple[bytes, ...]
    checkpoint_interval: int = 10  # K
    log_multiplier: int = 4  # L = K * log_multiplier
    request_timeout_ms: int = 2_000
    new_view_timeout_ms: int = 2_000  # also the VIEW-CHANGE resend period
    new_view_timeout_cap_ms: int = 60_000
    block_period_ms: int = 1_000
    empty_blocks: bool = False  # propose a block every block period even without requests
    # One empty block this long after the last block with transactions (0: none): a client
    # that waits for "the next head" to read its receipt (web3 1.x) gets one on an idle chain.
    trailing_block_ms: int = 1_000
    # Blocks the primary may have proposed and not yet executed (concurrent consensus): it
    # proposes n+1 on n's executed but uncommitted state while n is still being agreed on.
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    # A change by vote that would leave fewer validators does not pass (0: the default,
    # min(MIN_FAULT_TOLERANT_SET, the genesis set's size)).
    min_validators: int = 0
    vote_ttl: int = DEFAULT_VOTE_TTL  # blocks after which a validator-set vote expires
    # Overrides (`config.pbft.transitions`): from block `first` on, this set decides, without
    # a vote; for when more than f validators are gone for good (a coordinated restart).
    transitions: tuple[tuple[int, tuple[bytes, ...]], ...] = ()

    def __post_init__(self) -> None:
        if self.min_validators == 0:
            object.__setattr__(self, "min_validators",
                               min(MIN_FAULT_TOLERANT_SET, len(self.validators)))
        if not self.validators:
            raise ConfigError("config.pbft.validators must list at least one address")
        if any(len(v) != ADDRESS_SIZE for v in self.validators):
            raise ConfigError("config.pbft.validators must be 20-byte addresses")
        if len(set(self.validators)) != len(self.validators):
            raise ConfigError("config.pbft.validators lists an address twice")
        if self.checkpoint_interval < 1 or self.log_multiplier < 2:
            raise ConfigError("checkpoint_interval must be >= 1 and log_multiplier >= 2")
        if min(self.request_timeout_ms, self.new_view_timeout_ms, self.block_period_ms) <= 0:
            raise ConfigError("timeouts and the block period must be positive")
        if self.trailing_block_ms < 0:
            raise ConfigError("trailing_empty_block must be >= 0 seconds (0: none)")
        if self.new_view_timeout_cap_ms < self.new_view_timeout_ms:
            raise ConfigError("new_view_timeout_cap must be >= new_view_timeout")
        if not 1 <= self.max_in_flight <= self.log_size:
            raise ConfigError(f"max_in_flight must be between 1 and the watermark window "
                              f"checkpoint_interval x log_multiplier = {self.log_size}")
        if not 1 <= self.min_validators <= len(self.validators):
            raise ConfigError(f"min_validators must be between 1 and the genesis set's size "
                              f"{len(self.validators)}")
        if self.vote_ttl < 1:
            raise ConfigError("vote_ttl must be at least 1 block")
        firsts = [first for first, _ in self.transitions]
        if firsts != sorted(set(firsts)) or any(first < 2 for first in firsts):
            raise ConfigError("config.pbft.transitions: blocks must be 2 or above, each once, "
                              "in increasing order")

    @classmethod
    def from_genesis(cls, chain_id: int, config: Mapping[str, Any]) -> EngineParams:
        """From genesis `config.pbft`: addresses as 0x-hex, durations in (fractional) seconds."""
        try:
            validators = tuple(bytes.fromhex(a.removeprefix("0x")) for a in config["validators"])
            return cls(
                chain_id=chain_id,
                validators=validators,
                checkpoint_interval=int(config.get("checkpoint_interval", 10)),
                log_multiplier=int(config.get("log_multiplier", 4)),
                request_timeout_ms=_ms(config.get("request_timeout", 2)),
                new_view_timeout_ms=_ms(config.get("new_view_timeout", 2)),
                new_view_timeout_cap_ms=_ms(config.get("new_view_timeout_cap", 60)),
                block_period_ms=_ms(config.get("block_period", 1)),
                empty_blocks=bool(config.get("empty_blocks", False)),
                trailing_block_ms=_ms(config.get("trailing_empty_block", 1)),
                max_in_flight=int(config.get("max_in_flight", DEFAULT_MAX_IN_FLIGHT)),
                min_validators=(_count(config["min_validators"], "min_validators")
                                if "min_validators" in config else 0),
                vote_ttl=_count(config.get("vote_ttl", DEFAULT_VOTE_TTL), "vote_ttl"),
                transitions=tuple(_transition(t) for t in config.get("transitions", ())),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"invalid config.pbft section: {exc!r}") from None

    @property
    def n(self) -> int:
        """The genesis set's size; the set, quorum and primary of a height are the epoch
        schedule's (`core.epochs`)."""
        return len(self.validators)

    @property
    def log_size(self) -> int:
        """L: the width of the watermark window, H = h + L."""
        return self.checkpoint_interval * self.log_multiplier

    @property
    def future_block_bytes(self) -> int:
        """The block bytes a replica holds for views and seqNos it has not reached (PRE-PREPAREs
        of a primary ahead of it): room for a correct primary's blocks in flight, not for a
        flood; beyond it the highest of the sender holding the most are dropped."""
        return FUTURE_BLOCK_BYTES

    @property
    def block_time_budget_ms(self) -> int:
        """How long the primary may spend executing one block's transactions.

        The request timer restarts at every commit, so a whole round (build, validation on
        every replica, which may share cores with the primary, the three message phases and
        the commit) must fit inside one request timeout; the build gets a fifth of it.
        """
        return max(1, self.request_timeout_ms // BLOCK_BUDGET_SHARE)

    def escalated(self, duration_ms: int, doublings: int) -> int:
        """`duration_ms` doubled `doublings` times, capped (Castro & Liskov, section 4.5.2)."""
        cap = max(duration_ms, self.new_view_timeout_cap_ms)
        return min(duration_ms << max(0, min(doublings, MAX_DOUBLINGS)), cap)


def _transition(entry: Mapping[str, Any]) -> tuple[int, tuple[bytes, ...]]:
    """One `config.pbft.transitions` entry: {"block": n, "validators": ["0x..", ...]}."""
    addresses = tuple(bytes.fromhex(a.removeprefix("0x")) for a in entry["validators"])
    if not addresses or any(len(a) != ADDRESS_SIZE for a in addresses) or (
            len(set(addresses)) != len(addresses)):
        raise ConfigError(f"config.pbft.transitions: block {entry['block']}'s validators must "
                          "be distinct 20-byte addresses, at least one")
    return _count(entry["block"], "a transition's block"), addresses


def _count(value: object, name: str) -> int:
    """A whole number of at least 1 from JSON (not a bool, not a fraction)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a whole number of at least 1, not {value!r}")
    return value


def _ms(seconds: object) -> int:
    return round(float(seconds) * 1000)  # type: ignore[arg-type]
