"""The v2 run-state record as a pure fold of the batch's events.

The record is a plain dict whose key order is upstream's: the order of
`prepareBatchLaneRunState`, optional keys appended where they first appear, a
replaced delegation grant moved to the end. The aggregate keeps this dict as its
state and the projections fold the same functions over a log, so the live record
and a rebuilt one cannot differ.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from . import events as ev
from .ids import RECORD_CONTRACT

IN_FLIGHT = frozenset({"lane_admitted", "enrolled", "settled", "lane_committed"})
DONE = frozenset({"committed", "integrated", "released"})
TERMINAL_BATCH_STATES = frozenset({"completed", "budget_stopped", "failed", "rejected", "superseded"})
REPORT_STATES = TERMINAL_BATCH_STATES | {"needs_human"}


def is_terminal(batch_state: str) -> bool:
    return batch_state in TERMINAL_BATCH_STATES


def child_of(record: dict[str, Any], task_id: str) -> dict[str, Any]:
    for child in record["children"]:
        if child["task_id"] == task_id:
            return child
    raise KeyError(f"batch {record['batch_id']} has no child {task_id}")


def expected_batch_head(record: dict[str, Any]) -> str:
    """The last integrated commit, else the base, followed through every adopted fast-forward."""
    head = record["commits"][-1] if record["commits"] else record["base_head"]
    for adopted in record.get("adopted_heads", []):
        if adopted["from"] == head:
            head = adopted["to"]
    return head


def dependents_to_skip(record: dict[str, Any], task_id: str) -> list[str]:
    """Every pending child reached from `task_id` through blocked_by, breadth first."""
    seen = {task_id}
    queue = [task_id]
    while queue:
        current = queue.pop(0)
        for child in record["children"]:
            if current in child["blocked_by"] and child["task_id"] not in seen:
                seen.add(child["task_id"])
                queue.append(child["task_id"])
    return [child["task_id"] for child in record["children"]
            if child["task_id"] in seen and child["task_id"] != task_id and child["state"] == "pending"]


def consumed_slots(record: dict[str, Any]) -> int:
    return sum(1 for child in record["children"] if child["state"] not in ("pending", "skipped_blocked"))


# ---------------------------------------------------------------- the fold


def prepared_record(event: ev.BatchPrepared) -> dict[str, Any]:
    record: dict[str, Any] = {
        "contract": RECORD_CONTRACT,
        "batch_id": event.batch_id,
        "initiative_slug": event.initiative_slug,
        "plan_digest": event.plan_digest,
        "base_head": event.base_head,
        "branch": event.branch,
        "confirmation_time": event.confirmation_time,
        "budget": event.budget.plain(),
        "max_parallel": event.max_parallel,
        "batch_state": "prepared",
        "children": [
            {"task_id": child.task_id, "slice_id": child.slice_id, "blocked_by": list(child.blocked_by),
             "state": "pending", "reason": None, "commit": None, "lane": None, "qa_failures": 0}
            for child in event.children
        ],
        "commits": [],
    }
    if event.final_verification:
        record["final_verification"] = list(event.final_verification)
    if event.revision_delegation is not None:
        record["revision_delegation"] = {"confirmation_time": event.revision_delegation}
    if event.intent_identities:
        # In plan order: the stored event's map comes back with sorted keys.
        record["intent_identities"] = {child.task_id: event.intent_identities[child.task_id].plain()
                                       for child in event.children if child.task_id in event.intent_identities}
    record["created_at"] = event.at
    record["updated_at"] = event.at
    return record


def apply_event(record: dict[str, Any], event: ev.Event) -> None:
    """Move the record by one event, in place. Audit-only events leave it untouched.

    One dict lookup on the event's exact class (no event class derives from another, so it
    finds what an isinstance test would); a class that is neither folded nor audit-only is a
    KeyError, as before. A rebuild runs this once per event of the log, so it stays this cheap.
    """
    step = _STEPS[type(event)]
    if step is not None:
        step(record, event)
        record["updated_at"] = event.at


def fold_record(events: list[Any]) -> dict[str, Any] | None:
    """The record after every event of a batch's log, in order."""
    record: dict[str, Any] | None = None
    for event in events:
        if isinstance(event, ev.BatchPrepared):
            record = prepared_record(event)
        elif record is not None:
            apply_event(record, event)
    return record


def _started(record: dict[str, Any], event: ev.BatchStarted) -> None:
    record["batch_state"] = "running"


def _admitted(record: dict[str, Any], event: ev.LaneAdmitted) -> None:
    child = child_of(record, event.task_id)
    child["state"] = "lane_admitted"
    child["lane"] = {**event.lane.plain(), "lane_commit": None}


def _enrolled(record: dict[str, Any], event: ev.Enrolled) -> None:
    child = child_of(record, event.task_id)
    child["state"] = "enrolled"
    child["reason"] = event.reason
    child["lane"]["run_id"] = event.run_id


def _settled(record: dict[str, Any], event: ev.Settled) -> None:
    child = child_of(record, event.task_id)
    child["state"] = "settled"
    child["reason"] = None
    if event.qa_failures_reset:
        child["qa_failures"] = 0


def _lane_committed(record: dict[str, Any], event: ev.LaneCommitted) -> None:
    child = child_of(record, event.task_id)
    child["state"] = "lane_committed"
    child["lane"]["lane_commit"] = event.lane_commit


def _integrated(record: dict[str, Any], event: ev.Integrated) -> None:
    child = child_of(record, event.task_id)
    child["state"] = "integrated"
    child["commit"] = event.commit
    if not event.adopted:  # upstream's adoption path keeps the reason as it was
        child["reason"] = None
    record["commits"].append(event.commit)


