"""Synthetic batch logs for `lanes-es bench store`: what the real LaneBatch aggregate writes.

A log of N events: `children` children each admitted, enrolled, reviewed many times,
settled, committed, integrated and released, then rejected ticks to fill up to N, then
the batch completes. Every event goes through the aggregate's guards and its checks.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.ids import format_timestamp

START = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
BASE = "b" * 40


def at(tick: int) -> str:
    return format_timestamp(START + timedelta(seconds=tick))


def sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def prepared_batch(batch_id: str, slug: str, tasks: list[str]) -> LaneBatch:
    children = [ev.PlanChild(task_id=task, slice_id=f"slice-{task}", blocked_by=[]) for task in tasks]
    batch = LaneBatch.prepare(
        at=at(0), batch_id=batch_id, initiative_slug=slug, plan_digest="sha256:" + "0" * 64, base_head=BASE,
        branch=f"imm/{slug}", confirmation_time=at(0),
        budget=ev.Budget(max_children=len(tasks), qa_failure_limit=3), max_parallel=2, children=children)
    batch.start(at(0))
    return batch


def batch_ticks(batch_id: str, slug: str, event_count: int, children: int = 30,
                tick_size: int = 5) -> Iterator[LaneBatch]:
    """The batch after each tick of about `tick_size` events; save each before taking the next."""
    tasks = [f"task-{index:02d}" for index in range(children)]
    batch = prepared_batch(batch_id, slug, tasks)
    per_child = max(0, (event_count - 3 - 6 * children) // children)
    tick = 1
    for task in tasks:
        lane = ev.LaneBinding(path=f"/lanes/{slug}/{task}", branch=f"imm-lane/{slug}/{task}", base_head=BASE)
        batch.admit_lane(at(tick), task, lane)
        batch.enroll(at(tick), task, f"run-{task}")
        for note in range(per_child):
            batch.open_review(at(tick + note // 50), task, f"review round {note}")
            if len(batch.pending_events) >= tick_size:
                yield batch
        tick += per_child // 50 + 1
        batch.settle(at(tick), task)
        batch.commit_lane(at(tick), task, sha(f"lane-{slug}-{task}"))
        batch.integrate(at(tick), task, sha(f"batch-{slug}-{task}"))
        batch.release(at(tick), task)
        yield batch
    while batch.version < event_count - 1:
        batch.reject_tick(at(tick), "store is busy")
        if len(batch.pending_events) >= tick_size:
            yield batch
    batch.settle_batch(at(tick + 1), "completed", "all enrollable children integrated", "")
    yield batch


def write_batch(store: Any, batch_id: str, slug: str, event_count: int, children: int = 30,
                tick_size: int = 5) -> int:
    """Append one synthetic batch to `store`, `tick_size` events a save; returns the events appended."""
    appended = 0
    for batch in batch_ticks(batch_id, slug, event_count, children, tick_size):
        appended += store.save(batch)
    return appended
