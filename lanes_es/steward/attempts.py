"""The autopilot's Executor attempts in the batch's log: each recorded before it starts and when it ends.

- `start`: the attempt's number follows the task's last one in the log; an attempt that would start
  over the Lane's or the Initiative's budget does not start (lanes_es/domain/executor_budget.py:
  the budget that is spent is returned), else it is given what is left of them as its limits; for a
  named agent its assignment is read (the intent, the Lane's latest QA findings, the corrections
  recorded since its last attempt); ExecutorRunStarted is recorded, then the process starts. A batch
  that is busy (another tick holds its lock) starts nothing this round.
- `exhaust`: a task whose budget is spent: ExecutorBudgetExhausted, once.
- `end`: ExecutorRunFinished, or ExecutorRunKilled with why, from the attempt's result file (the attempts
  that ended since the last round in one save).
- `settle_open`: an attempt the log holds as under way with no process of this autopilot on it (the
  autopilot that started it was killed) is recorded from the result file it left, or as lost.
An end that cannot be recorded now (a busy batch) is kept and recorded on a later round.
"""

from __future__ import annotations

import shlex
from typing import Any, Callable

from lanes_es.adapters.store import StoreConflict, StoreOutage
from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.remote_attempts import record_remote_notes
from lanes_es.domain.executor_budget import Exhausted, decide_start
from lanes_es.domain.executor_runs import Spent
from lanes_es.executors.attempt import AttemptResult
from lanes_es.executors.prompt import Assignment
from lanes_es.steward.executors import Executors, ExecutorUnavailable, Finished, Running, lanes_es_command

Record = Callable[[str, Callable[[LaneBatch, str], None]], LaneBatch]
Load = Callable[[str], "LaneBatch | None"]
LOST = "lost"


