"""Engine parameters from the genesis `config.pbft` section."""

from __future__ import annotations

import pytest

from pbft_engine.core import EngineParams
from pbft_engine.core.epochs import EpochSchedule
from pbft_engine.errors import ConfigError

ADDRESSES = ["0x" + f"{i:040x}" for i in range(1, 5)]


def test_from_genesis_converts_seconds_and_derives_quorums() -> None:
    params = EngineParams.from_genesis(5, {
        "validators": ADDRESSES, "checkpoint_interval": 5, "log_multiplier": 3,
        "request_timeout": 1.5, "new_view_timeout": 2, "new_view_timeout_cap": 30,
        "block_period": 0.5, "empty_blocks": True,
    })
    genesis = EpochSchedule.genesis(params).current
    assert (genesis.n, genesis.f, genesis.quorum, genesis.view_change_quorum) == (4, 1, 3, 3)
    assert params.log_size == 15 and params.request_timeout_ms == 1500
    assert params.block_period_ms == 500 and params.empty_blocks
    assert [genesis.primary(v) for v in range(6)] == [0, 1, 2, 3, 0, 1]
    assert params.max_in_flight == 2  # the default, chosen by measurement (docs/performance.md)
    widest = EngineParams.from_genesis(5, {"validators": ADDRESSES, "checkpoint_interval": 5,
                                           "log_multiplier": 2, "max_in_flight": 10})
    assert widest.max_in_flight == widest.log_size == 10  # never beyond H = h + L


@pytest.mark.parametrize("config", [
    {},
    {"validators": []},
    {"validators": [ADDRESSES[0], ADDRESSES[0]]},
    {"validators": ["0x1234"]},
    {"validators": ADDRESSES, "checkpoint_interval": 0},
    {"validators": ADDRESSES, "new_view_timeout": 10, "new_view_timeout_cap": 5},
    {"validators": ADDRESSES, "request_timeout": "soon"},
    {"validators": ADDRESSES, "max_in_flight": 0},
    {"validators": ADDRESSES, "checkpoint_interval": 5, "log_multiplier": 2, "max_in_flight": 11},
])
def test_invalid_config_is_a_config_error(config: dict) -> None:
    with pytest.raises(ConfigError):
        EngineParams.from_genesis(5, config)
