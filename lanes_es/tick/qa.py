"""docs/upstream.md#the-steps-of-a-tick, `advanceTask`: the kernel runs a frozen Lane's QA; its verdict moves the child.

The QA of several Lanes runs at once, at most `qa_workers` (the batch's max_parallel) at a
time: each Lane's QA reads and writes only that Lane. The verdicts are recorded afterwards,
in record order, so the log does not depend on which QA finished first.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lanes_es.ports import AdvanceResult, GitFailure
from lanes_es.tick import commit
from lanes_es.tick.context import TickContext

MAX_COORDINATOR_CORRECTIONS = 2
CORRECTION_LIMIT_REACHED = "batch_correction_limit_reached"
QA_LIMIT_REASON = "QA failure limit reached"
LANE_LOST = "batch_lane_lost"


def advance_children(ctx: TickContext, children: list[dict[str, Any]]) -> dict[str, AdvanceResult]:
    """`advanceTask` of each child, concurrently; the first failure in record order is raised, as in sequence.

    A child whose QA completes has its lane commit made at once, in the same worker, while the other Lanes'
    QA still runs (`ctx.lane_commits`; the commit step records it after the child's Settled). A crash before
    then leaves a lane commit the next tick finds again, as a crash between the two steps always could."""
    def advance(child: dict[str, Any]) -> AdvanceResult:
        try:
            result = ctx.ports.kernel.advance_task(child["lane"]["path"], child["task_id"])
        except GitFailure as failure:  # the Lane is no git worktree any more (its links broke: a moved checkout)
            return AdvanceResult(state="lane_unreadable", reason=f"{LANE_LOST}: the Lane's git failed: {failure}")
        if result.state == "completed":
            ctx.lane_commits[child["task_id"]] = commit.lane_commit(ctx, child)
        return result

    workers = min(len(children), max(ctx.limit, 1))
    if workers <= 1:
        return {child["task_id"]: advance(child) for child in children}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lanes-es-qa") as pool:
        futures = [(child["task_id"], pool.submit(advance, child)) for child in children]
        return {task_id: future.result() for task_id, future in futures}


def record_advance(ctx: TickContext, child: dict[str, Any], result: AdvanceResult) -> None:
    task_id = child["task_id"]
    if result.state == "completed":
        ctx.live.settle(ctx.now, task_id, qa_failures_reset=True, qa_outputs=result.qa_outputs,
                        qa_tree=result.qa_tree if result.qa_outputs else None,
                        qa_acceptance=result.qa_acceptance if result.qa_outputs else None)
        ctx.persist()
    elif result.state == "review_ready":
        reason = f"review reservation {result.operation_id} open"
        if child["reason"] != reason:  # upstream's write is a no-op while the same reservation stays open
            ctx.live.open_review(ctx.now, task_id, reason, result.qa_outputs)
            ctx.persist()
        ctx.review_open.append(task_id)
    elif result.state == "rework" and result.operation == "qa":
        count_qa_failure(ctx, child, result.qa_outputs)
    elif (result.state in ("rework", "review_preparation_failed") or result.environment_failure
          or result.recovery_category == "repair"):
        return  # ordinary own-claim repair stays with the Executor
    else:
        ctx.park_child(task_id, "Kernel reported the child stopped" if result.state == "stopped" else result.reason)


def count_qa_failure(ctx: TickContext, child: dict[str, Any], outputs: list[Any]) -> None:
    """`outputs`: the failed QA's command output digests, recorded with the count."""
    task_id = child["task_id"]
    failures = child["qa_failures"] + 1
    if failures < ctx.record["budget"]["qa_failure_limit"]:
        ctx.live.count_qa_failure(ctx.now, task_id, failures, qa_outputs=outputs)
        ctx.persist()
        return
    used = child.get("corrections", 0)
    if used < MAX_COORDINATOR_CORRECTIONS:
        # The design judgment goes to the coordinator: one correction, to a new Lane session.
        ctx.live.count_qa_failure(ctx.now, task_id, failures, QA_LIMIT_REASON, qa_outputs=outputs)
        ctx.persist()
        return
    ctx.park_child(task_id, f"{CORRECTION_LIMIT_REACHED}: {QA_LIMIT_REASON} after {used} coordinator corrections",
                   qa_failures=failures)
