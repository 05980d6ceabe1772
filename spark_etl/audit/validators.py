"""The validator set and chain id the audit checks signatures against: from a genesis file
(geth format, `config.pbft.validators`: the trust anchor), or, when the auditor trusts the
node (`--trust-node`), the export manifest's chain id with a validators file's addresses or
the set the nodes reported."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from spark_etl.audit.context import Change, ValidatorSet
from spark_etl.errors import DataError, UsageError

ADDRESS = re.compile(r"^0x[0-9a-fA-F]{40}$")


def parse_addresses(items: Iterable[Any], source: str) -> tuple[str, ...]:
    """Lower-case addresses in replica order; UsageError for anything else."""
    addresses = []
    for item in items:
        if not isinstance(item, str) or not ADDRESS.match(item):
            raise UsageError(f"{source}: {item!r} is not an address (0x and 40 hex digits)")
        addresses.append(item.lower())
    if not addresses:
        raise UsageError(f"{source}: no validators listed")
    if len(set(addresses)) != len(addresses):
        raise UsageError(f"{source}: a validator is listed twice")
    return tuple(addresses)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def _json(path: Path) -> Any:
    try:
        return json.loads(_read(path))
    except ValueError as exc:
        raise UsageError(f"{path}: not JSON ({exc})") from None


def read_validators_file(path: Path) -> tuple[str, ...]:
    """A JSON list of addresses, a JSON object with "validators" (testnet.json), or one
    address per line."""
    text = _read(path).strip()
    if not text.startswith(("[", "{")):
        lines = [line.strip() for line in text.splitlines()]
        return parse_addresses([x for x in lines if x and not x.startswith("#")], str(path))
    value = _json(path)
    if isinstance(value, dict):
        value = value.get("validators")
    if not isinstance(value, list):
        raise UsageError(f'{path}: expected a list of addresses or an object with "validators"')
    return parse_addresses(value, str(path))


def _chain_id(value: Any, path: Path) -> int:
    try:
        number = value if isinstance(value, int) else int(str(value), 0)
    except ValueError:
        number = 0
    if isinstance(number, bool) or number <= 0:
        raise UsageError(f"{path}: config.chainId must be a positive number")
    return number


def read_genesis(path: Path) -> ValidatorSet:
    genesis = _json(path)
    config = genesis.get("config") if isinstance(genesis, dict) else None
    if not isinstance(config, dict):
        config = {}
    pbft = config.get("pbft")
    if not isinstance(pbft, dict) or not isinstance(pbft.get("validators"), list):
        raise UsageError(f"{path}: no config.pbft.validators: is it a PBFT chain's genesis?")
    chain_id = _chain_id(config.get("chainId"), path)
    interval = pbft.get("checkpoint_interval", 10)  # pbft_engine.core.params' default
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise UsageError(f"{path}: config.pbft.checkpoint_interval must be a positive integer")
    in_flight = pbft.get("max_in_flight", 2)  # pbft_engine.core.params' default
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
        raise UsageError(f"{path}: config.pbft.max_in_flight must be a positive integer")
    return ValidatorSet(parse_addresses(pbft["validators"], str(path)), chain_id, interval,
                        overrides=_overrides(pbft.get("transitions", []), path),
                        max_in_flight=in_flight)


def _overrides(entries: Any, path: Path) -> tuple[Change, ...]:
    """config.pbft.transitions: [{"block": n, "validators": [...]}, ...], by block."""
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("block"), int)
            and not isinstance(e["block"], bool) and e["block"] >= 2
            and isinstance(e.get("validators"), list) for e in entries):
        raise UsageError(f"{path}: config.pbft.transitions must be a list of "
                         '{"block": n >= 2, "validators": [addresses]}')
    overrides = tuple((e["block"], parse_addresses(e["validators"], str(path)))
                      for e in entries)
    firsts = [first for first, _ in overrides]
    if firsts != sorted(set(firsts)):
        raise UsageError(f"{path}: config.pbft.transitions: each block once, in order")
    return overrides


def _reported(manifest: DataFrame) -> tuple[tuple[str, ...], int]:
    """The validator set and chain id the most exported nodes reported (a tie: the one of
    the first node by URL). The nodes that reported another are reported by validator-set
    and chain-id: a node that disagrees must not take the verdict away (no verdict)."""
    rows = manifest.select("node", "validators", "chain_id").distinct().collect()
    if not rows:
        raise DataError("the export manifest is empty: run `pbft-etl export` first")
    votes = Counter((tuple(r["validators"] or ()), r["chain_id"]) for r in rows)
    first_node = {}
    for row in sorted(rows, key=lambda r: r["node"]):
        first_node.setdefault((tuple(row["validators"] or ()), row["chain_id"]), row["node"])
    return min(votes, key=lambda value: (-votes[value], first_node[value]))


def _claimed(epochs: DataFrame | None) -> tuple[Change, ...]:
    """The epochs (first block, set) the most nodes reported in the epochs table (a tie: the
    first node's by URL), epoch 0's first; none if no node reported well-formed ones. Their
    word: the audit checks every block's extraData against them (`extra-data`)."""
    rows = [] if epochs is None else epochs.select(
        "node", "epoch", "first_block", "validators").collect()
    per_node: dict[str, list[Change]] = {}
    for row in sorted(rows, key=lambda r: (r["node"], r["epoch"] if r["epoch"] is not None
                                           else -1)):
        validators = tuple(str(a).lower() for a in row["validators"] or ())
        per_node.setdefault(row["node"], []).append((row["first_block"], validators))
    claims = [(node, tuple(claim)) for node, claim in per_node.items() if _well_formed(claim)]
    if not claims:
        return ()
    votes = Counter(claim for _, claim in claims)
    first_node: dict[tuple[Change, ...], str] = {}
    for node, claim in claims:
        first_node.setdefault(claim, node)
    return min(votes, key=lambda claim: (-votes[claim], first_node[claim]))


def _well_formed(claim: list[Change]) -> bool:
    firsts = [first for first, _ in claim]
    return (bool(claim) and firsts[0] == 1 and firsts == sorted(set(firsts))
            and all(s and all(isinstance(a, str) and ADDRESS.match(a) for a in s)
                    and len(set(s)) == len(s) for _, s in claim))


def resolve_validators(
    manifest: DataFrame, addresses: tuple[str, ...] | None, genesis: ValidatorSet | None,
    epochs: DataFrame | None = None,
) -> ValidatorSet:
    """The genesis's set, else (trusting the nodes) the given addresses with the chain id the
    most nodes reported, else the genesis set the most nodes reported in `epochs` (or, from
    an export without one, their pbft_getValidators) and their chain id; with the set
    changes after genesis the most nodes reported (`_claimed`)."""
    claimed = _claimed(epochs)
    changes = claimed[1:]
    if genesis is not None:  # its overrides are the genesis file's word, not the nodes'
        overridden = {first for first, _ in genesis.overrides}
        changes = tuple(sorted((*(c for c in changes if c[0] not in overridden),
                                *genesis.overrides)))
        return replace(genesis, changes=changes)
    reported, chain_id = _reported(manifest)
    if addresses is not None:
        return ValidatorSet(addresses, chain_id, changes=changes)
    if claimed:
        return ValidatorSet(claimed[0][1], chain_id, changes=changes)
    return ValidatorSet(parse_addresses(reported, "the export manifest"), chain_id)
