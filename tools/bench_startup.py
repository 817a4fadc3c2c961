"""`lanes-es bench startup`: how long a `lanes-es` command takes to start, and which imports it pays.

Every Executor's `task submit` and every `status` starts a new interpreter, so start-up is paid
K times over when K Lanes finish together. This runs each command N times on a real repository
(the demo Initiative, a batch started, one Lane enrolled) and prints the median and fastest wall
time, and the CPU time (user + system: what a loaded machine does not inflate), next to the
target (0.2 s) and to a bare `python -c pass`, and, from `python -X importtime`, the modules that
cost the most. Bytecode is written once into the bench's own cache, as an installed lanes-es has
it (PYTHONDONTWRITEBYTECODE would recompile every module on every start). Timings are measured
here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_SECONDS = 0.2
SLUG = "demo"
ENTRY = "import sys; from lanes_es.cli.main import main; sys.exit(main())"  # what the lanes-es script runs


def register(others: Any) -> None:
    command = others.add_parser("startup", help="start-up time of --help, status and task submit",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("--repeat", type=int, default=7, help="runs per command (default 7)")
    command.add_argument("--json", action="store_true", help="print the figures as JSON")
    command.set_defaults(func=lambda args: run_startup_bench(args.repeat, args.json))


def run_startup_bench(repeat: int, as_json: bool) -> int:
    with tempfile.TemporaryDirectory(prefix="lanes-es-bench-startup-") as directory:
        os.environ["PYTHONPYCACHEPREFIX"] = str(Path(directory) / "pycache")  # compiled once, as an install is
        repo, lane = prepare(Path(directory))
        commands = [("python -c pass", [], repo, False), ("lanes-es --help", ["--help"], repo, True),
                    ("lanes-es status", ["status", SLUG], repo, True),
                    ("lanes-es task status", ["task", "status"], lane, True),
                    ("lanes-es task submit", ["task", "submit"], lane, True)]
        rows = [measure(name, args, cwd, repeat, is_lanes) for name, args, cwd, is_lanes in commands]
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            verdict = "" if row["name"].startswith("python") else (
                " met" if row["median_seconds"] <= TARGET_SECONDS else " MISSED")
            print(f"{row['name']:<22} median {row['median_seconds'] * 1000:5.0f} ms, fastest "
                  f"{row['min_seconds'] * 1000:5.0f} ms, CPU {row['cpu_seconds_median'] * 1000:4.0f} ms, imports "
                  f"{row['import_seconds'] * 1000:4.0f} ms"
                  f"{f' (target <= {TARGET_SECONDS * 1000:.0f} ms:{verdict})' if verdict else ''}")
            if row["top_imports"]:
                print("    costliest imports: " + ", ".join(f"{name} {ms:.0f} ms" for name, ms in row["top_imports"]))
    return 0


def prepare(base: Path) -> tuple[Path, Path]:
    """The demo repository with its batch started and the first Lane enrolled."""
    from lanes_es.adapters.git import git
    from lanes_es.cli.demo import make_repository

    repo = base / "repo"
    make_repository(repo)
    lanes_es(repo, "authorize", SLUG, "--yes", "--max-parallel", "1")
    report = json.loads(lanes_es(repo, "tick", SLUG, "--json"))
    handoff = next(item for item in report["handoffs"] if item.get("action") == "provision")
    lane = base / f"lane-{handoff['task_id']}"
    git(str(repo), "worktree", "add", "-q", "-b", handoff["lane_branch"], str(lane), handoff["base_head"])
    lanes_es(repo, "tick", SLUG, "--offer", f"{handoff['task_id']}={lane}")
    return repo, lane


def lanes_es(cwd: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, "-c", ENTRY, *args], cwd=cwd, capture_output=True, text=True,
                            env=_env(), check=False)
    if result.returncode not in (0, 2):
        raise RuntimeError(f"lanes-es {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def measure(name: str, args: list[str], cwd: Path, repeat: int, is_lanes: bool) -> dict[str, Any]:
    """Wall time, and the CPU time of the process (user + system), which a loaded machine does not inflate."""
    argv = [sys.executable, "-c", ENTRY, *args] if is_lanes else [sys.executable, "-c", "pass"]
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), check=False)
    times, cpu = [], []
    for _ in range(max(1, repeat)):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), check=False)
        times.append(time.perf_counter() - began)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    traced = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env(), check=False)
    total, top = import_costs(traced.stderr)
    return {"name": name, "median_seconds": round(statistics.median(times), 4), "min_seconds": round(min(times), 4),
            "cpu_seconds_median": round(statistics.median(cpu), 4), "import_seconds": round(total, 4),
            "top_imports": top}


def import_costs(trace: str, count: int = 5) -> tuple[float, list[tuple[str, float]]]:
    """Seconds spent in top-level imports, and the `count` costliest top-level packages (ms)."""
    top_level: list[tuple[str, float]] = []
    for line in trace.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|", 2)
        if name.startswith(" ") and not name.startswith("  "):  # one space: imported by the program itself
            try:
                top_level.append((name.strip(), int(cumulative) / 1000))
            except ValueError:
                continue
    total = sum(ms for _, ms in top_level) / 1000
    return total, sorted(top_level, key=lambda item: -item[1])[:count]


def _env() -> dict[str, str]:
    """The caller's environment, writing bytecode (as an installed lanes-es has it) into the bench's own cache."""
    project = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": project + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env
