"""The batch branch's lineage on real repositories (issue 3): a user's fast-forward is adopted
(`adopted_heads`) and the completion verifier accepts the chain that steps over it; a broken
lineage fails the batch with every in-flight child parked and no release handoff (LANE-LIN-01)."""

from __future__ import annotations

import json

import pytest

from lanes_es.audit.completion import verify_completion
from lanes_es.domain.report import TERMINAL_NEXT_ACTIONS
from tests.engine import Engine, Task
from tests.engine_more import commit_in_coordinator, enroll, lane_exists, make_engine, claim_path, state_bytes
from tests.gitfixtures import git_out, run_git
from lanes_es.usecases.load import initiative

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")


def adopted_in_the_same_tick(engine: Engine, moved_from: str, moved_to: str) -> dict:
    """A user's fast-forward of the batch branch is adopted by the next tick, which goes on running under the
    same confirmation (docs/upstream.md#the-steps-of-a-tick)."""
    confirmations = len(initiative(engine.deps, engine.slug).authorizations)
    report = engine.tick()
    assert report["batch_state"] == "running" and report["reason"] is None, report
    assert engine.batch.record["adopted_heads"][-1] == {"from": moved_from, "to": moved_to}
    assert len(initiative(engine.deps, engine.slug).authorizations) == confirmations  # none asked for
    return report


def test_user_fast_forwards_are_adopted_and_the_completed_chain_verifies(tmp_path):
    """Ports LANE-LCM-03 and LANE-LIN-02; each fast-forward is adopted in the tick that finds it, and the Lane
    provisioned after it is cut from the adopted head."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"], blocked_by=["task-a"])})
    batch_id = engine.authorize()
    base = engine.tick()["handoffs"][0]["base_head"]
    before_a = commit_in_coordinator(engine, "notes/one.txt", "one\n")
    report = adopted_in_the_same_tick(engine, base, before_a)
    assert engine.batch.record["adopted_heads"] == [{"from": base, "to": before_a}]
    assert report["handoffs"][0]["base_head"] == before_a  # the Lane is cut from the adopted head
    engine.tick(offers={"task-a": engine.provision("task-a", report)})
    engine.deliver("task-a", "a.txt", "a\n")
    commit_a = engine.tick()["children"][0]["commit"]
    assert git_out(engine.root, "rev-parse", f"{commit_a}^") == before_a
    between = commit_in_coordinator(engine, "notes/two.txt", "two\n")
    report = adopted_in_the_same_tick(engine, commit_a, between)
    assert engine.batch.record["adopted_heads"] == [{"from": base, "to": before_a}, {"from": commit_a, "to": between}]
    engine.tick(offers={"task-b": engine.provision("task-b", report)})
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert git_out(engine.root, "rev-parse", f"{report['commits'][1]}^") == between
    observation = verify_completion(engine.root, batch_id)
    assert observation.complete, observation.message
    assert [child.commit for child in observation.children] == report["commits"]


def integrated_and_in_flight(tmp_path) -> Engine:
    """task-a integrated (its Lane clean and releasable), task-b enrolled, task-c blocked by task-b."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"]),
                                    "task-c": Task(["c.txt"], blocked_by=["task-b"])})
    engine.authorize(max_parallel=2)
    enroll(engine, "task-a", "task-b")
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    assert engine.states() == ["integrated", "enrolled", "pending"]
    # the control: with the lineage whole, task-a's Lane is handed back for release
    assert [h["task_id"] for h in report["handoffs"] if h.get("action") == "release"] == ["task-a"]
    return engine


def break_by_reset(engine: Engine) -> str:
    run_git(engine.root, "reset", "-q", "--hard", engine.batch.record["base_head"])
    return f"current HEAD {engine.batch.record['base_head']} does not descend from expected batch head " \
           f"{engine.batch.record['commits'][-1]}"


def break_by_foreign_trailer(engine: Engine) -> str:
    foreign = commit_in_coordinator(engine, "foreign.txt", "x\n",
                                    f"foreign work\n\nImmune-Brain-Batch: {engine.batch.id}\n")
    return f"commit {foreign} claims batch {engine.batch.id} without recorded evidence"


@pytest.mark.parametrize("breaker", [break_by_reset, break_by_foreign_trailer])
def test_a_broken_lineage_fails_the_batch_parks_every_in_flight_child_and_withholds_release(tmp_path, breaker):
    # LANE-LIN-01
    engine = integrated_and_in_flight(tmp_path)
    commits = list(engine.batch.record["commits"])
    message = "batch_head_lineage_broken: " + breaker(engine)
    report = engine.tick()
    assert report["batch_state"] == "failed"
    assert report["reason"] == message
    assert report["next_action"] == TERMINAL_NEXT_ACTIONS["failed"]
    assert [(c["state"], c["reason"]) for c in report["children"]] == [
        ("integrated", None), ("needs_human", message), ("skipped_blocked", "dependency task-b parked")]
    assert report["handoffs"] == []  # task-a's Lane is still clean and unclaimed, but nothing is released
    assert report["commits"] == commits
    assert json.loads(engine.report_file().read_text())["batch_state"] == "failed"
    # the Lanes are kept as they are, task-b's claim included
    assert lane_exists(engine, "task-a") and claim_path(engine, "task-b").exists()
    # a failed batch stays failed, and still hands nothing back
    written = state_bytes(engine)
    replay = engine.tick()
    assert (replay["reason"], replay["handoffs"]) == ("terminal state already reached: failed", [])
    assert state_bytes(engine) == written


def test_a_coordinator_switched_to_another_branch_parks_the_batch_until_it_is_back_and_confirmed(tmp_path):
    """docs/upstream.md#authorization-reuse-and-the-tool-surface reuse blocker `batch_branch_changed`: the in-flight child parks (its Lane and
    claim kept), nothing moves on main or the batch branch; back on imm/<slug> and confirmed again,
    the batch resumes from its Lanes and completes."""
    engine = integrated_and_in_flight(tmp_path)
    commits = list(engine.batch.record["commits"])
    batch_head = engine.head()
    run_git(engine.root, "checkout", "-q", "main")
    main_head = engine.head()
    reason = f"batch_branch_changed: the coordinator is on main, the confirmation covers imm/{engine.slug}"
    report = engine.tick()
    assert (report["batch_state"], report["reason"]) == ("needs_human", reason)
    assert [(c["state"], c["reason"]) for c in report["children"]] == [
        ("integrated", None), ("needs_human", reason), ("skipped_blocked", "dependency task-b parked")]
    assert engine.head() == main_head and git_out(engine.root, "rev-parse", f"imm/{engine.slug}") == batch_head
    assert lane_exists(engine, "task-b") and claim_path(engine, "task-b").exists()
    engine.authorize(max_parallel=2)
    refused = engine.tick()  # still on main: the fresh confirmation does not cover it either
    assert refused["batch_state"] == "rejected" and refused["reason"].startswith("batch_branch_changed: ")
    assert engine.batch.batch_state == "needs_human" and report["commits"] == commits
    run_git(engine.root, "checkout", "-q", f"imm/{engine.slug}")
    engine.authorize(max_parallel=2)
    assert engine.tick()["batch_state"] == "running"
    assert engine.states()[:2] == ["integrated", "enrolled"]
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    engine.tick(offers={"task-c": engine.provision("task-c", report)})
    engine.deliver("task-c", "c.txt", "c\n")
    assert engine.tick()["batch_state"] == "completed"
