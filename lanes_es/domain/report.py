"""The lane report (`assurance_kernel/batch_run_report/v1`, lane form), built from a record.

Pure: the tick returns running reports made here, and the projections fold
written reports with the same function, so both have upstream's field order.
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from .ids import REPORT_CONTRACT
from .record import snapshot

LANE_NEEDS_HUMAN_NEXT_ACTION = (
    "The lane batch has stopped on a parked child and its Lane is kept. Resolve the child by hand; "
    "continuing needs a new Batch Authorization."
)

TERMINAL_NEXT_ACTIONS = {
    "completed": "The batch integrated every enrollable child; review the commits and the tracker.",
    "budget_stopped": "The child budget stopped new enrollments; re-confirm to continue under a new authorization.",
    "failed": "A lineage failure stopped the batch; inspect the failing child and the branch state.",
    "rejected": "The batch was rejected before any enrollment; correct the stated reason and re-confirm.",
    "superseded": ("The plan moved past this record and an explicit disposition retired it; "
                   "it grants no handoff and no child delivery."),
    "needs_human": LANE_NEEDS_HUMAN_NEXT_ACTION,
    "running": "The batch is still running; no terminal report is due yet.",
    "prepared": "The batch is prepared but not started.",
}
FALLBACK_NEXT_ACTION = "Inspect the batch run state."

NEXT_COORDINATOR = (
    "For each coordinator handoff, read every round's findings in that Lane, start a new Lane session and "
    "send one design-level correction as lane_instruction kind correction; run the other handoffs as usual."
)
NEXT_PROVISION = "Provide a Lane for each provision handoff, then call start_unattended_batch again with lane_offers."
NEXT_EXECUTOR = (
    "Run each executor handoff in its Lane. When a Lane finishes, call start_unattended_batch again "
    "with the same Initiative."
)
NEXT_REVIEW = (
    "Submit each reserved foreground Review verdict in its own Lane, then call start_unattended_batch "
    "again to continue."
)
NEXT_REJECTED_PARAMETERS = "Correct the lane-mode parameters and call start_unattended_batch again."
NEXT_FINAL_VERIFICATION_FAILED = (
    "Every child is integrated but the batch did not pass its final verification; inspect the failing "
    "commands on the batch branch. Integrated commits were not rolled back."
)
RELEASE_SUFFIX = ". Check each release handoff with the Lane Steward."

RETIRE_REASON = ("retired by an explicit literal-user disposition: the plan moved past this record, "
                 "so it no longer drives any child")
RETIRE_NEXT_ACTION = TERMINAL_NEXT_ACTIONS["superseded"]


def lane_report(record: dict[str, Any], reason: str | None, next_action: str,
                extras: ev.ReportExtras = ev.ReportExtras(), *, batch_state: str | None = None,
                created_at: str | None = None) -> dict[str, Any]:
    """The report of `record` as upstream's `laneReport` lays it out; optional fields only when non-empty."""
    state = batch_state or record["batch_state"]
    report: dict[str, Any] = {
        "contract": REPORT_CONTRACT,
        "batch_id": record["batch_id"],
        "initiative_slug": record["initiative_slug"],
        "batch_state": state,
        "max_parallel": record["max_parallel"],
        "children": snapshot(record["children"]),
        "commits": list(record["commits"]),
        "reason": reason,
        "handoffs": [handoff.plain() for handoff in extras.handoffs],
    }
    if extras.lane_refusals:
        report["lane_refusals"] = [refusal.plain() for refusal in extras.lane_refusals]
    if extras.tracker_observations:
        report["tracker_observations"] = [seen.plain() for seen in extras.tracker_observations]
    if record.get("restores"):
        report["restores"] = snapshot(record["restores"])
    if extras.final_verification is not None:
        report["final_verification"] = extras.final_verification.plain()
    if record.get("interventions"):
        report["interventions"] = snapshot(record["interventions"])
    if extras.lane_instruction is not None:
        report["lane_instruction"] = extras.lane_instruction.plain()
    if extras.lane_revision is not None:
        report["lane_revision"] = extras.lane_revision.plain()
    if record.get("delegated_revisions"):
        report["delegated_revisions"] = snapshot(record["delegated_revisions"])
    if record.get("reseals"):
        report["reseals"] = snapshot(record["reseals"])
    report["next_action"] = next_action or TERMINAL_NEXT_ACTIONS.get(state, FALLBACK_NEXT_ACTION)
    report["created_at"] = created_at or record["updated_at"]
    return report


def running_next_action(handoffs: list[ev.Handoff]) -> str:
    """Upstream's priority: a coordinator handoff, then a provision handoff, then the executors."""
    if any(isinstance(handoff, ev.CoordinatorHandoff) for handoff in handoffs):
        return NEXT_COORDINATOR
    if any(isinstance(handoff, ev.ProvisionHandoff) for handoff in handoffs):
        return NEXT_PROVISION
    return NEXT_EXECUTOR


def review_reason(task_ids: list[str]) -> str:
    if len(task_ids) == 1:
        return f"child {task_ids[0]} holds an open Review reservation"
    return f"children {', '.join(task_ids)} hold open Review reservations"


def report_after(current: dict[str, Any] | None, record: dict[str, Any], event: Any) -> dict[str, Any] | None:
    """The written report once `event` has been applied to `record`.

    A settle or a retirement makes a report; one whose state is not `needs_human` is
    terminal and is never replaced (upstream rule), so the written report is the first
    terminal one, else the newest parked one.
    """
    kind = type(event)  # exact class tests: no event class derives from another, and this runs once per event
    if kind is ev.BatchSettled:
        made = lane_report(record, event.reason, event.next_action, event.extras)
    elif kind is ev.BatchSuperseded:
        made = lane_report(record, event.reason, event.next_action or RETIRE_NEXT_ACTION, created_at=event.at)
    else:
        return current
    if current is None or current["batch_state"] == "needs_human":
        return made
    return current
