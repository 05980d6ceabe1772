"""The epochs walk (`spark_etl.epochs`) and the head anchor over set changes: a chain whose
validators vote a fifth member in (from block 11) and then one of the genesis members out
(from block 21), served by nodes on 127.0.0.1. Honest: every epoch proven from the genesis
set, the head certified by the last set, in a handful of requests. Lies: caught."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import rlp
from eth_hash.auto import keccak

from pbft_engine.epoch_feed import validators_hash as chain_validators_hash
from pbft_engine.messages import Commit, KeySigner
from pbft_engine.quorum import quorum
from spark_etl.audit.context import ValidatorSet
from spark_etl.epochs import UnprovenEpoch, claimed_epochs, validators_hash, walk_epochs
from spark_etl.export import ExportOptions, probe_all
from spark_etl.hexcodec import from_hex
from spark_etl.rpc import JsonRpcClient
from tests.etl.chain_factory import CHAIN_ID, Validators, certificate_json, hexed
from tests.etl.test_attack_review_export import (
    FAST,
    Answer,
    honest_answers,
    made_up_header,
    rpc_server,
)

GENESIS = Validators()  # 4 validators
ADDED = KeySigner(b"\x05" * 32)
SECOND = Validators([*GENESIS.signers, ADDED], epoch=1)  # voted in: from block 11 (N = 5, Q = 4)
THIRD = Validators([*GENESIS.signers[1:], ADDED], epoch=2)  # validator 0 voted out: from block 21
FIRSTS = (1, 11, 21)
HEAD = 25
GENESIS_SET = ValidatorSet(tuple(GENESIS.addresses), CHAIN_ID)


@dataclass
class EpochChain:
    """Made-up headers (13 fields: extraData is the 13th) of a chain with these epochs, each
    certified by a quorum of its height's set; what a node of it answers, lies optional."""

    epochs: tuple[tuple[int, Validators], ...] = tuple(zip(FIRSTS, (GENESIS, SECOND, THIRD),
                                                          strict=True))
    head: int = HEAD

    def set_at(self, number: int) -> Validators:
        return next(v for first, v in reversed(self.epochs) if number >= first)

    def header_fields(self, number: int) -> list[Any]:
        commitment = keccak(rlp.encode(sorted(s.address for s in self.set_at(number + 1).signers)))
        return [*made_up_header(number)[:12], commitment]

    def header(self, number: int) -> bytes:
        return rlp.encode(self.header_fields(number))

    def certificate(self, number: int, signers: Validators | None = None) -> dict[str, Any]:
        signers = signers or self.set_at(number)
        digest = keccak(self.header(number))
        return certificate_json(signers, [signers.sign(Commit(0, number, digest, r))
                                          for r in range(quorum(len(signers.signers)))])

    def epoch_of(self, number: int) -> dict[str, Any]:
        """pbft_getEpoch's answer (the fields the walk reads, and the set)."""
        index = max(i for i, (first, _) in enumerate(self.epochs) if number >= first)
        later = self.epochs[index + 1:]
        return {"epoch": hex(index), "firstBlock": hex(self.epochs[index][0]),
                "validators": self.epochs[index][1].addresses,
                "lastBlock": hex(later[0][0] - 1) if later else None}

    def answers(self) -> Answer:
        served = honest_answers(self.head)
        methods: dict[str, Callable[[int], Any]] = {
            "debug_getRawBlock": lambda n: hexed(rlp.encode([self.header_fields(n), [], []])),
            "pbft_getCommitCertificate": self.certificate,
            "pbft_getEpoch": self.epoch_of,
            "pbft_getValidatorsByBlockNumber": lambda n: self.set_at(n).addresses,
        }

        def answer(method: str, params: list[Any]) -> Any:
            if method not in methods:
                return served(method, params)
            number = int(params[0], 16)
            return methods[method](number) if number <= self.head + 1 else None

        return answer


