"""`lanes-es run`: the autopilot, playing Parent and Lane Steward for one Initiative's batch.

It runs under the Initiative's current authorization (where there is none it shows the
confirmation facts and asks, or takes --yes), then loops:

  tick -> for each release handoff: remove the Lane, only when it is clean
       -> for each provision handoff: make the Lane (git worktree add) and offer it on the next tick
       -> for each executor handoff: start the Executor command in the Lane
       -> when nothing else is to be done: wait for an Executor to exit, and tick again

It stops with a summary when the batch completes, parks (needs_human), runs out of budget,
fails, is rejected, asks for a coordinator's correction, or can make no more progress.

All the batch's state is in the log and in git: killed and started again, it re-offers the
Lanes it had made and starts the Executors again for the executor handoffs. The runtime never
makes or removes a worktree; only this steward does (DESIGN §1).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, TextIO

from lanes_es.adapters.git import git, git_ok
from lanes_es.adapters.store import StoreConflict
from lanes_es.domain.record import is_terminal
from lanes_es.ports import GitFailure
from lanes_es.service import (
    EXIT_OK, EXIT_REJECTED, EXIT_STOPPED, Confirmation, LanesService, ServiceError, TickResult,
)
from lanes_es.tick_input import LaneOfferInput

Out = Callable[[str], None]

# A tick that finds the batch lock held (another tick of the same batch) is tried again this often.
STORE_BUSY_RETRIES = 20
EXECUTOR_LOGS = ".executor-logs"
STOPPING_STATES = ("needs_human", "budget_stopped", "failed", "superseded")

REVISION_DELEGATION_TEXT = (
    "Delegate in-Lane Intent revisions (ADR 0018)? If yes, when a Lane's Executor needs a breaking revision "
    "of its TaskIntent, the coordinator may approve it for you, within bounds the runtime enforces: the same "
    "goal, owner and risk, and a scope_hint that is never widened. Anything beyond that still comes back to "
    "you. Default: no.")

RUN_DESCRIPTION = """\
The autopilot: run an Initiative's batch to the end, playing Parent and Lane Steward.

  lanes-es run SLUG --max-parallel 3 --lanes-dir ../lanes --executor "my-agent --task-from-env"

It confirms the batch first when it has no valid authorization (the facts are shown; you are
asked, or --yes answers for you), then ticks, makes a Lane (git worktree add -b
imm-lane/SLUG/TASK DIR/TASK BASE) for each provision handoff, offers it, and starts the
Executor command in each Lane. The Executor gets its task in its environment:

  LANES_ES_TASK_ID    the task id
  LANES_ES_LANE_PATH  the Lane (also its working directory)
  LANES_ES_INTENT     the task's TaskIntent JSON text
  LANES_ES_ROOT       the coordinator checkout
  LANES_ES_NEXT_OBLIGATION  what the task needs next (submit_assurance, run_review, ...)

and says it is done with `lanes-es task submit` in the Lane, as a person would. Its output
goes to DIR/.executor-logs/TASK.log. When an Executor exits the autopilot ticks again; a
Lane is removed (git worktree remove, never forced) only on a release handoff and only when
it is clean: a dirty Lane is kept and reported.

It stops on completed, needs_human, budget_stopped, failed, a rejected tick or a
coordinator handoff, and when nothing more can happen without you; the summary says what to
do next. Interrupted or killed, run the same command again: it goes on from the log.

Try it: lanes-es --root REPO run SLUG --max-parallel 3 --lanes-dir ../lanes \\
          --executor "python -m tools.example_executor"
"""

RUN_EPILOG = ("Exit codes: 0 completed, 3 stopped (needs_human, budget_stopped, failed, a coordinator handoff, "
              "no progress), 2 rejected or refused, 1 internal error, 130 interrupted.")


# ---------------------------------------------------------------- authorization


def authorization_needed(service: LanesService, slug: str) -> bool:
    """True when no authorization lets a tick run the Initiative's batch now.

    Valid: an authorization whose batch has not started yet, or is running, or is parked and
    was confirmed again after it parked. A terminal batch needs a new confirmation (a new
    batch), and so does a parked one that was not confirmed since.
    """
    initiative = service.initiative(slug)
    current = initiative.current if initiative else None
    if current is None:
        return True
    batch = service.store.batch(current.batch_id)
    if batch is None or batch.batch_state in ("prepared", "running"):
        return False
    if batch.batch_state == "needs_human":
        return current.confirmation_time <= batch.record["confirmation_time"]
    return True


def recorded_max_parallel(service: LanesService, slug: str) -> int | None:
    """The active lane batch's max_parallel, None when no batch is recorded or it is terminal."""
    batch = service.active_batch(slug)
    if batch is None or is_terminal(batch.batch_state):
        return None
    return int(batch.record["max_parallel"])


