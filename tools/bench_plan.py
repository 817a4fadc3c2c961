"""`lanes-es bench plan`: how long `plan` and `authorize` take for an Initiative of N slices.

For each N it builds a repository whose Initiative has N slices of one task each (scopes disjoint, so one
wave holds them all, with every Nth task blocked by the one before to give the waves a chain), runs
`lanes-es plan SLUG --json` and then `lanes-es authorize SLUG --yes` through the real command line, and
prints the wall time and the CPU time (user + system of the process, which a loaded machine does not
inflate) of each, per slice too. `authorize` reads the plan twice (before the gate and again after the
yes), then records the confirmation. Target: 4,000 slices plan in under 2 s, judged on CPU time (on an
idle machine the wall time is the CPU time plus a little; on a shared one it is whatever the others
leave). Timings are measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET = (4000, 2.0)  # slices, seconds for `plan`
SLUG = "bench"
ENTRY = "import sys; from lanes_es.cli.main import main; sys.exit(main())"  # what the lanes-es script runs


def register(others: Any) -> None:
    command = others.add_parser("plan", help="time of plan and authorize for an Initiative of N slices",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("--slices", type=int, nargs="+", default=[500, 4000], help="values of N (default 500 4000)")
    command.add_argument("--repeat", type=int, default=3, help="runs of `plan` per N (default 3; authorize runs once)")
    command.add_argument("--json", action="store_true", help="print the figures as JSON")
    command.set_defaults(func=lambda args: run_plan_bench(args.slices, args.repeat, args.json))


def run_plan_bench(counts: list[int], repeat: int, as_json: bool) -> int:
    from tools.bench import make_repository
    from tools.bench_startup import _env

    rows = []
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="lanes-es-bench-plan-") as directory:
            repo = Path(directory) / "repo"
            tasks = [f"task-{index:05d}" for index in range(count)]
            make_repository(repo, {SLUG: tasks})
            _chain_every(repo, tasks, 50)
            plans = [_timed(repo, _env(), "plan", SLUG, "--json") for _ in range(max(1, repeat))]
            authorized = _timed(repo, _env(), "authorize", SLUG, "--yes", "--max-parallel", "4", "--json")
        rows.append(_row(count, plans, authorized))
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        verdict = ""
        if row["slices"] == TARGET[0]:
            met = row["plan_cpu_median"] < TARGET[1]
            verdict = f" (target < {TARGET[1]:.0f} s of CPU: {'met' if met else 'MISSED'})"
        print(f"{row['slices']:>6} slices: plan {row['plan_wall_median']:.2f} s wall, {row['plan_cpu_median']:.2f} s CPU "
              f"({row['plan_cpu_ms_per_slice']:.3f} ms a slice){verdict}; authorize {row['authorize_wall']:.2f} s "
              f"wall, {row['authorize_cpu']:.2f} s CPU")
    return 0


def _chain_every(repo: Path, tasks: list[str], step: int) -> None:
    """Every `step`th task is blocked by the one before it: the plan has waves and dependents to count down."""
    from lanes_es.adapters.git import git

    path = repo / "docs" / "initiatives" / f"{SLUG}.md"
    lines = [f"# {SLUG}", ""]
    for index, task_id in enumerate(tasks):
        lines += [f"## S{index}: {task_id}", ""]
        if index and index % step == 0:
            lines += [f"Blocked by: {tasks[index - 1]}", ""]
        lines += ["Tasks:", f"- {task_id}", ""]
    path.write_text("\n".join(lines))
    git(str(repo), "commit", "-q", "-am", "bench: chains")


def _timed(repo: Path, env: dict[str, str], *args: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", ENTRY, *args], cwd=repo, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(f"lanes-es {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _row(count: int, plans: list[tuple[float, float]], authorized: tuple[float, float]) -> dict[str, Any]:
    wall = statistics.median(run[0] for run in plans)
    cpu = statistics.median(run[1] for run in plans)
    return {"slices": count, "plan_wall_median": round(wall, 3), "plan_cpu_median": round(cpu, 3),
            "plan_cpu_ms_per_slice": round(cpu * 1000 / count, 4), "authorize_wall": round(authorized[0], 3),
            "authorize_cpu": round(authorized[1], 3)}