class AttemptLog:
    def __init__(self, executors: Executors, record: Record, load: Load,
                 anchor: Callable[[str], Any] | None = None) -> None:
        self.executors = executors
        self._record_port = record
        self.load = load
        # The checkpoint of what this log recorded: brought up by the next tick (it anchors the whole log, two
        # git spawns for every fact since), or by `anchor_recorded` when the run ends with no tick after.
        self.anchor = anchor
        self.unanchored: set[str] = set()
        self.unrecorded: list[tuple[str, str, int, AttemptResult | None]] = []  # (batch, task, attempt, result)
        self.remote_notes: list[Any] = []  # attempts on Ray nodes: what their runners noted, not recorded yet
        self.spent = Spent()  # what the batch's attempts spent, as the log held it when last read or written

    def record(self, batch_id: str, change: Callable[[LaneBatch, str], None]) -> LaneBatch:
        batch = self._record_port(batch_id, change)
        self.unanchored.add(batch_id)
        return batch

    def anchor_recorded(self) -> None:
        """Bring the checkpoint of each batch this log recorded in up to its log (nothing to do, no git spawn,
        when a tick did since)."""
        for batch_id in sorted(self.unanchored):
            if self.anchor is not None:
                self.anchor(batch_id)
        self.unanchored.clear()

    def start(self, batch_id: str, handoff: dict[str, Any], intent_text: str,
              budgets: ev.ExecutorBudgets | None = None, live: Spent = Spent()) -> Running | Exhausted | None:
        """Record the attempt, then start it; the budget that is spent when it would start over one (nothing
        started); None when the batch is busy or the store out (nothing started, nothing written: a later round
        starts it). `live`: what the attempts running now spent beyond what the log holds."""
        batch = self.read(batch_id)
        if batch is None:
            return None
        task_id = handoff["task_id"]
        runs = batch.executor_runs
        decision = decide_start(budgets, runs.spent(task_id), runs.spent_in_all() + live,
                                self.executors.attempt_seconds)
        if isinstance(decision, Exhausted):
            return decision
        attempt = runs.next_attempt(task_id)
        assignment = assignment_for(handoff, batch, intent_text, attempt) if self.executors.agent else None
        launch = self.executors.prepare(handoff, intent_text, attempt, assignment, decision.limits,
                                        decision.wall_detail)
        try:
            batch = self.record(batch_id, lambda live, now: live.start_executor_run(
                now, task_id, attempt, launch.adapter, launch.recorded_argv, launch.obligation,
                launch.prompt_sha256, launch.limits))
        except (StoreConflict, StoreOutage):
            return None
        self.spent = batch.executor_runs.spent_in_all()
        try:
            return self.executors.launch(launch)
        except ExecutorUnavailable as error:
            self.write_down(batch_id, task_id, attempt, AttemptResult(
                exit_code=127, duration_ms=0, usage=ev.ExecutorUsage(agent_error=None, error=str(error)[:500])))
            raise

    def over_budget(self, batch_id: str, task_id: str, budgets: ev.ExecutorBudgets | None,
                    live: Spent = Spent()) -> Exhausted | None:
        """The budget that keeps the task's next attempt from starting, None when it could start (or the batch
        cannot be read now)."""
        batch = self.read(batch_id)
        if batch is None:
            return None
        runs = batch.executor_runs
        decision = decide_start(budgets, runs.spent(task_id), runs.spent_in_all() + live,
                                self.executors.attempt_seconds)
        return decision if isinstance(decision, Exhausted) else None

    def read(self, batch_id: str) -> LaneBatch | None:
        try:
            batch = self.load(batch_id)
        except StoreOutage:
            return None
        if batch is not None:
            self.spent = batch.executor_runs.spent_in_all()
        return batch

    def exhaust(self, batch_id: str, task_id: str, spent: Exhausted, detail: str) -> bool:
        """Record that `task_id` is stopped for `spent` (once: a task recorded already is left); False when the
        batch is busy or the store out (a later round tries again)."""
        def change(live: LaneBatch, now: str) -> None:
            if task_id not in live.executor_runs.exhausted:
                live.exhaust_executor_budget(now, task_id, spent.scope, spent.measure, spent.limit, spent.spent,
                                             detail)
        try:
            self.record(batch_id, change)
        except (StoreConflict, StoreOutage):
            return False
        return True

    def end(self, batch_id: str, finished: list[Finished]) -> None:
        """The ends of the attempts that exited since the last round, recorded together (one save and one
        checkpoint, two git spawns, for all: Executors that wait for each other exit at once, just before
        the tick that takes their work). An attempt on a Ray node has its dispatch, and its end or loss
        there, recorded before."""
        self.note_remote(batch_id, [note for done in finished for note in done.notes])
        for done in finished:
            if done.attempt >= 1:
                self.unrecorded.append((batch_id, done.task_id, done.attempt, done.result))
        self.flush()

    def note_remote(self, batch_id: str, notes: list[Any]) -> None:
        """What the runners of attempts on Ray nodes noted (dispatched, ended, lost), recorded in their order after
        any a busy batch or an outage kept back."""
        self.remote_notes += notes
        if not self.remote_notes:
            return
        kept = list(self.remote_notes)
        try:
            self.record(batch_id, lambda live, now: record_remote_notes(live, now, kept))
        except (StoreConflict, StoreOutage):
            return  # kept for a later round
        del self.remote_notes[:len(kept)]

    def write_down(self, batch_id: str, task_id: str, attempt: int, result: AttemptResult | None) -> None:
        self.unrecorded.append((batch_id, task_id, attempt, result))
        self.flush()

    def flush(self) -> None:
        """Record every end not yet recorded, in order, the ends of one batch in one save; a busy batch or a store
        outage keeps the rest for a later round."""
        while self.unrecorded:
            batch_id = self.unrecorded[0][0]
            count = next((index for index, pending in enumerate(self.unrecorded) if pending[0] != batch_id),
                         len(self.unrecorded))
            ends = self.unrecorded[:count]

            def change(live: LaneBatch, now: str) -> None:
                for _, task_id, attempt, result in ends:
                    record_end(live, now, task_id, attempt, result)
            try:
                batch = self.record(batch_id, change)
            except (StoreConflict, StoreOutage):
                return
            self.spent = batch.executor_runs.spent_in_all()
            del self.unrecorded[:count]

    def settle_open(self, batch_id: str) -> list[str]:
        """Attempts the log holds as under way that no process of this autopilot works on: recorded from their
        result files, or as lost. The tasks whose attempt was settled so."""
        batch = self.load(batch_id)
        if batch is None:
            return []
        self.settle_remote(batch_id, batch)
        settled = []
        for task_id in list(batch.executor_runs.attempts):
            open_attempt = batch.executor_runs.open_attempt(task_id)
            if open_attempt is None or task_id in self.executors.running:
                continue
            number = open_attempt.started.attempt
            if any(pending[1:3] == (task_id, number) for pending in self.unrecorded):
                continue
            self.write_down(batch_id, task_id, number, self.executors.read_result(task_id, number))
            settled.append(task_id)
        return settled

    def settle_remote(self, batch_id: str, batch: LaneBatch) -> None:
        """Executor attempts an earlier autopilot sent to Ray nodes and never saw end (the log holds their dispatch
        only): each cancelled on its node when it still runs (its agent stopped), collected when it ended, lost
        when its node no longer knows it; recorded. A cluster that cannot be reached leaves them open for a later
        run."""
        from lanes_es.adapters.ray_cluster import RayUnavailable
        from lanes_es.adapters.ray_runner import settle

        ours = {note.attempt_id for note in self.remote_notes}
        left = {attempt_id: sent for attempt_id, sent in batch.remote_attempts.open_of("executor").items()
                if attempt_id not in ours}
        if not left or self.executors.remote is None:
            return
        try:
            notes = settle(self.executors.remote(lambda note: None), left)
        except (RayUnavailable, ConnectionError, OSError):  # the cluster cannot be reached now: a later run
            return
        self.note_remote(batch_id, notes)


