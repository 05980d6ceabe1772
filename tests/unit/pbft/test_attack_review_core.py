"""Attacker's review of the resend / validated-again / relay / trailing-block change (issue 28
and 29: 27c62e3, 733de3d, cf8e2d1, 2cdd00f, 9f3a3d4). Each test proved a weakness of
the first versions (as a strict xfail); all six are fixed (9924b7f) and the tests now hold."""

from __future__ import annotations

from eth_hash.auto import keccak

from pbft_engine.core import (
    Action,
    BlockCommitted,
    BlockReceived,
    BlockValidated,
    Broadcast,
    BuildBlock,
    ChainHead,
    FetchBlock,
    MessageReceived,
    RelayRequests,
    Replica,
    RequestDropped,
    RequestReceived,
    SetTimer,
    TimerFired,
    TimerKind,
    ValidateBlock,
)
from pbft_engine.core.events import Refusal
from pbft_engine.core.records import u64
from pbft_engine.core.signing_bound import SigningBound
from pbft_engine.messages import (
    Commit,
    KeyVerifier,
    NewView,
    Prepare,
    PreparedProof,
    PrePrepare,
    PrePreparedEntry,
    ViewChange,
    WireMessage,
)
from tests.unit.pbft.helpers import AUTH, GENESIS, PARAMS, SIGNERS, from_peer
from tests.unit.pbft.test_pbft_lost_state import Disk
from tests.unit.pbft.test_pbft_resend import DIGEST as D1
from tests.unit.pbft.test_pbft_resend import (
    pre_prepares,
    primary_with_block_proposed,
    stranded_backup,
)

BLOCK = b"block 1: a block the adapter never answers for"
DIGEST = keccak(BLOCK)


def validations(actions: list[Action], seq_no: int = 1) -> int:
    return sum(1 for a in actions if isinstance(a, ValidateBlock) and a.seq_no == seq_no)


def sent_bodies(actions: list[Action]) -> list[object]:
    return [WireMessage.decode(a.data).signed.body for a in actions if isinstance(a, Broadcast)]


# --- 1. An INVALID block is validated again, every request timeout, on an amnesic backup ----

def test_an_invalid_block_is_never_validated_again_by_a_replica_that_cannot_leave_its_view(
) -> None:
    """A byzantine primary 0 proposes block 1 that executes (as much gas as it likes) and then
    fails: INVALID. A correct backup asks for view 1 and leaves the slot behind; an amnesic
    one (records wiped, `SigningBound` above its checkpoint) may not send a VIEW-CHANGE, so it
    stays in view 0 with the slot `refused`. Before 2cdd00f nothing validated it again. Now
    `_waiting()` counts that INVALID-refused slot as a reason to keep the request timer, so a
    RequestDropped no longer cancels it (any user can cause one: send a transaction, then
    replace it with a fee bump), and when it runs out with no request waiting,
    `_validate_refused_again` clears `refused` on INVALID slots too: the expensive invalid
    block is executed again, once per request timeout, for as long as the user keeps
    doing it (unbounded, where it was at most once per seqNo and view)."""
    disk = Disk(bound=SigningBound(0, PARAMS.log_size))
    replica = disk.start()
    assert replica.amnesia is not None  # FOLLOWING: no VIEW-CHANGE until it recovered
    actions = disk.run(replica.step(from_peer(PrePrepare(0, 1, DIGEST, 0), (BLOCK,))))
    executed = validations(actions)
    actions = disk.run(replica.step(BlockValidated(1, DIGEST, False, Refusal.INVALID)))
    assert (replica.view, replica.active) == (0, True)  # it may not ask for view 1
    rounds = 5
    for i in range(rounds):
        tx = keccak(b"a transfer replaced by a fee bump %d" % i)
        disk.run(replica.step(RequestReceived(tx)))  # arms the request timer
        disk.run(replica.step(RequestDropped(tx)))  # replaced: the timer stays (_waiting)
        actions = disk.run(replica.step(TimerFired(TimerKind.REQUEST, b"")))
        executed += validations(actions)
        disk.run(replica.step(BlockValidated(1, DIGEST, False, Refusal.INVALID)))
    assert executed == 1, f"the invalid block was executed {executed} times"



# --- 2. A hung executor gets a new ValidateBlock every 3 timeouts, none ever answered ------

