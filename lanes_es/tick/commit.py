"""docs/upstream.md#the-steps-of-a-tick: each settled Lane's work becomes its lane commit (found again after a crash)."""

from __future__ import annotations

from lanes_es.ports import PortError
from lanes_es.tick.context import TickContext, TickFinished, is_lineage_break


def commit_settled(ctx: TickContext) -> None:
    for child in list(ctx.live.children_in("settled")):
        task_id, lane = child["task_id"], child["lane"]
        try:
            evidence = ctx.ports.kernel.settled_evidence(lane["path"], task_id)
            args = (lane["path"], task_id, ctx.record["batch_id"], lane["base_head"], lane["branch"], evidence)
            lane_commit = ctx.ports.batch_git.lookup_batch_commit(*args) or ctx.ports.batch_git.commit_child(*args)
        except PortError as error:
            message = str(error)
            ctx.park_child(task_id, message)
            if is_lineage_break(message):
                raise TickFinished(ctx.fail_lineage(message)) from None
            continue
        ctx.live.commit_lane(ctx.now, task_id, lane_commit)
        ctx.persist()
