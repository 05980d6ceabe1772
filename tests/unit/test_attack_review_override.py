"""Attack review of the override (genesis `config.pbft.transitions`, commits fd6716a and
38dd501; issue 31). The attacker is one key of the override's set (a byzantine survivor), a
survivor that restarts behind the others or with the old set's messages in its store, a
vote that passed before the override, or an operator's genesis file. Each finding was a
strict xfail naming the interleaving; all ten are fixed (each marked "Fixed"):
1. an empty checkpoint proof at T - 1 taken by a replica that had not executed T - 1 (an
   IndexError, and one VIEW-CHANGE halting the old set before a planned override): a
   VIEW-CHANGE or NEW-VIEW on a checkpoint stable by the genesis file is taken only once it
   is executed here (`handover.unexecuted_by_genesis`);
2. a survivor's own old-epoch PREPARE at T halted it (SafetyError): a survivor asks for the
   next view at the restart (`handover.take_override`);
3. `schedule_change` checked held messages from the override's first height, not the
   inserted change's; 4. the adapter fed changes by position; 5. the feed's horizon looked
   past a pending override (`EpochSchedule.horizon`); 6. the registry reverted a vote an
   override voids, so blocks below T executed otherwise with the override (now recorded);
7. a genesis dropping or moving an override in force started; 9. a held old-set
   certificate for T survived (`overrides.check_overrides` checks the head and both sides
   of every override, `forget_unproven` drops certificates that no longer verify);
8. a planned override was brought at full speed (`owes_block`); 10. the audit's epoch walk
   (tests/etl/test_attack_review_override_audit.py).
Each rule that held is a passing test.

One replica driven event by event (the helpers of `test_replica_handover`): four genesis
validators V0 (K = 10, W = 2); the override of `test_override` (T = 37, the survivors V0[0]
and V0[1]: n = 2, f = 0, Q = 2) unless a test says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from eth_hash.auto import keccak
from eth_keys.datatypes import PrivateKey

from chain.errors import EngineError
from chain.system_contracts import ScratchStorage, SystemContractRevert
from pbft_engine.core import (
    BlockBuilt,
    Broadcast,
    BuildBlock,
    ChainHead,
    CommitBlock,
    EngineParams,
    FetchCommitted,
    MessageReceived,
    PeerCommitted,
    Replica,
    ScheduleChange,
)
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.engine import PbftEngine
from pbft_engine.epoch_feed import EpochFeed
from pbft_engine.errors import ConfigError
from pbft_engine.messages import (
    Commit,
    KeyVerifier,
    NewView,
    Prepare,
    PrePrepare,
    ViewChange,
    WireMessage,
    encode_commit_certificate,
)
from pbft_engine.overrides import check_overrides
from pbft_engine.registry import ValidatorRegistry, encode_vote
from pbft_engine.validator_state import ValidatorStateFile
from tests.unit.pbft.helpers import GENESIS, PARAMS
from tests.unit.pbft.test_pbft_epochs import (
    KEYS,
    POOL,
    REMOVED,
    V0,
    certificate,
    signed,
)
from tests.unit.test_override import OVERRIDE, SURVIVORS, T
from tests.unit.test_replica_handover import (
    PASSED_AT,
    C,
    Driven,
    block,
    checkpoint_from,
    commit_through,
    digest,
)


def replica_at(index: int, head: int, params: EngineParams = OVERRIDE) -> Driven:
    """Genesis validator V0[index] (re)started at `head` with `params`' genesis file."""
    return Driven(Replica(params, None, KEYS[V0[index]], KeyVerifier(),
                          ChainHead(head, GENESIS), block_digest=keccak,
                          schedule=EpochSchedule.genesis(params)))


@contextlib.contextmanager
def as_the_transport_does() -> Iterator[None]:
    """An exception out of the core's step is logged by the transport, which goes on with
    the next message (`chain/p2p/transport.py` `_deliver`: "a bug in a handler must not
    tear down the validator link"); what the step changed in memory stays."""
    with contextlib.suppress(Exception):
        yield


# --- finding 1: an empty checkpoint proof at T - 1 adopted by a replica that has not executed it


