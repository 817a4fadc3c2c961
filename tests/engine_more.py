"""More moves on the real engine (tests/engine.py) for the issue-3 tests: fast descriptors,
the Lane's kernel store as files, fresh confirmations, and a tick run without the service.

    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    report = enroll(engine, "task-a")            # provisioned, offered, enrolled
    with edited(claim_path(engine, "task-a")):   # a Lane fact changed for one tick, then put back
        ...

Everything here acts as a user, a steward or an Executor would (files, git, the kernel's
Executor commands), never through the tick's internals, except `run_tick`, which hands a
hand-made TickInput to the real tick with the real ports, for inputs the service never builds.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from lanes_es.adapters.kernel import ReferenceKernel
from lanes_es.domain.batch import LaneBatch
from lanes_es.tick import TickOutcome, run_lane_batch
from lanes_es.tick_input import TickInput
from lanes_es.projections.batch import documents_of, materialize
from tests.engine import Engine, Task
from tests.gitfixtures import descriptor, run_git
from lanes_es.usecases.authorize import authorize
from lanes_es.usecases.confirmation import BatchOptions, prepare_confirmation
from lanes_es.usecases.tick import tick

# coreutils' `test` starts faster than python3, and every QA run and integration rerun spawns it
PASSES = descriptor(["-n", "ok"], executable="test")
KERNEL_DIR = ".imm/state/kernel"


def needs_file(path: str) -> str:
    """A descriptor that passes only when `path` exists in the tree it runs on."""
    return descriptor(["-e", path], executable="test")


def make_engine(tmp_path: Path, tasks: dict[str, Task], **options: Any) -> Engine:
    """Engine.create with the fast passing descriptor for every task that names none."""
    fast = {task_id: Task(task.scope, list(task.blocked_by), task.verification or PASSES, task.risk)
            for task_id, task in tasks.items()}
    return Engine.create(tmp_path, fast, **options)


def kernel(engine: Engine) -> ReferenceKernel:
    """The reference kernel as the Executor's `lanes-es task ...` commands use it."""
    return ReferenceKernel(clock=engine.deps.now)


# ---------------------------------------------------------------- the steward and the Parent


def enroll(engine: Engine, *task_ids: str) -> dict[str, Any]:
    """One tick for the provision handoffs, a Lane for each task, one tick offering them; its report."""
    report = engine.tick()
    offers = {task_id: engine.provision(task_id, report) for task_id in task_ids}
    return engine.tick(offers=offers)


def confirm_again(engine: Engine, **options: Any) -> Any:
    """A fresh literal-user confirmation of the Initiative's batch (the same batch id)."""
    confirmation = prepare_confirmation(engine.deps, engine.slug, BatchOptions(**options))
    return authorize(engine.deps, confirmation)


def tick_result(engine: Engine, **inputs: Any) -> Any:
    """The tick use case's TickResult (the report and whether anything was written)."""
    return tick(engine.deps, engine.slug, **inputs)


def run_tick(engine: Engine, tick: TickInput, batch: LaneBatch | None) -> TickOutcome:
    """The real tick over the real ports, saving as the service saves, for a hand-made input."""
    deps = engine.deps

    def persist(live: LaneBatch) -> None:
        deps.store.save(live)
        materialize(deps.root, documents_of(live))

    return run_lane_batch(tick, batch, deps.adapters.tick_ports(deps.root, engine.slug), persist)


def correction_rounds_then_park(engine: Engine, task_id: str) -> dict[str, Any]:
    """With qa_failure_limit 1 and a task whose QA fails until its file exists: two coordinator
    corrections, then the third failure parks it (batch_correction_limit_reached). Returns that report."""
    from lanes_es.tick_input import InstructionInput

    for _ in range(2):
        engine.submit(task_id)
        assert engine.tick()["handoffs"][0]["role"] == "coordinator"
        accepted = engine.tick(instruction=InstructionInput(task_id, "correction", "rethink the design", "idle"))
        assert accepted["lane_instruction"]["accepted"] is True
    engine.submit(task_id)
    return engine.tick()


# ---------------------------------------------------------------- the Lane's kernel store as files


def record_path(engine: Engine, task_id: str) -> Path:
    return Path(engine.lane(task_id), KERNEL_DIR, "tasks", f"{task_id}.json")


def claim_path(engine: Engine, task_id: str) -> Path:
    return Path(engine.lane(task_id), KERNEL_DIR, "claim.json")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: Path, document: Any) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def lane_record(engine: Engine, task_id: str) -> dict[str, Any]:
    return read_json(record_path(engine, task_id))


@contextmanager
def edited(*paths: Path) -> Iterator[None]:
    """Keep the bytes of `paths` and put them back afterwards, whatever the block did to them."""
    kept = {path: path.read_bytes() for path in paths}
    try:
        yield
    finally:
        for path, data in kept.items():
            path.write_bytes(data)


@contextmanager
def moved_away(path: str) -> Iterator[None]:
    """The directory is gone for the block (a Lane a steward moved), then back."""
    aside = f"{path}.aside"
    shutil.move(path, aside)
    try:
        yield
    finally:
        shutil.move(aside, path)


def rerun(engine: Engine, task_id: str, run_id: str) -> None:
    """Give the Lane's claim and record another run id, as a Lane reused by another run would show."""
    for path in (claim_path(engine, task_id), record_path(engine, task_id)):
        document = read_json(path)
        document["run_id"] = run_id
        write_json(path, document)


# ---------------------------------------------------------------- the coordinator


def state_bytes(engine: Engine) -> bytes:
    return engine.state_file().read_bytes()


def batch_files(engine: Engine) -> dict[str, bytes]:
    """Every file under .imm/state/batches (state, report, restores), for zero-write checks."""
    directory = Path(engine.root, ".imm/state/batches")
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()} \
        if directory.exists() else {}


def commit_in_coordinator(engine: Engine, path: str, content: str, message: str = "user edit") -> str:
    """A user's own commit on the batch branch in the coordinator checkout; the new head."""
    target = Path(engine.root, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content, encoding="utf-8")
    run_git(engine.root, "add", "--", path)
    run_git(engine.root, "-c", "user.name=User", "-c", "user.email=user@example.invalid", "commit", "-qm", message)
    return engine.head()


def lane_exists(engine: Engine, task_id: str) -> bool:
    return os.path.isdir(engine.lane(task_id))
