"""What a validator may have signed, kept where a wiped consensus store cannot take it.

A replica's consensus records (the `SIGNED` store, its prepared certificates, its VIEW-CHANGE)
are what stop it from signing two different votes for one (view, seqNo) and from sending a
VIEW-CHANGE that leaves out a block it prepared. They live in the chain's LevelDB, so an
operator who rebuilds a validator (a new `chaindata`) or recovers a damaged database wipes
them, and the replica would vote again where it already voted: with one byzantine primary that
forks the chain at N = 4 (issue 14 gives the schedule). Like CometBFT's
`priv_validator_state.json`, the replica therefore keeps a `SigningBound` outside the database:
the highest view and seqNo it may have signed a vote for, raised (and written, before the
message leaves) in steps of a whole watermark window, so the file changes about once per
checkpoint interval.

A replica that starts with an empty store and a bound above zero has lost its records
(amnesia); so has one whose store's view and high watermark fall short of the bound (a
backup put back: in each step the store is written first, then the bound, then the messages,
so the bound never passes the store otherwise, and a crash between the two writes leaves the
store ahead, which a restart joins into the bound before it sends anything). A backup from
the bound's own view and window cannot be told apart, because the
bound moves a window at a time: the operations guide says never to restore one. Such a
replica follows: it fetches and executes certified blocks and sends CHECKPOINTs, and it signs
a vote only where `may_vote` / `may_view_change` allow. Why that is safe, with bound
(V, S) taken from the file:

- Every PRE-PREPARE, PREPARE and COMMIT it signed before has view <= V and seqNo <= S (the
  bound was raised before each was signed). A new vote at (v, n) with v > V, or v == V and
  n > S, is for a slot it never voted in: it cannot equivocate.
- A vote in a view v < V could contradict a VIEW-CHANGE(V) it may have sent (that message
  promised it prepared nothing more in views below V): refused, whatever the seqNo.
- A VIEW-CHANGE must report every block it prepared above its stable checkpoint; it lost the
  ones at seqNos <= S. Once its stable checkpoint is >= S, every such block is at or below
  the checkpoint, which the VIEW-CHANGE proves with 2f+1 signatures instead, so its report is
  complete again; and a VIEW-CHANGE for a view v > V is one it never sent. Until both hold it
  sends none (it waits for the NEW-VIEW), and a NEW-VIEW it would send as primary needs one.
- PREPAREs and COMMITs in views above V at any seqNo are safe too: a block committed at n in
  a view <= V had 2f+1 COMMITs, at least 2f of them from other replicas; the 2f+1
  VIEW-CHANGEs that install a later view, none of them this replica's (it sends none until
  it recovered), meet those 2f in at least f+1 replicas, one of them correct, whose
  prepared certificate carries the block into the new view (Castro and Liskov, 4.5).
- CHECKPOINTs attest the state after executing certified blocks, which is deterministic: the
  same as any it signed before unless the chain already forked.

Amnesia ends when the stable checkpoint is >= S and the view is >= V: every vote from then
on is at a seqNo above S in a view of at least V, and every VIEW-CHANGE for a view above V
(in a healthy cluster, one window and a checkpoint after it rejoined). The bound is written at
a validator's first start (zero: nothing signed yet), so an empty store with a zero bound is a
validator that never voted (it synced, say), and one with no bound at all is a new validator
when the chain holds only genesis; with a longer chain and no bound the replica cannot know
what it signed and refuses to start unless the operator says otherwise (`--fresh-validator`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pbft_engine.errors import LostRecordsError


@dataclass(frozen=True)
class SigningBound:
    """Every vote this validator signed has view <= `view` and seqNo <= `seq_no`."""

    view: int = 0
    seq_no: int = 0

    def covers(self, view: int, seq_no: int) -> bool:
        return view <= self.view and seq_no <= self.seq_no

    def joined(self, other: SigningBound) -> SigningBound:
        return SigningBound(max(self.view, other.view), max(self.seq_no, other.seq_no))

    def may_vote(self, view: int, seq_no: int) -> bool:
        """A PRE-PREPARE, PREPARE or COMMIT at (view, seqNo) is one never signed before."""
        return view > self.view or (view == self.view and seq_no > self.seq_no)

    def may_view_change(self, view: int, stable_checkpoint: int) -> bool:
        """A VIEW-CHANGE (or NEW-VIEW) for `view` is new and its report complete."""
        return view > self.view and stable_checkpoint >= self.seq_no

    def passed(self, view: int, stable_checkpoint: int) -> bool:
        """From this view and stable checkpoint on, every vote is allowed: amnesia is over."""
        return view >= self.view and stable_checkpoint >= self.seq_no


def restored_bound(written: SigningBound | None, known: SigningBound | None, *, fresh: bool,
                   chain_height: int, amnesia: SigningBound | None
                   ) -> tuple[SigningBound, SigningBound | None]:
    """The bound a restarted replica holds, and its amnesia (None: it lost nothing), from the
    file (`written`, None: no file) and the store (`known`: its view and high watermark,
    None: an empty store). Amnesia: an empty store, or one older than the bound (restored
    from a backup), while the bound says this validator voted beyond what the store holds.
    The bound is written at the first start, so no bound at all on a chain past genesis
    means it cannot know (unless the operator says it is `fresh`): LostRecordsError."""
    if written is None and not (known is not None or fresh or chain_height == 0):
        raise LostRecordsError(
            f"the consensus records are missing but the chain holds {chain_height} "
            "blocks, and nothing says what this validator signed")
    bound = written or SigningBound()
    if known is not None:
        # The bound never passes the view and high watermark of the store written in the
        # same step (it is written first, then the store): beyond them, records are lost.
        if not known.covers(bound.view, bound.seq_no):
            amnesia = bound if amnesia is None else amnesia.joined(bound)
        return bound.joined(known), amnesia
    if not fresh and bound != SigningBound():
        return bound, bound
    return bound, amnesia
