"""`enrollInLane` (docs/upstream.md#the-steps-of-a-tick): the kernel claims the task in its Lane under this batch's capability."""

from __future__ import annotations

from lanes_es.domain import events as ev
from lanes_es.domain.authority import AuthorizationError, BatchEnrollment
from lanes_es.ports import PortError
from lanes_es.tick.context import TickContext, TickFinished, is_lineage_break


def enroll_in_lane(ctx: TickContext, task_id: str) -> None:
    lane = ctx.live.child(task_id)["lane"]
    try:
        ctx.ports.kernel.enroll_task(lane["path"], task_id,
                                     BatchEnrollment(ctx.capability, ctx.record["batch_id"], lane["base_head"]))
        fresh = ctx.ports.kernel.project_task(lane["path"], task_id)
        if fresh.error is not None or not fresh.run_id or fresh.claim_task_id != task_id:
            raise PortError("enrolled Lane has no observable owned run")
    except (PortError, AuthorizationError) as error:
        message = str(error)
        ctx.park_child(task_id, message)
        if is_lineage_break(message):
            # A broken lineage cannot be trusted for any other child either.
            raise TickFinished(ctx.fail_lineage(message, ev.ReportExtras(lane_refusals=list(ctx.refusals)))) from None
        return
    ctx.live.enroll(ctx.now, task_id, fresh.run_id)
    ctx.persist()
