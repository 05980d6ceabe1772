"""Where `pbft-etl export` and `pbft-etl audit --genesis` spend their time (issue 30), on the
etl-large stage's chain (benchmarks/etl_large.py), each a new process as users run them.

    python -m benchmarks.profile_etl [--chain-dir DIR] [--to N] [--out DIR]

Three views of one run of each command, plus a per-rule pass:
- the driver: cProfile of `python -m cli.etl ...` (where the driver's wall time goes: Spark's
  start-up, each action it waits on);
- every Python process (the driver, the Python workers and data-source planners that the JVM
  forks): py-spy (`--subprocesses`, active samples only: waiting on a socket is not counted),
  samples sorted into CATEGORIES by the frames of each stack;
- the JVM: Spark's event log (`spark.eventLog.enabled`, through PYSPARK_SUBMIT_ARGS, so the
  command's own settings are untouched): jobs, stages (run and skipped), tasks, each job's
  wall time and its tasks' run time, by the Python line that started it;
- the node: node 0's CPU seconds over each command (what serving JSON-RPC cost it);
- the audit's rules one at a time (a Spark job group each) on the export, in this process:
  what each rule costs alone (the command runs them as one union, which shares the scans).

Everything lands in --out (default benchmarks/results/profile-etl): summary.json, summary.md,
the py-spy collapsed stacks (speedscope and flamegraph.pl read them), the cProfile dumps and
the event logs. py-spy is a development tool, not a dependency: `pip install py-spy` into the
virtualenv (`make profile` does).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.etl_large import chain_dir, chain_head, measured_commit, open_chain
from benchmarks.testnet import BenchNet, process_cpu_seconds

CHECKOUT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = CHECKOUT / "benchmarks" / "results" / "profile-etl"
SAMPLE_RATE = 50  # py-spy samples a second per process
ETL_DEADLINE = 3_600  # seconds for one profiled command
TOP = 25  # rows of each top list
# (category, pattern over a whole collapsed stack): the first match wins. Frames are
# "function (file:line)"; pyspark's own files are matched by their package path.
CATEGORIES = [
    ("genesis block 0 built by py-evm (driver)", r"genesis_block_hash"),
    # pyspark's workers import pyspark from pyspark.zip: zipimport compiles every module
    # from source in every new Python process (it never writes bytecode)
    ("pyspark imported from pyspark.zip (compiled from source)", r"zipimport"),
    ("imports (module loading)", r"<frozen importlib|_find_and_load"),
    ("signature recovery (coincurve)", r"coincurve|recover_signer|_recover"),
    ("trie roots (py-trie)", r"\(trie/|audit/roots\.py"),
    ("audit column checks (decode, compare)", r"spark_etl/audit/column_rules"),
    ("state replay (py-evm)", r"state_replay|state_rules|/eth/"),
    ("audit rules' other Python (driver: building the plans)", r"spark_etl/audit/"),
    ("JSON-RPC: HTTP, socket", r"spark_etl/rpc\.py.*(http/client|socket|ssl)"),
    ("JSON-RPC: JSON decoding", r"spark_etl/rpc\.py.*json"),
    ("row building (spark_etl/rows, hexcodec)", r"spark_etl/(rows|hexcodec)"),
    ("JSON-RPC: other client code", r"spark_etl/rpc\.py"),
    ("data source: Spark's row conversion to Arrow", r"data_source|datasource|conversion"),
    ("Arrow / pickling to the JVM", r"pyarrow|serializers|pickle|cloudpickle"),
    ("export driver (plan, manifest)", r"spark_etl/export"),
    ("py4j: driver <-> JVM calls", r"py4j"),
    ("pyspark worker loop", r"pyspark/(worker|daemon)"),
]
# Which process a py-spy stack is from: py-spy (--subprocesses) roots each stack in the
# chain of processes down to the sampled one (driver; spark-class; java; a pyspark daemon;
# its forked worker), so the last "process PID:cmdline" frame names the sampled process.
ROLES = [
    ("data source planning", r"plan_data_source_read|create_data_source|lookup_data_sources"),
    ("Python workers (tasks)", r"pyspark\.daemon|pyspark\.worker"),
]
PROCESS_FRAME = "process "
# Driver phases: cumulative time of these functions (cProfile), by name, in this order.
DRIVER_PHASES = [
    ("Spark session start-up", "spark_session"),
    ("probe the nodes", "probe"),
    ("read the manifest", "read_done"),
    ("export waves (fetch, write)", "export_wave"),
    ("  tasks fetch and write their files", "write_by_tasks"),
    ("  range counts (fetch + count: Spark's writer)", "range_counts"),
    ("  write tables (Spark's writer: the manifest, ...)", "write_table"),
    ("read the export", "read"),
    ("genesis block 0 (py-evm)", "genesis_block_hash"),
    ("audit: run_audit", "run_audit"),
    ("  signature recovery job", "signatures"),
    ("  violations (one union, collected)", "find_violations"),
    ("  consensus figures", "consensus_figures"),
    ("class archive / JVM exit", "finish_session"),
]


@dataclass
class CommandProfile:
    command: str
    argv: list[str]
    wall_seconds: float
    node_cpu_seconds: float | None
    driver: dict[str, Any] = field(default_factory=dict)
    python: dict[str, Any] = field(default_factory=dict)
    spark: dict[str, Any] = field(default_factory=dict)


def py_spy_path() -> str | None:
    return shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which(
        "py-spy")


def node_pid(directory: Path, index: int) -> int | None:
    """The pid of the node process running `directory`'s node `index`, if any."""
    config = str(directory / f"node{index}" / "config.toml").encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if config in (proc / "cmdline").read_bytes().split(b"\0"):
                    return int(proc.name)
            except OSError:  # gone meanwhile
                continue
    return None