def lying(answers: Answer, method: str, lie: Callable[[int], Any]) -> Answer:
    """`answers`, but `method` answered with `lie(block number)`."""
    return lambda m, p: lie(int(p[0], 16)) if m == method else answers(m, p)


def counted(answers: Answer, asked: Counter[str]) -> Answer:
    def answer(method: str, params: list[Any]) -> Any:
        asked[method] += 1
        return answers(method, params)

    return answer


def test_the_hash_is_the_chain_s_commitment() -> None:
    addresses = tuple(SECOND.addresses)
    assert from_hex(validators_hash(addresses)) == chain_validators_hash(
        tuple(s.address for s in SECOND.signers))
    assert validators_hash(addresses) == validators_hash(tuple(reversed(addresses)))


def test_the_walk_proves_each_epoch_from_the_genesis_set_visiting_only_the_boundaries() -> None:
    asked: Counter[str] = Counter()
    with rpc_server(counted(EpochChain().answers(), asked)) as url, \
            JsonRpcClient(url, FAST) as client:
        epochs = walk_epochs(client, GENESIS_SET.addresses, CHAIN_ID, HEAD)
    assert [(e.number, e.first_block, e.last_block) for e in epochs] == [
        (0, 1, 10), (1, 11, 20), (2, 21, None)]
    assert [e.validators for e in epochs] == [tuple(v.addresses)
                                              for v in (GENESIS, SECOND, THIRD)]
    assert [(e.n, e.f, e.quorum) for e in epochs] == [(4, 1, 3), (5, 1, 4), (4, 1, 3)]
    assert epochs[1].validators_hash == hexed(EpochChain().header(10)[-32:])
    # one pbft_getEpoch per epoch, one certified header and set per boundary
    assert asked == {"pbft_getEpoch": 3, "debug_getRawBlock": 2, "pbft_getCommitCertificate": 2,
                     "pbft_getValidatorsByBlockNumber": 2}


def test_a_height_before_a_change_needs_no_boundary() -> None:
    with rpc_server(EpochChain().answers()) as url, JsonRpcClient(url, FAST) as client:
        assert len(walk_epochs(client, GENESIS_SET.addresses, CHAIN_ID, 10)) == 1
        assert len(walk_epochs(client, GENESIS_SET.addresses, CHAIN_ID, 11)) == 2


def _probe(liar: Answer) -> list[str]:
    """probe_all of an honest node of EpochChain and `liar` with --genesis: the honest node
    is kept; the warnings."""
    with rpc_server(EpochChain().answers()) as honest, rpc_server(liar) as lie:
        options = ExportOptions(nodes=(honest, lie), out="unused", policy=FAST,
                                genesis=GENESIS_SET)
        warnings: list[str] = []
        infos = probe_all(options, warnings.append)
    assert [info.url for info in infos] == [honest]
    return [w.replace(lie, "LIAR") for w in warnings]


CHAIN = EpochChain()
OUTSIDERS = Validators([KeySigner(bytes([0x70 + i]) * 32) for i in range(5)])


