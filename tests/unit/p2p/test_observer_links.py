"""Observers on the transport: a validator lets in the observer keys it was given (they dial
it), never dials them, leaves them out of its broadcasts, and queues nothing for one that is
gone; any other key is refused. An observer reaches every validator it dials."""

from __future__ import annotations

from chain.p2p import Channel, Transport
from tests.unit.p2p.support import (
    CHAIN_ID,
    FAST,
    HOST,
    STRANGER_KEY,
    VALIDATOR_KEYS,
    Inbox,
    address_of,
    dropped,
    free_port,
    make_transport,
    refused,
    run,
    wait_for,
)

OBSERVER_KEY = VALIDATOR_KEYS[3]  # a key the validators below do not hold as a validator
VALIDATORS = VALIDATOR_KEYS[:2]


Endpoints = dict[bytes, tuple[str, int]]


def _validators(observers: list[bytes]) -> tuple[list[Transport], list[Inbox], Endpoints]:
    """Two validators dialing each other, letting in `observers`."""
    ports = [free_port() for _ in VALIDATORS]
    endpoints = {address_of(k): (HOST, p) for k, p in zip(VALIDATORS, ports, strict=True)}
    inboxes = [Inbox() for _ in VALIDATORS]
    made = [
        Transport(key, CHAIN_ID, {a: e for a, e in endpoints.items() if a != address_of(key)},
                  HOST, port, inbox, FAST, observers=observers)
        for key, port, inbox in zip(VALIDATORS, ports, inboxes, strict=True)]
    return made, inboxes, endpoints


def test_an_allowed_observer_connects_and_is_left_out_of_broadcasts() -> None:
    async def body() -> None:
        observer_address = address_of(OBSERVER_KEY)
        validators, inboxes, endpoints = _validators([observer_address])
        observer, observer_inbox = make_transport(OBSERVER_KEY, endpoints, free_port())
        for transport in (*validators, observer):
            await transport.start()
        try:
            await wait_for(observer, lambda: len(observer.connected_peers()) == 2)
            for validator in validators:
                await wait_for(validator, lambda v=validator: len(v.connected_peers()) == 2)
            # a validator's broadcast reaches the other validator, not the observer
            assert validators[0].broadcast(Channel.ENGINE, b"prepare") == 1
            await inboxes[1].wait_for_count(1)
            # a message for the observer goes to it, after the broadcast it was left out of;
            # the observer's broadcast reaches both validators
            assert validators[0].send(observer_address, Channel.BLOCK_SYNC, b"status")
            await observer_inbox.wait_for_count(1)
            assert observer_inbox.messages == [
                (address_of(VALIDATORS[0]), Channel.BLOCK_SYNC, b"status")]
            assert observer.broadcast(Channel.TX_GOSSIP, b"tx") == 2
            gossip = (observer_address, Channel.TX_GOSSIP, b"tx")
            for inbox in inboxes:
                await inbox.signal.wait_until(lambda i=inbox: gossip in i.messages)
            # gone: nothing is queued for it (a validator holds nothing for lost observers)
            await observer.stop()
            await wait_for(validators[0], lambda: len(validators[0].connected_peers()) == 1)
            before = dropped(validators[0], "not_connected")
            assert not validators[0].send(observer_address, Channel.BLOCK_SYNC, b"status")
            assert dropped(validators[0], "not_connected") == before + 1
        finally:
            for transport in (*validators, observer):
                await transport.stop()

    run(body())


def test_a_key_not_listed_as_an_observer_is_refused() -> None:
    async def body() -> None:
        validators, _, endpoints = _validators([address_of(OBSERVER_KEY)])
        stranger, _ = make_transport(STRANGER_KEY, endpoints, free_port())
        for transport in (*validators, stranger):
            await transport.start()
        try:
            for validator in validators:
                await wait_for(validator, lambda v=validator: refused(v, "unknown_key") >= 1)
                assert address_of(STRANGER_KEY) not in validator.connected_peers()
        finally:
            for transport in (*validators, stranger):
                await transport.stop()

    run(body())