def test_a_hung_validation_is_not_asked_again_while_it_is_still_outstanding() -> None:
    """The adapter spawns one task per ValidateBlock (engine.py `_perform_one`) and the core
    says `the adapter may hang`. At the validation deadline the slot is given up and the
    request timer armed; when it runs out (no request waiting) the same block is validated
    again, with a new deadline, that is not escalated (no view change happens): every
    3 request timeouts another task, each awaiting the hung executor, and the late answer
    of an earlier one is dropped when it does not come inside the next attempt's window. The
    number of outstanding validations of one block grows without bound (2 before
    2cdd00f: it was never asked again)."""
    disk = Disk()
    replica = disk.start()
    actions = disk.run(replica.step(from_peer(PrePrepare(0, 1, DIGEST, 0), (BLOCK,))))
    outstanding = validations(actions)
    deadlines = []
    for _ in range(10):
        actions = disk.run(replica.step(TimerFired(TimerKind.VALIDATION, u64(1))))
        actions += disk.run(replica.step(TimerFired(TimerKind.REQUEST, b"")))
        outstanding += validations(actions)
        deadlines += [a.duration_ms for a in actions
                      if isinstance(a, SetTimer) and a.kind is TimerKind.VALIDATION]
    assert (replica.view, replica.active) == (0, True)
    assert outstanding <= 2, (f"{outstanding} ValidateBlocks of one block outstanding, "
                              f"deadlines {sorted(set(deadlines))} ms (never escalated)")



# --- 3. The primary never validates again a re-proposal it gave up at its deadline ----------

def _new_primary_of_view_1_holding_a_re_proposal() -> tuple[Replica, list[Action]]:
    """Replica 1, primary of view 1 at N = 4 (replica 0 down): replicas 2 and 3 prepared
    block 1 in view 0 and ask for view 1; replica 1 joins, sends the NEW-VIEW re-proposing
    block 1, fetches its body and validates it."""
    replica = Replica(PARAMS, 1, SIGNERS[1], KeyVerifier(), ChainHead(0, GENESIS),
                      block_digest=keccak)
    history = list(replica.start().actions)
    pre_prepare = AUTH.sign(PrePrepare(0, 1, DIGEST, 0), SIGNERS[0])
    prepares = tuple(AUTH.sign(Prepare(0, 1, DIGEST, r), SIGNERS[r]) for r in (2, 3))
    proof = PreparedProof(pre_prepare, prepares)
    actions: list[Action] = []
    for r in (2, 3):
        vc = ViewChange(1, 0, (), (proof,), (PrePreparedEntry(1, DIGEST, 0),), r)
        actions += replica.step(MessageReceived(
            WireMessage(AUTH.sign(vc, SIGNERS[r])).encode())).actions
    new_views = [b for b in sent_bodies(actions) if isinstance(b, NewView)]
    assert (replica.view, replica.active) == (1, True) and len(new_views) == 1
    assert any(isinstance(a, FetchBlock) for a in actions)
    history += actions
    actions = replica.step(BlockReceived(1, DIGEST, BLOCK)).actions
    assert validations(actions) == 1
    return replica, history + actions


def test_a_new_primary_validates_again_a_re_proposal_given_up_at_its_deadline() -> None:
    """A primary runs no request timer, so a new primary whose executor missed the deadline
    on a block it re-proposed in its NEW-VIEW never validated it again in that view: it never
    COMMITted it and could not build on it. With replica 0 down, replicas 2 and 3 need its
    COMMIT; if their pools hold none of the block's transactions, they time nothing: the
    cluster halted (it did on 2d9ecfc too). Fixed: the first deadline asks again at once,
    for every replica."""
    replica, _ = _new_primary_of_view_1_holding_a_re_proposal()
    actions = replica.step(TimerFired(TimerKind.VALIDATION, u64(1))).actions
    assert validations(actions) == 1
    for r in (2, 3):  # the backups prepared and committed; they need the primary's COMMIT
        replica.step(from_peer(Prepare(1, 1, DIGEST, r)))
        replica.step(from_peer(Commit(1, 1, DIGEST, r)))
    actions = replica.step(BlockValidated(1, DIGEST, True)).actions
    commits = [b for b in sent_bodies(actions) if isinstance(b, Commit)]
    assert commits and 1 in replica.log.certified


# --- 4. Two empty blocks in a row after a view change (9f3a3d4 says never) -----------------

BUSY, EMPTY = b"block 1 with a transfer", b"block 2, empty"
TX = keccak(b"a transfer")


def owed(replica: Replica) -> bool:
    return replica.trailing_owed  # (read afresh: mypy narrows the attribute)


