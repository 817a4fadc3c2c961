"""The whole engine on real git, for end-to-end tests: a coordinator repository with a Local
Initiative and its intents, the real service (SQLite store, reference kernel, git adapters),
and the steward's and Executor's moves a test plays by hand.

    engine = Engine.create(tmp_path, {"a": Task(["a.txt"]), "b": Task(["b.txt"], blocked_by=["a"])})
    engine.authorize(max_parallel=2)
    report = engine.tick()                       # provision handoffs
    lane = engine.provision("a", report)         # git worktree add, as a steward
    engine.tick(offers={"a": lane})              # admitted and enrolled
    engine.deliver("a", "a.txt", "a\\n")          # the Executor's edit and `task submit`
    engine.tick()                                # QA, lane commit, integration
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lanes_es.domain.ids import format_timestamp
from lanes_es.tick_input import LaneOfferInput
from tests.gitfixtures import (
    add_lane, intent_json, make_repo, passing_descriptor, run_git, write_file,
)
from lanes_es.usecases.authorize import authorize
from lanes_es.usecases.confirmation import BatchOptions, prepare_confirmation
from lanes_es.usecases.load import active_batch
from lanes_es.usecases.tick import tick

SLUG = "initiative-slug"


@dataclass
class Task:
    scope: list[str]
    blocked_by: list[str] = field(default_factory=list)
    verification: str | None = None
    risk: str = "routine"


def initiative_markdown(tasks: dict[str, Task]) -> str:
    lines = ["# Test Initiative", ""]
    for index, (task_id, task) in enumerate(tasks.items(), start=1):
        lines += [f"## S{index}: {task_id}", ""]
        if task.blocked_by:
            lines += [f"Blocked by: {', '.join(task.blocked_by)}", ""]
        lines += ["Tasks:", f"- {task_id}", ""]
    return "\n".join(lines)


class SteppingClock:
    """A clock a test controls: each call is one millisecond later, so confirmations are always fresh."""

    def __init__(self, start: float = 1_900_000_000.0) -> None:
        self.moment = start

    def __call__(self) -> str:
        from datetime import datetime, timezone

        self.moment += 0.001
        return format_timestamp(datetime.fromtimestamp(self.moment, timezone.utc))


@dataclass
class Engine:
    root: str
    lanes_dir: Path
    tasks: dict[str, Task]
    deps: Any
    slug: str = SLUG

    @classmethod
    def create(cls, tmp_path: Path, tasks: dict[str, Task], *, slug: str = SLUG, files: dict[str, str] | None = None,
               store_url: str | None = None) -> "Engine":
        from lanes_es.bootstrap import bootstrap

        intents = {task_id: intent_json(task_id, task.scope, verification=task.verification or passing_descriptor(),
                                        risk=task.risk)
                   for task_id, task in tasks.items()}
        all_files = {f"docs/initiatives/{slug}.md": initiative_markdown(tasks), **(files or {})}
        root = make_repo(tmp_path / "repo", intents=intents, files=all_files)
        deps = bootstrap(root, store_url, clock=SteppingClock())
        return cls(root=root, lanes_dir=tmp_path / "lanes", tasks=tasks, deps=deps, slug=slug)

    # ------------------------------------------------------------ the user and the Parent

    def authorize(self, max_parallel: int = 1, **options: Any) -> str:
        confirmation = prepare_confirmation(self.deps, self.slug, BatchOptions(max_parallel=max_parallel, **options))
        return authorize(self.deps, confirmation).batch_id

    def tick(self, offers: dict[str, str] | None = None, **inputs: Any) -> dict[str, Any]:
        offered = [LaneOfferInput(task_id=task, path=path) for task, path in (offers or {}).items()]
        return tick(self.deps, self.slug, offers=offered, **inputs).report

    # ------------------------------------------------------------ the steward

    def provision(self, task_id: str, report: dict[str, Any] | None = None, base: str | None = None) -> str:
        """A worktree on the task's Lane branch at the handoff's base head (or `base`)."""
        if base is None:
            handoff = next(h for h in (report or {}).get("handoffs", [])
                           if h.get("action") == "provision" and h["task_id"] == task_id)
            base = handoff["base_head"]
        return add_lane(self.root, self.slug, task_id, self.lanes_dir, base=base)

    def lane(self, task_id: str) -> str:
        return os.path.realpath(self.lanes_dir / f"lane-{task_id}")

    def release(self, task_id: str) -> None:
        run_git(self.root, "worktree", "remove", self.lane(task_id))

    # ------------------------------------------------------------ the Executor

    def deliver(self, task_id: str, path: str, content: str, *, submit: bool = True) -> None:
        write_file(self.lane(task_id), path, content)
        if submit:
            self.submit(task_id)

    def submit(self, task_id: str) -> None:
        from lanes_es.adapters.kernel import ReferenceKernel

        ReferenceKernel(clock=self.deps.now).submit(self.lane(task_id), task_id)

    # ------------------------------------------------------------ reading

    @property
    def batch(self) -> Any:
        return active_batch(self.deps, self.slug)

    def states(self) -> list[str]:
        return [child["state"] for child in self.batch.record["children"]]

    def state_file(self) -> Path:
        return Path(self.root) / ".imm" / "state" / "batches" / f"{self.batch.id}.json"

    def report_file(self) -> Path:
        return Path(self.root) / ".imm" / "state" / "batches" / f"{self.batch.id}.report.json"

    def head(self) -> str:
        return run_git(self.root, "rev-parse", f"imm/{self.slug}").stdout.decode().strip()

    def subjects(self, since: str) -> list[str]:
        out = run_git(self.root, "log", "--format=%s", f"{since}..imm/{self.slug}").stdout.decode()
        return [line for line in out.splitlines() if line]

    def run_to_end(self, deliveries: dict[str, tuple[str, str]], max_ticks: int = 40) -> dict[str, Any]:
        """Play steward and Executor on every handoff until the batch leaves `running`."""
        report = self.tick()
        offers: dict[str, str] = {}
        for _ in range(max_ticks):
            if report["batch_state"] != "running":
                return report
            offers = {}
            for handoff in report["handoffs"]:
                task_id = handoff["task_id"]
                if handoff.get("action") == "provision":
                    offers[task_id] = self.provision(task_id, report)
                elif handoff.get("action") == "release":
                    self.release(task_id)
                elif handoff["role"] == "executor":
                    path, content = deliveries[task_id]
                    self.deliver(task_id, path, content)
            report = self.tick(offers=offers)
        raise AssertionError(f"the batch did not settle in {max_ticks} ticks: {report['batch_state']}")


def observe(root: str, lane: str | None = None) -> dict[str, Any]:
    """A before/after observation for zero-write checks (scenarios LANE-ADM-07)."""
    seen: dict[str, Any] = {
        "head": run_git(root, "rev-parse", "HEAD").stdout,
        "branch": run_git(root, "symbolic-ref", "-q", "HEAD", check=False).stdout,
        "worktrees": run_git(root, "worktree", "list", "--porcelain").stdout,
        "state_files": {p.name: p.read_bytes() for p in sorted((Path(root) / ".imm/state/batches").glob("*.json"))},
    }
    if lane:
        seen["lane_head"] = run_git(lane, "rev-parse", "HEAD", check=False).stdout
        seen["lane_status"] = run_git(lane, "status", "--porcelain", check=False).stdout
        seen["lane_kernel"] = sorted(str(p) for p in Path(lane, ".imm/state/kernel").rglob("*")) \
            if Path(lane, ".imm/state/kernel").exists() else []
    return seen