def facts_digest(facts: dict[str, Any]) -> str:
    """What a person confirmed, minus the freshly minted batch id: equal digests, equal facts."""
    seen = {key: value for key, value in facts.items() if key != "batch_id"}
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()


def confirmation_text(facts: dict[str, Any], *, with_delegation: bool = True) -> str:
    """The confirmation facts as a person reads them (upstream's gate message, lane form)."""
    verb = "Resume the parked" if facts["resumes_parked_batch"] else "Start the unattended"
    lines = [f"{verb} lane batch {facts['batch_id']} of Initiative {facts['initiative_slug']}?",
             f"Branch: {facts['branch']} from base {facts['base_head']}",
             f"Plan digest: {facts['plan_digest']}",
             f"Children ({len(facts['children'])}):"]
    for child in facts["children"]:
        after = f" after {', '.join(child['blocked_by'])}" if child["blocked_by"] else ""
        lines.append(f"  - {child['task_id']} ({child['slice_id']}){after}")
    if facts["excluded"]:
        lines.append(f"Excluded children ({len(facts['excluded'])}):")
        lines += [f"  - {c['task_id']} ({c.get('slice_id')}): {c.get('reason') or c.get('status')}"
                  for c in facts["excluded"]]
    budget, lane = facts["budget"], facts["lane_mode"]
    lines.append(f"Budget: max_children={budget['max_children']}, qa_failure_limit={budget['qa_failure_limit']}")
    lines.append(f"Lane mode: max_parallel={lane['max_parallel']}")
    if lane["parallel_groups"]:
        lines.append(f"Parallel groups ({len(lane['parallel_groups'])}):")
        lines += [f"  - {', '.join(group)}" for group in lane["parallel_groups"]]
    if lane["serialized"]:
        lines.append(f"Serialized by overlapping scope ({len(lane['serialized'])}):")
        lines += [f"  - {c['task_id']} after {', '.join(c['overlaps_with'])}" for c in lane["serialized"]]
    if lane.get("final_verification"):
        lines.append("Final verification: " + "; ".join(lane["final_verification"]))
    if with_delegation:
        lines += ["", REVISION_DELEGATION_TEXT]
    return "\n".join(lines)


def confirm_on_terminal(service: LanesService, slug: str, max_parallel: int, yes: bool, out: Out,
                        ask: Callable[[str], str] | None, *, final_verification: list[str] | None = None,
                        delegate_revisions: bool = False) -> Confirmation | None:
    """Show the facts and record the answer; None when the current authorization is valid."""
    if not authorization_needed(service, slug):
        return None
    confirmation = service.confirmation(slug, max_parallel=max_parallel, final_verification=final_verification,
                                        delegate_revisions=delegate_revisions)
    out(confirmation_text(confirmation.facts(), with_delegation=delegate_revisions))
    if not yes:
        if ask is None:
            raise ServiceError("confirmation_port_unavailable",
                               "no terminal to ask on; review the facts above and run again with --yes")
        if ask("Confirm this batch as the literal user? [y/N] ").strip().lower() not in ("y", "yes"):
            raise ServiceError("confirmation_declined", "nothing was recorded")
    service.authorize(confirmation)
    out(f"confirmed {confirmation.batch_id} (max_parallel {confirmation.max_parallel})")
    return confirmation


# ---------------------------------------------------------------- the steward: Lanes in git


class StewardRefusal(Exception):
    """The steward cannot make a task's Lane without a person; the message says what to do."""

    def __init__(self, task_id: str, message: str) -> None:
        super().__init__(message)
        self.task_id = task_id


@dataclass(frozen=True)
class Worktree:
    path: str  # real path
    head: str | None
    branch: str | None  # refs/heads/..., None when detached