def record_end(batch: LaneBatch, now: str, task_id: str, attempt: int, result: AttemptResult | None) -> None:
    open_attempt = batch.executor_runs.open_attempt(task_id)
    if open_attempt is None or open_attempt.started.attempt != attempt:
        return  # recorded already (by another round, or another autopilot)
    if result is None:
        batch.kill_executor_run(now, task_id, attempt, LOST, "the attempt's process ended with the autopilot that "
                                "started it, or left no result", None, ev.ExecutorUsage())
    elif result.killed is not None:
        batch.kill_executor_run(now, task_id, attempt, result.killed, result.detail, result.duration_ms, result.usage)
    else:
        batch.finish_executor_run(now, task_id, attempt, result.exit_code, result.duration_ms, result.submitted,
                                  result.usage)


def assignment_for(handoff: dict[str, Any], batch: LaneBatch, intent_text: str, attempt: int) -> Assignment:
    """What the agent is asked for: the intent as its Lane holds it, the Lane's latest QA findings (with their
    output tails), and the corrections and instructions recorded since the task's last attempt."""
    import json

    task_id, lane = handoff["task_id"], handoff["lane_path"]
    try:
        intent = json.loads(intent_text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes: no intent to show
        intent = {}
    return Assignment(task_id=task_id, lane=lane, branch=handoff.get("lane_branch") or "", attempt=attempt,
                      intent=intent if isinstance(intent, dict) else {}, findings=latest_findings(lane, task_id),
                      interventions=list(batch.executor_runs.undelivered.get(task_id, [])),
                      lanes_es=shlex.join(lanes_es_command()))


def latest_findings(lane: str, task_id: str) -> list[tuple[str, str]]:
    """The findings of the Lane's latest QA when it failed (none when the Lane's task cannot be read)."""
    from lanes_es.adapters.kernel import ReferenceKernel
    from lanes_es.ports import KernelError

    try:
        status = ReferenceKernel().status(lane, task_id)
    except (KernelError, OSError):
        return []
    return [(finding.id, finding.reason) for finding in status.findings]


def ended_text(done: Finished) -> str:
    """How an attempt ended, as the autopilot's line says it: `exited with 0 after 12.3s (attempt 2): ...`."""
    result = done.result
    which = f" (attempt {done.attempt})" if done.attempt else ""
    if result is None:
        return f"exited with {done.exit_code} after {done.seconds:.1f}s{which}"
    if result.killed is not None:
        said = f"was killed after {result.duration_ms / 1000:.1f}s{which}: {result.killed}: {result.detail}"
    else:
        code = "an unknown status" if result.exit_code is None else result.exit_code
        said = f"exited with {code} after {result.duration_ms / 1000:.1f}s{which}"
    usage = result.usage
    facts = []
    if usage.tokens_in is not None or usage.tokens_out is not None:
        facts.append(f"{usage.tokens_in or 0} tokens in, {usage.tokens_out or 0} out")
    if usage.cost_usd is not None:
        facts.append(f"${usage.cost_usd:.4f}")
    if usage.denied_tools:
        facts.append(f"{len(usage.denied_tools)} tool call{'s' if len(usage.denied_tools) != 1 else ''} denied")
    if usage.agent_error:
        facts.append(f"agent error: {usage.error}")
    if result.submitted is not None:
        facts.append("submitted" if result.submitted else "not submitted")
    return said + (f"; {', '.join(facts)}" if facts else "")
