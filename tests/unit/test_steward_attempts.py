"""The autopilot's attempt log: the ends of attempts that exited together are recorded in one save."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lanes_es.adapters.store import StoreConflict
from lanes_es.executors.attempt import AttemptResult
from lanes_es.steward.attempts import AttemptLog
from lanes_es.steward.executors import Finished


class FakeBatch:
    """Open attempt 1 of every task; what was recorded as finished."""

    def __init__(self) -> None:
        self.finished: list[tuple[str, int]] = []
        self.executor_runs = SimpleNamespace(open_attempt=lambda task_id: SimpleNamespace(
            started=SimpleNamespace(attempt=1)) if task_id not in {t for t, _ in self.finished} else None,
            spent_in_all=lambda: None)

    def finish_executor_run(self, now: str, task_id: str, attempt: int, *rest: Any) -> None:
        self.finished.append((task_id, attempt))


def finished(task_id: str) -> Finished:
    return Finished(task_id, 0, 1.0, 3, Path("log"), attempt=1, result=AttemptResult(exit_code=0, duration_ms=1000))


def test_the_ends_of_executors_that_exited_together_are_one_save():
    batch, saves = FakeBatch(), []

    def record(batch_id: str, change: Any) -> FakeBatch:
        saves.append(batch_id)
        change(batch, "now")
        return batch
    log = AttemptLog(executors=None, record=record, load=lambda batch_id: batch)  # type: ignore[arg-type]
    log.end("b1", [finished(f"t{index}") for index in range(8)])
    assert saves == ["b1"]
    assert batch.finished == [(f"t{index}", 1) for index in range(8)]


def test_ends_a_busy_batch_kept_are_recorded_together_on_the_next_round():
    batch, saves, busy = FakeBatch(), [], [True]

    def record(batch_id: str, change: Any) -> FakeBatch:
        if busy[0]:
            raise StoreConflict("busy")
        saves.append(batch_id)
        change(batch, "now")
        return batch
    log = AttemptLog(executors=None, record=record, load=lambda batch_id: batch)  # type: ignore[arg-type]
    log.end("b1", [finished("t0")])
    log.end("b1", [finished("t1"), finished("t2")])
    assert saves == [] and len(log.unrecorded) == 3
    busy[0] = False
    log.flush()
    assert saves == ["b1"] and batch.finished == [("t0", 1), ("t1", 1), ("t2", 1)] and not log.unrecorded



def test_what_the_log_recorded_is_anchored_once_at_the_end_not_after_each_save():
    batch, anchored = FakeBatch(), []
    log = AttemptLog(executors=None, record=lambda batch_id, change: (change(batch, "now"), batch)[1],  # type: ignore[arg-type]
                     load=lambda batch_id: batch, anchor=anchored.append)
    log.end("b1", [finished("t0")])
    log.end("b1", [finished("t1")])
    assert anchored == []  # the next tick anchors the whole log
    log.anchor_recorded()
    log.anchor_recorded()
    assert anchored == ["b1"]