# Fixed (finding 1, see the module's doc).
def test_a_survivor_behind_the_others_takes_the_new_set_s_view_change() -> None:
    """The documented restart (docs/validators.md, steps 1-4): V0[1] restarts at 34, the
    other survivor V0[0] at 36 = T - 1 ("a survivor behind catches up through block sync").
    V0[0] was in a view change when the chain halted, so it asks for the next view with the
    stable checkpoint 36 and no proof (`test_override`). That VIEW-CHANGE reaches V0[1] first
    (or the NEW-VIEW it leads to, which block sync's STATUS offers before the peer's head):
    the step raises, half done (h and the stable checkpoint at 36, the override's epoch
    installed, nothing fetched, nothing written). It must fetch up to 36 instead."""
    behind = replica_at(1, T - 3)
    behind.receive(ViewChange(2, T - 1, (), (), (), 0), SURVIVORS)
    replica = behind.replica
    assert replica.stable_checkpoint <= replica.last_exec or any(
        isinstance(a, FetchCommitted) and a.target_seq_no >= T - 1 for a in behind.actions)


REPLACED = (V0[0], V0[1], POOL[4], POOL[5])  # the two gone replaced by two new keys: f = 1
WITH_NEW_KEYS = dataclasses.replace(PARAMS, transitions=((T, REPLACED),))


# Fixed (finding 1, see the module's doc).
def test_a_survivor_behind_the_others_takes_the_new_set_s_new_view() -> None:
    """The same with the NEW-VIEW that block sync's STATUS offers before the peer's head
    (`BlockSync._on_status` calls `_offer_new_view` first): two gone validators replaced by
    two new keys (n = 4), view 4 formed by V0[0] and the new keys while V0[1] was at 34.
    The step raises with the view active and the rest of the NEW-VIEW not installed."""
    behind = replica_at(1, T - 3, WITH_NEW_KEYS)
    view_changes = tuple(signed(ViewChange(4, T - 1, (), (), (), i), REPLACED, epoch=1)
                         for i in (0, 2, 3))
    new_view = signed(NewView(4, view_changes, (), 0), REPLACED, epoch=1)
    behind.step(MessageReceived(WireMessage(new_view).encode()))
    replica = behind.replica
    assert replica.stable_checkpoint <= replica.last_exec or any(
        isinstance(a, FetchCommitted) and a.target_seq_no >= T - 1 for a in behind.actions)


FUTURE = 57  # an override planned ahead ("H + 1 or higher"): the old set decides up to 56
PLANNED = dataclasses.replace(PARAMS, transitions=((FUTURE, SURVIVORS),))


# Fixed (finding 1, see the module's doc).
def test_one_override_member_cannot_stop_the_old_set_before_a_planned_override() -> None:
    """Every node restarted with an override at 57 while the chain runs at 30 (the file
    allows any block above the head). V0[0], a byzantine member of the override's set,
    signs VIEW-CHANGE(1) with the stable checkpoint 56 and no proof: `stable_by_genesis`
    passes it, and V0[2] takes 56 as its stable checkpoint (h = 56). The old set's votes
    for 31 are then outside its watermarks, it cannot change view (56 not executed), and
    nothing will ever commit 56: the chain halts for good (each correct replica is hit by
    the same message). An empty proof proves nothing about a block not executed here."""
    honest = replica_at(2, 30, PLANNED)
    with as_the_transport_does():
        honest.receive(ViewChange(1, FUTURE - 1, (), (), (), 0), SURVIVORS)
    n = 31
    honest.receive(PrePrepare(0, n, digest(n), 0), V0, (block(n),))
    for i in (1, 3):
        honest.receive(Prepare(0, n, digest(n), i), V0)
    for i in (0, 1, 3):
        honest.receive(Commit(0, n, digest(n), i), V0)
    assert honest.replica.last_exec == n, "the old set's block 31 is refused"


def test_without_the_early_view_change_the_old_set_decides_below_a_planned_override() -> None:
    """The control: the same replica takes block 31 from the old set."""
    honest = replica_at(2, 30, PLANNED)
    commit_through(honest, 31)


# --- finding 8: a planned override is brought at full speed ----------------------------------


# Fixed (finding 8, see the module's doc).
def test_an_idle_primary_does_not_race_to_a_planned_override() -> None:
    """Nodes restarted at 10 with an override at 57 and nothing to order: the primary builds
    empty block 11 at once, then 12, ... 56, as fast as consensus goes (the backups time it
    for them too: `awaits_primary`). An override planned at head + 10^6 is reached within
    minutes, not when the operator planned, and fills the disks with empty blocks."""
    primary = replica_at(0, 10, PLANNED)
    assert not any(isinstance(a, BuildBlock) for a in primary.actions)


def test_an_idle_primary_without_an_override_builds_nothing() -> None:
    """The control: the same primary with the genesis file without the override."""
    primary = replica_at(0, 10, PARAMS)
    assert not any(isinstance(a, BuildBlock) for a in primary.actions)


