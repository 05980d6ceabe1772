"""Frames over real TCP on 127.0.0.1: bad lengths, tampered and replayed sealed frames."""


from __future__ import annotations

import tracemalloc

import pytest

from chain.p2p import Channel
from tests.unit.p2p.support import (
    VALIDATOR_KEYS,
    address_of,
    dropped,
    raw_connect,
    raw_handshake,
    read_until_closed,
    refused,
    run,
    sealed_message,
    validator_a,
    wait_for,
)

BAD_FRAMES = {
    "zero_length": (0).to_bytes(4, "big"),
    "length_2_31": (2**31).to_bytes(4, "big"),
    "length_2_32_minus_1": (2**32 - 1).to_bytes(4, "big"),
    "truncated": (100).to_bytes(4, "big") + b"\x00" * 10,
}


@pytest.mark.parametrize("phase", ["before_handshake", "after_handshake"])
@pytest.mark.parametrize("frame", sorted(BAD_FRAMES))
def test_bad_frame_closes_connection_without_allocating(
    frame: str, phase: str, caplog_transport: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        a, a_inbox, a_port = validator_a()
        await a.start()
        try:
            if phase == "before_handshake":
                peer = await raw_connect(a_port)
            else:
                peer = await raw_handshake(a_port, VALIDATOR_KEYS[1])
                peer.writer.write(sealed_message(peer, Channel.ENGINE, b"fine"))
                await a_inbox.wait_for_count(1)
            tracemalloc.start()
            try:
                baseline, _ = tracemalloc.get_traced_memory()
                peer.writer.write(BAD_FRAMES[frame])
                if frame == "truncated":
                    peer.writer.write_eof()
                # Only the header was sent: the victim must close without waiting for a body.
                await read_until_closed(peer.reader)
                await wait_for(a, lambda: dropped(a, "bad_frame") == 1)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak - baseline < 1024 * 1024
            assert a.connected_peers() == set()
            if phase == "before_handshake":
                assert refused(a, "bad_frame") == 1
            peer.close()
        finally:
            await a.stop()

    run(body())
    expected_reason = {
        "zero_length": "zero-length frame",
        "length_2_31": f"frame length {2**31} exceeds cap",
        "length_2_32_minus_1": f"frame length {2**32 - 1} exceeds cap",
        "truncated": "truncated frame (10 of 100 bytes)",
    }[frame]
    assert expected_reason in caplog_transport.text


@pytest.mark.parametrize("attack", ["tampered", "replayed"])
def test_tampered_or_replayed_sealed_frame_closes_connection(
    attack: str, caplog_transport: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        a, a_inbox, a_port = validator_a()
        await a.start()
        try:
            peer = await raw_handshake(a_port, VALIDATOR_KEYS[1])
            good = sealed_message(peer, Channel.ENGINE, b"first")
            peer.writer.write(good)
            await a_inbox.wait_for_count(1)
            assert a_inbox.messages == [(address_of(VALIDATOR_KEYS[1]), 0, b"first")]
            assert a.connected_peers() == {address_of(VALIDATOR_KEYS[1])}
            if attack == "tampered":
                frame = bytearray(sealed_message(peer, Channel.ENGINE, b"second"))
                frame[6] ^= 0x01
                peer.writer.write(bytes(frame))
            else:
                peer.writer.write(good)
            await read_until_closed(peer.reader)
            await wait_for(a, lambda: dropped(a, "decrypt_failure") == 1)
            assert a.connected_peers() == set()
            assert len(a_inbox.messages) == 1
            peer.close()
        finally:
            await a.stop()

    run(body())
    assert "decrypt failure" in caplog_transport.text
