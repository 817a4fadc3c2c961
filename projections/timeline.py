"""The audit timeline: one row per event of a batch's log, in the words people search for.

Pure: a function of the events. `replay` and the audit page read the same rows, so
what the command line prints and what the page shows cannot disagree.
"""

from __future__ import annotations

from typing import Any, Iterable

import msgspec

from lanes_es.domain import events as ev

# Fields every event carries; a row shows them in their own columns, not among the facts.
_ENVELOPE = frozenset({"originator_id", "originator_version", "timestamp", "at", "digest", "originator_topic",
                       "task_id"})


class TimelineRow(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    at: str
    event: str
    task_id: str | None
    transition: str | None  # one of the card's eight transition names, else None
    facts: dict[str, Any]
    digest: str


# The output digests a QA or guard verdict carries (absent from older logs): shown only when recorded.
_SHOWN_WHEN_RECORDED = frozenset({(ev.Settled, "qa_outputs"), (ev.QaFailureCounted, "qa_outputs"),
                                  (ev.ReviewOpened, "qa_outputs"), (ev.Integrated, "checks")})


def facts_of(event: Any) -> dict[str, Any]:
    """What the event says beyond its envelope, as plain JSON values in field order."""
    facts: dict[str, Any] = {}
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if name in _ENVELOPE or value is msgspec.UNSET or (value == [] and (type(event), name) in _SHOWN_WHEN_RECORDED):
            continue
        facts[name] = msgspec.to_builtins(value)
    return facts


def timeline_row(event: Any) -> TimelineRow:
    return TimelineRow(
        version=event.originator_version,
        at=event.at,
        event=type(event).__name__,
        task_id=getattr(event, "task_id", None),
        transition=ev.TRANSITION_NAMES.get(type(event)),
        facts=facts_of(event),
        digest=event.digest,
    )


def timeline(events: Iterable[Any]) -> list[TimelineRow]:
    return [timeline_row(event) for event in events]


def tasks_in_plan_order(events: Iterable[Any]) -> list[str]:
    """The batch's children as the plan lists them, then any other task the log names."""
    tasks: list[str] = []
    for event in events:
        if isinstance(event, ev.BatchPrepared):
            names = [child.task_id for child in event.children]
        else:
            named = getattr(event, "task_id", None)
            names = [named] if isinstance(named, str) else []
        for name in names:
            if name not in tasks:
                tasks.append(name)
    return tasks


class AnchorMarks(msgspec.Struct, frozen=True, kw_only=True):
    """What lies on the batch's checkpoint ref, for the timeline: each checkpoint's size and root
    (oldest first), and the attestation of each integration by the version of its Integrated event."""

    checkpoints: list[tuple[int, str]] = []
    attested: dict[int, str] = {}

    def checkpoint_at(self, version: int) -> list[str]:
        """The roots of the checkpoints whose tree ends at `version`."""
        return [root for size, root in self.checkpoints if size == version]
