"""Starting the Executors in their Lanes, and adopting the ones a killed autopilot left running."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from lanes_es.adapters.processes import process_alive

EXECUTOR_LOGS = ".executor-logs"


def path_with_lanes_es(path: str) -> str:
    """`path` with the directory of the running lanes-es first, so that an Executor's `lanes-es task submit`
    reaches this very installation without an activated virtual environment (else: exit 127, not found)."""
    import sys

    here = os.path.dirname(os.path.abspath(sys.argv[0])) if os.path.basename(sys.argv[0]) == "lanes-es" else None
    if here is None:  # run as `python -m ...` (the demo, the tests): the interpreter's scripts
        candidate = os.path.dirname(sys.executable)
        here = candidate if os.path.exists(os.path.join(candidate, "lanes-es")) else None
    if here is None:
        return path
    return os.pathsep.join([here, *(part for part in path.split(os.pathsep) if part != here)])


class ExecutorUnavailable(Exception):
    """The Executor command cannot be started."""


class Survivor:
    """An Executor process this autopilot did not start (it survived a killed run), watched by pid.

    Its exit status belongs to the process that started it, so it reads as 0 here; the
    kernel's record, not the exit status, says whether the task moved.
    """

    def __init__(self, pid: int, lane: str) -> None:
        self.pid = pid
        self.lane = lane

    def poll(self) -> int | None:
        return None if _alive_in(self.pid, self.lane) else 0


def _alive_in(pid: int, lane: str) -> bool:
    """Whether `pid` is a live process working in `lane` (Linux's /proc tells its directory)."""
    if not process_alive(pid):
        return False
    try:
        return os.path.realpath(f"/proc/{pid}/cwd") == os.path.realpath(lane)
    except OSError:
        return False


@dataclass
class Running:
    task_id: str
    process: subprocess.Popen[bytes] | Survivor
    started: float
    record_revision: int | None
    log: Path


@dataclass(frozen=True)
class Finished:
    task_id: str
    exit_code: int
    seconds: float
    record_revision: int | None
    log: Path


class Executors:
    """The Executor processes: one per Lane at most, started without a shell, cwd = the Lane."""

    def __init__(self, argv: list[str], root: str, logs_dir: Path, clock: Callable[[], float] = time.monotonic,
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.argv = argv
        self.root = root
        self.logs_dir = logs_dir
        self.clock = clock
        self.extra_env = dict(extra_env or {})
        self.running: dict[str, Running] = {}
        self.finished: dict[str, Finished] = {}
        self.adopt_survivors()

    def should_start(self, handoff: dict[str, Any]) -> bool:
        """Not while one runs; again only when the task moved since the last one started (no busy loop)."""
        task_id = handoff["task_id"]
        if task_id in self.running:
            return False
        last = self.finished.get(task_id)
        return last is None or last.record_revision != handoff["record_revision"]

    def start(self, handoff: dict[str, Any], intent_text: str) -> Running:
        task_id, lane = handoff["task_id"], handoff["lane_path"]
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        log = self.logs_dir / f"{task_id}.log"
        env = {**os.environ, **self.extra_env, "LANES_ES_TASK_ID": task_id, "LANES_ES_LANE_PATH": lane, "LANES_ES_INTENT": intent_text,
               "LANES_ES_ROOT": self.root, "LANES_ES_NEXT_OBLIGATION": handoff.get("next_obligation") or ""}
        env["PATH"] = path_with_lanes_es(env.get("PATH", os.defpath))
        with open(log, "ab") as sink:
            sink.write(f"--- lanes-es run: {shlex.join(self.argv)} in {lane} "
                       f"(record revision {handoff['record_revision']})\n".encode())
            sink.flush()
            try:
                process = subprocess.Popen(self.argv, cwd=lane, env=env, stdin=subprocess.DEVNULL, stdout=sink,
                                           stderr=subprocess.STDOUT)
            except OSError as error:
                raise ExecutorUnavailable(f"cannot start the Executor {shlex.join(self.argv)}: {error}") from None
        running = Running(task_id, process, self.clock(), handoff["record_revision"], log)
        self.running[task_id] = running
        self.pid_file(task_id).write_text(json.dumps({"pid": process.pid, "lane": lane,
                                                            "record_revision": handoff["record_revision"]}) + "\n")
        return running

    def pid_file(self, task_id: str) -> Path:
        return self.logs_dir / f"{task_id}.pid"

    def adopt_survivors(self) -> None:
        """Executors an earlier, killed autopilot started and that still work in their Lanes are waited
        for rather than started a second time beside them.

        Adopted once, when this autopilot starts, with the record revision each was started at: a
        survivor that exits between a report and the next start is then reaped like one of ours
        (not started again until its task moves), instead of looking like a Lane with no Executor.
        """
        if not self.logs_dir.is_dir():
            return
        for pid_file in sorted(self.logs_dir.glob("*.pid")):
            task_id = pid_file.stem
            try:
                recorded = json.loads(pid_file.read_text())
                pid, lane = int(recorded["pid"]), str(recorded["lane"])
                revision = recorded.get("record_revision")
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                pid_file.unlink(missing_ok=True)
                continue
            if not _alive_in(pid, lane):
                pid_file.unlink(missing_ok=True)
                continue
            self.running[task_id] = Running(task_id, Survivor(pid, lane), self.clock(),
                                            revision if isinstance(revision, int) else None, self.logs_dir / f"{task_id}.log")

    def reap(self) -> list[Finished]:
        done: list[Finished] = []
        for task_id, running in list(self.running.items()):
            code = running.process.poll()
            if code is None:
                continue
            finished = Finished(task_id, code, self.clock() - running.started, running.record_revision, running.log)
            self.finished[task_id] = finished
            del self.running[task_id]
            self.pid_file(task_id).unlink(missing_ok=True)
            done.append(finished)
        return done

