"""The batch's log as the autopilot's news: each new event once, as a dict, with a line that says it.

The display is driven by the log, not by a list of known kinds: an event that names a task
(`task_id`) is that Lane's last event, one that names several Lanes (`lanes`, as an
integration candidate does) is the round's news, and any kind added later shows up the same
way, its name in words and its short fields beside it.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Callable, Protocol

import msgspec

# Fields every event carries, or that the line already shows another way.
BOOKKEEPING = frozenset({"originator_id", "originator_version", "originator_topic", "timestamp", "at", "digest",
                         "batch_id", "task_id", "lanes"})
SHOWN_FIELDS = 4
SHOWN_TEXT = 48
OBJECT_ID = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


class EventSource(Protocol):
    def events_after(self, aggregate_id: str, version: int) -> list[Any]: ...


def words(type_name: str) -> str:
    """`CandidateVerified` -> `candidate verified`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", type_name).lower()


def event_item(batch_id: str, event: Any) -> dict[str, Any]:
    """One log event as the display and `--json` take it: kind, batch, version, type, time, fields."""
    fields = msgspec.to_builtins(event)
    payload = {key: value for key, value in fields.items()
               if key not in ("originator_id", "originator_version", "originator_topic", "timestamp", "digest")}
    item = {"kind": "event", "batch_id": batch_id, "version": event.originator_version, "type": type(event).__name__,
            "at": fields.get("at"), "fields": payload}
    item["text"] = describe(item)
    return item


def subjects(item: dict[str, Any]) -> list[str]:
    """The Lanes an event is about: its task, or the Lanes of a candidate."""
    fields = item["fields"]
    if isinstance(fields.get("task_id"), str):
        return [fields["task_id"]]
    lanes = fields.get("lanes")
    if isinstance(lanes, list) and all(isinstance(lane, str) for lane in lanes):
        return list(lanes)
    return []


def describe(item: dict[str, Any]) -> str:
    """`one+two: candidate verified mode=speculative passed=yes commit=1a2b3c4d5e6f`."""
    named = subjects(item)
    head = f"{'+'.join(named)}: " if named else ""
    details = [f"{key}={shown}" for key, value in item["fields"].items()
               if key not in BOOKKEEPING and (shown := short(value)) is not None][:SHOWN_FIELDS]
    return f"{head}{words(item['type'])}" + (f" {' '.join(details)}" if details else "")


def short(value: Any) -> str | None:
    """A field value worth a place on one line, else None (records, long lists, empty values)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value:
        text = value[:12] if OBJECT_ID.match(value) else value
        return text if len(text) <= SHOWN_TEXT else text[:SHOWN_TEXT - 3] + "..."
    if isinstance(value, list) and value and len(value) <= 8 and all(isinstance(v, str) for v in value):
        return short(",".join(value))
    return None


class BatchFeed:
    """The events of one batch not yet shown, read from the store after the last one shown.

    Read from the loop after each tick and from a watcher while a tick runs (a long
    integration round shows its candidates as they are recorded); the lock makes each event
    come out exactly once whichever thread reads it.
    """

    def __init__(self, store: EventSource) -> None:
        self.store = store
        self.batch_id: str | None = None
        self.version = 0
        self.lock = threading.Lock()

    def follow(self, batch_id: str, after: int = 0) -> None:
        """Tell the events of `batch_id` after version `after` (those before were told by an earlier run)."""
        with self.lock:
            if batch_id != self.batch_id:
                self.batch_id, self.version = batch_id, after

    def drain(self, emit: Callable[[dict[str, Any]], None]) -> int:
        """Hand each new event to `emit`, in log order (under the lock: two readers never reorder them)."""
        with self.lock:
            if self.batch_id is None:
                return 0
            events = self.store.events_after(self.batch_id, self.version)
            for event in events:
                self.version = event.originator_version
                emit(event_item(self.batch_id, event))
            return len(events)
