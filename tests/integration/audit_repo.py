"""Completed lane batches built by hand, as the engine would leave them, for the audit tests.

Lane commits carry the batch subject, trailer and author and the child's audit pair, on
`imm/<slug>`; the state file and the report are the projections of a log made with the
real LaneBatch aggregate (`write_documents` returns that log).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from lanes_es.projections.batch import fold_documents, materialize
from tests.gitfixtures import (
    batch_message, checkout_batch_branch, commit_all, intent_json, make_repo, write_audit_pair, write_file,
)

BATCH = "batch-demo-7c1e"
SLUG = "demo"
NOW = "2026-04-01T10:00:00.000Z"


def at(second: int) -> str:
    return f"2026-04-01T10:00:{second:02d}.000Z"


class Built:
    def __init__(self, root: str, base: str) -> None:
        self.root = root
        self.base = base
        self.delivered: list[tuple[str, str, str]] = []  # (task, commit, run id), in integration order
        self.adopted: list[tuple[str, str]] = []
        self.events: list[Any] = []  # the log of the last write_documents


def deliver(built: Built, task: str, *, pair: bool = True, lifecycle: str = "done", extra: dict[str, str] | None = None,
            message: str | None = None) -> str:
    run_id = f"run-{uuid.uuid4()}"
    write_file(built.root, f"{task}.txt", f"{task} delivered\n")
    for relative, content in (extra or {}).items():
        write_file(built.root, relative, content)
    if pair:
        write_audit_pair(built.root, task, run_id, lifecycle=lifecycle, at=NOW)
    commit = commit_all(built.root, message or batch_message(task, BATCH))
    built.delivered.append((task, commit, run_id))
    return commit


def make_batch(tmp_path: Path, tasks: list[str]) -> Built:
    root = make_repo(tmp_path / "repo", intents={task: intent_json(task) for task in tasks})
    base = checkout_batch_branch(root, SLUG)
    return Built(root, base)


def write_documents(built: Built, plan: list[str], *, final_state: str = "completed") -> list[Any]:
    """The log of this delivery, made by the aggregate, materialized as the state file and report."""
    batch = LaneBatch.prepare(
        at=at(0), batch_id=BATCH, initiative_slug=SLUG, plan_digest="sha256:" + "0" * 64, base_head=built.base,
        branch=f"imm/{SLUG}", confirmation_time=at(0),
        budget=ev.Budget(max_children=len(plan), qa_failure_limit=3), max_parallel=2,
        children=[ev.PlanChild(task_id=task, slice_id=f"slice-{task}", blocked_by=[]) for task in plan])
    batch.start(at(1))
    adopted = dict(built.adopted)
    if built.base in adopted:
        batch.adopt_head(at(1), built.base, adopted[built.base])
    for second, (task, commit, run_id) in enumerate(built.delivered, start=2):
        batch.admit_lane(at(second), task, ev.LaneBinding(path=f"/lanes/{task}", branch=f"imm-lane/{SLUG}/{task}",
                                                          base_head=built.base))
        batch.enroll(at(second), task, run_id)
        batch.settle(at(second), task)
        batch.commit_lane(at(second), task, commit)
        batch.integrate(at(second), task, commit)
        if commit in adopted:
            batch.adopt_head(at(second), commit, adopted[commit])
    batch.settle_batch(at(30), final_state, "all enrollable children integrated", "")
    materialize(built.root, fold_documents(batch.pending_events))
    built.events = list(batch.pending_events)
    return built.events


def completed(tmp_path: Path, order: tuple[str, ...] = ("task-s1", "task-s0")) -> Built:
    """Two children integrated in an order that is not the plan's (LANE-CMP-08)."""
    built = make_batch(tmp_path, ["task-s0", "task-s1"])
    for task in order:
        deliver(built, task)
    write_documents(built, ["task-s0", "task-s1"])
    return built
