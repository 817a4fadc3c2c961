"""docs/upstream.md#the-steps-of-a-tick: observe each admitted or enrolled Lane, in record order, through its kernel.

Every Lane is projected and decided first; the QA of the Lanes that need it runs at once
(`qa.advance_children`); then each decision is recorded in record order, as one Lane after
another would have recorded it.
"""

from __future__ import annotations

from typing import Any

from lanes_es.domain.observation import ADOPT_CLAIM, ADVANCE, ENROLL, PARK, SETTLE, Observation, decide_observation
from lanes_es.ports import AdvanceResult, TaskProjection
from lanes_es.tick import enroll, qa
from lanes_es.tick.context import TickContext


def observe_lanes(ctx: TickContext) -> None:
    children = list(ctx.live.children_in("lane_admitted", "enrolled"))
    fresh = {child["task_id"]: ctx.ports.kernel.project_task(child["lane"]["path"], child["task_id"])
             for child in children}
    decisions = {child["task_id"]: decide_observation(child, fresh[child["task_id"]],
                                                      ctx.capability.is_child_consumed(child["task_id"]))
                 for child in children}
    advanced = qa.advance_children(ctx, [child for child in children if decisions[child["task_id"]].move == ADVANCE])
    for child in children:
        task_id = child["task_id"]
        current = ctx.live.child(task_id)
        if current["state"] not in ("lane_admitted", "enrolled"):
            continue  # a park earlier in this loop moved it
        record_observation(ctx, current, decisions[task_id], fresh[task_id], advanced.get(task_id))


def record_observation(ctx: TickContext, child: dict[str, Any], decision: Observation, fresh: TaskProjection,
                       advanced: AdvanceResult | None) -> None:
    task_id, move = child["task_id"], decision.move
    if move == PARK:
        ctx.park_child(task_id, decision.reason)
    elif move == ADOPT_CLAIM:
        ctx.live.enroll(ctx.now, task_id, fresh.run_id, reason="adopted existing lane claim after interruption")
        ctx.persist()
    elif move == ENROLL:
        enroll.enroll_in_lane(ctx, task_id)
    elif move == SETTLE:
        ctx.live.settle(ctx.now, task_id)
        ctx.persist()
    elif move == ADVANCE and advanced is not None:
        qa.record_advance(ctx, child, advanced)
