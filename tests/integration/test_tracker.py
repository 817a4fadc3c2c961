"""The tracker port on real repositories (issue 3): the CommandTracker adapter, configured with
LANES_ES_TRACKER_COMMAND, closes each integrated child's Issue once, after integration, retried
on later ticks (a completed batch included) without ever changing batch state; a Local
Initiative has none by default (LANE-TRK-01/03/05)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.engine import Engine, Task
from tests.engine_more import claim_path, enroll, make_engine, read_json, state_bytes

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")

CLOSED = "terminal Task Issue closure confirmed"
TRACKER = """\
import json, pathlib, sys
request = json.load(sys.stdin)
here = pathlib.Path(__file__).parent
with open(here / "calls.jsonl", "a") as calls:
    calls.write(json.dumps(request) + "\\n")
mode = (here / "mode").read_text().split() if (here / "mode").exists() else []
if "crash" in mode:
    print("tracker offline", file=sys.stderr)
    sys.exit(3)
if request["task_id"] in mode:
    print(json.dumps({"status": "retryable_failure", "message": "the remote is busy"}))
else:
    print(json.dumps({"status": "updated", "message": %r}))
""" % CLOSED


class Tracker:
    """A tracker command in tmp_path that records each request and answers as `mode` says."""

    def __init__(self, tmp_path: Path, monkeypatch: Any) -> None:
        self.directory = tmp_path / "tracker"
        self.directory.mkdir()
        (self.directory / "tracker.py").write_text(TRACKER)
        monkeypatch.setenv("LANES_ES_TRACKER_COMMAND", f"{sys.executable} {self.directory / 'tracker.py'}")

    def calls(self) -> list[dict[str, Any]]:
        path = self.directory / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def answer(self, *mode: str) -> None:
        (self.directory / "mode").write_text(" ".join(mode))


def terminal_event_id(engine: Engine, task_id: str) -> str:
    """The done proof the integration brought onto the batch branch, as the coordinator reads it."""
    [proof] = Path(engine.root, ".imm/audit", task_id).glob("*/terminal-proof.json")
    return read_json(proof)["terminal_event_id"]


def dependent_pair(tmp_path: Path) -> Engine:
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"], blocked_by=["task-a"])})
    engine.authorize()
    return engine


def test_an_issue_is_closed_once_after_integration(tmp_path, monkeypatch):  # LANE-TRK-01
    tracker = Tracker(tmp_path, monkeypatch)
    engine = dependent_pair(tmp_path)
    enroll(engine, "task-a")
    engine.submit("task-a")
    assert tracker.calls() == []  # nothing while the child is only enrolled in its Lane
    engine.deliver("task-a", "a.txt", "a\n", submit=False)
    report = engine.tick()
    assert report["children"][0]["state"] == "integrated" and report["children"][0]["tracker_closed"] is True
    assert report["tracker_observations"] == [{"task_id": "task-a", "status": "updated", "message": CLOSED}]
    event_id = terminal_event_id(engine, "task-a")
    assert event_id.startswith("complete:task-a:")
    assert tracker.calls() == [{"op": "mark-terminal", "task_id": "task-a", "phase": "done",
                                "terminal_event_id": event_id, "root": engine.root}]
    report = engine.tick()
    assert "tracker_observations" not in report
    assert len(tracker.calls()) == 1


def test_a_failed_close_is_retried_on_later_ticks_even_on_a_completed_batch(tmp_path, monkeypatch):
    # LANE-TRK-01 retry, LANE-TRK-05: only updated or already_current close; batch state never changes
    tracker = Tracker(tmp_path, monkeypatch)
    engine = dependent_pair(tmp_path)
    enroll(engine, "task-a")
    tracker.answer("task-a")
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    assert report["tracker_observations"] == [{"task_id": "task-a", "status": "retryable_failure",
                                               "message": "the remote is busy"}]
    assert "tracker_closed" not in report["children"][0]
    assert report["batch_state"] == "running" and engine.states() == ["integrated", "pending"]
    tracker.answer("crash")
    report = engine.tick(offers={"task-b": engine.provision("task-b", report)})
    [observation] = report["tracker_observations"]
    assert observation["status"] == "retryable_failure"
    assert observation["message"].startswith("tracker command exited 3 without a valid answer")
    assert engine.states() == ["integrated", "enrolled"]
    tracker.answer("task-b")
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert report["tracker_observations"] == [
        {"task_id": "task-a", "status": "updated", "message": CLOSED},
        {"task_id": "task-b", "status": "retryable_failure", "message": "the remote is busy"}]
    completed_report = engine.report_file().read_bytes()
    # the proof is missing from the coordinator checkout: reported, no call made
    calls = len(tracker.calls())
    removed = Path(engine.root, ".imm/audit/task-b")
    kept = tmp_path / "proof-aside"
    removed.rename(kept)
    report = engine.tick()
    assert report["tracker_observations"] == [{"task_id": "task-b", "status": "retryable_failure",
                                               "message": "integrated child has no done terminal proof on the "
                                                          "batch branch"}]
    assert len(tracker.calls()) == calls
    kept.rename(removed)
    tracker.answer()
    report = engine.tick()
    assert report["reason"] == "terminal state already reached: completed"
    assert report["tracker_observations"] == [{"task_id": "task-b", "status": "updated", "message": CLOSED}]
    assert engine.batch.batch_state == "completed"
    assert [c["tracker_closed"] for c in engine.batch.record["children"]] == [True, True]
    assert engine.report_file().read_bytes() == completed_report  # the terminal report is immutable
    closed = state_bytes(engine)
    report = engine.tick()
    assert "tracker_observations" not in report
    assert state_bytes(engine) == closed
    assert [call["task_id"] for call in tracker.calls()] == ["task-a"] * 3 + ["task-b"] * 2


def test_the_issue_of_a_lost_child_stays_open(tmp_path, monkeypatch):  # LANE-TRK-03
    tracker = Tracker(tmp_path, monkeypatch)
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"])})
    engine.authorize(max_parallel=2)
    enroll(engine, "task-a", "task-b")
    claim_path(engine, "task-a").unlink()
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert engine.states() == ["needs_human", "integrated"]
    assert report["children"][0]["reason"] == "batch_lane_lost"
    assert [call["task_id"] for call in tracker.calls()] == ["task-b"]


@pytest.mark.parametrize("configured", [None, ""])
def test_a_local_initiative_has_no_tracker_by_default(tmp_path, monkeypatch, configured):  # LANE-TRK-05
    if configured is None:
        monkeypatch.delenv("LANES_ES_TRACKER_COMMAND", raising=False)
    else:
        monkeypatch.setenv("LANES_ES_TRACKER_COMMAND", configured)
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    assert engine.deps.adapters.tick_ports(engine.root, engine.slug).tracker is None
    enroll(engine, "task-a")
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert "tracker_observations" not in report and "tracker_closed" not in report["children"][0]