def profile_command(name: str, etl_args: list[str], out: Path, py_spy: str,
                    node: int | None) -> CommandProfile:
    """Run `pbft-etl ETL_ARGS` under cProfile and py-spy, with Spark's event log on."""
    events = out / f"{name}-events"
    shutil.rmtree(events, ignore_errors=True)
    events.mkdir(parents=True)
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS":
           f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={events.as_uri()} "
           # one plain JSON-lines file (Spark 4 rolls and compresses it with zstd by default)
           "--conf spark.eventLog.compress=false --conf spark.eventLog.rolling.enabled=false "
           "pyspark-shell"}
    argv = [py_spy, "record", "--subprocesses", "--nonblocking", "--rate", str(SAMPLE_RATE),
            "--format", "raw", "--output", str(out / f"{name}-py-spy.txt"), "--",
            sys.executable, "-m", "cProfile", "-o", str(out / f"{name}-driver.prof"),
            "-m", "cli.etl", *etl_args]
    node_before = process_cpu_seconds(node) if node else None
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env,
                          timeout=ETL_DEADLINE, check=False)
    wall = time.monotonic() - started
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: exited {done.returncode}, see {out / f'{name}.log'}")
    node_cpu = process_cpu_seconds(node) - node_before if node and node_before is not None \
        else None
    profile = CommandProfile(name, etl_args, wall, node_cpu)
    profile.driver = driver_phases(out / f"{name}-driver.prof")
    profile.python = python_samples(out / f"{name}-py-spy.txt")
    profile.spark = spark_events(next(events.iterdir()), started_wall=time.time() - wall)
    return profile


def driver_phases(path: Path) -> dict[str, Any]:
    """Cumulative seconds of the driver's phases, and its top functions by cumulative time."""
    stats = pstats.Stats(str(path))
    table: dict[tuple[str, int, str], Any] = stats.stats  # type: ignore[attr-defined]
    by_name: dict[str, float] = defaultdict(float)
    for (file, _, function), (_, _, _, cumulative, _) in table.items():
        if "spark_etl" in file or "cli/" in file:
            by_name[function] = max(by_name[function], cumulative)
    top = sorted(((cumulative, f"{function} ({_short(file)}:{line})")
                  for (file, line, function), (_, _, _, cumulative, _) in table.items()
                  if _ours_or_spark(file)), reverse=True)[:TOP]
    return {
        "total_seconds": max((c for *_, c, _ in table.values()), default=0.0),
        "phases": {label: round(by_name[fn], 2) for label, fn in DRIVER_PHASES
                   if fn in by_name},
        "top_cumulative": [(round(seconds, 2), where) for seconds, where in top],
    }


def _short(file: str) -> str:
    """A path from the package or the checkout it is in."""
    return re.sub(r".*/site-packages/|^" + re.escape(str(CHECKOUT)) + "/", "", file)


def _ours_or_spark(file: str) -> bool:
    return any(part in file for part in ("spark_etl/", "cli/", "pyspark/sql/", "py4j/"))


