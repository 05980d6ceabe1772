"""A node's claimed head, anchored in the genesis validator set (`pbft-etl export --genesis`).

The export plans blocks up to the heads the nodes claim, and checks nothing of a block (the
audit does): a node that makes up well-formed blocks up to a claimed head of 2**63 would be
followed without end. Before planning past it, a node's claimed head must carry a commit
certificate of a quorum of the set that decides that height, for the header the node serves
there (no node operator holds the validators' keys): then the chain does reach that height.
That set is reached from the genesis set by `spark_etl.epochs.walk_epochs`, over the
certified headers of the epoch boundaries only. A node whose head is not certified is left
out of the export, with a one-line warning, by `probe_all`: an honest node always holds its
head's certificate (its engine stores the certificate before it commits the block; catch-up
stores it in the block's write batch), so lowering the head to some height the same node
certifies would trust it further for no honest node's sake."""

from __future__ import annotations

from pbft_engine.messages import MessageError
from spark_etl.audit.context import ValidatorSet
from spark_etl.epochs import (
    Epoch,
    UnprovenEpoch,
    certified_header,
    epoch_at,
    extra_data,
    walk_epochs,
)
from spark_etl.errors import ExtractError
from spark_etl.rpc import JsonRpcClient


class UncertifiedHead(ExtractError):
    """A node's claimed head has no valid commit certificate of its height's validators."""


def check_head(client: JsonRpcClient, head: int, genesis: ValidatorSet) -> None:
    """UncertifiedHead unless block `head` of the node of `client` has a commit certificate
    of a quorum of the set that decides it (proven from the `genesis` set) for the hash of
    the header the node serves there. One request per epoch boundary and one for the head.
    Block 0 needs none: the audit checks it against the genesis."""
    if head == 0:
        return
    try:
        # up to the set of head + 1, which the head's header commits to
        epochs = walk_epochs(client, genesis.addresses, genesis.chain_id, head + 1,
                             dict(genesis.overrides))
    except UnprovenEpoch as exc:
        raise UncertifiedHead(f"its head {head} is not certified: {exc}") from None
    epoch = epoch_at(epochs, head)
    number = hex(head)
    certificate, raw_block = client.batch(
        [("pbft_getCommitCertificate", [number]), ("debug_getRawBlock", [number])]
    )
    try:
        committed = extra_data(certified_header(raw_block, certificate, head, epoch,
                                                genesis.chain_id))
    except (ExtractError, MessageError) as exc:
        raise UncertifiedHead(f"its head {head} is not certified by {epoch.describe()} "
                              f"({exc})") from None
    _check_commitment(head, committed, epochs)


def _check_commitment(head: int, committed: str, epochs: list[Epoch]) -> None:
    """The certified head commits to the set the walk reached for head + 1: else the node
    hid a change (the head then certified by an old set: the keys of a set that has left).
    Extra data 0x only on a chain where nothing ever changed (built before the commitment)."""
    expected = epochs[-1].validators_hash
    if committed != expected and not (committed == "0x" and len(epochs) == 1):
        raise UncertifiedHead(
            f"its head {head} commits to the next validator set {committed}, not to the "
            f"{expected} of the set changes the node served: a change is hidden")
