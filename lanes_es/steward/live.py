"""The live board on a terminal: a line per Lane (task, state, time in it, last event) and the batch's progress.

Drawn with `rich` (its `Live` redraws the board in place and prints other lines above it);
imported only by `lanes-es run` on a terminal, so no other command pays for it.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from lanes_es.steward.progress import Board, lines_of, why_lines

REFRESHES_PER_SECOND = 4


class LiveProgress:
    def __init__(self, console: Console | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console or Console(highlight=False)
        self.clock = clock
        self.started = clock()
        self.board: Board | None = None
        self.live = Live(console=self.console, get_renderable=self.render, refresh_per_second=REFRESHES_PER_SECOND,
                         transient=False, redirect_stdout=False, redirect_stderr=False)
        self.started_live = False  # the board starts with the first tick, after the confirmation's question

    def tell(self, item: dict[str, Any]) -> None:
        if item["kind"] == "event":
            for line in why_lines(item):  # why a check failed: above the board, where it stays
                self.console.print(Text(line), soft_wrap=True)
            if self.started_live:
                self.live.refresh()  # the board shows it: the Lane's last event, or the round's news
            return
        for line in lines_of(item):
            self.console.print(Text(line), soft_wrap=True)  # above the board, a long path never cut in two

    def show(self, board: Board) -> None:
        self.board = board
        if not self.started_live:
            self.started_live = True
            self.live.start()
        self.live.refresh()

    def close(self) -> None:
        self.live.stop()  # the last drawing stays; later lines go below it

    def render(self) -> Group | Text:
        board = self.board
        if board is None:
            return Text("")
        now = self.clock()
        header = Table.grid(padding=(0, 1))
        header.add_row(Text(f"{now - self.started:5.0f}s"), Text(board.batch_state, style="bold"),
                       ProgressBar(total=max(board.total, 1), completed=board.done, width=24),
                       Text(f"{board.done}/{board.total} done, {board.working} Executor"
                            f"{'s' if board.working != 1 else ''} working: batch {board.batch_id}"))
        lanes = Table.grid(padding=(0, 2))
        for row in board.rows:
            lanes.add_row(Text(row.task_id, no_wrap=True, overflow="ellipsis"), Text(row.state),
                          Text(f"{now - row.since:6.1f}s"),
                          Text(" · ".join(part for part in (row.note, row.last_event) if part),
                               no_wrap=True, overflow="ellipsis"))
        parts: list[Any] = [header]
        if board.round:
            parts.append(Text(f"integration: {board.round}", no_wrap=True, overflow="ellipsis"))
        parts.append(lanes)
        return Group(*parts)
