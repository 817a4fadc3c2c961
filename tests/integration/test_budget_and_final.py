"""The child budget and the final verification on real repositories (issue 3): max_children
stops new admissions only, budget_stopped and "no child can start" (LANE-BUD-02/03); 1 to 8
plain-argv commands recorded at authorize and run on the batch branch before `completed`, a
failure reported and nothing rolled back (LANE-CMP-02)."""

from __future__ import annotations

import json
from pathlib import Path

from lanes_es.domain.report import LANE_NEEDS_HUMAN_NEXT_ACTION, NEXT_FINAL_VERIFICATION_FAILED, TERMINAL_NEXT_ACTIONS
from lanes_es.tick import TickContext
from tests.engine import Engine, Task
from tests.engine_more import claim_path, confirm_again, enroll, make_engine, state_bytes
from tests.gitfixtures import git_out, run_git
import pytest
from lanes_es.usecases.authorize import authorize
from lanes_es.usecases.confirmation import prepare_confirmation
from lanes_es.usecases.load import initiative

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = [pytest.mark.usefixtures("store_url"), pytest.mark.coordinator_worktree]


def three_disjoint(tmp_path: Path) -> Engine:
    return make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"]), "task-c": Task(["c.txt"])})


def test_max_children_stops_new_admissions_only_then_the_batch_settles_budget_stopped(tmp_path):  # LANE-BUD-02
    engine = three_disjoint(tmp_path)
    engine.authorize(max_parallel=3, max_children=2)
    report = engine.tick()
    assert [h["task_id"] for h in report["handoffs"]] == ["task-a", "task-b", "task-c"]
    lanes = {task_id: engine.provision(task_id, report) for task_id in ("task-a", "task-b", "task-c")}
    report = engine.tick(offers=lanes)
    assert engine.states() == ["enrolled", "enrolled", "pending"]
    assert "lane_refusals" not in report  # not refused: the budget stops admitting
    assert not claim_path(engine, "task-c").exists()
    assert not any(h.get("action") == "provision" for h in report["handoffs"])
    # the Lanes already in flight still finish
    engine.deliver("task-a", "a.txt", "a\n")
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert engine.states() == ["integrated", "integrated", "pending"]
    assert report["batch_state"] == "budget_stopped"
    assert report["reason"] == "max_children budget exhausted (2)"
    assert report["next_action"] == TERMINAL_NEXT_ACTIONS["budget_stopped"]
    assert report["children"][2]["lane"] is None
    assert report["handoffs"] == []  # upstream's idle settle carries no handoff, release included
    assert json.loads(engine.report_file().read_text())["batch_state"] == "budget_stopped"
    # re-confirmed, a new batch takes the child the budget left, from the stopped batch's head
    stopped = engine.batch
    confirmation = prepare_confirmation(engine.deps, engine.slug)
    assert confirmation.batch_id != stopped.id and [c.task_id for c in confirmation.children] == ["task-c"]
    assert confirmation.base_head == engine.head() == stopped.record["commits"][-1]
    authorize(engine.deps, confirmation)
    report = engine.tick()
    # the Lane the budget left unclaimed is still at the old base: refused, then brought up by the steward
    refused = engine.tick(offers={"task-c": lanes["task-c"]})
    assert refused["lane_refusals"][0]["reason"] == "batch_lane_base_mismatch"
    run_git(lanes["task-c"], "merge", "-q", "--ff-only", report["handoffs"][0]["base_head"])
    engine.tick(offers={"task-c": lanes["task-c"]})
    engine.deliver("task-c", "c.txt", "c\n")
    assert engine.tick()["batch_state"] == "completed"
    assert len(engine.subjects(stopped.record["base_head"])) == 3


def test_over_budget_with_a_parked_child_settles_needs_human(tmp_path):  # LANE-BUD-02, parked wins
    engine = three_disjoint(tmp_path)
    engine.authorize(max_parallel=2, max_children=2)
    enroll(engine, "task-a", "task-b")
    claim_path(engine, "task-a").unlink()
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert engine.states() == ["needs_human", "integrated", "pending"]
    assert (report["batch_state"], report["reason"]) == ("needs_human", "batch_lane_lost")
    assert report["next_action"] == LANE_NEEDS_HUMAN_NEXT_ACTION


