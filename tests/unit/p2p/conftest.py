"""Fixtures of the chain.p2p tests."""


from __future__ import annotations

import logging

import pytest


@pytest.fixture
def caplog_transport(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="chain.p2p")
    return caplog