def python_samples(path: Path) -> dict[str, Any]:
    """py-spy's active samples per process role, and per category within each role."""
    roles: dict[str, Counter[str]] = defaultdict(Counter)
    functions: dict[str, Counter[str]] = defaultdict(Counter)
    for stack, count in _collapsed(path):
        frames = stack.split(";")
        processes = [f for f in frames if f.startswith(PROCESS_FRAME)]
        python = ";".join(f for f in frames if not f.startswith(PROCESS_FRAME))
        if not python:  # a process sampled outside Python (the JVM launcher)
            continue
        role = "driver" if len(processes) <= 1 else next(
            (r for r, pattern in ROLES if re.search(pattern, processes[-1])),
            "short-lived forks (command line gone)")
        category = next((c for c, pattern in CATEGORIES if re.search(pattern, python)),
                        "other")
        roles[role][category] += count
        functions[role][_own_frame(python)] += count
    return {
        "seconds_per_sample": 1 / SAMPLE_RATE,
        "roles": {role: {"seconds": round(sum(c.values()) / SAMPLE_RATE, 1),
                         "categories": {k: round(v / SAMPLE_RATE, 1)
                                        for k, v in c.most_common()}}
                  for role, c in roles.items()},
        "top_own_frames": {role: [(round(v / SAMPLE_RATE, 1), k)
                                  for k, v in c.most_common(TOP)]
                           for role, c in functions.items()},
    }


def _collapsed(path: Path) -> Iterator[tuple[str, int]]:
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            yield stack, int(count)


def _own_frame(stack: str) -> str:
    """The innermost frame of ours (spark_etl, cli, benchmarks) or, if none, the leaf."""
    frames = stack.split(";")
    ours = [f for f in frames if "spark_etl/" in f or "cli/" in f]
    return _short(ours[-1] if ours else frames[-1])