def test_nothing_startable_and_nothing_parked_settles_no_child_can_start(tmp_path, monkeypatch):  # LANE-BUD-03
    # A valid record always has a startable child when nothing is in flight or parked (the plan is
    # acyclic), so the scheduler is made to find none: the settle rule itself is what is tested.
    engine = three_disjoint(tmp_path)
    engine.authorize()
    engine.tick()
    monkeypatch.setattr(TickContext, "startable", lambda self: [])
    report = engine.tick()
    assert (report["batch_state"], report["reason"]) == ("needs_human", "no child can start")
    assert report["next_action"] == LANE_NEEDS_HUMAN_NEXT_ACTION
    assert json.loads(engine.report_file().read_text())["reason"] == "no child can start"


def test_final_verification_runs_on_the_batch_branch_before_completed_and_is_recorded(tmp_path):  # LANE-CMP-02
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    seen = tmp_path / "state-seen-by-the-command.json"
    confirmation = prepare_confirmation(engine.deps, engine.slug)
    commands = ["git status", "test -e a.txt", f"cp .imm/state/batches/{confirmation.batch_id}.json {seen}"]
    confirmation.final_verification = commands
    authorize(engine.deps, confirmation)
    enroll(engine, "task-a")
    assert engine.batch.record["final_verification"] == commands
    # a fresh confirmation does not replace the recorded commands
    confirm_again(engine, final_verification=["false"])
    engine.tick()
    assert engine.batch.record["final_verification"] == commands
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert report["reason"] == "all enrollable children integrated"
    final = report["final_verification"]
    assert final["passed"] is True and final["head"] == report["commits"][0] == engine.head()
    assert [(r["command"], r["exit_code"], r["passed"]) for r in final["results"]] == [(c, 0, True) for c in commands]
    # a.txt exists only on the batch branch, and the state the command saw was not yet completed
    assert json.loads(seen.read_text())["batch_state"] == "running"
    assert json.loads(seen.read_text())["children"][0]["state"] == "integrated"
    assert json.loads(engine.report_file().read_text())["final_verification"]["passed"] is True


def test_a_failed_final_verification_is_reported_and_nothing_is_rolled_back(tmp_path):  # LANE-CMP-02
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize(final_verification=["test -e a.txt", "test -e missing.txt"])
    enroll(engine, "task-a")
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert report["reason"] == "all enrollable children integrated; final verification did not pass: test -e missing.txt"
    assert report["next_action"] == NEXT_FINAL_VERIFICATION_FAILED
    final = report["final_verification"]
    assert final["passed"] is False
    assert [r["passed"] for r in final["results"]] == [True, False] and final["results"][1]["exit_code"] != 0
    assert engine.head() == report["commits"][0] == final["head"]
    assert git_out(engine.root, "show", f"imm/{engine.slug}:a.txt") == "a"
    written = state_bytes(engine)
    assert engine.tick()["reason"] == "terminal state already reached: completed"  # not run again
    assert state_bytes(engine) == written


def test_final_verification_takes_one_to_eight_plain_argv_commands(tmp_path, capsys):
    from lanes_es.cli.main import main

    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    root = ["--root", engine.root, "authorize", engine.slug, "--yes"]
    nine = [arg for i in range(9) for arg in ("--final-verification", f"test -n {i}")]
    assert main([*root, *nine]) == 2
    assert "invalid final_verification: expected 1 to 8 commands" in capsys.readouterr().err
    assert main([*root, "--final-verification", "git status | cat"]) == 2
    assert "invalid final_verification" in capsys.readouterr().err
    assert initiative(engine.deps, engine.slug) is None  # nothing was recorded
    eight = [arg for i in range(8) for arg in ("--final-verification", f"test  -n   {i}")]
    assert main([*root, *eight]) == 0
    assert initiative(engine.deps, engine.slug).current.final_verification == [f"test -n {i}" for i in range(8)]
