"""`lanes-es bench integration`: QA and integration wall time of K settled Lanes, per integration mode.

For each integration mode and each K it builds a repository of K scope-disjoint tasks from
one base, each task's acceptance check a `sleep T`, and runs the batch to the end through
the autopilot with max_parallel K. Each Executor writes its file and submits, then waits
until all K have submitted, so one tick finds K settled-ready Lanes at once (the case a
merge queue is built for). Measured in this process, around the tick's own steps:

- QA: from the start of the first Lane's QA to the end of the last one;
- integration: from the start of the first integration step that integrated a Lane to the
  end of the last one;
- check runs: acceptance commands run during QA and during integration;
- git spawns per integrated Lane, during integration.

Times are also given as multiples of T, with the seconds spent in git in each phase (summed over
threads). Why measured here and not from the events' timestamps: every event of a tick carries the
tick's one `at` (the v2 record and report fold those times, and a run's log must not depend on how
long a step took), so the log holds no time inside a tick; the bench therefore times the steps. `--failing I` makes task I's check fail on any
candidate that holds task 0's work (it passes in its own Lane), to compare what each mode parks.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from lanes_es.adapters.git import STATS

SLUG = "bench"
LOCAL_CLUSTER = "ray-here"


def register(commands: Any) -> None:
    command = commands.add_parser("integration", help="QA and integration wall time of K settled Lanes, per mode",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8], help="values of K (default 1 2 4 8)")
    command.add_argument("--sleep", type=float, default=1.0, help="T, seconds each check sleeps (default 1)")
    command.add_argument("--modes", nargs="+", default=None,
                         help=f"integration modes to compare (default: all, {' '.join(available_modes())})")
    command.add_argument("--verify-workers", type=int, default=None,
                         help="candidate verification workers (default: K)")
    command.add_argument("--failing", type=int, default=None, metavar="I",
                         help="task I's check fails on every candidate holding task 0's work")
    command.add_argument("--json", action="store_true", help="one JSON object per row")
    command.add_argument("--runner", default="local",
                         help="where checks and QA run: local (default), ray://HOST:PORT (a cluster, RAY_AUTH_TOKEN "
                              f"set), or {LOCAL_CLUSTER} (a three-node cluster on this machine, 12 check slots each, "
                              "started for the bench from tests/integration/ray_cluster.py)")
    command.set_defaults(func=lambda args: run_integration_bench(
        args.k, args.sleep, args.modes or available_modes(), args.verify_workers, args.failing, args.json,
        args.runner))


def available_modes() -> list[str]:
    try:
        from lanes_es.domain.candidates import INTEGRATION_MODES
    except ImportError:  # before integration modes existed: today's serial integration only
        return ["serial"]
    return list(INTEGRATION_MODES)


# ---------------------------------------------------------------- the repository


def _intent(task_id: str, check: list[str]) -> str:
    return json.dumps({
        "contract": "assurance_kernel/task_intent/v1", "task_id": task_id, "goal": f"Deliver {task_id}",
        "acceptance": [{"id": "A1", "assertion": "the check passes", "verification": json.dumps({
            "contract": "assurance_kernel/verification_descriptor/v2",
            "command": {"executable": check[0], "argv": check[1:], "cwd": ".", "timeout_ms": 600000,
                        "max_output_bytes": 4096},
            "environment": {"prepare": None, "writable_paths": []}})}],
        "scope_hint": [f"src/{task_id}.txt"], "risk": "routine", "revision": 1, "owner": "user"}, indent=2) + "\n"


def task_ids(count: int) -> list[str]:
    return [f"task-{index:03d}" for index in range(count)]


def check_of(index: int, seconds: float, failing: int | None) -> list[str]:
    if index == failing and index != 0:
        return ["sh", "-c", f"sleep {seconds:g} && test ! -e src/task-000.txt"]
    return ["sleep", f"{seconds:g}"]


def make_repository(root: Path, count: int, seconds: float, failing: int | None) -> None:
    from tools.bench import _repository

    _repository(root, count, lambda index, task_id: _intent(task_id, check_of(index, seconds, failing)), SLUG)


def executor_argv(barrier: Path, count: int) -> list[str]:
    """The scripted Executor, then a barrier: it exits only once all K Lanes have submitted."""
    deliver = shlex.join([sys.executable, "-P", "-m", "lanes_es.cli.example_executor"])
    wait = (f'touch {shlex.quote(str(barrier))}/"$LANES_ES_TASK_ID" && '
            f'while [ "$(ls {shlex.quote(str(barrier))} | wc -l)" -lt {count} ]; do sleep 0.05; done')
    return ["sh", "-c", f"{deliver} && {wait}"]


# ---------------------------------------------------------------- measuring


@dataclass
class Phase:
    """Wall-clock spans of one phase, and what ran inside them."""

    spans: list[tuple[float, float]] = field(default_factory=list)
    checks: int = 0
    spawns: int = 0
    git_seconds: float = 0.0  # summed over threads: spawns run at once count each

    @property
    def seconds(self) -> float:
        return max(end for _, end in self.spans) - min(start for start, _ in self.spans) if self.spans else 0.0


@dataclass
class Probe:
    qa: Phase = field(default_factory=Phase)
    integration: Phase = field(default_factory=Phase)
    current: Phase | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @contextmanager
    def phase(self, phase: Phase, keep: Any = lambda: True) -> Iterator[None]:
        self.current, began, spawns, in_git = phase, time.perf_counter(), STATS.spawns, STATS.seconds
        try:
            yield
        finally:
            self.current = None
            if keep():
                phase.spans.append((began, time.perf_counter()))
                phase.spawns += STATS.spawns - spawns
                phase.git_seconds += STATS.seconds - in_git

    def count_check(self) -> None:
        with self.lock:
            if self.current is not None:
                self.current.checks += 1


@contextmanager
def probing(deps: Any) -> Iterator[Probe]:
    """Time the tick's QA and integration steps and count the checks they run (this process only)."""
    import lanes_es.adapters.qa as qa_adapter
    from lanes_es.tick import integrate as integrate_step
    from lanes_es.tick import qa as qa_step

    probe = Probe()
    run_command, integrate_committed = qa_adapter.run_command, integrate_step.integrate_committed
    # QA of several Lanes is one step (`advance_children`) once it runs concurrently; before, one call per Lane.
    qa_name = "advance_children" if hasattr(qa_step, "advance_children") else "advance_child"
    advance = getattr(qa_step, qa_name)

    def counted_run_command(*args: Any, **kwargs: Any) -> Any:
        probe.count_check()
        return run_command(*args, **kwargs)

    def timed_integration(ctx: Any) -> None:
        moved = lambda: len(ctx.live.children_in("integrated", "needs_human"))  # noqa: E731
        before = moved()
        with probe.phase(probe.integration, keep=lambda: moved() > before):
            integrate_committed(ctx)

    def timed_qa(ctx: Any, children: Any) -> Any:
        with probe.phase(probe.qa, keep=lambda: bool(children)):
            return advance(ctx, children)

    qa_adapter.run_command, integrate_step.integrate_committed = counted_run_command, timed_integration
    setattr(qa_step, qa_name, timed_qa)
    try:
        yield probe
    finally:
        qa_adapter.run_command, integrate_step.integrate_committed = run_command, integrate_committed
        setattr(qa_step, qa_name, advance)


