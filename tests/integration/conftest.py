"""Real node processes on loopback, driven with web3.py (the processes: `testkit`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from web3 import Web3

from testkit.cluster import Cluster
from testkit.nodes import RunningNode, run_dev_node


@pytest.fixture(scope="module")
def dev_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    """One dev-engine node shared by a test module."""
    yield from run_dev_node(tmp_path_factory.mktemp("testnet"))


@pytest.fixture(scope="module")
def w3(dev_node: RunningNode) -> Web3:
    return dev_node.web3()


@pytest.fixture(scope="module")
def accounts(dev_node: RunningNode) -> list[dict[str, str]]:
    return dev_node.description["accounts"]


def load_contract(name: str) -> dict[str, Any]:
    path = Path(__file__).resolve().parent.parent / "fixtures" / "contracts" / f"{name}.json"
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Four PBFT validators in a full mesh, shared by a test module."""
    cluster = Cluster.create(tmp_path_factory.mktemp("pbft"))
    try:
        cluster.start()
        yield cluster
    finally:
        codes = cluster.close()
    assert codes == [0, 0, 0, 0]
