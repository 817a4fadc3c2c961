"""The Executor attempts in a batch's log: numbered, one at a time per task, audit only (the v2 record and
the written report keep upstream's shape), folded back the same from the log, and added up per task in
the report's extras of the log; corrections are handed to the next attempt once."""

from __future__ import annotations

import msgspec
import pytest

from lanes_es.domain import events as ev
from lanes_es.domain.aggregate import TransitionRefused
from lanes_es.domain.batch import LaneBatch
from lanes_es.projections.batch import fold_documents, documents_of
from tests.unit.audit_logs import at, deliver, lane, prepared

USAGE = ev.ExecutorUsage(session_id="s-1", tokens_in=1000, tokens_out=200, cost_usd=0.1, denied_tools=["WebFetch"],
                         agent_error=False)


def started(batch: LaneBatch, task: str, attempt: int, tick: int) -> None:
    batch.start_executor_run(at(tick), task, attempt, "claude-code", ["claude", "-p", "<prompt sha256:ab>"],
                             "first_delivery" if attempt == 1 else "rework", "sha256:ab",
                             ev.AttemptLimits(timeout_seconds=600, cost_usd=2.0))


def running_batch() -> LaneBatch:
    batch = prepared(["task-a", "task-b"])
    batch.start(at(0))
    batch.admit_lane(at(1), "task-a", lane("task-a"))
    batch.enroll(at(2), "task-a", "run-task-a")
    return batch


def test_attempts_are_numbered_one_at_a_time_and_leave_the_record_as_it_was():
    batch = running_batch()
    record = msgspec.json.encode(batch.record)
    started(batch, "task-a", 1, 3)
    with pytest.raises(TransitionRefused, match="has not ended"):
        started(batch, "task-a", 2, 3)
    batch.finish_executor_run(at(4), "task-a", 1, 0, 61_000, True, USAGE)
    with pytest.raises(TransitionRefused, match="no Executor attempt 1 under way"):
        batch.kill_executor_run(at(4), "task-a", 1, "timeout", "late", 1, ev.ExecutorUsage())
    with pytest.raises(TransitionRefused, match="is number 2, not 3"):
        started(batch, "task-a", 3, 5)
    with pytest.raises(TransitionRefused, match="no child task-z"):
        started(batch, "task-z", 1, 5)
    started(batch, "task-a", 2, 5)
    batch.kill_executor_run(at(6), "task-a", 2, "budget", "the Lane's cost budget is spent", 5_000, USAGE)
    assert msgspec.json.encode(batch.record) == record  # audit only: the v2 record does not move
    runs = batch.executor_runs
    assert [attempt.started.attempt for attempt in runs.of("task-a")] == [1, 2]
    assert runs.spent("task-a").attempts == 2 and runs.spent("task-a").tokens == 2400
    assert runs.spent("task-a").duration_ms == 66_000 and runs.spent("task-a").cost_usd == pytest.approx(0.2)
    assert runs.spent_in_all() == runs.spent("task-a") and runs.next_attempt("task-b") == 1


def test_a_correction_goes_to_the_next_attempt_once():
    batch = running_batch()
    started(batch, "task-a", 1, 3)
    batch.finish_executor_run(at(4), "task-a", 1, 0, 1_000, True, USAGE)
    batch.count_qa_failure(at(5), "task-a", 1, "QA failure limit reached")
    batch.record_intervention(at(6), "task-a", "correction", "Keep greet() pure.")
    assert batch.executor_runs.undelivered["task-a"] == [("correction", "Keep greet() pure.")]
    started(batch, "task-a", 2, 7)
    assert "task-a" not in batch.executor_runs.undelivered


def test_the_log_folds_back_to_the_same_attempts_and_the_totals_land_in_the_reports_extras_only():
    batch = running_batch()
    started(batch, "task-a", 1, 3)
    batch.finish_executor_run(at(4), "task-a", 1, 0, 1_500, True, USAGE)
    batch.settle(at(5), "task-a")
    batch.commit_lane(at(5), "task-a", "a" * 40)
    batch.integrate(at(5), "task-a", "b" * 40)
    deliver(batch, "task-b", 10)
    started(batch, "task-b", 1, 20)
    batch.kill_executor_run(at(21), "task-b", 1, "lost", "its process ended with the autopilot", None,
                            ev.ExecutorUsage())
    batch.settle_batch(at(30), "completed", "all enrollable children integrated", "")
    settled = batch.pending_events[-1]
    assert settled.extras.executor_totals == [
        ev.ExecutorTotal(task_id="task-a", attempts=1, killed=0, duration_ms=1_500, tokens_in=1000, tokens_out=200,
                         cost_usd=0.1),
        ev.ExecutorTotal(task_id="task-b", attempts=1, killed=1, duration_ms=0)]
    assert "executor_totals" not in batch.report  # the written report keeps upstream's shape
    events = list(batch.pending_events)
    replayed = events[0].mutate(None)
    for event in events[1:]:
        replayed = event.mutate(replayed)
    assert replayed.executor_runs.totals() == settled.extras.executor_totals
    folded = fold_documents(iter(events))
    assert folded.record_bytes() == documents_of(batch).record_bytes()
    assert folded.report_bytes() == documents_of(batch).report_bytes()


def test_a_batch_without_attempts_settles_as_before():
    batch = prepared(["task-a"])
    batch.start(at(0))
    deliver(batch, "task-a", 10)
    batch.settle_batch(at(20), "completed", "all enrollable children integrated", "")
    stored = msgspec.json.encode(batch.pending_events[-1])
    assert b"executor_totals" not in stored  # logs without attempts are byte for byte what they were
