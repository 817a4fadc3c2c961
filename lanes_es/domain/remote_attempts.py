"""The attempts a batch sent to a Ray cluster's nodes, folded from its log (the `ray` runner).

Pure. Every dispatch is an event (`RemoteAttemptDispatched`), and so is its end or its loss; the
attempts dispatched with neither are *open*: a coordinator that starts after one that was killed reads
them here, and collects or cancels each on its node before it runs anything (lanes_es/tick/remote.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import events as ev


@dataclass
class RemoteAttempts:
    open: dict[str, ev.RemoteAttemptDispatched] = field(default_factory=dict)
    dispatched: int = 0
    lost: int = 0

    def fold(self, event: Any) -> None:
        kind = type(event)
        if kind is ev.RemoteAttemptDispatched:
            self.open[event.attempt_id] = event
            self.dispatched += 1
        elif kind is ev.RemoteAttemptEnded:
            self.open.pop(event.attempt_id, None)
        elif kind is ev.RemoteAttemptLost:
            self.open.pop(event.attempt_id, None)
            self.lost += 1

    def open_of(self, *kinds: str) -> dict[str, ev.RemoteAttemptDispatched]:
        """The open attempts of these kinds (`check`, `qa`: a tick's; `executor`: an autopilot's), by id."""
        return {attempt_id: sent for attempt_id, sent in self.open.items() if sent.kind in kinds}


def record_remote_notes(batch: Any, at: str, notes: list[Any]) -> None:
    """Record a Ray runner's notes (`kind` dispatched, ended or lost; lanes_es/adapters/ray_runner.py
    AttemptNote) on `batch` (a LaneBatch) as events, in their order."""
    for note in notes:
        if note.kind == "dispatched":
            batch.note_remote_dispatched(at, note.attempt_id, note.work, note.task_id, note.node, note.tree)
        elif note.kind == "ended":
            batch.note_remote_ended(at, note.attempt_id, note.node, note.detail)
        else:
            batch.note_remote_lost(at, note.attempt_id, note.node, note.detail)
