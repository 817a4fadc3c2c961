"""One line per batch for the read model: who, where, what state, its children by status, when last.

A pure fold over the events of every aggregate in the store's order. A batch's line
starts with its authorization on the Initiative (which names the repository it was
confirmed in) and moves with the batch's own events. Only the child states are kept,
not the whole record: the read model spans every batch of every repository, so each
line stays small. The states follow the same transitions as the v2 record's fold
(`lanes_es.domain.record`); a test holds the two together on real logs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec

from . import events as ev
from .initiative import slug_of

AUTHORIZED = "authorized"  # confirmed, not ticked yet: the batch has no record so far


class BatchSummary(msgspec.Struct, kw_only=True):
    batch_id: str
    initiative_slug: str
    repository: str | None
    batch_state: str
    children: dict[str, str]  # task_id -> child state, in plan order
    last_event_at: str
    version: int  # the batch's newest event version (0 before its first event)

    def children_by_status(self) -> dict[str, int]:
        return dict(sorted(Counter(self.children.values()).items()))

    def as_json(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "initiative_slug": self.initiative_slug, "repository": self.repository,
                "batch_state": self.batch_state, "children": self.children_by_status(),
                "last_event_at": self.last_event_at, "version": self.version}


# The child state each event moves its task to (docs/upstream.md#child-and-batch-transitions), as `record.apply_event` does.
_CHILD_STATE: dict[type, str] = {
    ev.LaneAdmitted: "lane_admitted",
    ev.Enrolled: "enrolled",
    ev.Settled: "settled",
    ev.LaneCommitted: "lane_committed",
    ev.Integrated: "integrated",
    ev.Released: "released",
}


def summary_key(event: Any) -> str | None:
    """The batch whose line `event` touches, or None for an event no line shows."""
    if isinstance(event, (ev.BatchAuthorized, ev.BatchRetired, ev.BatchPrepared)):
        return event.batch_id
    if isinstance(event, ev.Event) and not event.originator_id.startswith("initiative:"):
        return event.originator_id
    return None


def summary_after(summary: BatchSummary | None, event: Any) -> BatchSummary | None:
    """The line after `event`; None when the event names a batch the line cannot start from."""
    if isinstance(event, ev.BatchAuthorized):
        return _authorized(summary, event)
    if isinstance(event, ev.BatchRetired):
        if summary is not None and summary.batch_state == AUTHORIZED:
            summary.batch_state = "superseded"
            summary.last_event_at = event.at
        return summary
    if isinstance(event, ev.BatchPrepared):
        return _prepared(summary, event)
    if summary is None:
        return None
    summary.version = event.originator_version
    summary.last_event_at = event.at
    _move(summary, event)
    return summary


def _authorized(summary: BatchSummary | None, event: ev.BatchAuthorized) -> BatchSummary:
    repository = getattr(event, "repository", None)
    slug = slug_of(event.originator_id)
    if summary is None:
        return BatchSummary(batch_id=event.batch_id, initiative_slug=slug, repository=repository,
                            batch_state=AUTHORIZED, children={child.task_id: "pending" for child in event.children},
                            last_event_at=event.at, version=0)
    if repository is not None:
        summary.repository = repository
    return summary


def _prepared(summary: BatchSummary | None, event: ev.BatchPrepared) -> BatchSummary:
    return BatchSummary(batch_id=event.batch_id, initiative_slug=event.initiative_slug,
                        repository=summary.repository if summary is not None else None, batch_state="prepared",
                        children={child.task_id: "pending" for child in event.children},
                        last_event_at=event.at, version=event.originator_version)


def _move(summary: BatchSummary, event: Any) -> None:
    children = summary.children
    state = _CHILD_STATE.get(type(event))
    if state is not None:
        children[event.task_id] = state
    elif isinstance(event, ev.Parked):
        children[event.task_id] = "needs_human"
        for task_id in event.skipped:
            children[task_id] = "skipped_blocked"
    elif isinstance(event, ev.ParkResumed):
        resumed = {child.task_id: child.state for child in event.children}
        for task_id, current in children.items():
            if task_id in resumed:
                children[task_id] = resumed[task_id]
            elif current == "skipped_blocked":
                children[task_id] = "pending"
        summary.batch_state = "running"
    elif isinstance(event, ev.BatchStarted):
        summary.batch_state = "running"
    elif isinstance(event, ev.BatchSettled):
        summary.batch_state = event.batch_state
    elif isinstance(event, ev.BatchSuperseded):
        summary.batch_state = "superseded"
