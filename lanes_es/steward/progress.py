"""What the autopilot tells while it works, three ways: plain lines, one JSON line per item, or a live board.

Everything it tells is an item (a dict with a `kind`):

- `event`: an event of the batch's log (`feed.py`), with the line that says it;
- `steward`: a move of the steward itself (a Lane made or removed, an Executor started or
  exited, a busy tick, the lease), with its `action` and the facts of it;
- `note`: a line for a person (the confirmation facts);
- `summary`: the end: the batch's state, the exit code and the summary's lines.

Between items the loop shows a `Board`: a row per Lane and the batch's progress. Plain lines
(logs, pipes, CI) and JSON lines ignore the board; the live board (`live.py`, on a terminal)
draws it and prints the other items above it.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

Out = Callable[[str], None]
IN_FLIGHT = frozenset({"lane_admitted", "enrolled", "settled", "lane_committed"})  # a Lane at work


@dataclass(frozen=True)
class Row:
    task_id: str
    state: str
    since: float  # when the Lane entered this state (the clock's time)
    note: str = ""  # what the steward knows that the log does not (an Executor working, a Lane kept)
    last_event: str = ""


@dataclass(frozen=True)
class Board:
    batch_id: str
    batch_state: str
    working: int  # Executors working
    done: int  # children whose Lane is behind them (integrated, released, parked, skipped)
    total: int
    rows: list[Row] = field(default_factory=list)
    round: str = ""  # the latest news about several Lanes at once: an integration round's candidates


class Progress(Protocol):
    def tell(self, item: dict[str, Any]) -> None: ...

    def show(self, board: Board) -> None: ...

    def close(self) -> None: ...


def steward_item(action: str, text: str, **facts: Any) -> dict[str, Any]:
    return {"kind": "steward", "action": action, **facts, "text": text}


def note_item(text: str) -> dict[str, Any]:
    return {"kind": "note", "text": text}


def lines_of(item: dict[str, Any]) -> list[str]:
    """The lines a person reads for an item."""
    if item["kind"] == "summary":
        return list(item["lines"])
    return [item["text"]]


def why_lines(item: dict[str, Any]) -> list[str]:
    """Under an event that records failed checks (a park, a failed QA): each failed command's reason, times and
    output tail, and where a failed candidate is kept."""
    if item["kind"] != "event":
        return []
    from lanes_es.projections.failures import failure_lines

    return [f"    {line}" for line in failure_lines(item["fields"])]


class LineProgress:
    """Plain lines: the log's events with the time since the start, the steward's moves, the summary; while
    nothing happens for a while (Executors at work), a line every `quiet` seconds says who is working, so a log
    or a CI job shows that the run is alive."""

    def __init__(self, out: Out, clock: Callable[[], float] = time.monotonic, quiet: float = 30.0) -> None:
        self.out = out
        self.clock = clock
        self.started = self.last = clock()
        self.quiet = quiet

    def tell(self, item: dict[str, Any]) -> None:
        self.last = self.clock()
        if item["kind"] == "event":
            self.out(f"[{self.last - self.started:6.1f}s] {item['text']}")
            for line in why_lines(item):
                self.out(line)
            return
        for line in lines_of(item):
            self.out(line)

    def show(self, board: Board) -> None:
        now = self.clock()
        busy = [row for row in board.rows if row.state in IN_FLIGHT]
        if now - self.last < self.quiet or not busy:  # the events say it line by line
            return
        self.last = now
        working = [f"{row.task_id} {row.state}{f' ({row.note})' if row.note else ''} for {_duration(now - row.since)}"
                   for row in busy]
        self.out(f"[{now - self.started:6.1f}s] still working: {board.done}/{board.total} done; {'; '.join(working)}")

    def close(self) -> None:
        pass


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


class JsonProgress:
    """One JSON object per line for each item, and nothing else on stdout (`lanes-es run --json`)."""

    def __init__(self, out: Out) -> None:
        self.out = out

    def tell(self, item: dict[str, Any]) -> None:
        self.out(json.dumps(item, sort_keys=True, default=str))

    def show(self, board: Board) -> None:
        pass

    def close(self) -> None:
        pass


class Guarded:
    """A progress told from two threads (the loop, and the watcher of a running tick), one at a time."""

    def __init__(self, inner: Progress) -> None:
        self.inner = inner
        self.lock = threading.RLock()

    def tell(self, item: dict[str, Any]) -> None:
        with self.lock:
            self.inner.tell(item)

    def show(self, board: Board) -> None:
        with self.lock:
            self.inner.show(board)

    def close(self) -> None:
        with self.lock:
            self.inner.close()
