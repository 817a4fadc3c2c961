"""docs/upstream.md#the-steps-of-a-tick: each integrated child's Issue closed once; a failure retries next tick."""

from __future__ import annotations

from lanes_es.domain import events as ev
from lanes_es.tick.context import TickContext


def close_integrated_issues(ctx: TickContext) -> None:
    tracker = ctx.ports.tracker
    if tracker is None:
        return
    for child in ctx.live.children_in("integrated", "released"):
        if child.get("tracker_closed"):
            continue
        task_id = child["task_id"]
        try:
            tombstone = ctx.ports.kernel.read_tombstone(ctx.tick.root, task_id)
            if (tombstone is None or tombstone.lifecycle_status != "terminal"
                    or tombstone.terminal_lifecycle != "done"):
                ctx.tracker.append(ev.TrackerObservation(
                    task_id=task_id, status="retryable_failure",
                    message="integrated child has no done terminal proof on the batch branch"))
                continue
            result = tracker.mark_terminal(ctx.tick.root, task_id, "done", tombstone.terminal_event_id)
            status, message = result.status, result.message
        except Exception as error:  # noqa: BLE001 - a tracker failure never changes batch state
            status, message = "retryable_failure", str(error)
        ctx.tracker.append(ev.TrackerObservation(task_id=task_id, status=status, message=message))
        if status in ("updated", "already_current"):
            ctx.live.close_tracker(ctx.now, task_id)
            ctx.persist()