# --- finding 2: the survivor's own old-epoch message at T in the same view --------------------

NEW_PRIMARY_FIRST = (V0[1], V0[2])  # V0[0] (the old primary) and V0[3] gone; V0[1] leads view 0
REORDERED = dataclasses.replace(PARAMS, transitions=((T, NEW_PRIMARY_FIRST),))
REPROPOSED = b"block 37 of the new set"


def _prepared_37_in_the_old_epoch() -> Driven:
    """V0[2] at 36, active in view 0: the old primary V0[0] proposed the trailing (empty)
    block 37, V0[2] prepared it, and then V0[0] and V0[3] were gone for good. No request
    waits, so no timer ever took V0[2] out of view 0."""
    before = replica_at(2, T - 1, PARAMS)
    before.receive(PrePrepare(0, T, digest(T), 0), V0, (block(T),))
    assert Prepare(0, T, digest(T), 2) in before.sent(Prepare)
    return before


# Fixed (finding 2): a survivor restarted on the override asks for the next view at once
# (`handover.take_override`), so nothing it signed in the old epoch's views is signed again
# in one of them; its PREPARE of the old 37 is no prepared certificate (one PREPARE of the
# four-set's Q - 1 = 2), so the new view proposes afresh.
def test_a_survivor_that_prepared_t_in_the_old_epoch_votes_for_the_new_set_s_block_t() -> None:
    """The survivors V0[1] and V0[2] restart with an override at 37 (their heads are 36);
    V0[2] had sent its PREPARE of the old primary's block 37 in view 0. Both ask for view 1,
    whose primary is V0[2] (replica 1 of the new set): its NEW-VIEW has no O, it proposes a
    block 37 of its own, and V0[1] prepares it: nothing halts."""
    before = _prepared_37_in_the_old_epoch()
    survivor = Driven(Replica.restore(
        REORDERED, None, KEYS[V0[2]], KeyVerifier(), ChainHead(T - 1, GENESIS), before.store,
        block_digest=keccak, schedule=EpochSchedule.genesis(REORDERED),
        signing_bound=before.replica.signing_bound))
    _new_view_then_block_37(survivor, replica_at(1, T - 1, REORDERED))


def test_a_survivor_that_prepared_nothing_at_t_votes_for_the_new_set_s_block_t() -> None:
    """The control: the same survivor without the old PREPARE."""
    _new_view_then_block_37(replica_at(2, T - 1, REORDERED), replica_at(1, T - 1, REORDERED))


def _new_view_then_block_37(primary: Driven, backup: Driven) -> None:
    for driven in (primary, backup):
        assert not driven.replica.halted
        assert [(b.view, b.stable_seq_no) for b in driven.sent(ViewChange)] == [(1, T - 1)]
    primary.step(MessageReceived(_last(backup, ViewChange)))
    backup.step(MessageReceived(_last(primary, NewView)))
    assert any(isinstance(a, BuildBlock) and a.seq_no == T for a in primary.actions)
    primary.step(BlockBuilt(T, keccak(REPROPOSED), REPROPOSED, ()))
    backup.step(MessageReceived(_last(primary, PrePrepare)))
    assert not (primary.replica.halted or backup.replica.halted)
    assert Prepare(1, T, keccak(REPROPOSED), 0, epoch=1) in backup.sent(Prepare)


def _last(driven: Driven, kind: type) -> bytes:
    """The last message of `kind` that `driven` broadcast."""
    return next(a.data for a in reversed(driven.actions) if isinstance(a, Broadcast)
                and isinstance(WireMessage.decode(a.data).signed.body, kind))


# --- finding 3: a change inserted before the override is checked from the override's first ---

FORGED = b"the removed validator's block 11"


# Fixed (finding 3, see the module's doc).
def test_a_removed_validator_s_early_messages_never_count_with_an_override_scheduled() -> None:
    """The handover review's finding 1 with an override at 37 in genesis: V0[0], voted out
    in block 8, sends V0[2] (not yet at 8) a PRE-PREPARE and a COMMIT for 11 as replica 0
    of the genesis set. The change is inserted before the override (epoch 1 from 11, the
    override now epoch 2), and the held messages are checked only from 37: at the install
    the PRE-PREPARE is replayed as V0[1]'s (replica 0 of {V0[1], V0[2], V0[3]}) and V0[2]
    commits V0[0]'s block with V0[0]'s COMMIT (Q = 2)."""
    driven = replica_at(2, PASSED_AT - 1)
    forged = keccak(FORGED)
    driven.receive(PrePrepare(0, C + 1, forged, 0), V0, (FORGED,))
    driven.receive(Commit(0, C + 1, forged, 0), V0)
    commit_through(driven, PASSED_AT)
    driven.step(ScheduleChange(REMOVED, PASSED_AT))
    assert [e.first for e in driven.replica.epochs.schedule.epochs] == [1, C + 1, T]
    commit_through(driven, C)
    checkpoint_from(driven, (0, 1))
    assert driven.replica.epochs.current.validators == REMOVED
    assert Prepare(0, C + 1, forged, 1, epoch=1) not in driven.sent(Prepare), (
        "voted for the removed validator's block as the new primary's")
    assert not any(isinstance(a, CommitBlock) and a.digest == forged for a in driven.actions)