def measure(mode: str, count: int, seconds: float, verify_workers: int | None, failing: int | None,
            workdir: Path, runner: str = "local") -> dict[str, Any]:
    from lanes_es.steward.run import AutopilotOptions, run_autopilot
    from lanes_es.bootstrap import bootstrap
    from lanes_es.usecases.authorize import authorize
    from lanes_es.usecases.confirmation import BatchOptions, prepare_confirmation
    from lanes_es.usecases.load import active_batch

    repo, lanes, barrier = workdir / f"{mode}-{count}" / "repo", workdir / f"{mode}-{count}" / "lanes", \
        workdir / f"{mode}-{count}" / "barrier"
    make_repository(repo, count, seconds, failing)
    barrier.mkdir(parents=True)
    deps = bootstrap(repo)
    on_cluster = runner != "local"
    confirmation = prepare_confirmation(deps, SLUG, BatchOptions(
        max_parallel=count, **_mode_options(mode, verify_workers or count), **({"runner": runner} if on_cluster else {})))
    authorize(deps, confirmation)
    lines: list[str] = []
    dispatched = _dispatch_times()
    seen = len(dispatched)
    with probing(deps) as probe:
        began = time.perf_counter()
        options = AutopilotOptions(batch=BatchOptions(max_parallel=count), lanes_dir=lanes,
                                   executor=executor_argv(barrier, count), yes=True, poll=0.05)
        code = run_autopilot(deps, SLUG, options, out=lines.append)
        total = time.perf_counter() - began
    batch = active_batch(deps, SLUG)
    record = batch.record if batch is not None else {"children": []}
    remote = _remote_checks(deps, batch) if on_cluster and batch is not None else {}
    overheads = [total - ran for total, ran in list(dispatched)[seen:]]
    integrated = [c["task_id"] for c in record["children"] if c["state"] in ("integrated", "released")]
    parked = sorted((c["task_id"], c["reason"]) for c in record["children"] if c["state"] == "needs_human")
    deps.store.close()
    if code not in (0, 3):
        raise RuntimeError(f"the autopilot stopped with exit {code}: " + " | ".join(lines[-5:]))
    return {
        "mode": mode, "k": count, "t": seconds, "batch_state": batch.batch_state if batch else None,
        "qa_seconds": round(probe.qa.seconds, 3), "qa_t": round(probe.qa.seconds / seconds, 2),
        "integration_seconds": round(probe.integration.seconds, 3),
        "integration_t": round(probe.integration.seconds / seconds, 2),
        "qa_check_runs": probe.qa.checks, "integration_check_runs": probe.integration.checks,
        "qa_ticks": len(probe.qa.spans), "integration_ticks": len(probe.integration.spans),
        "git_spawns_per_integrated_lane": round(probe.integration.spawns / max(len(integrated), 1), 1),
        "integration_git_spawns": probe.integration.spawns,
        "integration_git_seconds": round(probe.integration.git_seconds, 3),
        "qa_git_spawns": probe.qa.spawns, "qa_git_seconds": round(probe.qa.git_seconds, 3),
        "integrated": len(integrated), "parked": parked, "total_seconds": round(total, 2),
        **({"runner": "ray", "remote_qa_runs": remote.get("qa", 0), "remote_check_runs": remote.get("check", 0),
            "lost": remote.get("lost", 0),
            "dispatch_overhead_ms_median": round(statistics.median(overheads) * 1000, 1) if overheads else None,
            "dispatch_overhead_ms_mean": round(statistics.mean(overheads) * 1000, 1) if overheads else None}
           if on_cluster else {}),
    }