def test_no_second_empty_block_after_a_new_view_commits_the_trailing_one() -> None:
    """View 0: primary 0 commits busy block 1 and proposes its trailing empty block 2, which
    replicas 2 and 3 prepare; the view changes before 2 commits. Replica 1, primary of view
    1, re-proposes block 2 in its NEW-VIEW and `_install_new_view` arms the trailing timer
    (`trailing_owed`: the last block executed here, 1, held transactions). Block 2 commits
    (trailing_owed False, but the timer armed is never cancelled), then the timer runs out:
    the primary sees nothing in flight and proposes empty block 3 on top of empty block 2,
    on a chain that has nothing to do."""
    replica = Replica(PARAMS, 1, SIGNERS[1], KeyVerifier(), ChainHead(0, GENESIS),
                      block_digest=keccak)
    replica.start()
    busy, empty = keccak(BUSY), keccak(EMPTY)
    replica.step(from_peer(PrePrepare(0, 1, busy, 0), (BUSY,)))
    replica.step(BlockValidated(1, busy, True))
    for r in (2, 3):
        replica.step(from_peer(Prepare(0, 1, busy, r)))
    for r in (0, 2, 3):
        replica.step(from_peer(Commit(0, 1, busy, r)))
    assert replica.executing == 1
    replica.step(BlockCommitted(1, busy, keccak(b"state 1"), (TX,)))
    assert owed(replica)
    replica.step(from_peer(PrePrepare(0, 2, empty, 0), (EMPTY,)))
    replica.step(BlockValidated(2, empty, True))
    proofs = tuple(PreparedProof(
        AUTH.sign(PrePrepare(0, n, d, 0), SIGNERS[0]),
        tuple(AUTH.sign(Prepare(0, n, d, r), SIGNERS[r]) for r in (2, 3)))
        for n, d in ((1, busy), (2, empty)))
    qset = (PrePreparedEntry(1, busy, 0), PrePreparedEntry(2, empty, 0))
    actions: list[Action] = []
    for r in (2, 3):
        vc = ViewChange(1, 0, (), proofs, qset, r)
        actions += replica.step(MessageReceived(
            WireMessage(AUTH.sign(vc, SIGNERS[r])).encode())).actions
    assert (replica.view, replica.active, replica.primary) == (1, True, 1)
    assert any(isinstance(a, SetTimer) and a.kind is TimerKind.TRAILING_BLOCK for a in actions)
    actions = [a for a in actions if isinstance(a, ValidateBlock)]
    if actions:  # the re-proposed empty block, validated again in view 1
        replica.step(BlockValidated(2, empty, True))
    for r in (2, 3):
        replica.step(from_peer(Prepare(1, 2, empty, r)))
    for r in (2, 3):
        replica.step(from_peer(Commit(1, 2, empty, r)))
    assert replica.executing == 2
    replica.step(BlockCommitted(2, empty, keccak(b"state 2"), ()))
    assert not owed(replica) and replica.last_exec == 2
    actions = replica.step(TimerFired(TimerKind.TRAILING_BLOCK, b"")).actions
    builds = [a for a in actions if isinstance(a, BuildBlock)]
    assert not builds, f"an empty block 3 is built on empty block 2: {builds}"



# --- 5. A primary slow to execute re-broadcasts its whole block every request timeout -----

def test_a_certified_block_is_not_broadcast_again_while_it_executes_here() -> None:
    """The primary's block 1 is certified here (every peer committed it, so each holds its
    body; one that missed it fetches it by digest on the certificate), but its own
    execution is slow or keeps failing (`CommitRefused(false_copy=False)` is tried again):
    `_open_own_slots` counts every slot above the last executed block, so each RESEND
    broadcasts the PRE-PREPARE with the whole block to all N-1 peers, every request
    timeout, for as long as the execution lasts (up to max_in_flight blocks each time), and
    each peer decodes it to drop it. Bounded per timeout, not in total."""
    replica = primary_with_block_proposed()
    for peer in (1, 2, 3):
        replica.step(from_peer(Prepare(0, 1, D1, peer)))
    for peer in (1, 2, 3):
        replica.step(from_peer(Commit(0, 1, D1, peer)))
    assert replica.executing == 1 and 1 in replica.log.certified
    resent = []
    for _ in range(5):
        resent += pre_prepares(replica.step(TimerFired(TimerKind.RESEND, b"")).actions)
    assert not resent, f"{len(resent)} PRE-PREPAREs with their block broadcast again"



# --- 6. A view change that cannot complete relays the same requests to every peer for ever --

def test_a_stranded_replica_relays_a_request_to_a_peer_a_bounded_number_of_times() -> None:
    """733de3d: each VIEW-CHANGE (re)send relays the 4 oldest waiting requests to every peer.
    The resend period is new_view_timeout (2 s), never escalated (the NEW-VIEW timer is), and
    nothing remembers what each peer was sent: during a view change that cannot complete
    (f+1 validators down, or a replica cut off for hours) each replica sends the same 4
    transactions (up to 128 KiB each) to each of its N-1 peers every 2 s, for ever:
    N(N-1)*4 transactions every 2 s on the cluster (360 at N = 10), ~23 MB/s at 128 KiB."""
    replica, actions = stranded_backup()
    for _ in range(300):  # ten minutes of resends: relayed on the 1st, 2nd, 4th ... 128th
        actions += replica.step(TimerFired(TimerKind.VIEW_CHANGE_RESEND, u64(1))).actions
    per_peer = {p: sum(1 for a in actions if isinstance(a, RelayRequests) and a.replica == p)
                for p in (0, 1, 3)}
    assert max(per_peer.values()) <= 8, f"TX relayed per peer in one view: {per_peer}"

