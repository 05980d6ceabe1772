"""Shared helpers for the PBFT unit scenarios (built on the simulator's cluster)."""

from __future__ import annotations

from eth_hash.auto import keccak

from pbft_engine.core import EngineParams, MessageReceived
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.epoch_feed import EpochFeed
from pbft_engine.messages import Authenticator, KeySigner, KeyVerifier, MessageType, WireMessage
from tests.simulation.cluster import Cluster, Node

# One replica driven event by event: four validators, messages signed by hand.
SIGNERS = [KeySigner(keccak(b"validator %d" % i)) for i in range(4)]
PARAMS = EngineParams(chain_id=1337, validators=tuple(s.address for s in SIGNERS))
AUTH = Authenticator(PARAMS.chain_id, PARAMS.validators, KeyVerifier())
GENESIS = keccak(b"genesis")


def from_peer(body: object, blocks: tuple[bytes, ...] = (),
              relayed_by: int | None = None) -> MessageReceived:
    """`body` signed by its replica, delivered by that replica (or relayed by another)."""
    signer = SIGNERS[body.replica]  # type: ignore[attr-defined]
    sender = signer if relayed_by is None else SIGNERS[relayed_by]
    return MessageReceived(WireMessage(AUTH.sign(body, signer), blocks).encode(),  # type: ignore[arg-type]
                           sender.address)


def tx_hashes(count: int, tag: str = "tx") -> list[bytes]:
    return [keccak(f"{tag} {i}".encode()) for i in range(count)]


def commit(cluster: Cluster, txs: list[bytes], limit_ms: int = 20_000,
           nodes: list[Node] | None = None) -> None:
    """Submit `txs` and run until every (given) node has them all; then check safety."""
    for tx in txs:
        cluster.submit(tx)
    def done() -> bool:
        settled = all(node.replica.last_exec == len(node.chain.blocks)
                      for node in cluster.nodes if node.replica is not None)
        return settled and cluster.all_committed(txs, nodes)

    assert cluster.run_until(done, limit_ms), f"not committed: heights {cluster.heights()}"
    cluster.check_safety()


def drop_from(*replicas: int):
    """A network filter that silences the given replicas."""
    return lambda src, dst, wire: src not in replicas


def drop_type(message_type: MessageType, to: int | None = None):
    return lambda src, dst, wire: not (
        wire.signed.body.TYPE is message_type and (to is None or dst == to)
    )


def capture(message_type: MessageType, into: list[WireMessage]):
    def record(src: int, dst: int, wire: WireMessage) -> bool:
        if wire.signed.body.TYPE is message_type:
            into.append(wire)
        return True

    return record


def fixed_feed(validators: tuple[bytes, ...]) -> EpochFeed:
    """The adapter's schedule feed of a chain whose set never changes (the genesis set)."""
    genesis = EpochSchedule.genesis(EngineParams(chain_id=1, validators=validators))
    return EpochFeed(genesis, lambda block_hash: genesis)