def _dispatch_times() -> Any:
    from lanes_es.adapters.ray_runner import DISPATCH_TIMES

    return DISPATCH_TIMES


def _remote_checks(deps: Any, batch: Any) -> dict[str, int]:
    """What the batch's log says was sent to the cluster: attempts per kind, and the losses."""
    from lanes_es.domain import events as ev

    counted: dict[str, int] = {}
    for event in deps.store.events(batch.id):
        if isinstance(event, ev.RemoteAttemptDispatched):
            counted[event.kind] = counted.get(event.kind, 0) + 1
        elif isinstance(event, ev.RemoteAttemptLost):
            counted["lost"] = counted.get("lost", 0) + 1
    return counted


def _mode_options(mode: str, verify_workers: int) -> dict[str, Any]:
    if available_modes() == ["serial"]:
        return {}
    return {"integration": mode, "verify_workers": verify_workers}


def run_integration_bench(counts: list[int], seconds: float, modes: list[str], verify_workers: int | None,
                          failing: int | None, as_json: bool, runner: str = "local") -> int:
    """The bench on `runner`; `ray-here` starts a three-node cluster on this machine for it."""
    if runner != LOCAL_CLUSTER:
        return _run_bench(counts, seconds, modes, verify_workers, failing, as_json, runner)
    import os

    from tests.integration.ray_cluster import local_ray_cluster

    with local_ray_cluster() as cluster:
        os.environ.update(cluster.env())
        try:
            return _run_bench(counts, seconds, modes, verify_workers, failing, as_json, cluster.runner)
        finally:
            from lanes_es.adapters.ray_cluster import disconnect

            disconnect()


def _run_bench(counts: list[int], seconds: float, modes: list[str], verify_workers: int | None,
               failing: int | None, as_json: bool, runner: str) -> int:
    unknown = [mode for mode in modes if mode not in available_modes()]
    if unknown:
        print(f"lanes-es bench integration: unknown mode {', '.join(unknown)}; choose from "
              f"{', '.join(available_modes())}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="lanes-es-bench-integration-") as directory:
        for count in counts:
            for mode in modes:
                row = measure(mode, count, seconds, verify_workers, failing, Path(directory), runner)
                rows.append(row)
                if as_json:
                    print(json.dumps(row), flush=True)
                else:
                    print(f"K={count:>2} {mode:<11} QA {row['qa_seconds']:6.2f} s ({row['qa_t']:5.2f} T), "
                          f"integration {row['integration_seconds']:6.2f} s ({row['integration_t']:5.2f} T), "
                          f"check runs {row['qa_check_runs']} QA + {row['integration_check_runs']} integration, "
                          f"{row['git_spawns_per_integrated_lane']} git spawns per integrated Lane "
                          f"({row['integration_git_seconds']:.2f} s in git; QA {row['qa_git_spawns']} spawns, "
                          f"{row['qa_git_seconds']:.2f} s), "
                          f"ticks with QA {row['qa_ticks']} / integration {row['integration_ticks']}, "
                          f"{row['integrated']} integrated, parked {[task for task, _ in row['parked']] or 'none'}"
                          + (f"; on the cluster: {row['remote_qa_runs']} QA + {row['remote_check_runs']} check "
                             f"attempts, dispatch overhead per check {row['dispatch_overhead_ms_median']} ms median "
                             f"({row['dispatch_overhead_ms_mean']} ms mean)" if "runner" in row else ""),
                          flush=True)
    return 0
