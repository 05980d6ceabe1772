"""The final attack review of the override: a block below an override executes as it did
before the override was written (`ValidatorRegistry.schedule_in`), or a node that executes it
again (one that lagged when the chain halted, a new node syncing from genesis) computes
another state root than the one certified, and never gets past it."""

from __future__ import annotations

import dataclasses

from chain.system_contracts import ScratchStorage, SystemContractRevert
from pbft_engine.core.params import EngineParams
from pbft_engine.registry import ValidatorRegistry, encode_vote
from tests.unit.test_registry import ADDRESSES, CHAIN_ID

NEWCOMER = ADDRESSES[4]
T = 37  # the override's first block: the chain halted after 36 (two of four gone for good)
BEFORE = EngineParams(CHAIN_ID, tuple(ADDRESSES[:4]), checkpoint_interval=10,
                      log_multiplier=2, max_in_flight=2)
AFTER = dataclasses.replace(BEFORE, transitions=((T, tuple(ADDRESSES[:2])),))


def _block_31(params: EngineParams, add: bool = True) -> tuple[str, dict[object, object]]:
    """Blocks 30 and 31 as each genesis file executes them: three votes pass "add NEWCOMER"
    in block 30 (handover checkpoint 40: after T, so the override voids it); the fourth
    validator's vote for the same change, sent at the same time, lands in block 31."""
    registry, storage = ValidatorRegistry(params), ScratchStorage()
    for voter in range(3):
        registry.call(storage, ADDRESSES[voter], encode_vote(NEWCOMER, True, 0), 30)
    try:
        registry.call(storage, ADDRESSES[3], encode_vote(NEWCOMER, add, 0), 31)
        outcome = "executed"
    except SystemContractRevert as exc:
        outcome = f"reverted: {exc}"
    return outcome, dict(storage.slots)


def test_a_block_below_the_override_executes_as_it_did_before_the_override_was_written() -> None:
    """The chain certified block 31 with the vote reverted ("its addition is scheduled"); a
    node with the override in its genesis file executes the same transaction successfully
    and writes a vote and a second change: another receipt and state root for block 31."""
    certified = _block_31(BEFORE)
    assert certified[0].startswith("reverted")
    assert _block_31(AFTER) == certified


def test_a_removal_vote_below_the_override_executes_as_it_did_before_either() -> None:
    """The mirror: in block 31 the fourth validator votes to remove NEWCOMER again (its
    addition was scheduled in 30). The chain recorded the vote; the override's node reverts
    it ("not a validator"): after_changes(31) leaves out the change the override voids."""
    certified = _block_31(BEFORE, add=False)
    assert certified[0] == "executed"
    assert _block_31(AFTER, add=False) == certified
