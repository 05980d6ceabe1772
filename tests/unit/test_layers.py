"""The dependency direction of docs/ARCHITECTURE.md, checked on every module's imports, and
`pbft_engine.messages` usable on its own (the audit ETL imports it without the node)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("encoding", "storage", "chain", "pbft_engine", "bft_client", "spark_etl", "cli")
# what each package may import of the project (itself always); cli wires everything
ALLOWED: dict[str, tuple[str, ...]] = {
    "encoding": (),
    "storage": (),
    "chain": ("encoding", "storage"),
    "pbft_engine": ("encoding", "storage", "chain"),
    "bft_client": ("encoding",),
    # the signature checks use the message module and what it is made of, nothing else
    "spark_etl": ("encoding", "pbft_engine.messages", "pbft_engine.quorum",
                  "pbft_engine.errors"),
    "cli": PROJECT,
}
# the replica is a pure state machine: no I/O, no clock, no threads
PURE = "pbft_engine.core"
IMPURE = ("asyncio", "socket", "time", "threading", "os", "plyvel", "aiohttp", "storage",
          "chain", "selectors", "subprocess", "random")


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PROJECT:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


MODULES = list(_modules())


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_imports_point_down_the_layers(module: str, path: Path) -> None:
    package = module.split(".")[0]
    allowed = (package, *ALLOWED[package])
    ours = {i for i in _imports(path) if i.split(".")[0] in PROJECT}
    wrong = sorted(i for i in ours if not any(_within(i, a) for a in allowed))
    assert not wrong, f"{module} imports {wrong}; {package} may import {allowed}"
    if _within(module, PURE):
        io = sorted(i for i in _imports(path) if any(_within(i, x) for x in IMPURE))
        assert not io, f"{module} is the pure core but imports {io}"


def test_the_layer_table_covers_every_package() -> None:
    assert {m.split(".")[0] for m, _ in MODULES} == set(PROJECT) == set(ALLOWED)


def test_the_message_module_loads_without_the_node() -> None:
    """A fresh interpreter imports pbft_engine.messages; of the project it loads only the
    engine's message, quorum and error modules and the bottom `encoding` package."""
    probe = ("import sys, pbft_engine.messages; print(' '.join(sorted(m for m in sys.modules "
             f"if m.split('.')[0] in {PROJECT!r})))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=ROOT, check=True, timeout=120).stdout.split()
    assert set(loaded) == {"pbft_engine", "pbft_engine.messages", "pbft_engine.quorum",
                           "pbft_engine.errors", "encoding", "encoding.rlp"}, loaded