@pytest.mark.parametrize(("liar", "why"), [
    # a set that does not hash to the commitment of the certified block before it
    (lying(CHAIN.answers(), "pbft_getValidatorsByBlockNumber",
           lambda n: OUTSIDERS.addresses if n == 11 else CHAIN.set_at(n).addresses),
     "its head 25 is not certified: the validators served for block 11 hash to"),
    # the head certified by the genesis set, the changes hidden: the old set above c
    (lying(lying(CHAIN.answers(), "pbft_getEpoch",
                 lambda n: {**CHAIN.epoch_of(n), "lastBlock": None}),
           "pbft_getCommitCertificate", lambda n: CHAIN.certificate(n, GENESIS)),
     "its head 25 commits to the next validator set 0x"),
    # the changes claimed, but the head certified by the old set
    (lying(CHAIN.answers(), "pbft_getCommitCertificate",
           lambda n: CHAIN.certificate(n, SECOND if n == HEAD else None)),
     "its head 25 is not certified by the validators of epoch 2 (from block 21) (a COMMIT "
     "names epoch 1, counted here only in epoch 2)"),
    # a change claimed where the certified header commits to the same set
    (lying(CHAIN.answers(), "pbft_getEpoch",
           lambda n: {**CHAIN.epoch_of(n), "lastBlock": "0x7"} if n == 1 else CHAIN.epoch_of(n)),
     "its head 25 is not certified: block 7 commits to the same validator set"),
    # a boundary block certified by a set that does not decide it
    (lying(CHAIN.answers(), "pbft_getCommitCertificate",
           lambda n: CHAIN.certificate(n, OUTSIDERS)),
     "its head 25 is not certified: block 10 is not certified by the genesis validators"),
])
def test_a_set_change_that_the_certified_headers_do_not_prove_leaves_the_node_out(
    liar: Answer, why: str,
) -> None:
    [warning] = _probe(liar)
    assert warning.startswith(f"warning: LIAR: {why}"), warning


def test_a_boundary_that_commits_to_no_set_is_not_proven() -> None:
    """An old chain (extraData 0x everywhere) whose node claims a change: no commitment."""

    class Uncommitted(EpochChain):
        def header_fields(self, number: int) -> list[Any]:
            return made_up_header(number)

    with rpc_server(Uncommitted().answers()) as url, JsonRpcClient(url, FAST) as client, \
            pytest.raises(UnprovenEpoch, match="block 10 commits to no next validator set"):
        walk_epochs(client, GENESIS_SET.addresses, CHAIN_ID, HEAD)


def test_an_override_of_the_genesis_file_is_proven_by_the_file_not_the_header() -> None:
    """The third set takes over at block 21 by the genesis file's config.pbft.transitions:
    block 20 was decided before anyone knew, so it commits to the set the votes scheduled
    (the second, again). With the file's override the walk takes the third set from 21;
    without it, nothing proves the change."""

    class Overridden(EpochChain):
        def header_fields(self, number: int) -> list[Any]:
            fields = super().header_fields(number)
            if number == FIRSTS[2] - 1:
                fields[-1] = keccak(rlp.encode(sorted(s.address for s in SECOND.signers)))
            return fields

    with rpc_server(Overridden().answers()) as url, JsonRpcClient(url, FAST) as client:
        epochs = walk_epochs(client, GENESIS_SET.addresses, CHAIN_ID, HEAD,
                             {FIRSTS[2]: tuple(THIRD.addresses)})
        assert [(e.number, e.first_block, e.validators) for e in epochs][-1] == (
            2, FIRSTS[2], tuple(THIRD.addresses))
        with pytest.raises(UnprovenEpoch, match="commits to the same validator set"):
            walk_epochs(client, GENESIS_SET.addresses, CHAIN_ID, HEAD)


def test_a_node_claiming_endless_one_block_epochs_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """claimed_epochs (what the export writes) stops at MAX_EPOCHS requests."""
    monkeypatch.setattr("spark_etl.epochs.MAX_EPOCHS", 5)
    endless = lying(CHAIN.answers(), "pbft_getEpoch", lambda n: {
        **CHAIN.epoch_of(1), "firstBlock": hex(n), "lastBlock": hex(n)})
    asked: Counter[str] = Counter()
    with rpc_server(counted(endless, asked)) as url, JsonRpcClient(url, FAST) as client, \
            pytest.raises(UnprovenEpoch, match="more than 5 epochs claimed"):
        claimed_epochs(client, 2**63 - 1)
    assert asked["pbft_getEpoch"] == 5


def test_the_claimed_epochs_are_the_node_s_word_up_to_the_last_block() -> None:
    with rpc_server(EpochChain().answers()) as url, JsonRpcClient(url, FAST) as client:
        assert [(e.first_block, e.last_block) for e in claimed_epochs(client, 12)] == [
            (1, 10), (11, 20)]
