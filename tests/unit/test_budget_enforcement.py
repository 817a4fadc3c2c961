"""How the autopilot applies the budgets' decisions: an attempt's spec carries what is left (a wall-clock budget
that binds makes its kill a budget stop), and the Initiative's budget, spent by what running attempts
reported, ends each of them once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from lanes_es.domain import events as ev
from lanes_es.domain import executor_budget as budget
from lanes_es.domain.executor_runs import Spent
from lanes_es.executors import agent_named
from lanes_es.executors.prompt import Assignment
from lanes_es.steward.executors import Executors, executor_bounds
from lanes_es.steward.loop import Autopilot

HANDOFF = {"task_id": "greet", "lane_path": "/lanes/greet", "record_revision": 3, "next_obligation": "submit_assurance"}


def test_an_attempt_bounded_by_a_wall_budget_is_killed_as_a_budget_stop_with_what_was_left(tmp_path: Path):
    executors = Executors(["/usr/bin/claude"], str(tmp_path), tmp_path / "logs", agent=agent_named("claude-code"))
    start = budget.decide_start(budget.with_values(None, {("lane", "wall"): 600, ("initiative", "cost"): 2.0}),
                                Spent(1, 480_000, 0, 0.0), Spent(1, 480_000, 0, 1.25), 3600)
    assignment = Assignment("greet", "/lanes/greet", "imm-lane/s/greet", {"goal": "Write greet"}, 2)
    launch = executors.prepare(HANDOFF, "{}", 2, assignment, start.limits, start.wall_detail)
    assert launch.limits == ev.AttemptLimits(timeout_seconds=120, cost_usd=0.75)
    assert (launch.spec.timeout_seconds, launch.spec.timeout_reason) == (120, "budget")
    assert launch.spec.timeout_detail == "the attempt reached the Lane's wall-time budget of 10m (2m were left when it started)"
    assert launch.spec.max_cost_usd == 0.75 and launch.recorded_argv[-2:] == ["--max-budget-usd", "0.75"]
    plain = executors.prepare(HANDOFF, "{}", 1, assignment, ev.AttemptLimits(timeout_seconds=60))
    assert (plain.spec.timeout_reason, plain.spec.timeout_detail) == ("timeout", "")
    assert "--max-budget-usd" not in plain.recorded_argv


def test_each_executor_is_held_only_to_what_it_reports():
    assert executor_bounds(None) == {"attempts"}
    assert executor_bounds(agent_named("codex")) == {"attempts", "wall", "tokens"}
    assert executor_bounds(agent_named("claude-code")) == executor_bounds(agent_named("opencode")) == set(budget.MEASURES)


def test_running_attempts_end_once_when_the_initiative_budget_is_spent():
    stopped, told = [], []
    running = {"greet": SimpleNamespace(attempt=1), "farewell": SimpleNamespace(attempt=2)}
    live = Spent(0, 10_000, 0, 0.30)
    autopilot = SimpleNamespace(
        attempts=SimpleNamespace(spent=Spent(2, 0, 0, 0.75)), budgets=budget.with_values(None, {("initiative", "cost"): 1.0}),
        executors=SimpleNamespace(running=running, live_spent=lambda: live,
                                  stop=lambda task, reason, detail: stopped.append((task, reason, detail))),
        ended_for_budget=set(), tell=lambda action, text, **facts: told.append(text))
    Autopilot.end_over_budget(autopilot)  # type: ignore[arg-type]
    assert [entry[:2] for entry in stopped] == [("farewell", "budget"), ("greet", "budget")]
    assert stopped[0][2] == "the attempt was ended: the Initiative's budget of $1.00 is spent ($1.05 used)"
    Autopilot.end_over_budget(autopilot)  # type: ignore[arg-type]
    assert len(stopped) == 2 and len(told) == 2  # asked once per attempt
    live = Spent(0, 10_000, 0, 0.10)
    autopilot.ended_for_budget.clear()
    Autopilot.end_over_budget(autopilot)  # type: ignore[arg-type]
    assert len(stopped) == 2  # $0.85 of $1.00: nothing ends


def test_the_end_of_an_attempt_that_is_submitting_is_waited_for_and_recorded_before_the_next_tick(tmp_path: Path):
    """A tick that integrates submitted work and settles the batch totals the attempts recorded by then: the
    attempt that submitted it must have its end recorded first (it exits within moments of its submit)."""
    import subprocess
    import sys

    from lanes_es.executors.attempt import submitting_marker
    from lanes_es.steward.executors import Running

    executors = Executors(["/usr/bin/claude"], str(tmp_path), tmp_path / "logs", agent=agent_named("claude-code"))
    (tmp_path / "logs").mkdir()
    finishing = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    working = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        executors.running["greet"] = Running("greet", finishing, 0.0, 3, tmp_path / "greet.log", attempt=2,
                                             adapter="claude-code")
        executors.running["farewell"] = Running("farewell", working, 0.0, 3, tmp_path / "farewell.log", attempt=1,
                                                adapter="claude-code")
        submitting_marker(executors.result_path("greet", 2)).touch()
        ended: list[list[str]] = []
        autopilot = SimpleNamespace(report={"batch_id": "b"}, executors=executors,
                                    tell_exits=lambda finished: ended.append([done.task_id for done in finished]))
        Autopilot.record_submitted_attempts(autopilot)  # type: ignore[arg-type]
        assert ended == [["greet"]]  # waited for, reaped and told; the one still working is not waited for
        assert list(executors.running) == ["farewell"]
        assert not submitting_marker(executors.result_path("greet", 2)).exists()
    finally:
        working.kill()
        working.wait()
