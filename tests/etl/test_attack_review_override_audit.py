"""Attack review of the override in the audit (issue 31, commit fd6716a): the auditor's
genesis file has an override (`config.pbft.transitions`) and a node serves a chain on which
the old set went on past it. Served on 127.0.0.1 like `test_epochs`' chains."""

from __future__ import annotations

from spark_etl.epochs import UnprovenEpoch, epoch_at, walk_epochs
from spark_etl.rpc import JsonRpcClient
from tests.etl.chain_factory import CHAIN_ID
from tests.etl.test_attack_review_export import FAST, rpc_server
from tests.etl.test_epochs import GENESIS, GENESIS_SET, HEAD, THIRD, EpochChain

T = 21  # the file's override: THIRD decides from block 21
OVERRIDES = {T: tuple(THIRD.addresses)}


def _set_of_the_head(chain: EpochChain) -> tuple[str, ...] | None:
    """The set the walk anchors the node's head 25 in, the auditor's file naming the
    override (None: the walk refused the node)."""
    with rpc_server(chain.answers()) as url, JsonRpcClient(url, FAST) as client:
        try:
            return epoch_at(walk_epochs(client, GENESIS_SET.addresses, CHAIN_ID, HEAD,
                                        OVERRIDES), HEAD).validators
        except UnprovenEpoch:
            return None


def test_the_walk_takes_the_override_where_the_node_says_its_epoch_ends() -> None:
    """What held: the honest node (the override's set from 21) is anchored in it."""
    honest = EpochChain(epochs=((1, GENESIS), (T, THIRD)))
    assert _set_of_the_head(honest) == tuple(THIRD.addresses)


# Fixed (finding 10): the genesis file's next override ends an epoch whatever the node says.
def test_the_walk_takes_the_override_whatever_the_node_says() -> None:
    """The node serves the chain of the old set, gone on past 20 (the block the gone
    validators committed and no survivor did, or a chain of their keys): pbft_getEpoch
    says the genesis epoch never ends. The file says THIRD decides 21 and up: the walk must
    anchor the head 25 in THIRD (and the old set's certificate then fails), or refuse."""
    old_set_went_on = EpochChain(epochs=((1, GENESIS),))
    assert _set_of_the_head(old_set_went_on) in (None, tuple(THIRD.addresses))
