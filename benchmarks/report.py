"""Benchmark results: rows with an absolute figure, a reference, their ratio and the target,
printed as a table and written as JSON."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any


@dataclass
class Row:
    benchmark: str  # "1" .. "6", the numbering
    name: str
    value: float | None  # None: not measured (the note says why)
    unit: str
    reference: float | None = None  # what the ratio divides by
    reference_name: str = ""
    target: float | None = None  # for the ratio, or for the value when `absolute`
    at_most: bool = False  # the target is an upper bound
    absolute: bool = False  # the target is in `unit`, not a ratio
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.reference:
            return None
        return self.value / self.reference

    @property
    def met(self) -> bool | None:
        measured = self.value if self.absolute else self.ratio
        if measured is None or self.target is None:
            return None
        return measured <= self.target if self.at_most else measured >= self.target

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "met": self.met}


@dataclass
class Results:
    machine: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        print(format_row(row), flush=True)
        return row

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "rows": [r.to_json() for r in self.rows],
            "details": self.details,
            "errors": self.errors,
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")


def describe_machine() -> dict[str, Any]:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")),
        platform.processor(),
    )
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "py-evm": version("py-evm"),
        "coincurve": version("coincurve"),
        "plyvel": version("plyvel"),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "load_average_start": os.getloadavg(),
    }


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def _verdict(row: Row) -> str:
    if row.target is None:
        return ""
    bound = "<=" if row.at_most else ">="
    target = f"{bound} {row.target:g}" + (f" {row.unit}" if row.absolute else "x")
    met = {True: "met", False: "MISSED", None: "n/a"}[row.met]
    return f"{target} {met}"


def format_row(row: Row) -> str:
    ratio = f"{row.ratio:.2f}x {row.reference_name}" if row.ratio is not None else ""
    return (f"{row.benchmark:>2} {row.name:<44} {_number(row.value):>9} {row.unit:<9} "
            f"{ratio:<34} {_verdict(row)}")


def format_table(results: Results) -> str:
    machine = results.machine
    lines = [
        f"machine: {machine['cores']} cores ({machine['cpu']}), {machine['memory_gib']} GiB, "
        f"Python {machine['python']}, py-evm {machine['py-evm']}, commit {machine['commit']}, "
        f"load average {' '.join(f'{x:.1f}' for x in machine['load_average_start'])} at start",
        f"{'#':>2} {'benchmark':<44} {'value':>9} {'unit':<9} {'ratio to reference':<34} target",
    ]
    lines += [format_row(row) for row in results.rows]
    lines += [f"   note ({row.name}): {row.note}" for row in results.rows if row.note]
    lines += [f"   error: {error}" for error in results.errors]
    return "\n".join(lines)
