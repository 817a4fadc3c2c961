"""QA of several Lanes in one tick runs at once, and the log records the verdicts in record order."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from lanes_es.ports import AdvanceResult
from tests.unit.fakes import FakeKernel, Harness, plan_children

TASKS = ["task-a", "task-b", "task-c"]


class RendezvousKernel(FakeKernel):
    """advance_task returns only once every Lane's QA has started (a barrier), and in reverse record order."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=20)
        self.finished: list[str] = []
        self.turn = {task_id: threading.Event() for task_id in TASKS}
        self.turn[TASKS[-1]].set()
        self.lock = threading.Lock()

    def advance_task(self, lane_path: str, task_id: str) -> AdvanceResult:
        self.barrier.wait()  # a BrokenBarrierError here means the QA ran one Lane at a time
        assert self.turn[task_id].wait(20)
        with self.lock:
            result = super().advance_task(lane_path, task_id)
            self.finished.append(task_id)
        index = TASKS.index(task_id)
        if index:
            self.turn[TASKS[index - 1]].set()  # the Lane before it in record order finishes after it
        return result


def three_frozen(kernel: FakeKernel, max_parallel: int = 3) -> Harness:
    harness = Harness(plan_children(*((task_id, []) for task_id in TASKS)), max_parallel=max_parallel, kernel=kernel)
    harness.batch_git.scopes = {task_id: [f"{task_id}.txt"] for task_id in TASKS}
    harness.tick()
    harness.tick([(task_id, harness.lane_git.add_lane(task_id)) for task_id in TASKS])
    assert harness.states() == ["enrolled"] * 3
    kernel.frozen |= set(TASKS)
    return harness


def tick_recording(harness: Harness) -> list[tuple[str, str]]:
    from lanes_es.tick import run_lane_batch
    from lanes_es.tick_input import TickInput
    from tests.unit.fakes import NOW, SLUG

    events: list[tuple[str, str]] = []

    def persist(batch: Any) -> None:
        events.extend((type(event).__name__, getattr(event, "task_id", "")) for event in batch.collect_events())

    tick = TickInput(root="/coordinator", initiative_slug=SLUG, authorization=harness.authorization(), now=NOW)
    harness.batch = run_lane_batch(tick, harness.batch, harness.ports(), persist).batch
    return events


def test_the_qa_of_three_lanes_runs_at_once_and_is_recorded_in_record_order():
    kernel = RendezvousKernel(parties=3)
    harness = three_frozen(kernel)
    events = tick_recording(harness)
    assert kernel.finished == ["task-c", "task-b", "task-a"]  # the QA finished in reverse order ...
    settled = [task_id for name, task_id in events if name == "Settled"]
    assert settled == TASKS  # ... and the log still holds the verdicts in record order
    assert harness.states() == ["integrated"] * 3


def test_the_log_of_a_tick_is_the_same_whatever_order_the_qa_finished_in():
    concurrent = RendezvousKernel(parties=3)
    harness = three_frozen(concurrent)
    in_parallel = tick_recording(harness)
    sequential = three_frozen(FakeKernel())
    sequential.kernel.frozen |= set(TASKS)
    assert tick_recording(sequential) == in_parallel


def test_qa_workers_are_bounded_by_max_parallel():
    """With max_parallel 2, three Lanes' QA can never all be running together: a barrier of three breaks."""
    kernel = RendezvousKernel(parties=3)
    kernel.barrier = threading.Barrier(3, timeout=2)
    harness = Harness(plan_children(*((task_id, []) for task_id in TASKS)), max_parallel=2, kernel=kernel)
    harness.batch_git.scopes = {task_id: [f"{task_id}.txt"] for task_id in TASKS}
    harness.tick()
    harness.tick([(task_id, harness.lane_git.add_lane(task_id)) for task_id in TASKS[:2]])
    kernel.frozen |= set(TASKS[:2])
    with pytest.raises(threading.BrokenBarrierError):
        tick_recording(harness)
