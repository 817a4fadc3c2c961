"""The v2 record validator (`validateLaneRecordShape`), rule for rule and in upstream's order.

Every message starts `batch run state <id> ...`; a caller shows it as it is.
"""

from __future__ import annotations

from typing import Any

from .ids import RECORD_CONTRACT, is_canonical_timestamp

BATCH_RUN_STATES = frozenset({
    "prepared", "running", "needs_human", "completed", "budget_stopped", "failed", "rejected", "superseded",
})
LANE_CHILD_STATES = frozenset({
    "pending", "lane_admitted", "enrolled", "settled", "lane_committed", "integrated", "released",
    "needs_human", "skipped_blocked",
})
LANE_BOUND_STATES = frozenset({"lane_admitted", "enrolled", "settled", "lane_committed", "integrated", "released"})
IN_FLIGHT_STATES = frozenset({"lane_admitted", "enrolled", "settled", "lane_committed"})
MAX_SAFE_INTEGER = 2**53 - 1


class InvalidRecord(ValueError):
    """A record that breaks a v2 rule; the message names the rule."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_of(value: Any, allowed: frozenset[str]) -> bool:
    """Membership that refuses any value cleanly, as upstream's `String(state)` lookup does."""
    return isinstance(value, str) and value in allowed


def _non_empty_str(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def validate_record(record: Any, batch_id: str) -> None:
    """Raise `InvalidRecord` at the first broken rule of docs/upstream.md#the-run-state-record-and-its-validator."""
    fail = _failer(batch_id)
    _validate_batch_fields(record, batch_id, fail)
    commits = record.get("commits")
    if not isinstance(commits, list) or any(not isinstance(commit, str) for commit in commits):
        fail("has an invalid commits list")
    _validate_optional_lists(record, fail)
    children = record["children"]
    seen: set[str] = set()
    for child in children:
        _validate_child(child, fail)
        if child["task_id"] in seen:
            fail(f"has a duplicate child {child['task_id']}")
        seen.add(child["task_id"])
    for child in children:
        _validate_child_commit(child, commits, fail)
    _validate_settled_children(record, children, fail)


def validate_change(record: Any, batch_id: str, event: Any, before_valid: bool = True) -> None:
    """`validate_record` for a record that was valid before `event` and is now folded past it, checking
    what the event can have changed: every field of the batch itself (a handful), the children the
    event names, the item it appended to a list, and the rules that tie the batch state to its
    children. An event whose reach is not known here, or a record not known to be valid before,
    gets the whole check. Raises at the first broken rule, with the same message as the whole check.
    """
    touched = _touched_children(record, event) if before_valid else None
    if touched is None:
        validate_record(record, batch_id)
        return
    fail = _failer(batch_id)
    _validate_batch_fields(record, batch_id, fail)
    commits = record.get("commits")
    if not isinstance(commits, list) or (commits and not isinstance(commits[-1], str)):
        fail("has an invalid commits list")
    appended = _APPENDS.get(type(event).__name__)
    if appended is not None:
        _validate_optional_lists({appended: record.get(appended, [])[-1:]}, fail)
    for child in touched:
        _validate_child(child, fail)
    for child in touched:
        _validate_child_commit(child, commits, fail)
    if record["batch_state"] in _SETTLED_RULE_STATES:
        _validate_settled_children(record, record["children"], fail)


# The list each event appends one item to (the rest of the list was checked when it was appended).
_APPENDS = {"InterventionRecorded": "interventions", "LeaksRestored": "restores", "HeadAdopted": "adopted_heads"}
# Events that change no child, and those that change the children they name (`task_id`, `skipped`).
_NO_CHILD = frozenset({"BatchStarted", "BatchSettled", "BatchSuperseded", "DelegationGrantChanged", "HeadAdopted",
                       "LeaksRestored", "Resealed", "DelegatedRevisionApplied", "OffersRefused", "TickRejected",
                       "ProjectionDriftRepaired"})
_NAMED_CHILD = frozenset({"LaneAdmitted", "Enrolled", "Settled", "LaneCommitted", "Integrated", "Released", "Parked",
                          "QaFailureCounted", "ReviewOpened", "InterventionRecorded", "TrackerClosed"})
_SETTLED_RULE_STATES = frozenset({"budget_stopped", "failed", "rejected", "superseded", "completed"})


def _touched_children(record: Any, event: Any) -> list[Any] | None:
    """The children `event` can have changed, or None when the whole record must be checked."""
    name = type(event).__name__
    if not isinstance(record, dict) or not isinstance(record.get("children"), list):
        return None
    if name in _NO_CHILD:
        return []
    if name not in _NAMED_CHILD:
        return None
    names = {event.task_id, *getattr(event, "skipped", ())}
    touched = []
    for child in record["children"]:
        if isinstance(child, dict) and child.get("task_id") in names:
            touched.append(child)
            if len(touched) == len(names):
                return touched
    return None


def _failer(batch_id: str) -> Any:
    def fail(text: str) -> None:
        raise InvalidRecord(f"batch run state {batch_id} {text}")
    return fail


def _validate_batch_fields(record: Any, batch_id: str, fail: Any) -> None:
    if not isinstance(record, dict):
        fail("is not an object")
    if record.get("contract") != RECORD_CONTRACT:
        fail("has an unknown contract")
    if record.get("batch_id") != batch_id:
        fail(f"carries batch_id {record.get('batch_id')}")
    if not _non_empty_str(record.get("plan_digest")):
        fail("has an invalid plan_digest")
    if not _non_empty_str(record.get("base_head")):
        fail("has an invalid base_head")
    if "branch" in record and not _non_empty_str(record["branch"]):
        fail("has an invalid branch")
    if not is_canonical_timestamp(record.get("confirmation_time")):
        fail("has an invalid confirmation_time")
    if not is_canonical_timestamp(record.get("created_at")) or not is_canonical_timestamp(record.get("updated_at")):
        fail("has invalid state timestamps")
    children = record.get("children")
    if not isinstance(children, list) or not children:
        fail("has no children")
    if not _one_of(record.get("batch_state"), BATCH_RUN_STATES):
        fail("has an invalid batch_state")
    max_parallel = record.get("max_parallel")
    if not _is_int(max_parallel) or max_parallel <= 0 or max_parallel > MAX_SAFE_INTEGER:
        fail("has an invalid max_parallel")
    budget = record.get("budget")
    if (not isinstance(budget, dict) or not _is_int(budget.get("max_children")) or budget["max_children"] <= 0
            or not _is_int(budget.get("qa_failure_limit")) or budget["qa_failure_limit"] <= 0):
        fail("has an invalid budget")


def _validate_child_commit(child: dict[str, Any], commits: list[str], fail: Any) -> None:
    if child["commit"] is not None and child["commit"] not in commits:
        fail(f"child {child['task_id']} commit is missing from commits")


def _validate_settled_children(record: dict[str, Any], children: list[Any], fail: Any) -> None:
    state = record["batch_state"]
    if state in ("budget_stopped", "failed", "rejected", "superseded") and any(
            child["state"] in IN_FLIGHT_STATES for child in children):
        fail(f"is {state} but a child is still mid-flight")
    if state == "completed" and any(child["state"] not in ("integrated", "released") for child in children):
        fail("is completed but a child is not integrated")


def _validate_optional_lists(record: dict[str, Any], fail: Any) -> None:
    adopted = record.get("adopted_heads")
    if adopted is not None and (not isinstance(adopted, list) or any(
            not isinstance(item, dict) or not _non_empty_str(item.get("from")) or not _non_empty_str(item.get("to"))
            for item in adopted)):
        fail("has an invalid adopted_heads list")
    restores = record.get("restores")
    if restores is not None and (not isinstance(restores, list) or any(
            not isinstance(item, dict) or not isinstance(item.get("backup"), str) or not isinstance(item.get("paths"), list)
            for item in restores)):
        fail("has an invalid restores list")
    final = record.get("final_verification")
    if final is not None and (not isinstance(final, list) or not final or any(not _non_empty_str(c) for c in final)):
        fail("has an invalid final_verification list")
    interventions = record.get("interventions")
    if interventions is not None and (not isinstance(interventions, list) or any(
            not isinstance(item, dict) or not isinstance(item.get("task_id"), str)
            or item.get("kind") not in ("instruction", "correction") or not isinstance(item.get("text"), str)
            or not isinstance(item.get("text_digest"), str)
            for item in interventions)):
        fail("has an invalid interventions list")


def _validate_child(child: Any, fail: Any) -> None:
    if (not isinstance(child, dict) or not _non_empty_str(child.get("task_id"))
            or not _non_empty_str(child.get("slice_id"))):
        fail("has an invalid child entry")
    task = child["task_id"]
    state = child.get("state")
    if not _one_of(state, LANE_CHILD_STATES):
        fail(f"child {task} has an invalid state")
    blocked_by = child.get("blocked_by")
    if not isinstance(blocked_by, list) or any(not isinstance(item, str) for item in blocked_by):
        fail(f"child {task} has an invalid blocked_by")
    if ("reason" not in child or "commit" not in child
            or (child["reason"] is not None and not isinstance(child["reason"], str))
            or (child["commit"] is not None and not isinstance(child["commit"], str))):
        fail(f"child {task} has invalid terminal fields")
    if not _is_int(child.get("qa_failures")) or child["qa_failures"] < 0:
        fail(f"child {task} has an invalid qa_failures")
    if "corrections" in child and (not _is_int(child["corrections"]) or not 0 <= child["corrections"] <= 2):
        fail(f"child {task} has an invalid corrections count")
    if "correction_due" in child and (not _non_empty_str(child["correction_due"]) or state != "enrolled"):
        fail(f"child {task} has an invalid correction_due")
    if "tracker_closed" in child and (child["tracker_closed"] is not True or state not in ("integrated", "released")):
        fail(f"child {task} closed its tracker Issue before integration")
    lane = child.get("lane", "missing")
    if lane is not None:
        if (not isinstance(lane, dict) or not _non_empty_str(lane.get("path")) or not _non_empty_str(lane.get("branch"))
                or not _non_empty_str(lane.get("base_head")) or "lane_commit" not in lane
                or (lane["lane_commit"] is not None and not isinstance(lane["lane_commit"], str))
                or ("run_id" in lane and lane["run_id"] is not None and not _non_empty_str(lane["run_id"]))):
            fail(f"child {task} has an invalid lane")
    if state in LANE_BOUND_STATES and lane is None:
        fail(f"child {task} is {state} without a lane")
    if state in ("pending", "skipped_blocked") and lane is not None:
        fail(f"child {task} is {state} but holds a lane")
    integrated = state in ("integrated", "released")
    if integrated and child["commit"] is None:
        fail(f"child {task} is {state} without a commit")
    if not integrated and child["commit"] is not None:
        fail(f"child {task} has a commit but is not integrated")
    if integrated and lane["lane_commit"] is None:
        fail(f"child {task} is {state} without a lane commit")
    if state == "lane_committed" and lane["lane_commit"] is None:
        fail(f"child {task} is lane_committed without a lane commit")
    if state in ("needs_human", "skipped_blocked") and child["reason"] is None:
        fail(f"child {task} needs a terminal reason")
