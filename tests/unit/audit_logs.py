"""Batch logs made by the real LaneBatch aggregate, for the audit tests."""

from __future__ import annotations

from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from tools.bench_logs import BASE, at, sha


def prepared(tasks: list[str], batch_id: str = "batch-demo-1", blocked: dict[str, list[str]] | None = None,
             max_children: int | None = None) -> LaneBatch:
    blocked = blocked or {}
    children = [ev.PlanChild(task_id=task, slice_id=f"slice-{task}", blocked_by=blocked.get(task, []))
                for task in tasks]
    return LaneBatch.prepare(
        at=at(0), batch_id=batch_id, initiative_slug="demo", plan_digest="sha256:" + "0" * 64, base_head=BASE,
        branch="imm/demo", confirmation_time=at(0),
        budget=ev.Budget(max_children=max_children or len(tasks), qa_failure_limit=3),
        max_parallel=2, children=children)


def lane(task: str) -> ev.LaneBinding:
    return ev.LaneBinding(path=f"/lanes/lane-{task}", branch=f"imm-lane/demo/{task}", base_head=BASE)


def deliver(batch: LaneBatch, task: str, tick: int) -> None:
    """One child from pending to integrated, one tick per step."""
    batch.admit_lane(at(tick), task, lane(task))
    batch.enroll(at(tick + 1), task, f"run-{task}")
    batch.settle(at(tick + 2), task)
    batch.commit_lane(at(tick + 2), task, sha(f"lane-{task}"))
    batch.integrate(at(tick + 2), task, sha(f"batch-{task}"))


def completed_log(tasks: tuple[str, ...] = ("task-a", "task-b")) -> list[Any]:
    batch = prepared(list(tasks))
    batch.start(at(0))
    for index, task in enumerate(tasks):
        deliver(batch, task, 10 * (index + 1))
    batch.release(at(100), tasks[0])
    batch.settle_batch(at(100), "completed", "all enrollable children integrated", "")
    return list(batch.pending_events)


def parked_log() -> list[Any]:
    """task-a integrates, task-b parks and skips task-c, which depends on it."""
    batch = prepared(["task-a", "task-b", "task-c"], blocked={"task-c": ["task-b"]})
    batch.start(at(0))
    deliver(batch, "task-a", 10)
    batch.admit_lane(at(20), "task-b", lane("task-b"))
    batch.enroll(at(21), "task-b", "run-task-b")
    batch.park(at(22), "task-b", "batch_lane_lost: the claim <script>alert(1)</script> vanished")
    batch.refuse_offers(at(22), [ev.LaneRefusal(task_id="task-c", path="/lanes/x", reason="batch_lane_unknown_child")])
    batch.settle_batch(at(22), "needs_human", "child task-b parked", "")
    return list(batch.pending_events)


def long_log(event_count: int, tasks: int = 30) -> list[Any]:
    """`event_count` events (at least 6 per child): every child delivered, review notes filling the rest."""
    names = [f"task-{index:02d}" for index in range(tasks)]
    batch = prepared(names)
    batch.start(at(0))
    per_child = max(0, (event_count - 3 - 6 * tasks) // tasks)
    tick = 1
    for task in names:
        batch.admit_lane(at(tick), task, lane(task))
        batch.enroll(at(tick), task, f"run-{task}")
        for note in range(per_child):
            batch.open_review(at(tick + note // 50), task, f"review round {note}")
        tick += per_child // 50 + 1
        batch.settle(at(tick), task)
        batch.commit_lane(at(tick), task, sha(f"lane-{task}"))
        batch.integrate(at(tick), task, sha(f"batch-{task}"))
        batch.release(at(tick), task)
    while len(batch.pending_events) < event_count - 1:
        batch.reject_tick(at(tick), "store is busy")
    batch.settle_batch(at(tick + 1), "completed", "all enrollable children integrated", "")
    return list(batch.pending_events)