def spark_events(path: Path, started_wall: float) -> dict[str, Any]:
    """Jobs, stages and tasks of one Spark application's event log, with times."""
    jobs: dict[int, dict[str, Any]] = {}
    stages: dict[int, dict[str, Any]] = {}
    tasks: dict[int, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    app: dict[str, float] = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerApplicationStart":
            app["start"] = event["Timestamp"] / 1000
        elif kind == "SparkListenerApplicationEnd":
            app["end"] = event["Timestamp"] / 1000
        elif kind == "SparkListenerJobStart":
            properties = event.get("Properties") or {}
            jobs[event["Job ID"]] = {
                "start": event["Submission Time"] / 1000, "stages": event["Stage IDs"],
                "site": properties.get("spark.job.description")
                or properties.get("callSite.short", "?"),
            }
        elif kind == "SparkListenerJobEnd":
            jobs[event["Job ID"]]["end"] = event["Completion Time"] / 1000
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            stages[info["Stage ID"]] = {
                "name": info["Stage Name"], "tasks": info["Number of Tasks"],
                "seconds": (info["Completion Time"] - info["Submission Time"]) / 1000}
        elif kind == "SparkListenerTaskEnd":
            metrics = event.get("Task Metrics") or {}
            entry = tasks[event["Stage ID"]]
            entry[0] += 1
            entry[1] += metrics.get("Executor Run Time", 0) / 1000
            entry[2] += metrics.get("Executor CPU Time", 0) / 1e9
            entry[3] += metrics.get("JVM GC Time", 0) / 1000
    return _summarise(jobs, stages, tasks, app, started_wall)


def _summarise(jobs: dict[int, dict[str, Any]], stages: dict[int, dict[str, Any]],
               tasks: dict[int, list[float]], app: dict[str, float],
               started_wall: float) -> dict[str, Any]:
    by_site: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for job in jobs.values():
        ran = [s for s in job["stages"] if s in stages]
        site = job["site"]
        if ".py:" not in site and ran:  # no Python call site (a write): the stage's name
            site = stages[min(ran)]["name"]
        entry = by_site[site]
        entry[0] += 1
        entry[1] += len(ran)
        entry[2] += sum(tasks[s][0] for s in ran)
        entry[3] += sum(tasks[s][1] for s in ran)
        spans[site].append((job["start"], job.get("end", job["start"])))
    starts = [j["start"] for j in jobs.values()]
    ends = [j.get("end", j["start"]) for j in jobs.values()]
    all_stages = {s for j in jobs.values() for s in j["stages"]}
    return {
        "jobs": len(jobs),
        "stages_run": len(stages),
        "stages_skipped": len(all_stages - set(stages)),
        "tasks": int(sum(t[0] for t in tasks.values())),
        "task_run_seconds": round(sum(t[1] for t in tasks.values()), 1),
        "task_jvm_cpu_seconds": round(sum(t[2] for t in tasks.values()), 1),
        "task_gc_seconds": round(sum(t[3] for t in tasks.values()), 1),
        "jobs_busy_seconds": round(_union_seconds(list(zip(starts, ends, strict=True))), 1),
        # the driver alone (planning, Python, py4j) between the first job and the last
        "no_job_running_seconds": round(max(ends, default=0) - min(starts, default=0)
                                        - _union_seconds(list(zip(starts, ends, strict=True))),
                                        1),
        "longest_gaps": _gaps(jobs),
        "process_to_app_start_seconds": round(app.get("start", started_wall) - started_wall, 1),
        "app_start_to_first_job_seconds": round(min(starts, default=0) - app.get("start", 0), 1)
        if starts else None,
        "last_job_to_app_end_seconds": round(app.get("end", 0) - max(ends), 1)
        if ends and "end" in app else None,
        "by_call_site": sorted(
            ({"site": site, "jobs": int(v[0]), "stages": int(v[1]), "tasks": int(v[2]),
              # a site's jobs run at once (the audit's union): the time any of them ran
              "wall_seconds": round(_union_seconds(spans[site]), 1),
              "task_seconds": round(v[3], 1)}
             for site, v in by_site.items()), key=lambda e: -e["wall_seconds"]),
    }


def _gaps(jobs: dict[int, dict[str, Any]], count: int = 3) -> list[dict[str, Any]]:
    """The longest stretches with no job running: seconds, the job before and the job after."""
    ordered = sorted(jobs.items(), key=lambda item: item[1]["start"])
    gaps, reach, before = [], float("inf"), None
    for job_id, job in ordered:
        if before is not None and job["start"] > reach:
            gaps.append({"seconds": round(job["start"] - reach, 1), "after_job": before,
                         "before_job": job_id, "next_site": job["site"]})
        end = job.get("end", job["start"])
        reach = end if before is None else max(reach, end)
        before = job_id
    return sorted(gaps, key=lambda g: -g["seconds"])[:count]


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval (jobs may overlap)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def rule_costs(data: str, genesis: str) -> list[dict[str, Any]]:
    """Each audit rule alone on the export `data` (signatures recovered and cached first,
    as the audit does): wall seconds, Spark jobs and stages; in this process's own session."""
    from cli.etl import genesis_validators
    from spark_etl.audit import RULES
    from spark_etl.audit.context import Audit
    from spark_etl.audit.signatures import signatures
    from spark_etl.audit.validators import resolve_validators
    from spark_etl.session import spark_session
    from spark_etl.tables import Dataset

    spark = spark_session()
    context = spark.sparkContext
    dataset = Dataset.read(spark, data)
    validators = resolve_validators(dataset.export_manifest, None,
                                    genesis_validators(Path(genesis)))
    audit = Audit(dataset, validators)
    costs = [_timed_group(context, "signature recovery (cached)",
                          lambda: signatures(audit).count())]
    for rule in RULES:
        costs.append(_timed_group(context, rule.__name__, lambda r=rule: r(audit).collect()))
    spark.stop()
    return sorted(costs, key=lambda c: -c["seconds"])


def _timed_group(context: Any, name: str, action: Callable[[], object]) -> dict[str, Any]:
    context.setJobGroup(name, name)
    started = time.monotonic()
    action()
    seconds = time.monotonic() - started
    tracker = context.statusTracker()
    jobs = tracker.getJobIdsForGroup(name)
    stages = sum(len(info.stageIds) for job in jobs if (info := tracker.getJobInfo(job)))
    return {"rule": name, "seconds": round(seconds, 2), "jobs": len(jobs), "stages": stages}


def profile(net: BenchNet, last: int, out: Path, py_spy: str) -> dict[str, Any]:
    url, genesis = net.rpc_urls([0])[0], net.cluster.description["genesis"]
    node = node_pid(net.cluster.directory, 0)
    workdir = Path(tempfile.mkdtemp(prefix="pbft-profile-etl-"))
    try:
        data = str(workdir / "export")
        commands = [
            ("export", ["export", "--rpc", url, "--out", data, "--to", str(last)]),
            ("audit", ["audit", "--data", data, "--genesis", genesis,
                       "--report", str(out / "audit-report.json")]),
        ]
        profiles = [profile_command(name, args, out, py_spy, node) for name, args in commands]
        try:
            rules = rule_costs(data, genesis)
        except Exception as exc:  # a diagnostic: the commands' profiles stand without it
            rules = [{"rule": f"failed: {type(exc).__name__}: {exc}", "seconds": 0, "jobs": 0,
                      "stages": 0}]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"blocks": last + 1, "chain_transactions": sum(net.next_nonce),
            "measured_at": measured_commit(), "load_average": os.getloadavg(),
            "commands": [asdict(p) for p in profiles], "rules_alone": rules}


