"""`lanes-es bench`: git spawns and time of a tick that observes N Lanes in flight and changes nothing.

For each N it builds a repository with N scope-disjoint tasks, authorizes them with
max_parallel N, provisions and offers N worktrees, then measures quiet ticks (every
Lane enrolled, no Executor has submitted). Targets: one spawn to inspect a Lane (its
status; the git directories are read from git's own files), at most 2N + 4 spawns for such
a tick. Also the spawns of one `inspect_lane`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from lanes_es.adapters.git import STATS, git


def register(commands: Any) -> None:
    command = commands.add_parser("bench", help="measure git spawns and tick time for N Lanes in flight",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("--lanes", type=int, nargs="+", default=[1, 8, 32], help="values of N (default 1 8 32)")
    command.add_argument("--repeat", type=int, default=5, help="quiet ticks measured per N (default 5)")
    command.add_argument("--json", action="store_true", help="print the figures as JSON")
    command.set_defaults(func=lambda args: run_bench(args.lanes, args.repeat, args.json))
    others = command.add_subparsers(title="other benchmarks", metavar="WHAT")
    for module in OTHER_BENCHMARKS:
        importlib.import_module(module).register(others)


INSPECT_LANE_TARGET = 1  # spawns of one inspect_lane: its status (git dirs come from git's own files)
# Each module's `register(subparsers)` adds `lanes-es bench WHAT`; add yours here.
OTHER_BENCHMARKS = ("tools.bench_anchor", "tools.bench_store", "tools.bench_integration", "tools.bench_startup",
                    "tools.bench_plan", "tools.bench_realrepo")


def _intent(task_id: str) -> str:
    return json.dumps({
        "contract": "assurance_kernel/task_intent/v1", "task_id": task_id, "goal": f"Deliver {task_id}",
        "acceptance": [{"id": "A1", "assertion": "the file exists", "verification": json.dumps({
            "contract": "assurance_kernel/verification_descriptor/v2",
            "command": {"executable": "true", "argv": [], "cwd": ".", "timeout_ms": 60000, "max_output_bytes": 4096},
            "environment": {"prepare": None, "writable_paths": []}})}],
        "scope_hint": [f"src/{task_id}.txt"], "risk": "routine", "revision": 1, "owner": "user"}, indent=2) + "\n"


def make_repository(root: Path, initiatives: dict[str, list[str]],
                    intent: Callable[[int, str], str] | None = None,
                    populate: Callable[[Path], None] | None = None) -> str:
    """A repository whose Initiatives each run their tasks in slices of one, with the intents
    `intent(index, task)` (default: intents that always pass); `populate(root)` adds a project's files."""
    root.mkdir(parents=True)
    git(str(root), "init", "-q", "-b", "main")
    git(str(root), "config", "user.name", "Bench")
    git(str(root), "config", "user.email", "bench@example.invalid")
    (root / ".gitignore").write_text(".imm/state/\n")
    if populate is not None:
        populate(root)
    (root / "docs" / "initiatives").mkdir(parents=True)
    (root / "docs" / "plans").mkdir(parents=True)
    for slug, tasks in initiatives.items():
        lines = [f"# {slug}", ""]
        for index, task_id in enumerate(tasks):
            lines += [f"## S{index}: {task_id}", "", "Tasks:", f"- {task_id}", ""]
            text = intent(index, task_id) if intent is not None else _intent(task_id)
            (root / "docs" / "plans" / f"{task_id}.intent.json").write_text(text)
        (root / "docs" / "initiatives" / f"{slug}.md").write_text("\n".join(lines))
    git(str(root), "add", "-A")
    git(str(root), "commit", "-q", "-m", "bench base")
    return git(str(root), "rev-parse", "HEAD").text


def _repository(root: Path, count: int, intent: Callable[[int, str], str] | None = None, slug: str = "bench") -> str:
    """A repository of `count` tasks (`task-000`, ...) in one Initiative `slug`."""
    return make_repository(root, {slug: [f"task-{index:03d}" for index in range(count)]}, intent)


def measure(count: int, repeat: int, workdir: Path) -> dict[str, Any]:
    from lanes_es.tick_input import LaneOfferInput
    from lanes_es.bootstrap import bootstrap
    from lanes_es.usecases.authorize import authorize
    from lanes_es.usecases.confirmation import BatchOptions, prepare_confirmation
    from lanes_es.usecases.tick import tick

    repo = workdir / f"repo-{count}"
    base = _repository(repo, count)
    deps = bootstrap(repo)
    confirmation = prepare_confirmation(deps, "bench", BatchOptions(max_parallel=count))
    authorize(deps, confirmation)
    tick(deps, "bench")
    offers = []
    for index in range(count):
        task_id = f"task-{index:03d}"
        lane = workdir / f"lanes-{count}" / task_id
        git(str(repo), "worktree", "add", "-q", "-b", f"imm-lane/bench/{task_id}", str(lane), base)
        offers.append(LaneOfferInput(task_id=task_id, path=str(lane)))
    tick(deps, "bench", offers=offers)
    spawns, seconds = [], []
    for _ in range(repeat):
        STATS.reset()
        started = time.perf_counter()
        report = tick(deps, "bench").report
        seconds.append(time.perf_counter() - started)
        spawns.append(STATS.spawns)
        assert report["batch_state"] == "running", report["reason"]
    from lanes_es.adapters.lane_git import GitLaneInspector

    lanes = GitLaneInspector()
    lanes.inspect_lane(str(repo), offers[0].path)  # warms the coordinator's cached common dir
    STATS.reset()
    lanes.inspect_lane(str(repo), offers[0].path)
    inspect = STATS.spawns
    deps.store.close()
    return {"lanes": count, "spawns_per_tick": max(spawns), "target": 2 * count + 4,
            "spawns_per_inspect_lane": inspect, "tick_seconds_median": round(statistics.median(seconds), 4),
            "tick_seconds_max": round(max(seconds), 4)}


def run_bench(counts: list[int], repeat: int, as_json: bool) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="lanes-es-bench-") as directory:
        for count in counts:
            rows.append(measure(count, repeat, Path(directory)))
            if not as_json:
                row = rows[-1]
                print(f"N={row['lanes']:>3}: {row['spawns_per_tick']:>3} spawns per quiet tick (target <= {row['target']}), "
                      f"{row['spawns_per_inspect_lane']} per inspect_lane (target <= {INSPECT_LANE_TARGET}), tick {row['tick_seconds_median'] * 1000:.1f} ms "
                      f"median, {row['tick_seconds_max'] * 1000:.1f} ms max", flush=True)
    if as_json:
        print(json.dumps(rows, indent=2))
    return 0 if all(row["spawns_per_tick"] <= row["target"] and row["spawns_per_inspect_lane"] <= INSPECT_LANE_TARGET
                    for row in rows) else 1
