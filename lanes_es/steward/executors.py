"""Starting the Executors in their Lanes, and adopting the ones a killed autopilot left running.

An Executor is a command (`--executor CMD`, started as given) or a named agent (`--executor
claude-code|codex|opencode`), whose attempt runs as a process of its own
(lanes_es/executors/attempt.py) that starts the agent, enforces the attempt's limits and submits
the work. Each attempt leaves a result file (the attempt process writes an agent's; the autopilot
writes a command's when it reaps it), which the autopilot records as the attempt's end.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import msgspec

from lanes_es.adapters.files import read_capped_text
from lanes_es.adapters.processes import process_alive
from lanes_es.domain.jstext import parse_json
from lanes_es.domain.events import AttemptLimits, ExecutorUsage
from lanes_es.domain.executor_runs import Spent
from lanes_es.executors.agent import Agent
from lanes_es.executors.attempt import (AttemptResult, AttemptSpec, ask_to_stop, read_progress, submitting_marker,
                                      write_atomically)
from lanes_es.executors.environment import argv_for_the_record, executor_environment
from lanes_es.executors.prompt import Assignment, build_prompt, prompt_digest

EXECUTOR_LOGS = ".executor-logs"
DEFAULT_ATTEMPT_SECONDS = 3600
COMMAND = "command"
SUBMITTING_POLL_SECONDS = 0.02
SUBMITTING_WAIT_SECONDS = 30.0  # a submit stuck longer (a busy store) is not waited for: the next tick goes on


def path_with_lanes_es(path: str) -> str:
    """`path` with the directory of the running lanes-es first, so that an Executor's `lanes-es task submit`
    reaches this very installation without an activated virtual environment (else: exit 127, not found)."""
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


@dataclass(frozen=True)
class Launch:
    """One attempt, ready to start: what runs where, and what the log keeps of it."""

    task_id: str
    attempt: int
    lane: str
    record_revision: int | None
    argv: list[str]
    env: dict[str, str]
    adapter: str
    recorded_argv: list[str]
    obligation: str
    prompt_sha256: str | None = None
    limits: AttemptLimits | None = None
    spec: AttemptSpec | None = None
    # A named agent's prompt and contract variables, for an attempt on a Ray node (kept out of the log).
    prompt: str | None = None
    contract: dict[str, str] | None = None
    scope: list[str] | None = None


@dataclass
class Running:
    task_id: str
    process: subprocess.Popen[bytes] | Survivor
    started: float
    record_revision: int | None
    log: Path
    attempt: int = 0
    adapter: str = COMMAND
    started_at: float = field(default_factory=time.time)  # the wall clock, for a survivor's duration


@dataclass(frozen=True)
class Finished:
    task_id: str
    exit_code: int
    seconds: float
    record_revision: int | None
    log: Path
    attempt: int = 0
    result: AttemptResult | None = None  # as its result file says; None when it left none
    notes: list[Any] = field(default_factory=list)  # an attempt on a Ray node: what its runner noted


class Executors:
    """The Executor processes: one per Lane at most, started without a shell, cwd = the Lane.

    `argv` is the command of `--executor CMD`, or, with `agent`, the agent's program (its path).
    """

    def __init__(self, argv: list[str], root: str, logs_dir: Path, clock: Callable[[], float] = time.monotonic,
                 extra_env: Mapping[str, str] | None = None, agent: Agent | None = None,
                 attempt_seconds: int = DEFAULT_ATTEMPT_SECONDS) -> None:
        self.argv = argv
        self.root = root
        self.logs_dir = logs_dir
        self.clock = clock
        self.extra_env = dict(extra_env or {})
        self.agent = agent
        self.attempt_seconds = attempt_seconds
        # The `ray` runner: connect(journal) -> a RayCheckRunner; a named agent's attempts then run on its nodes
        # (lanes_es/steward/remote_run.py). None: on this machine.
        self.remote: Callable[[Callable[[Any], None]], Any] | None = None
        self.running: dict[str, Running] = {}
        self.finished: dict[str, Finished] = {}
        self.exited = threading.Event()  # set when an Executor this autopilot started exits
        self.adopt_survivors()

    @property
    def adapter(self) -> str:
        return self.agent.name if self.agent is not None else COMMAND

    def should_start(self, handoff: dict[str, Any]) -> bool:
        """Not while one runs; again only when the task moved since the last one started (no busy loop).
        A named agent delivers work only: a Review (or anything else a task may wait for) is a person's."""
        task_id = handoff["task_id"]
        if task_id in self.running:
            return False
        if self.agent is not None and handoff.get("next_obligation") != "submit_assurance":
            return False
        last = self.finished.get(task_id)
        return last is None or last.record_revision != handoff["record_revision"]

    # ------------------------------------------------------------ one attempt

    def start(self, handoff: dict[str, Any], intent_text: str, attempt: int = 0,
              assignment: Assignment | None = None, limits: AttemptLimits | None = None) -> Running:
        """Prepare and launch at once (attempt 0: one the log does not number, as a test starts it)."""
        return self.launch(self.prepare(handoff, intent_text, attempt, assignment, limits))

    def prepare(self, handoff: dict[str, Any], intent_text: str, attempt: int,
                assignment: Assignment | None = None, limits: AttemptLimits | None = None,
                wall_detail: str | None = None) -> Launch:
        """What to launch; `wall_detail`, when a budget bounds the attempt's wall clock, is why its kill at the
        timeout is a budget stop."""
        task_id, lane = handoff["task_id"], handoff["lane_path"]
        contract = {"LANES_ES_TASK_ID": task_id, "LANES_ES_LANE_PATH": lane, "LANES_ES_INTENT": intent_text,
                    "LANES_ES_NEXT_OBLIGATION": handoff.get("next_obligation") or ""}
        common = {"task_id": task_id, "attempt": attempt, "lane": lane, "record_revision": handoff["record_revision"]}
        if self.agent is None:
            env = executor_environment(os.environ, {**contract, "LANES_ES_ROOT": self.root}, self.extra_env)
            env["PATH"] = path_with_lanes_es(env.get("PATH", os.defpath))
            return Launch(**common, argv=list(self.argv), env=env, adapter=COMMAND,
                          recorded_argv=argv_for_the_record(self.argv), obligation=contract["LANES_ES_NEXT_OBLIGATION"])
        assert assignment is not None, "a named agent's attempt needs its assignment"
        limits = limits or AttemptLimits(timeout_seconds=self.attempt_seconds)
        prompt = build_prompt(assignment)
        digest = prompt_digest(prompt)
        agent_argv = self.agent.argv(self.argv[0], lane, prompt, limits)
        spec = AttemptSpec(agent=self.agent.name, argv=agent_argv, lane=lane, timeout_seconds=limits.timeout_seconds,
                           timeout_reason="budget" if wall_detail else "timeout", timeout_detail=wall_detail or "",
                           max_tokens=limits.tokens, max_cost_usd=limits.cost_usd, tmpdir=str(Path(lane) / ".imm" / "state" / "executor-tmp"),
                           result_path=str(self.result_path(task_id, attempt)),
                           progress_path=str(self.progress_path(task_id)), stop_path=str(self.stop_path(task_id)),
                           submit_argv=[*lanes_es_command(), "task", "submit"])
        env = executor_environment(os.environ, contract, {**self.extra_env, **self.agent.environment(lane)})
        env["PATH"] = path_with_lanes_es(env.get("PATH", os.defpath))
        return Launch(**common, argv=[sys.executable, "-P", "-m", "lanes_es.executors.attempt",
                                      str(self.spec_path(task_id, attempt))],
                      env=env, adapter=self.agent.name, recorded_argv=argv_for_the_record(agent_argv, prompt, digest),
                      obligation=assignment.obligation, prompt_sha256=digest, limits=limits, spec=spec,
                      prompt=prompt, contract=contract, scope=_scope_of(intent_text))

    def launch(self, launch: Launch) -> Running:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        task_id = launch.task_id
        for stale in (self.progress_path(task_id), self.stop_path(task_id)):
            stale.unlink(missing_ok=True)
        if launch.spec is not None:
            write_atomically(self.spec_path(task_id, launch.attempt), msgspec.json.encode(launch.spec))
        log = self.logs_dir / f"{task_id}.log"
        if self.remote is not None and launch.spec is not None and self.agent is not None:
            return self._launch_remote(launch, log)
        with open(log, "ab") as sink:
            sink.write(f"--- lanes-es run: attempt {launch.attempt}: {shlex.join(launch.recorded_argv)} in "
                       f"{launch.lane} (record revision {launch.record_revision})\n".encode())
            sink.flush()
            try:
                process = subprocess.Popen(launch.argv, cwd=launch.lane, env=launch.env, stdin=subprocess.DEVNULL,
                                           stdout=sink, stderr=subprocess.STDOUT)
            except OSError as error:
                raise ExecutorUnavailable(f"cannot start the Executor {shlex.join(launch.recorded_argv)}: "
                                          f"{error}") from None
        running = Running(task_id, process, self.clock(), launch.record_revision, log, launch.attempt, launch.adapter)
        self.running[task_id] = running
        threading.Thread(target=self._watch, args=(process,), name=f"lanes-es-executor-{task_id}", daemon=True).start()
        self.pid_file(task_id).write_text(json.dumps({
            "pid": process.pid, "lane": launch.lane, "record_revision": launch.record_revision,
            "attempt": launch.attempt, "adapter": launch.adapter, "started_at": running.started_at}) + "\n")
        return running

    def _launch_remote(self, launch: Launch, log: Path) -> Running:
        """The attempt on a node of the cluster (no pid file: no process here for a later autopilot to adopt)."""
        from lanes_es.steward.remote_run import RemoteRun

        assert self.remote is not None and self.agent is not None
        with open(log, "ab") as sink:
            sink.write(f"--- lanes-es run: attempt {launch.attempt}: {shlex.join(launch.recorded_argv)} on the Ray "
                       f"cluster, for {launch.lane} (record revision {launch.record_revision})\n".encode())
        process = RemoteRun(self.remote, launch, log, launch.scope or [], self.exited, self.agent.program)
        running = Running(launch.task_id, process, self.clock(), launch.record_revision, log,  # type: ignore[arg-type]
                          launch.attempt, launch.adapter)
        self.running[launch.task_id] = running
        return running

    def stop(self, task_id: str, reason: str, detail: str) -> None:
        """Ask a running agent attempt to end (its process kills the agent and records why), here or on its Ray
        node; a command is left."""
        running = self.running.get(task_id)
        if running is None or running.adapter == COMMAND:
            return
        if running.process.pid is None:  # on a Ray node (steward/remote_run.py)
            running.process.stop(reason, detail)
            return
        ask_to_stop(self.stop_path(task_id), running.process.pid, reason, detail)

    def live_usage(self, task_id: str) -> ExecutorUsage:
        """What a running agent attempt has reported so far (its progress file), nothing when it has not."""
        running = self.running.get(task_id)
        if running is not None and running.process.pid is None:  # on a Ray node: its host reads the file there
            return running.process.live_usage()
        return read_progress(self.progress_path(task_id))

    def live_spent(self) -> Spent:
        """What the running attempts have spent so far, beyond what the log holds of them (each counted as an
        attempt when it started): their wall-clock time, and the tokens and dollars their agents reported."""
        total = Spent()
        now = time.time()
        for task_id, running in self.running.items():
            usage = self.live_usage(task_id) if running.adapter != COMMAND else ExecutorUsage()
            total = total + Spent(0, int(max(now - running.started_at, 0) * 1000),
                                  (usage.tokens_in or 0) + (usage.tokens_out or 0), usage.cost_usd or 0.0)
        return total

    def _watch(self, process: subprocess.Popen[bytes]) -> None:
        process.wait()
        self.exited.set()

    def wait_for_exit(self, timeout: float) -> None:
        """Until an Executor this autopilot started exits, or `timeout` seconds (a survivor it adopted, watched by
        pid, is seen only by the next `reap`): the tick that takes up a submitted task starts at once."""
        self.exited.wait(timeout)
        self.exited.clear()

    # ------------------------------------------------------------ files

    def pid_file(self, task_id: str) -> Path:
        return self.logs_dir / f"{task_id}.pid"

    def spec_path(self, task_id: str, attempt: int) -> Path:
        return self.logs_dir / f"{task_id}.attempt-{attempt}.json"

    def result_path(self, task_id: str, attempt: int) -> Path:
        return self.logs_dir / f"{task_id}.attempt-{attempt}.result.json"

    def progress_path(self, task_id: str) -> Path:
        return self.logs_dir / f"{task_id}.progress.json"

    def stop_path(self, task_id: str) -> Path:
        return self.logs_dir / f"{task_id}.stop.json"

    def read_result(self, task_id: str, attempt: int) -> AttemptResult | None:
        try:
            return msgspec.json.decode(self.result_path(task_id, attempt).read_bytes(), type=AttemptResult)
        except (OSError, msgspec.DecodeError):
            return None

    # ------------------------------------------------------------ survivors, and the ends

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
                recorded = parse_json(read_capped_text(pid_file, 64 * 1024))
                pid, lane = int(recorded["pid"]), str(recorded["lane"])
                revision = recorded.get("record_revision")
            except (OSError, ValueError, KeyError, TypeError, AttributeError):  # not a pid file this steward wrote
                pid_file.unlink(missing_ok=True)
                continue
            if not _alive_in(pid, lane):
                pid_file.unlink(missing_ok=True)
                continue
            attempt, adapter, since = recorded.get("attempt"), recorded.get("adapter"), recorded.get("started_at")
            self.running[task_id] = Running(task_id, Survivor(pid, lane), self.clock(),
                                            revision if isinstance(revision, int) else None,
                                            self.logs_dir / f"{task_id}.log",
                                            attempt if isinstance(attempt, int) else 0,
                                            adapter if isinstance(adapter, str) else COMMAND,
                                            since if isinstance(since, (int, float)) else time.time())

    def wait_for_submitting(self, timeout: float) -> None:
        """Until every attempt that is submitting its work (its marker written) has exited, or `timeout` seconds:
        such an attempt ends within moments, and the tick that follows should find its end recorded."""
        deadline = self.clock() + timeout
        for task_id, running in list(self.running.items()):
            if running.attempt < 1 or not submitting_marker(self.result_path(task_id, running.attempt)).exists():
                continue
            while running.process.poll() is None and self.clock() < deadline:
                time.sleep(SUBMITTING_POLL_SECONDS)

    def reap(self) -> list[Finished]:
        done: list[Finished] = []
        for task_id, running in list(self.running.items()):
            code = running.process.poll()
            if code is None:
                continue
            seconds = self.clock() - running.started
            finished = Finished(task_id, code, seconds, running.record_revision, running.log, running.attempt,
                                self.result_of(running, code), self._notes_of(running))
            self.finished[task_id] = finished
            del self.running[task_id]
            self.pid_file(task_id).unlink(missing_ok=True)
            submitting_marker(self.result_path(task_id, running.attempt)).unlink(missing_ok=True)
            done.append(finished)
        return done

    def take_remote_notes(self) -> list[Any]:
        """What the runners of the attempts running on Ray nodes noted since the last call (their dispatches)."""
        return [note for running in self.running.values() for note in self._notes_of(running)]

    @staticmethod
    def _notes_of(running: Running) -> list[Any]:
        take = getattr(running.process, "take_notes", None)
        return take() if take is not None else []

    def result_of(self, running: Running, code: int) -> AttemptResult | None:
        """An agent attempt's result file; for a command, the one the autopilot writes now (a survivor's exit
        status is not ours to read: unknown)."""
        if running.attempt < 1:
            return None
        if running.adapter != COMMAND:
            return self.read_result(running.task_id, running.attempt)
        survivor = isinstance(running.process, Survivor)
        result = AttemptResult(exit_code=None if survivor else code,
                               duration_ms=int(round((time.time() - running.started_at) * 1000)))
        write_atomically(self.result_path(running.task_id, running.attempt), msgspec.json.encode(result))
        return result


def executor_bounds(agent: Agent | None) -> frozenset[str]:
    """The budget measures an Executor can be held to: a command (None) only by its number of attempts (it runs
    without an attempt process and reports nothing); an agent by its wall clock and tokens too, and by dollars
    when it reports what it cost."""
    if agent is None:
        return frozenset({"attempts"})
    return frozenset({"attempts", "wall", "tokens", *(("cost",) if agent.reports_cost else ())})


def lanes_es_command() -> list[str]:
    """How an Executor runs the lanes-es that started it, with no virtual environment activated: this
    interpreter's `lanes-es` script beside it when there is one, else the interpreter itself (-P: the Lane's
    files never shadow lanes-es)."""
    script = Path(sys.executable).parent / "lanes-es"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-P", "-m", "lanes_es.cli.main"]


def _scope_of(intent_text: str) -> list[str]:
    """The task's scope as its intent names it: what a delivery from a Ray node may touch."""
    from lanes_es.domain.jstext import parse_json

    try:
        scope = parse_json(intent_text).get("scope_hint", [])
    except (ValueError, AttributeError):
        return []
    return [entry for entry in scope if isinstance(entry, str)] if isinstance(scope, list) else []
