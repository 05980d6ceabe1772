"""chain.genesis: valid files load; every invalid one fails with one clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chain.errors import GenesisError
from chain.genesis import load_genesis_bytes, load_genesis_file

ENGINES = {"dev", "pbft"}
REPO = Path(__file__).resolve().parents[2]


def _genesis(**overrides: object) -> dict:
    document = {
        "config": {"chainId": 1337, "dev": {"period": 0}},
        "alloc": {"0x" + "11" * 20: {"balance": "0xde0b6b3a7640000"}},
        "gasLimit": "0x1c9c380",
        "baseFeePerGas": "0x3b9aca00",
        "timestamp": "0x0",
        "extraData": "0x",
    }
    document.update(overrides)
    return document


def _load(document: object) -> object:
    return load_genesis_bytes(json.dumps(document).encode(), ENGINES)


def test_valid_genesis_loads() -> None:
    genesis = _load(_genesis())
    assert genesis.chain_id == 1337 and genesis.engine == "dev"
    assert genesis.alloc[b"\x11" * 20].balance == 10**18
    assert genesis.gas_limit == 30_000_000 and genesis.base_fee_per_gas == 10**9


@pytest.mark.parametrize("path", sorted((REPO / "genesis").glob("*.json")))
def test_shipped_examples_load(path: Path) -> None:
    assert load_genesis_file(path, ENGINES).chain_id > 0


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "JSON object"),
        (_genesis(config={"dev": {}}), 'missing "config.chainId"'),
        (_genesis(config={"chainId": 5, "clique": {}}), "unknown consensus engine 'clique'"),
        (_genesis(config={"chainId": 5}), "no engine section"),
        (_genesis(config={"chainId": 5, "dev": {}, "pbft": {}}), "several engine sections"),
        (_genesis(alloc={"0x1234": {"balance": "1"}}), "not a 20-byte hex address"),
        (_genesis(alloc={"0x" + "11" * 20: {"balance": "0xzz"}}), "not a decimal or 0x-hex"),
        (_genesis(extraData="0x1"), "not valid hex"),
        (_genesis(extraData="0x" + "00" * 33), "at most 32"),
        (_genesis(gasLimit=-1), "must not be negative"),
        (_genesis(config={"chainId": "seven", "dev": {}}), "config.chainId"),
    ],
)
def test_invalid_genesis_fails_with_a_clear_message(document: object, message: str) -> None:
    with pytest.raises(GenesisError, match=message):
        _load(document)


def test_unreadable_and_non_json_files(tmp_path: Path) -> None:
    with pytest.raises(GenesisError, match="cannot read genesis file"):
        load_genesis_file(tmp_path / "missing.json", ENGINES)
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    with pytest.raises(GenesisError, match="not valid JSON"):
        load_genesis_file(bad, ENGINES)
