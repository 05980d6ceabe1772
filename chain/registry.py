"""Consensus engines by name, from the `pbft_chain.engines` entry-point group."""

from __future__ import annotations

from importlib.metadata import entry_points

from chain.engine import ConsensusEngine
from chain.errors import EngineError

ENTRY_POINT_GROUP = "pbft_chain.engines"


def available_engines() -> set[str]:
    return {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_engine_class(name: str) -> type[ConsensusEngine]:
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        raise EngineError(
            f"no consensus engine named {name!r} is installed; "
            f"installed: {', '.join(sorted(available_engines())) or 'none'}"
        )
    engine_class = matches[0].load()
    if not (isinstance(engine_class, type) and issubclass(engine_class, ConsensusEngine)):
        raise EngineError(f"entry point {name!r} does not name a ConsensusEngine class")
    return engine_class