def _released(record: dict[str, Any], event: ev.Released) -> None:
    child_of(record, event.task_id)["state"] = "released"


def _parked(record: dict[str, Any], event: ev.Parked) -> None:
    child = child_of(record, event.task_id)
    child["state"] = "needs_human"
    child["reason"] = event.reason
    # correction_due is only valid while enrolled, so a park always clears it.
    child.pop("correction_due", None)
    if event.qa_failures is not None:
        child["qa_failures"] = event.qa_failures
    for task_id in event.skipped:
        skipped = child_of(record, task_id)
        skipped["state"] = "skipped_blocked"
        skipped["reason"] = f"dependency {event.task_id} parked"


def _resealed(record: dict[str, Any], event: ev.Resealed) -> None:
    record.setdefault("reseals", []).append({
        "at": event.at, "task_id": event.task_id, "from_digest": event.from_digest,
        "to_digest": event.to_digest, "intent_revision": event.intent_revision,
        "intent_content_hash": event.intent_content_hash,
    })
    identity = record["intent_identities"][event.task_id]
    identity["intent_revision"] = event.intent_revision
    identity["intent_content_hash"] = event.intent_content_hash
    record["plan_digest"] = event.to_digest


def _qa_failure_counted(record: dict[str, Any], event: ev.QaFailureCounted) -> None:
    child = child_of(record, event.task_id)
    child["qa_failures"] = event.qa_failures
    if event.correction_due is not None:
        child["correction_due"] = event.correction_due


def _review_opened(record: dict[str, Any], event: ev.ReviewOpened) -> None:
    child_of(record, event.task_id)["reason"] = event.reason


def _intervention(record: dict[str, Any], event: ev.InterventionRecorded) -> None:
    if event.kind == "correction":
        child = child_of(record, event.task_id)
        used = child.get("corrections", 0)
        child.pop("correction_due", None)
        child["corrections"] = used + 1
        child["qa_failures"] = 0
    record.setdefault("interventions", []).append({
        "at": event.at, "task_id": event.task_id, "kind": event.kind,
        "text": event.text, "text_digest": event.text_digest,
    })


def _delegated_revision(record: dict[str, Any], event: ev.DelegatedRevisionApplied) -> None:
    record.setdefault("delegated_revisions", []).append({
        "at": event.at, "task_id": event.task_id, "from_revision": event.from_revision,
        "to_revision": event.to_revision, "intent_content_hash": event.intent_content_hash,
        "confirmation_ref": event.confirmation_ref,
    })


def _grant_changed(record: dict[str, Any], event: ev.DelegationGrantChanged) -> None:
    # A replaced grant moves to the end of the record, as upstream's spread does.
    record.pop("revision_delegation", None)
    if event.confirmation_time is not None:
        record["revision_delegation"] = {"confirmation_time": event.confirmation_time}


def _tracker_closed(record: dict[str, Any], event: ev.TrackerClosed) -> None:
    child_of(record, event.task_id)["tracker_closed"] = True


def _head_adopted(record: dict[str, Any], event: ev.HeadAdopted) -> None:
    record.setdefault("adopted_heads", []).append({"from": event.from_head, "to": event.to_head})


def _leaks_restored(record: dict[str, Any], event: ev.LeaksRestored) -> None:
    record.setdefault("restores", []).append({
        "at": event.at, "backup": event.backup, "paths": [path.plain() for path in event.paths],
    })


def _park_resumed(record: dict[str, Any], event: ev.ParkResumed) -> None:
    resumed = {child.task_id: child.state for child in event.children}
    for child in record["children"]:
        if child["task_id"] in resumed:
            child["state"] = resumed[child["task_id"]]
            child["reason"] = None
            child["qa_failures"] = 0
        elif child["state"] == "skipped_blocked":
            child["state"] = "pending"
            child["reason"] = None
    record["batch_state"] = "running"
    record["confirmation_time"] = event.confirmation_time


def _settled_batch(record: dict[str, Any], event: ev.BatchSettled) -> None:
    record["batch_state"] = event.batch_state


def _superseded(record: dict[str, Any], event: ev.BatchSuperseded) -> None:
    record["batch_state"] = "superseded"


_APPLY: dict[type, Callable[[dict[str, Any], Any], None]] = {
    ev.BatchStarted: _started,
    ev.LaneAdmitted: _admitted,
    ev.Enrolled: _enrolled,
    ev.Settled: _settled,
    ev.LaneCommitted: _lane_committed,
    ev.Integrated: _integrated,
    ev.Released: _released,
    ev.Parked: _parked,
    ev.Resealed: _resealed,
    ev.QaFailureCounted: _qa_failure_counted,
    ev.ReviewOpened: _review_opened,
    ev.InterventionRecorded: _intervention,
    ev.DelegatedRevisionApplied: _delegated_revision,
    ev.DelegationGrantChanged: _grant_changed,
    ev.TrackerClosed: _tracker_closed,
    ev.HeadAdopted: _head_adopted,
    ev.LeaksRestored: _leaks_restored,
    ev.ParkResumed: _park_resumed,
    ev.BatchSettled: _settled_batch,
    ev.BatchSuperseded: _superseded,
}

# Every event class a batch's record folds: its step, or None for the audit-only ones.
_STEPS: dict[type, Callable[[dict[str, Any], Any], None] | None] = {**_APPLY, **dict.fromkeys(ev.AUDIT_ONLY)}


def snapshot(record: dict[str, Any]) -> dict[str, Any]:
    """A deep copy, so a report keeps the children as they were when it was made."""
    return copy.deepcopy(record)
