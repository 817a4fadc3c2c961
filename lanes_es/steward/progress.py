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


class LineProgress:
    """Plain lines: the log's events with the time since the start, the steward's moves, the summary."""

    def __init__(self, out: Out, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.clock = clock
        self.started = clock()

    def tell(self, item: dict[str, Any]) -> None:
        if item["kind"] == "event":
            self.out(f"[{self.clock() - self.started:6.1f}s] {item['text']}")
            return
        for line in lines_of(item):
            self.out(line)

    def show(self, board: Board) -> None:
        pass  # the events already said it, line by line

    def close(self) -> None:
        pass


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
