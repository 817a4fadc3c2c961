"""docs/upstream.md#the-steps-of-a-tick: each settled Lane's work becomes its lane commit (found again after a crash).

The lane commits of several Lanes are made at once (each touches only its own Lane: its index, its
branch, its evidence files), at most max_parallel at a time, and recorded afterwards in record order,
as one Lane after another would have recorded them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lanes_es.ports import PortError
from lanes_es.tick.context import TickContext, TickFinished, is_lineage_break


def commit_settled(ctx: TickContext) -> None:
    children = list(ctx.live.children_in("settled"))
    for child, made in zip(children, make_lane_commits(ctx, children)):
        task_id = child["task_id"]
        if isinstance(made, PortError):
            message = str(made)
            ctx.park_child(task_id, message)
            if is_lineage_break(message):
                raise TickFinished(ctx.fail_lineage(message)) from None
            continue
        ctx.live.commit_lane(ctx.now, task_id, made)
        ctx.persist()


def make_lane_commits(ctx: TickContext, children: list[dict[str, Any]]) -> list[str | PortError]:
    """Each child's lane commit (made by its QA's worker in this tick, an earlier tick's found again, or a new
    one), or why it could not be made."""
    made = {child["task_id"]: ctx.lane_commits.pop(child["task_id"]) for child in children
            if child["task_id"] in ctx.lane_commits}
    missing = [child for child in children if child["task_id"] not in made]
    workers = min(len(missing), max(ctx.limit, 1))
    if workers <= 1:
        made.update((child["task_id"], lane_commit(ctx, child)) for child in missing)
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lanes-es-lane-commit") as pool:
            made.update(zip((child["task_id"] for child in missing), pool.map(lambda c: lane_commit(ctx, c), missing)))
    return [made[child["task_id"]] for child in children]


def lane_commit(ctx: TickContext, child: dict[str, Any]) -> str | PortError:
    """The child's lane commit: an earlier tick's, found again (a crash in between), or a new one."""
    task_id, lane = child["task_id"], child["lane"]
    try:
        evidence = ctx.ports.kernel.settled_evidence(lane["path"], task_id)
        args = (lane["path"], task_id, ctx.record["batch_id"], lane["base_head"], lane["branch"], evidence)
        return ctx.ports.batch_git.lookup_batch_commit(*args) or ctx.ports.batch_git.commit_child(*args)
    except PortError as error:
        return error
