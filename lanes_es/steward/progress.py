"""What the autopilot shows while it works: plain lines, or a block redrawn in place on a terminal."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from typing import Callable, TextIO

Out = Callable[[str], None]


@dataclass(frozen=True)
class Row:
    task_id: str
    state: str
    since: float
    note: str = ""


class LineProgress:
    """Plain lines, one per change: for logs, pipes and CI."""

    def __init__(self, out: Out, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.clock = clock
        self.started = clock()
        self.shown: dict[str, tuple[str, str]] = {}

    def show(self, header: str, rows: list[Row]) -> None:
        for row in rows:
            if self.shown.get(row.task_id) != (row.state, row.note):
                self.shown[row.task_id] = (row.state, row.note)
                note = f" ({row.note})" if row.note else ""
                self.out(f"[{self.clock() - self.started:6.1f}s] {row.task_id}: {row.state}{note}")

    def refresh(self) -> None:
        pass

    def note(self, line: str) -> None:
        self.out(line)

    def close(self) -> None:
        pass


class TerminalProgress:
    """A block of lines redrawn in place: task, state, time in that state, and what is going on."""

    def __init__(self, stream: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.clock = clock
        self.started = clock()
        self.header = ""
        self.rows: list[Row] = []
        self.drawn = 0

    def show(self, header: str, rows: list[Row]) -> None:
        self.header, self.rows = header, rows
        self.refresh()

    def refresh(self) -> None:
        self._clear()
        self._draw()

    def note(self, line: str) -> None:
        self._clear()
        self.stream.write(line + "\n")
        self._draw()

    def close(self) -> None:
        self.refresh()
        self.drawn, self.header, self.rows = 0, "", []  # the last drawing stays; later lines go below it

    def _clear(self) -> None:
        if self.drawn:
            self.stream.write(f"\x1b[{self.drawn}F\x1b[J")
            self.drawn = 0

    def _draw(self) -> None:
        if not self.header:
            return
        width = max(20, shutil.get_terminal_size().columns - 1)
        now = self.clock()
        lines = [f"{now - self.started:5.0f}s {self.header}"]
        lines += [f"  {row.task_id:<24} {row.state:<15} {now - row.since:6.1f}s  {row.note}".rstrip()
                  for row in self.rows]
        self.stream.write("".join(line[:width] + "\n" for line in lines))
        self.stream.flush()
        self.drawn = len(lines)

