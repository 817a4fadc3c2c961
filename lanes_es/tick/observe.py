"""Contracts §3.2 step 1: observe each admitted or enrolled Lane, in record order, through its kernel."""

from __future__ import annotations

from typing import Any

from lanes_es.tick import enroll, qa
from lanes_es.tick.context import TickContext, lane_unreadable_reason


def observe_lanes(ctx: TickContext) -> None:
    for child in list(ctx.live.children_in("lane_admitted", "enrolled")):
        current = ctx.live.child(child["task_id"])
        if current["state"] not in ("lane_admitted", "enrolled"):
            continue  # a park earlier in this loop moved it
        observe_lane(ctx, current)


def observe_lane(ctx: TickContext, child: dict[str, Any]) -> None:
    task_id, lane = child["task_id"], child["lane"]
    fresh = ctx.ports.kernel.project_task(lane["path"], task_id)
    if fresh.error is not None:
        ctx.park_child(task_id, lane_unreadable_reason(fresh.error))
        return
    if lane.get("run_id") and fresh.run_id != lane["run_id"]:
        ctx.park_child(task_id, "batch_lane_run_mismatch")
        return
    holds_claim = fresh.claim_task_id == task_id
    if child["state"] == "lane_admitted":
        if holds_claim and fresh.run_id:
            # A crash between admission and enrollment: adopt the claim the kernel already made.
            ctx.live.enroll(ctx.now, task_id, fresh.run_id, reason="adopted existing lane claim after interruption")
            ctx.persist()
        else:
            enroll.enroll_in_lane(ctx, task_id)
        return
    if fresh.lifecycle == "done" and fresh.completion_ready:
        ctx.live.settle(ctx.now, task_id)
        ctx.persist()
        return
    if not holds_claim:
        ctx.park_child(task_id, "batch_lane_lost")
        return
    if not ctx.capability.is_child_consumed(task_id):
        ctx.park_child(task_id, "claim held by another batch")
        return
    if child.get("correction_due"):
        return  # waits for the coordinator's correction
    if fresh.next_obligation == "run_qa" or fresh.artifact_state != "frozen":
        return  # the Executor's move
    qa.advance_child(ctx, child)