# --- finding 4: the adapter feeds the core only the epochs appended after its own ------------


# Fixed (finding 4, see the module's doc).
def test_the_adapter_feeds_a_change_inserted_before_the_override() -> None:
    """A survivor restarted behind a vote (at 7; the vote passed in 8, effective from 11,
    before the override at 37) commits 8: the feed now reads [genesis, the change, the
    override]; the core knows [genesis, the override] and must hear of the change."""
    driven = replica_at(2, PASSED_AT - 1)
    commit_through(driven, PASSED_AT)
    engine = PbftEngine.__new__(PbftEngine)
    voted = EpochSchedule.genesis(OVERRIDE).schedule(REMOVED, passed_at=PASSED_AT)
    engine.feed = EpochFeed(EpochSchedule.genesis(OVERRIDE), lambda h: voted)
    engine.context = SimpleNamespace(  # type: ignore[assignment]
        head=lambda: SimpleNamespace(block_number=PASSED_AT, hash=digest(PASSED_AT)))
    engine.replica = driven.replica
    engine._perform = driven._take  # type: ignore[method-assign,assignment]
    engine.log = SimpleNamespace(info=lambda *a: None)  # type: ignore[assignment]
    engine._feed_schedule()
    assert driven.replica.epochs.schedule.epochs == voted.epochs


# --- finding 5: the feed's horizon believes sets that a vote before the override may change --


# Fixed (finding 5, see the module's doc).
def test_the_feed_believes_no_set_that_a_vote_passing_after_its_head_may_change() -> None:
    """A node syncing from genesis (an observer, or a survivor restarted with an empty data
    directory) on a chain with the override at 37 and a change that passed in 8. At head 5
    the feed says it knows the set of every height up to 46; block sync then verifies
    blocks 11..36 (certified by the voted set, epoch 1) with the genesis set (epoch 0) as
    one segment, calls the serving peer a liar, and never gets past them."""
    genesis = EpochSchedule.genesis(OVERRIDE)
    feed = EpochFeed(genesis, lambda h: genesis)
    feed.refresh(5, digest(5))
    voted = genesis.schedule(REMOVED, passed_at=PASSED_AT)
    for height in range(1, feed.horizon + 1):
        believed = feed.epoch_at(height)
        assert believed is None or believed == voted.epoch_at(height), (
            f"the feed at head 5 believes epoch {believed and believed.number} at {height}")


# --- finding 6: an override changes how blocks below it execute ------------------------------

NEWCOMER = b"\x42" * 20


def _votes_in_block_30(params: EngineParams) -> tuple[list[str], dict[int, int]]:
    """V0[0], V0[1] and V0[2] vote, in block 30, to add NEWCOMER (it passes with the third:
    c = 40, effective from 41). What each call did, and the registry's storage after."""
    registry, storage, outcomes = ValidatorRegistry(params), ScratchStorage(), []
    for voter in (0, 1, 2):
        try:
            registry.call(storage, V0[voter], encode_vote(NEWCOMER, True, 0), 30)
            outcomes.append("recorded")
        except SystemContractRevert as exc:
            outcomes.append(str(exc))
    return outcomes, storage.slots


# Fixed (finding 6, see the module's doc).
def test_a_block_below_the_override_executes_as_it_did_before_the_override_existed() -> None:
    """The chain ran with the genesis set; a change passed in block 30 (effective from 41),
    then two validators were gone for good at 36 and the survivors restarted with an
    override at 37, which voids the change. A node that executes block 30 again with that
    genesis file (an observer or auditor syncing from genesis, a survivor that lost its data
    directory, `cli/state_replay`) must get the state the validators certified."""
    assert _votes_in_block_30(OVERRIDE) == _votes_in_block_30(PARAMS)


# --- finding 7: `pbft-node init` and the start's check let an override in force move ---------


