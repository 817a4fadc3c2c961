"""LANES_ES_STATS: a tick appends one JSON line of its counts (git spawns, seconds in git, the store, the
kernel and the checkpoint, events appended) to the file it names."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from lanes_es.errors import ServiceError
from lanes_es.tick_input import TickPorts


@dataclass
class Timings:
    store: float = 0.0
    kernel: float = 0.0
    anchor: float = 0.0
    events: int = 0
    git_before: tuple[int, float, float] = (0, 0.0, 0.0)  # the git counters when the tick began


def git_snapshot() -> tuple[int, float, float]:
    from lanes_es.adapters.git import STATS  # the runner's module: only a tick imports it

    return STATS.snapshot()


def require_stats_file(path: str | None) -> None:
    """LANES_ES_STATS is checked before the tick: a tick that ran is never reported as refused for it."""
    if not path:
        return
    foreign = _foreign_stats_file(path)
    if foreign:
        raise ServiceError("invalid_stats_file", f"LANES_ES_STATS={path} is {foreign}, not a tick "
                                                 f"statistics file; nothing was ticked: name a new file or one "
                                                 f"lanes-es wrote, or unset LANES_ES_STATS")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise ServiceError("invalid_stats_file", f"LANES_ES_STATS={path} cannot be appended to "
                                                 f"({error.strerror}); nothing was ticked: name a writable file, "
                                                 f"or unset LANES_ES_STATS") from None


def write_stats(path: str | None, started: float, timings: Timings) -> None:
    if not path:
        return
    spawns, seconds, busy = (now - before for now, before in zip(git_snapshot(), timings.git_before))
    # This tick's figures only (the process may tick many times: `lanes-es run`, the MCP server).
    # git_seconds adds up spawns that ran at once from several threads; git_busy_seconds is wall time.
    line = {"git_spawns": spawns, "git_seconds": round(seconds, 4), "git_busy_seconds": round(busy, 4),
            "store_seconds": round(timings.store, 4), "kernel_seconds": round(timings.kernel, 4),
            "anchor_seconds": round(timings.anchor, 4),
            "total_seconds": round(time.perf_counter() - started, 4), "events_appended": timings.events}
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
    except OSError as error:  # the tick itself is done and recorded: say so, do not fail it
        print(f"lanes-es: tick statistics not written to {path}: {error.strerror}", file=sys.stderr)


def _foreign_stats_file(path: str) -> str | None:
    """What makes an existing file at `path` no statistics file (None when it is one, or absent).

    lanes-es only appends JSON lines; appending to anything else (a program, a document) would
    damage a file of the user's, which root could do to any file on the machine."""
    try:
        info = os.stat(path)
    except OSError:
        return None  # absent (made on first use) or unreadable: the append check says which
    if stat.S_ISCHR(info.st_mode):
        return None  # a device such as /dev/null or a terminal takes lines and keeps nothing
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_mode & 0o111:
        return "an executable file"
    if info.st_size == 0:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(max(info.st_size - 4096, 0))
            tail = handle.read()
    except OSError:
        return None
    if b"\0" in tail or not tail.endswith(b"}\n"):
        return "a file whose last line is no JSON line lanes-es wrote"
    return None


class _TimedKernel:
    """Wraps the kernel port to add up the seconds spent in it, for LANES_ES_STATS."""

    def __init__(self, kernel: Any, timings: Timings) -> None:
        self._kernel = kernel
        self._timings = timings

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._kernel, name)
        if not callable(target):
            return target

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return target(*args, **kwargs)
            finally:
                self._timings.kernel += time.perf_counter() - began
        return timed


def timed(ports: TickPorts, timings: Timings) -> TickPorts:
    return replace(ports, kernel=_TimedKernel(ports.kernel, timings))
