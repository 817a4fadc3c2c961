"""The store soak: several repositories, several batches each, processes ticking them at random.

Each repository holds `batches` Initiatives of two tasks each, run one after another (a
coordinator checkout carries one batch branch at a time). Each of `processes` worker
processes, for `rounds` rounds, picks a repository at random and plays Parent, steward and
Executor for its current batch: authorizes it when it has no batch yet, ticks it, makes the
Lanes a provision handoff asks for and offers them, delivers and submits in each Lane an
Executor handoff names, removes released Lanes. Workers meet on the same batches all the
time; a tick that finds the batch lock held, a Lane another worker already made, a task
another worker already submitted, are the races this soak is about and are counted, not
fatal. Every tick's resulting (batch, version, chain head) is kept.

Then: nothing lost (every kept version and head is in the log), no duplicate commit (each
batch branch carries each task once, the record's commits are distinct), every batch
verifies (`verify`, exit 0), and the read model matches a rebuild from scratch.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lanes_es.adapters.git import git, git_ok
from lanes_es.usecases.authorize import authorize
from lanes_es.usecases.confirmation import BatchOptions, prepare_confirmation
from lanes_es.usecases.load import active_batch, initiative
from lanes_es.usecases.tick import tick

TASKS_PER_BATCH = 2


def slug_of(repo_index: int, batch_index: int) -> str:
    return f"soak{repo_index}-b{batch_index:02d}"


def task_of(slug: str, index: int) -> str:
    return f"{slug}-t{index}"


def make_repository(root: Path, repo_index: int, batches: int) -> str:
    from tools.bench import make_repository as make

    make(root, {slug_of(repo_index, b): [task_of(slug_of(repo_index, b), t) for t in range(TASKS_PER_BATCH)]
                for b in range(batches)})
    return str(root.resolve())


# ---------------------------------------------------------------- a worker


@dataclass
class WorkerLog:
    ticks: int = 0
    busy: int = 0
    races: dict[str, int] = field(default_factory=dict)
    kept: list[tuple[str, int, str]] = field(default_factory=list)  # (batch id, version, chain head) after a tick

    def race(self, kind: str) -> None:
        self.races[kind] = self.races.get(kind, 0) + 1


class Worker:
    def __init__(self, store_url: str, repos: list[str], batches: int, lanes_dir: Path, seed: int) -> None:
        self.store_url = store_url
        self.repos = repos
        self.batches = batches
        self.lanes_dir = lanes_dir
        self.random = random.Random(seed)
        self.deps_by_root: dict[str, Any] = {}
        self.log = WorkerLog()

    def deps(self, root: str) -> Any:
        if root not in self.deps_by_root:
            self.deps_by_root[root] = _open_deps(root, self.store_url)
        return self.deps_by_root[root]

    def current_slug(self, repo_index: int) -> str | None:
        """The repository's first Initiative whose batch has not completed."""
        deps = self.deps(self.repos[repo_index])
        for batch_index in range(self.batches):
            slug = slug_of(repo_index, batch_index)
            batch = active_batch(deps, slug)
            if batch is None or batch.batch_state != "completed":
                return slug
        return None

    def round(self) -> None:
        repo_index = self.random.randrange(len(self.repos))
        slug = self.current_slug(repo_index)
        if slug is None:
            return
        root = self.repos[repo_index]
        deps = self.deps(root)
        self.authorize(deps, slug)
        report = self.tick(deps, slug, offers={})
        if report is None:
            return
        offers = self.steward(root, slug, report)
        if offers:
            self.tick(deps, slug, offers=offers)

    def authorize(self, deps: Any, slug: str) -> None:
        """The literal user's yes, once per Initiative: two confirmations of an Initiative whose batch
        has not ticked yet would mint two batch ids (the second one current), so the workers agree
        under a lock of their own, as one person at one terminal would."""
        import fcntl

        with open(self.lanes_dir.parent / f"authorize-{slug}.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            found = initiative(deps, slug)
            if found is None or found.current is None:
                authorize(deps, prepare_confirmation(deps, slug, BatchOptions(max_parallel=TASKS_PER_BATCH)))

    def tick(self, deps: Any, slug: str, offers: dict[str, str]) -> dict[str, Any] | None:
        from lanes_es.tick_input import LaneOfferInput

        try:
            result = tick(deps, slug, offers=[LaneOfferInput(task_id=task, path=path) for task, path in offers.items()])
        except Exception as error:  # noqa: BLE001
            if _is_busy(error):
                self.log.busy += 1
                return None
            raise
        report = result.report
        if report.get("outcome") == "busy":
            self.log.busy += 1
            return None
        self.log.ticks += 1
        batch = deps.store.batch(report["batch_id"])
        if batch is not None:
            self.log.kept.append((batch.id, batch.version, batch.last_digest))
        if report["batch_state"] not in ("running", "completed"):
            raise AssertionError(f"batch {report['batch_id']} is {report['batch_state']}: {report.get('reason')}")
        return report

    def steward(self, root: str, slug: str, report: dict[str, Any]) -> dict[str, str]:
        from lanes_es.adapters.kernel import KernelError, ReferenceKernel

        offers: dict[str, str] = {}
        for handoff in report.get("handoffs", []):
            task_id = handoff["task_id"]
            lane = self.lanes_dir / slug / task_id
            if handoff.get("action") == "provision":
                if not lane.exists():
                    made = git_ok(root, "worktree", "add", "-q", "-b", handoff["lane_branch"], str(lane),
                                  handoff["base_head"])
                    if made.exit_code != 0:
                        self.log.race("provision")
                        continue
                offers[task_id] = os.path.realpath(lane)
            elif handoff.get("action") == "release":
                if lane.exists() and git_ok(root, "worktree", "remove", str(lane)).exit_code != 0:
                    self.log.race("release")
            elif handoff["role"] == "executor" and lane.exists():
                target = lane / "src" / f"{task_id}.txt"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(f"{task_id} delivered\n")
                try:
                    ReferenceKernel().submit(str(lane), task_id)
                except KernelError:
                    self.log.race("submit")
        return offers


def _open_deps(root: str, store_url: str, attempts: int = 10) -> Any:
    """bootstrap, again when another process was making the PostgreSQL tables at the same instant
    (eventsourcing's CREATE ... IF NOT EXISTS and CREATE OR REPLACE FUNCTION race there)."""
    from lanes_es.adapters.store import StoreError
    from lanes_es.bootstrap import bootstrap

    for attempt in range(attempts):
        try:
            return bootstrap(root, store_url)
        except StoreError as error:
            if attempt == attempts - 1 or not any(text in str(error) for text in ("concurrently", "duplicate key")):
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _is_busy(error: BaseException) -> bool:
    from lanes_es.adapters.store import StoreConflict

    return isinstance(error, StoreConflict) or "busy" in str(getattr(error, "code", ""))


def _work(store_url: str, repos: list[str], batches: int, lanes_dir: str, seed: int, rounds: int) -> dict[str, Any]:
    worker = Worker(store_url, repos, batches, Path(lanes_dir), seed)
    try:
        for _ in range(rounds):
            worker.round()
    finally:
        for deps in worker.deps_by_root.values():
            deps.store.close()
    return {"ticks": worker.log.ticks, "busy": worker.log.busy, "races": worker.log.races, "kept": worker.log.kept}


# ---------------------------------------------------------------- the run and its checks


@dataclass
class SoakResult:
    seconds: float
    ticks: int
    busy: int
    races: dict[str, int]
    batches: dict[str, str]  # batch id -> state
    findings: list[str]

    @property
    def ok(self) -> bool:
        return not self.findings


def run_soak(store_url: str, workdir: Path, *, repos: int = 5, batches: int = 10, processes: int = 4,
             rounds: int = 40, seed: int = 12) -> SoakResult:
    roots = [make_repository(workdir / f"repo-{index}", index, batches) for index in range(repos)]
    lanes_dir = workdir / "lanes"
    _open_deps(roots[0], store_url).store.close()  # the tables exist before the workers start
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        logs = pool.starmap(_work, [(store_url, roots, batches, str(lanes_dir), seed + worker, rounds)
                                    for worker in range(processes)])
    seconds = time.perf_counter() - started
    races: dict[str, int] = {}
    for log in logs:
        for kind, count in log["races"].items():
            races[kind] = races.get(kind, 0) + count
    findings, states = check_soak(store_url, roots, [tuple(item) for log in logs for item in log["kept"]])
    return SoakResult(seconds=seconds, ticks=sum(log["ticks"] for log in logs), busy=sum(log["busy"] for log in logs),
                      races=races, batches=states, findings=findings)


def check_soak(store_url: str, roots: list[str], kept: list[tuple[str, int, str]]) -> tuple[list[str], dict[str, str]]:
    import io

    from lanes_es.adapters.read_model import ReadModel, fold_from_scratch
    from lanes_es.adapters.store import EventStore
    from lanes_es.cli.audit import verify_command

    findings: list[str] = []
    store = EventStore(store_url)
    states: dict[str, str] = {}
    try:
        for batch_id, version, head in kept:  # nothing lost
            rows = store.app.recorder.select_events(batch_id, gt=version - 1, lte=version)
            if not rows or json.loads(bytes(rows[0].state))["digest"] != head:
                findings.append(f"{batch_id} version {version} ({head[:12]}) is not in the log")
        for batch_id in store.batch_ids():
            batch = store.batch(batch_id)
            states[batch_id] = batch.batch_state
            root = next(root for root in roots if os.path.isdir(root) and _has_branch(root, batch.record["branch"]))
            commits = batch.record["commits"]
            if len(set(commits)) != len(commits):
                findings.append(f"{batch_id}: a commit is integrated twice: {commits}")
            subjects = git(root, "log", "--format=%s", f"{batch.record['base_head']}..{batch.record['branch']}").text
            tasks = [line for line in subjects.splitlines() if line]
            if len(tasks) != len(set(tasks)):
                findings.append(f"{batch_id}: the batch branch carries a task twice: {tasks}")
            # upstream's completion verifier reads the checkout: put the batch's branch there, as an auditor would
            git(root, "checkout", "-q", batch.record["branch"])
            out, err = io.StringIO(), io.StringIO()
            if verify_command(store, Path(root), batch_id, out=out, err=err) != 0:
                findings.append(f"{batch_id} does not verify: {out.getvalue().strip()[-400:]}")
        with ReadModel(store) as model:
            model.catch_up()
            followed = {line.batch_id: line for line in model.lines()}
        rebuilt = fold_from_scratch(store)
        if followed != rebuilt:
            differing = sorted(key for key in followed.keys() | rebuilt.keys() if followed.get(key) != rebuilt.get(key))
            findings.append(f"the read model differs from a rebuild from scratch on {differing}")
    finally:
        store.close()
    return findings, states


def _has_branch(root: str, branch: str) -> bool:
    return git_ok(root, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}").exit_code == 0