def markdown(summary: dict[str, Any]) -> str:
    """The summary as the tables of docs/performance.md."""
    lines = [f"blocks 0-{summary['blocks'] - 1:,}, commit {summary['measured_at']}, load "
             f"average {' '.join(f'{x:.1f}' for x in summary['load_average'])} at the end", ""]
    for command in summary["commands"]:
        spark, driver = command["spark"], command["driver"]
        lines += [f"### `pbft-etl {command['command']}`: {command['wall_seconds']:.1f} s", "",
                  f"Spark: {spark['jobs']} jobs, {spark['stages_run']} stages run "
                  f"({spark['stages_skipped']} skipped), {spark['tasks']} tasks; jobs busy "
                  f"{spark['jobs_busy_seconds']} s; task run time {spark['task_run_seconds']} s"
                  f" (JVM CPU {spark['task_jvm_cpu_seconds']} s, GC {spark['task_gc_seconds']}"
                  f" s); no job running {spark['no_job_running_seconds']} s between the first"
                  f" job and the last (longest: {_gap_list(spark['longest_gaps'])} s); process"
                  f" to Spark app {spark['process_to_app_start_seconds']} s, app to"
                  f" first job {spark['app_start_to_first_job_seconds']} s; node 0 CPU "
                  f"{_seconds(command['node_cpu_seconds'])}", "",
                  "| driver phase | s |", "|---|---|"]
        lines += [f"| {label} | {seconds} |" for label, seconds in driver["phases"].items()]
        lines += ["", "| Spark jobs by call site | jobs | stages | tasks | wall s | task s |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {e['site']} | {e['jobs']} | {e['stages']} | {e['tasks']} | "
                  f"{e['wall_seconds']} | {e['task_seconds']} |" for e in spark["by_call_site"]]
        for role, entry in command["python"]["roles"].items():
            lines += ["", f"| Python, {role}: {entry['seconds']} s active | s |", "|---|---|"]
            lines += [f"| {k} | {v} |" for k, v in entry["categories"].items()]
        lines.append("")
    lines += ["### The audit's rules one at a time", "", "| rule | s | jobs | stages |",
              "|---|---|---|---|"]
    lines += [f"| {r['rule']} | {r['seconds']} | {r['jobs']} | {r['stages']} |"
              for r in summary["rules_alone"]]
    return "\n".join(lines) + "\n"


def _gap_list(gaps: list[dict[str, Any]]) -> str:
    return ", ".join(f"{g['seconds']} before job {g['before_job']}" for g in gaps)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_etl",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chain-dir", type=Path, help="the etl-large chain (its default)")
    parser.add_argument("--to", type=int, help="last block (default: the head)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--again", action="store_true",
                        help="only sort the samples of an earlier run in --out again")
    args = parser.parse_args(argv)
    if args.again:
        return write_summary(args.out, summarise_again(args.out))
    py_spy = py_spy_path()
    if py_spy is None:
        print("py-spy is not installed: .venv/bin/pip install py-spy", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    net = open_chain(chain_dir(args.chain_dir))
    try:
        last = chain_head(net) if args.to is None else args.to
        summary = profile(net, last, args.out, py_spy)
    finally:
        net.close()
    return write_summary(args.out, summary)


def summarise_again(out: Path) -> dict[str, Any]:
    """An earlier run's summary, its driver and Python views made again from its files (the
    categories may have changed since)."""
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    for command in summary["commands"]:
        name = command["command"]
        command["driver"] = driver_phases(out / f"{name}-driver.prof")
        command["python"] = python_samples(out / f"{name}-py-spy.txt")
        started = command["spark"].get("process_to_app_start_seconds", 0.0)
        spark = spark_events(next((out / f"{name}-events").iterdir()), 0.0)
        command["spark"] = {**spark, "process_to_app_start_seconds": started}
    return summary


def write_summary(out: Path, summary: dict[str, Any]) -> int:
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = markdown(summary)
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