def list_worktrees(root: str) -> dict[str, Worktree]:
    """Every worktree of the repository, by real path, from one `git worktree list --porcelain -z`."""
    fields = git(root, "worktree", "list", "--porcelain", "-z").stdout.decode("utf-8", "replace").split("\0")
    found: dict[str, Worktree] = {}
    block: dict[str, str] = {}
    for item in fields + [""]:
        if item:
            key, _, value = item.partition(" ")
            block[key] = value
            continue
        if "worktree" in block:
            path = os.path.realpath(block["worktree"])
            found[path] = Worktree(path=path, head=block.get("HEAD"), branch=block.get("branch"))
        block = {}
    return found


class Steward:
    """Makes and removes Lanes: the only code that runs `git worktree add` and `git worktree remove`."""

    def __init__(self, root: str, lanes_dir: Path) -> None:
        self.root = root
        self.lanes_dir = lanes_dir
        self._worktrees: dict[str, Worktree] | None = None

    def lane_path(self, task_id: str) -> Path:
        return self.lanes_dir / task_id

    def begin_round(self) -> None:
        """Forget the worktree list: one `git worktree list` serves every move of a round."""
        self._worktrees = None

    def worktrees(self) -> dict[str, Worktree]:
        if self._worktrees is None:
            self._worktrees = list_worktrees(self.root)
        return self._worktrees

    def _added(self, path: Path, lane_branch: str, head: str) -> None:
        real = os.path.realpath(path)
        self.worktrees()[real] = Worktree(path=real, head=head, branch=f"refs/heads/{lane_branch}")

    def provision(self, task_id: str, lane_branch: str, base_head: str) -> str:
        """The task's Lane on `lane_branch` at `base_head`, made or found; StewardRefusal otherwise.

        A Lane or branch left by an earlier run is reused: at `base_head` as it is, behind it
        (clean, never admitted) brought forward by fast-forward. Nothing is ever reset or deleted.
        """
        path = self.lane_path(task_id)
        ref = f"refs/heads/{lane_branch}"
        worktrees = self.worktrees()
        existing = worktrees.get(os.path.realpath(path))
        if existing is not None:
            if existing.branch != ref:
                shown = existing.branch.removeprefix("refs/heads/") if existing.branch else "a detached HEAD"
                raise StewardRefusal(task_id, f"{path} is a worktree on {shown}, not {lane_branch}; move it away "
                                              f"(or remove it by hand), then run again")
            self._bring_forward(task_id, str(path), existing.head or "", base_head)
            return str(path)
        if os.path.lexists(path):
            raise StewardRefusal(task_id, f"{path} exists and is not a worktree of this repository; move it away, "
                                          f"then run again")
        holder = next((w for w in worktrees.values() if w.branch == ref), None)
        if holder is not None:
            raise StewardRefusal(task_id, f"branch {lane_branch} is checked out at {holder.path}; offer that Lane "
                                          f"by hand (lanes-es tick --offer) or remove it, then run again")
        tip = git_ok(self.root, "rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
        self.lanes_dir.mkdir(parents=True, exist_ok=True)
        if tip.exit_code != 0:
            git(self.root, "worktree", "add", "-q", "-b", lane_branch, str(path), base_head)
            self._added(path, lane_branch, base_head)
            return str(path)
        self._check_forward(task_id, lane_branch, tip.text, base_head)
        git(self.root, "worktree", "add", "-q", str(path), lane_branch)
        self._added(path, lane_branch, tip.text)
        self._bring_forward(task_id, str(path), tip.text, base_head)
        return str(path)

    def _check_forward(self, task_id: str, lane_branch: str, head: str, base_head: str) -> None:
        if head == base_head:
            return
        if git_ok(self.root, "merge-base", "--is-ancestor", head, base_head).exit_code != 0:
            raise StewardRefusal(task_id, f"branch {lane_branch} is at {head[:12]}, which the batch head "
                                          f"{base_head[:12]} does not contain: it holds other work; inspect it, "
                                          f"rename or delete it by hand, then run again")

    def _bring_forward(self, task_id: str, path: str, head: str, base_head: str) -> None:
        """A clean Lane behind the batch head (the batch moved since it was made) is fast-forwarded."""
        if head == base_head:
            return
        self._check_forward(task_id, f"of {path}", head, base_head)
        status = git(path, "status", "--porcelain", "--untracked-files=all")
        if status.text:
            raise StewardRefusal(task_id, f"{path} is behind the batch head and not clean; commit nothing in a "
                                          f"Lane before it is admitted: move the changes away, then run again")
        git(path, "merge", "--ff-only", "-q", base_head)

    def release(self, path: str, lane_branch: str) -> str | None:
        """Remove a released Lane; None when removed (or already gone), else why it is kept.

        The tick offers a release only for a clean Lane, and the steward checks again: an
        Executor may have written since. `git worktree remove` runs without --force.
        """
        if not os.path.lexists(path):
            return None
        existing = self.worktrees().get(os.path.realpath(path))
        if existing is None:
            return "it is not a worktree of this repository any more"
        if existing.branch != f"refs/heads/{lane_branch}":
            return f"it is not on {lane_branch} any more"
        dirty = self.dirt(path)
        if dirty is not None:
            return dirty
        removed = git_ok(self.root, "worktree", "remove", path)
        if removed.exit_code != 0:
            return f"git worktree remove refused: {removed.error_text}"
        self.worktrees().pop(os.path.realpath(path), None)
        return None

    def dirt(self, path: str) -> str | None:
        """None for a clean Lane, else what makes it dirty (ignored files, like its kernel store, do not)."""
        status = git_ok(path, "status", "--porcelain", "--untracked-files=all")
        if status.exit_code != 0:
            return f"its status cannot be read: {status.error_text}"
        if not status.text:
            return None
        changed = status.text.splitlines()
        shown = ", ".join(line[3:] for line in changed[:3]) + (", ..." if len(changed) > 3 else "")
        return f"it is dirty ({len(changed)} changed path{'s' if len(changed) != 1 else ''}: {shown})"


# ---------------------------------------------------------------- Executors


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
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cwd = os.path.realpath(f"/proc/{pid}/cwd")
    except (OSError, IndexError):
        return False
    return state != "Z" and cwd == os.path.realpath(lane)


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

    def should_start(self, handoff: dict[str, Any]) -> bool:
        """Not while one runs; again only when the task moved since the last one started (no busy loop)."""
        task_id = handoff["task_id"]
        if task_id in self.running or self.adopt_survivor(handoff):
            return False
        last = self.finished.get(task_id)
        return last is None or last.record_revision != handoff["record_revision"]

    def start(self, handoff: dict[str, Any], intent_text: str) -> Running:
        task_id, lane = handoff["task_id"], handoff["lane_path"]
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        log = self.logs_dir / f"{task_id}.log"
        env = {**os.environ, **self.extra_env, "LANES_ES_TASK_ID": task_id, "LANES_ES_LANE_PATH": lane, "LANES_ES_INTENT": intent_text,
               "LANES_ES_ROOT": self.root, "LANES_ES_NEXT_OBLIGATION": handoff.get("next_obligation") or ""}
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
        self.pid_file(task_id).write_text(json.dumps({"pid": process.pid, "lane": lane}) + "\n")
        return running

    def pid_file(self, task_id: str) -> Path:
        return self.logs_dir / f"{task_id}.pid"

    def adopt_survivor(self, handoff: dict[str, Any]) -> bool:
        """An Executor an earlier, killed autopilot started is still working in this Lane: wait for it
        rather than start a second one beside it."""
        task_id = handoff["task_id"]
        try:
            recorded = json.loads(self.pid_file(task_id).read_text())
            pid, lane = int(recorded["pid"]), str(recorded["lane"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        if not _alive_in(pid, lane) or os.path.realpath(lane) != os.path.realpath(handoff["lane_path"]):
            self.pid_file(task_id).unlink(missing_ok=True)
            return False
        self.running[task_id] = Running(task_id, Survivor(pid, lane), self.clock(), handoff["record_revision"],
                                        self.logs_dir / f"{task_id}.log")
        return True

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


# ---------------------------------------------------------------- progress


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


# ---------------------------------------------------------------- the loop


@dataclass
class Autopilot:
    service: LanesService
    slug: str
    max_parallel: int
    steward: Steward
    executors: Executors
    progress: LineProgress | TerminalProgress
    poll: float = 1.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    since: dict[str, tuple[str, float]] = field(default_factory=dict)
    offered: dict[str, str] = field(default_factory=dict)  # task -> the base head its Lane was offered at
    refused: dict[str, tuple[str, str]] = field(default_factory=dict)  # task -> (reason, base head)
    released: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # task -> why its Lane was not removed
    steward_refusals: dict[str, str] = field(default_factory=dict)

    def run(self) -> int:
        offers: list[LaneOfferInput] = []
        idle = 0
        while True:
            result = self.tick(offers)
            report = result.report
            for line in result.drift:
                self.progress.note(f"drift repaired: {line}")
            self.note_refusals(report)
            self.show(report)
            if report["batch_state"] != "running":
                self.wait_for_all()
                self.steward.begin_round()
                self.release_lanes(report)
                return self.finish(report)
            if any(handoff["role"] == "coordinator" for handoff in report["handoffs"]):
                return self.finish(report, stopped_for="coordinator")
            self.steward.begin_round()
            released = self.release_lanes(report)
            offers = self.provision_lanes(report)
            self.start_executors(report)
            if offers or released:
                idle = 0
                continue
            if self.executors.running:
                self.wait_for_an_exit(report)
                idle = 0
                continue
            # Nothing to do and nobody working: one more tick may still move (a retried tracker
            # close, a leak restored); a second idle round means only a person can move it.
            idle += 1
            if idle >= 2:
                return self.finish(report, stopped_for="stuck")
            self.sleep(self.poll)

    # ------------------------------------------------------------ one tick

    def tick(self, offers: list[LaneOfferInput]) -> TickResult:
        for attempt in range(STORE_BUSY_RETRIES):
            try:
                return self.service.tick(self.slug, max_parallel=self.max_parallel, offers=offers)
            except StoreConflict as error:
                if attempt == STORE_BUSY_RETRIES - 1:
                    raise ServiceError("store_busy", f"{error}; is another `lanes-es run` or tick running on "
                                                     f"this batch? let it end, then run again") from None
                self.sleep(self.poll)
        raise AssertionError("unreachable")

    def note_refusals(self, report: dict[str, Any]) -> None:
        for refusal in report.get("lane_refusals", []):
            task_id = refusal["task_id"]
            self.refused[task_id] = (refusal["reason"], self.offered.get(task_id, ""))
            self.progress.note(f"offer of {refusal['path']} for {task_id} refused: {refusal['reason']}")

    # ------------------------------------------------------------ the steward's moves

    def release_lanes(self, report: dict[str, Any]) -> bool:
        lanes = {child["task_id"]: child["lane"] for child in report["children"] if child.get("lane")}
        released = False
        for handoff in report["handoffs"]:
            if handoff["role"] != "lane-steward" or handoff["action"] != "release":
                continue
            task_id = handoff["task_id"]
            lane = lanes.get(task_id)
            if lane is None or task_id in self.released or task_id in self.kept:
                continue
            if task_id in self.executors.running:
                continue  # its Executor is still exiting: the Lane goes on a later tick, never from under it
            why_kept = self.steward.release(lane["path"], handoff["lane_branch"])
            if why_kept is None:
                self.released.append(task_id)
                released = True
                self.progress.note(f"steward: released the Lane of {task_id} ({lane['path']})")
            else:
                self.kept[task_id] = f"{lane['path']}: {why_kept}"
                self.progress.note(f"steward: kept the Lane of {task_id}: {lane['path']}: {why_kept}")
        return released

    def provision_lanes(self, report: dict[str, Any]) -> list[LaneOfferInput]:
        offers: list[LaneOfferInput] = []
        for handoff in report["handoffs"]:
            if handoff["role"] != "lane-steward" or handoff["action"] != "provision":
                continue
            task_id, base_head = handoff["task_id"], handoff["base_head"]
            refused = self.refused.get(task_id)
            if refused is not None and refused[1] == base_head:
                continue  # offered at this head and refused: again would be refused the same way
            try:
                path = self.steward.provision(task_id, handoff["lane_branch"], base_head)
            except (StewardRefusal, GitFailure) as error:
                if self.steward_refusals.get(task_id) != str(error):
                    self.progress.note(f"steward: cannot make the Lane of {task_id}: {error}")
                self.steward_refusals[task_id] = str(error)
                continue
            self.steward_refusals.pop(task_id, None)
            self.refused.pop(task_id, None)  # a refusal of this offer comes back in the next report
            self.offered[task_id] = base_head
            offers.append(LaneOfferInput(task_id=task_id, path=path))
            self.progress.note(f"steward: offering {path} for {task_id} on {handoff['lane_branch']}")
        return offers

    def start_executors(self, report: dict[str, Any]) -> None:
        for handoff in report["handoffs"]:
            if handoff["role"] != "executor" or not self.executors.should_start(handoff):
                continue
            running = self.executors.start(handoff, self.intent_text(handoff))
            self.progress.note(f"executor: started for {handoff['task_id']} in {handoff['lane_path']} "
                               f"(pid {running.process.pid}, next: {handoff.get('next_obligation')})")

    def intent_text(self, handoff: dict[str, Any]) -> str:
        """The task's TaskIntent as its Lane holds it, at the path the plan recorded."""
        initiative = self.service.initiative(self.slug)
        children = initiative.current.children if initiative and initiative.current else []
        relative = next((c.intent_path for c in children if c.task_id == handoff["task_id"] and c.intent_path),
                        f"docs/plans/{handoff['task_id']}.intent.json")
        try:
            return (Path(handoff["lane_path"]) / relative).read_text(encoding="utf-8")
        except OSError as error:
            self.progress.note(f"executor: the intent of {handoff['task_id']} is unreadable in its Lane: {error}")
            return ""

    def wait_for_an_exit(self, report: dict[str, Any]) -> None:
        while True:
            finished = self.executors.reap()
            if finished:
                for done in finished:
                    self.progress.note(f"executor: {done.task_id} exited with {done.exit_code} after "
                                       f"{done.seconds:.1f}s (log {done.log})")
                return
            self.show(report)
            self.sleep(self.poll)

    def wait_for_all(self) -> None:
        if self.executors.running:
            names = ", ".join(sorted(self.executors.running))
            self.progress.note(f"waiting for the running Executors to exit: {names}")
        while self.executors.running:
            self.executors.reap()
            self.sleep(self.poll)

    # ------------------------------------------------------------ display

    def show(self, report: dict[str, Any]) -> None:
        now = self.clock()
        rows: list[Row] = []
        for child in report["children"]:
            task_id, state = child["task_id"], child["state"]
            note = self.note_of(task_id)
            key = f"{state}|{note}"
            if self.since.get(task_id, ("", 0.0))[0] != key:
                self.since[task_id] = (key, now)
            rows.append(Row(task_id, state, self.since[task_id][1], note))
        active = len(self.executors.running)
        header = f"{report['batch_state']}, {active} Executor{'s' if active != 1 else ''} working: batch {report['batch_id']}"
        self.progress.show(header, rows)

    def note_of(self, task_id: str) -> str:
        if task_id in self.executors.running:
            return f"Executor working (pid {self.executors.running[task_id].process.pid})"
        if task_id in self.kept:
            return "Lane kept"
        if task_id in self.steward_refusals:
            return "no Lane: see the steward's note"
        if task_id in self.refused:
            return f"offer refused: {self.refused[task_id][0]}"
        finished = self.executors.finished.get(task_id)
        if finished is not None and finished.exit_code != 0:
            return f"Executor exited {finished.exit_code}"
        return ""

    # ------------------------------------------------------------ the end

    def finish(self, report: dict[str, Any], stopped_for: str | None = None) -> int:
        self.wait_for_all()
        self.show(report)
        self.progress.close()
        state = report["batch_state"]
        lines = ["", f"batch {report['batch_id']}: {state}" + (f": {report['reason']}" if report.get("reason") else "")]
        for child in report["children"]:
            commit = f" {child['commit'][:12]}" if child.get("commit") else ""
            reason = f" ({child['reason']})" if child.get("reason") else ""
            lines.append(f"  {child['task_id']:<24} {child['state']}{commit}{reason}")
        lines.append(f"{len(report['commits'])} commit{'s' if len(report['commits']) != 1 else ''} on "
                     f"imm/{report['initiative_slug']}; {len(self.released)} Lane{'s' if len(self.released) != 1 else ''} "
                     f"released by the steward")
        lines += self.kept_lines(report)
        lines += self.waiting_lines(report, stopped_for)
        lines.append(f"next: {self.next_step(report, stopped_for)}")
        for line in lines:
            self.progress.note(line)
        if state == "completed":
            return EXIT_OK
        if state == "rejected":
            return EXIT_REJECTED
        return EXIT_STOPPED

    def kept_lines(self, report: dict[str, Any]) -> list[str]:
        lines = [f"kept the Lane of {task_id}: {why} (clean it, then `git worktree remove` it yourself)"
                 for task_id, why in self.kept.items()]
        if report["batch_state"] == "completed":
            for child in report["children"]:
                lane = child.get("lane")
                if (child["state"] == "integrated" and lane and child["task_id"] not in self.released
                        and child["task_id"] not in self.kept and os.path.lexists(lane["path"])):
                    why = self.steward.dirt(lane["path"]) or "the tick gave no release handoff for it"
                    lines.append(f"kept the Lane of {child['task_id']}: {lane['path']}: {why} (a Lane is released "
                                 f"only when clean: look with `git -C {lane['path']} status`, then remove it yourself)")
        return lines

    def waiting_lines(self, report: dict[str, Any], stopped_for: str | None) -> list[str]:
        lines: list[str] = []
        for task_id, why in self.steward_refusals.items():
            lines.append(f"no Lane for {task_id}: {why}")
        for task_id, (reason, _) in self.refused.items():
            if any(h.get("action") == "provision" and h["task_id"] == task_id for h in report["handoffs"]):
                lines.append(f"the Lane of {task_id} at {self.steward.lane_path(task_id)} was refused: {reason}")
        for handoff in report["handoffs"]:
            if handoff["role"] == "executor":
                finished = self.executors.finished.get(handoff["task_id"])
                how = (f"its Executor exited with {finished.exit_code} without moving it (log {finished.log})"
                       if finished else "no Executor ran")
                lines.append(f"{handoff['task_id']} waits for {handoff.get('next_obligation')} in "
                             f"{handoff['lane_path']}: {how}")
            elif handoff["role"] == "coordinator":
                lines.append(f"{handoff['task_id']} needs a design-level correction ({handoff['reason']}; "
                             f"{handoff['corrections_left']} left): read the findings in {handoff['lane_path']} "
                             f"(`lanes-es task status` there), then send one with "
                             f"`lanes-es tick {report['initiative_slug']} --instruction "
                             f"'{{\"task_id\": \"{handoff['task_id']}\", \"kind\": \"correction\", \"text\": \"...\", "
                             f"\"session_state\": \"idle\"}}'` and run again")
        return lines

    def next_step(self, report: dict[str, Any], stopped_for: str | None) -> str:
        if stopped_for == "coordinator":
            return "send the correction above, then run the same `lanes-es run` command again"
        if stopped_for == "stuck":
            return ("nothing more moves without you: settle what is listed above, then run the same "
                    "`lanes-es run` command again")
        return report.get("next_action") or ""


def run_autopilot(service: LanesService, slug: str, max_parallel: int, lanes_dir: str | os.PathLike[str],
                  executor_argv: list[str], yes: bool, out: Out = print, *, poll: float = 1.0,
                  live: bool | None = None, ask: Callable[[str], str] | None = None,
                  executor_env: Mapping[str, str] | None = None, final_verification: list[str] | None = None,
                  delegate_revisions: bool = False) -> int:
    """Run the Initiative's batch to the end; the exit code of `lanes-es run`.

    `out` receives every line. `live` redraws the progress in place (default: when `out` is
    `print` and stdout is a terminal). `ask` puts the confirmation question (default: `input`
    when stdin is a terminal; with neither, only `yes` can confirm). `executor_env` is added to
    every Executor's environment (the demo passes LANES_ES_EXECUTOR_HINT this way).
    """
    if not executor_argv:
        raise ServiceError("invalid_executor", "the Executor command is empty; pass --executor CMD")
    lanes = Path(lanes_dir).resolve()
    root = Path(service.root).resolve()
    if lanes == root or root in lanes.parents:
        raise ServiceError("invalid_lanes_dir", f"{lanes} is inside the coordinator checkout {root}; Lanes there make "
                                                f"it dirty: choose a directory outside it, for example {root.parent / 'lanes'}")
    if live is None:
        live = out is print and sys.stdout.isatty()
    if ask is None and sys.stdin.isatty():
        ask = input
    progress: LineProgress | TerminalProgress = TerminalProgress(sys.stdout) if live else LineProgress(out)
    autopilot = Autopilot(service=service, slug=slug, max_parallel=max_parallel, steward=Steward(service.root, lanes),
                          executors=Executors(list(executor_argv), service.root, lanes / EXECUTOR_LOGS,
                                              extra_env=executor_env),
                          progress=progress, poll=poll)
    try:
        confirm_on_terminal(service, slug, max_parallel, yes, progress.note, ask,
                            final_verification=final_verification, delegate_revisions=delegate_revisions)
        return autopilot.run()
    except ExecutorUnavailable as error:
        progress.note(f"lanes-es run: {error}")
        autopilot.wait_for_all()
        return EXIT_REJECTED
    except ServiceError as error:
        autopilot.wait_for_all()
        if error.code == "empty_enrollable_set":
            return nothing_to_run(service, slug, progress.note)
        progress.note(f"lanes-es run: {error}")
        return EXIT_REJECTED
    except KeyboardInterrupt:
        progress.close()
        working = ", ".join(f"{task} (pid {r.process.pid})" for task, r in autopilot.executors.running.items())
        out("lanes-es run: interrupted; the log and git keep every step already taken"
            + (f"; Executors still working: {working}" if working else "")
            + ". Run the same command again to go on.")
        return 130


def nothing_to_run(service: LanesService, slug: str, out: Out) -> int:
    """Every task is settled: 0 when the Initiative's last batch completed (running again is harmless)."""
    batch = service.active_batch(slug)
    if batch is not None and batch.batch_state == "completed":
        out(f"lanes-es run: nothing to run: batch {batch.id} of Initiative {slug} completed and no task is left; "
            f"add tasks to docs/initiatives/{slug}.md to run a new batch")
        return EXIT_OK
    out(f"lanes-es run: Initiative {slug} has no enrollable task; `lanes-es plan {slug}` shows why each is excluded")
    return EXIT_REJECTED


# ---------------------------------------------------------------- command line


def register(commands: Any) -> None:
    from tools.cli import positive_int

    command = commands.add_parser("run", help="the autopilot: run an Initiative's batch to the end",
                                  description=RUN_DESCRIPTION, epilog=RUN_EPILOG,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("slug", metavar="SLUG", help="the Initiative (docs/initiatives/SLUG.md)")
    command.add_argument("--max-parallel", type=positive_int, required=True, metavar="N", help="Lanes in flight at once")
    command.add_argument("--lanes-dir", required=True, metavar="DIR",
                         help="where Lanes are made, one per task as DIR/TASK (outside the coordinator checkout)")
    command.add_argument("--executor", required=True, metavar="CMD",
                         help="the Executor command, split into argv like a shell would but run without one")
    command.add_argument("--yes", action="store_true", help="confirm the batch without asking (you are the literal user)")
    command.add_argument("--final-verification", action="append", metavar="CMD", default=None,
                         help="with a new confirmation: a plain-argv command run on the batch branch before the "
                              "batch completes (1 to 8; repeatable)")
    command.add_argument("--delegate-revisions", action="store_true",
                         help="with a new confirmation: let the coordinator approve in-bounds breaking Intent "
                              "revisions in a Lane (ADR 0018)")
    command.add_argument("--poll", type=_seconds, default=1.0, metavar="SECONDS",
                         help="how often to look at the running Executors (default 1)")
    command.set_defaults(func=_run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number of seconds") from None
    if not 0 < value <= 60:
        raise argparse.ArgumentTypeError("expected more than 0 and at most 60 seconds")
    return value


def _run(args: argparse.Namespace) -> int:
    from tools.cli import service_of

    try:
        argv = shlex.split(args.executor)
    except ValueError as error:
        raise ServiceError("invalid_executor", f"the Executor command cannot be split: {error}") from None
    from lanes_es.domain.inputs import parse_final_verification

    final = parse_final_verification(args.final_verification) if args.final_verification else None
    return run_autopilot(service_of(args), args.slug, args.max_parallel, args.lanes_dir, argv, args.yes,
                         poll=args.poll, final_verification=final, delegate_revisions=args.delegate_revisions)


__all__ = ["run_autopilot", "authorization_needed", "recorded_max_parallel", "confirmation_text", "facts_digest",
           "REVISION_DELEGATION_TEXT", "Steward", "StewardRefusal", "Executors", "register"]