def _override_s_certificate(number: int) -> bytes:
    """What a node past the override holds: blocks from 37 on certified by the survivors
    (epoch 1), those below by the genesis set."""
    if number >= T:
        return certificate(number, SURVIVORS, (0, 1))
    return certificate(number, V0, (0, 1, 2))


# Fixed (finding 7, see the module's doc).
@pytest.mark.parametrize("transitions", [(), ((T + 2, SURVIVORS),)], ids=["dropped", "moved"])
def test_the_start_refuses_a_genesis_that_rewrites_an_override_below_the_head(
        transitions: tuple[tuple[int, tuple[bytes, ...]], ...]) -> None:
    """A node at 45, past the override at 37, is initialised again with a genesis file
    whose `transitions` lost the override (an older copy of the file) or starts it at 39 (a
    typo): blocks 37 and 38 (or every block from 37) were certified by the survivors, not
    the genesis set the file now names for them."""
    rewritten = EpochSchedule.genesis(dataclasses.replace(PARAMS, transitions=transitions))
    with pytest.raises(ConfigError):
        check_overrides(rewritten, T + 8, PARAMS.chain_id, _override_s_certificate)


def test_the_start_takes_the_override_in_force_as_it_was() -> None:
    """The control: the same node with the file it restarted with starts."""
    assert check_overrides(EpochSchedule.genesis(OVERRIDE), T + 8, PARAMS.chain_id,
                           _override_s_certificate)


def test_the_start_refuses_an_override_added_below_the_head_even_with_the_same_set() -> None:
    """What held: an override added at 20 (below the head 45) naming the genesis set itself
    is refused too: block 20's certificate names epoch 0, and the override's epoch is 1."""
    same_set = EpochSchedule.genesis(dataclasses.replace(PARAMS, transitions=((20, V0),)))
    with pytest.raises(ConfigError, match="block 20's certificate is not epoch 1's"):
        check_overrides(same_set, T + 8, PARAMS.chain_id,
                        lambda n: certificate(n, V0, (0, 1, 2)))


# --- finding 9: the old set's certificate for T, held and not executed, survives the override


def _certified_37_not_executed() -> Driven:
    """V0[1] at 36, in the old epoch: a peer's STATUS proved block 37 with the old set's
    certificate (V0[0], V0[2], V0[3] committed it), and V0[1] asked for its body, which never
    came before V0[2] and V0[3] were gone. Its head is 36, its store holds the certificate."""
    before = replica_at(1, T - 1, PARAMS)
    old = encode_commit_certificate(
        signed(Commit(0, T, digest(T), i), V0, epoch=0) for i in (0, 2, 3))
    before.step(PeerCommitted(T, digest(T), old))
    assert before.replica.last_exec == T - 1 and T in before.replica.log.certified
    return before


# Fixed (finding 9, see the module's doc).
def test_a_survivor_holding_the_old_set_s_certificate_for_t_refuses_to_start(
        tmp_path: Path) -> None:
    """The heads are 36 everywhere, so the operator follows the doc: T = 37. V0[1] restarts
    (the start's check passes: 37 is above its head), asks for block 37's body by the old
    digest (`_advance`), and the commit path does not check extraData: with the body from
    V0[0] it commits the OLD block 37 at a height the override's set decides. V0[0] and
    V0[1] then hold different blocks at 37 (with n = 2, V0[1] drops the new set's 37 as
    "at an executed seqNo": a halt; with more members, a fork). The certificate is a
    decided block above the head: the start must refuse, as for one executed."""
    before = _certified_37_not_executed()
    ValidatorStateFile(tmp_path, V0[1]).write(before.replica.signing_bound)
    engine = PbftEngine.__new__(PbftEngine)
    engine.engine_params = OVERRIDE
    engine.store = before.store  # type: ignore[assignment]
    engine.context = SimpleNamespace(  # type: ignore[assignment]
        head=lambda: SimpleNamespace(block_number=T - 1, hash=GENESIS),
        canonical_header=lambda n: SimpleNamespace(hash=digest(n)) if n < T else None,
        validator_key=PrivateKey(keccak(b"validator 1")), datadir=tmp_path,
        fresh_validator=False)
    engine.feed = EpochFeed(EpochSchedule.genesis(OVERRIDE),
                            lambda h: EpochSchedule.genesis(OVERRIDE))
    engine.log = SimpleNamespace(warning=lambda *a: None,  # type: ignore[assignment]
                                 info=lambda *a: None)
    started: list[Replica] = []
    engine._run_replica = started.append  # type: ignore[method-assign,assignment]
    with pytest.raises(EngineError, match="block 37's certificate is not epoch 1's"):
        asyncio.run(engine.start())
