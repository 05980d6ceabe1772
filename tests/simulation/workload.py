"""Clients for the simulator: accounts sending bursts with nonce gaps, fee bumps, evictions and
fee caps too low to pay the base fee, planned ahead from the seed and played on a cluster."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from eth_hash.auto import keccak

from tests.simulation.cluster import Cluster
from tests.simulation.ledger import PRICE_BUMP_PERCENT, Tx


@dataclass(frozen=True)
class Fees:
    """Fee caps against a base fee that stays within [floor, ceiling]."""

    floor: int
    ceiling: int

    def rich(self, rng: random.Random) -> int:
        return self.ceiling + rng.randint(0, 5)  # pays any base fee

    def marginal(self, rng: random.Random) -> int:
        return rng.randint(self.floor, max(self.floor, self.ceiling - 1))  # pays some

    def poor(self, rng: random.Random) -> int:
        return rng.randint(0, self.floor - 1)  # pays none: never executable


@dataclass
class Account:
    """One sender and what its committed run must reach: every nonce it sent, or up to
    `blocked_at` (a nonce that never becomes executable), and at least up to `marginal_at`
    (a marginal fee cap may wait for a base fee that never falls again: blocks stop when
    nothing is executable)."""

    sender: bytes
    next_nonce: int = 0
    blocked_at: int | None = None  # a nonce that never becomes executable (poor, or never sent)
    marginal_at: int | None = None  # the first nonce whose fee cap is only marginal


@dataclass
class Workload:
    cluster: Cluster
    rng: random.Random
    fees: Fees
    max_gas: int = 1
    plan: list[tuple[int, int, Callable[[], None]]] = field(default_factory=list)
    accounts: list[Account] = field(default_factory=list)
    never: set[bytes] = field(default_factory=set)  # never executable: must never be reported
    salt: int = 0

    # --- building blocks --------------------------------------------------------------------

    def account(self) -> Account:
        account = Account(keccak(b"account %d" % len(self.accounts))[:20])
        self.accounts.append(account)
        return account

    def tx(self, account: Account, fee_cap: int, nonce: int | None = None) -> Tx:
        if nonce is None:
            nonce, account.next_nonce = account.next_nonce, account.next_nonce + 1
        self.salt += 1
        return Tx(account.sender, nonce, fee_cap, self.rng.randint(1, self.max_gas), self.salt)

    def bump(self, tx: Tx, fee_cap: int | None = None) -> Tx:
        """The same nonce with a fee cap high enough to replace it in the pools."""
        least = tx.fee_cap * (100 + PRICE_BUMP_PERCENT) // 100 + 1
        self.salt += 1
        return Tx(tx.sender, tx.nonce, max(least, fee_cap or 0), tx.gas, self.salt)

    def at(self, when: int, action: Callable[[], None]) -> None:
        self.plan.append((when, len(self.plan), action))

    def send(self, when: int, tx: Tx, to: int | None = None) -> None:
        self.at(when, lambda: self.cluster.submit(tx, to))

    def evict(self, when: int, tx: Tx) -> None:
        self.at(when, lambda: self.cluster.evict(tx.hash))

    def play(self) -> None:
        """Run the cluster through the plan, in time order, and until the last gossip lands."""
        for when, _, action in sorted(self.plan, key=lambda item: item[:2]):
            self.cluster.run_for(max(0, when - self.cluster.now))
            action()
        self.cluster.run_for(self.cluster.faults.max_delay_ms + 1)

    @property
    def last_action_ms(self) -> int:
        return max((when for when, _, _ in self.plan), default=0)

    # --- client behaviours ------------------------------------------------------------------

    def burst(self, start: int, accounts: list[Account], per_account: int, *,
              spread_ms: int = 20, gap: float = 0.0, replace: float = 0.0, evict: float = 0.0,
              marginal: float = 0.0) -> None:
        """Each account sends `per_account` transactions in nonce order, each to a random node
        within spread_ms of the last. Some arrive late (a nonce gap for the ones behind them
        until they do), some are replaced by a fee bump, some are evicted everywhere and sent
        again later; some fee caps are only marginal (priced out while the base fee is high)."""
        for account in accounts:
            when = start
            for _ in range(per_account):
                when += self.rng.randint(0, spread_ms)
                fee = self.fees.rich(self.rng)
                if self.rng.random() < marginal:
                    fee = self.fees.marginal(self.rng)
                tx = self.tx(account, fee)
                if fee < self.fees.ceiling and account.marginal_at is None:
                    account.marginal_at = tx.nonce
                late = self.rng.randint(300, 3_000) if self.rng.random() < gap else 0
                self.send(when + late, tx)
                if self.rng.random() < replace:
                    self.send(when + self.rng.randint(0, 600), self.bump(tx))
                if self.rng.random() < evict:
                    # after it reached every pool: the pools evict what they hold (a lifetime
                    # runs out), they do not refuse it on arrival
                    settled = 2 * self.cluster.faults.max_delay_ms + 1
                    gone = when + late + self.rng.randint(settled, settled + 1_500)
                    self.evict(gone, tx)
                    self.send(gone + self.rng.randint(100, 2_000), tx)

    def gapped(self, start: int, account: Account, count: int, *, fill_after: int | None,
               poor_first: bool = False) -> None:
        """`count` transactions from nonce 1 on, nonce 0 held back: sent after fill_after ms
        (None: never, a gap for good), or sent at once with a fee cap that pays no base fee
        and replaced by a paying one after fill_after ms (None: never)."""
        first = account.next_nonce
        account.next_nonce += 1
        head = self.tx(account, self.fees.poor(self.rng), nonce=first) if poor_first else None
        run = [self.tx(account, self.fees.rich(self.rng)) for _ in range(count)]
        for offset, tx in enumerate(run):
            self.send(start + offset * self.rng.randint(0, 5), tx)
        if head is not None:
            self.send(start, head)
        if fill_after is None:
            account.blocked_at = first
            self.never.update(tx.hash for tx in run)
            if head is not None:
                self.never.add(head.hash)
            return
        fill = (self.bump(head, self.fees.rich(self.rng)) if head is not None
                else self.tx(account, self.fees.rich(self.rng), nonce=first))
        self.send(start + fill_after, fill)

    def poor(self, start: int, account: Account, count: int) -> None:
        """Transactions whose fee caps never pay the base fee: never executable."""
        account.blocked_at = account.next_nonce
        for _ in range(count):
            tx = self.tx(account, self.fees.poor(self.rng))
            self.never.add(tx.hash)
            self.send(start + self.rng.randint(0, 50), tx)

    def stream(self, start: int, stop: int, accounts: list[Account], period_ms: int) -> None:
        """A steady trickle: one transaction from a random account every ~period_ms."""
        when = start
        while when < stop:
            account = self.rng.choice(accounts)
            self.send(when, self.tx(account, self.fees.rich(self.rng)))
            when += self.rng.randint(period_ms // 2, period_ms * 3 // 2)
