"""Resume and authority on real repositories (issue 3): a parked batch resumes only on a fresh
confirmation and only from its Lanes' facts (LANE-NH-01/03/04), rehydrateConsumption, and the
refusals that write nothing (batch_parallel_mismatch, batch_plan_empty, a preflight refusal,
assertPlanMatches)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from lanes_es.adapters.kernel import ReferenceKernel
from lanes_es.domain import events as ev
from lanes_es.domain.report import LANE_NEEDS_HUMAN_NEXT_ACTION, NEXT_REJECTED_PARAMETERS
from lanes_es.errors import ServiceError
from lanes_es.tick_input import TickInput
from tests.engine import Task
from tests.engine_more import (
    batch_files, claim_path, commit_in_coordinator, confirm_again, correction_rounds_then_park, edited, enroll, kernel, lane_record,
    make_engine, moved_away, needs_file, record_path, rerun, run_tick, state_bytes, tick_result,
)
from tests.gitfixtures import git_out, run_git, write_file
from lanes_es.usecases.confirmation import BatchOptions, prepare_confirmation
from lanes_es.usecases.load import initiative

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")

PARKED_NEXT = ("The lane batch has stopped on a parked child and its Lane is kept. Resolve the child by hand; "
               "continuing needs a new Batch Authorization.")


def parked_pair(tmp_path: Path):
    """task-a (QA needs a.txt) parked after two coordinator corrections; task-b, blocked by a, skipped."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"], verification=needs_file("a.txt")),
                                    "task-b": Task(["b.txt"], blocked_by=["task-a"])})
    engine.authorize(qa_failure_limit=1)
    enroll(engine, "task-a")
    report = correction_rounds_then_park(engine, "task-a")
    return engine, report


def test_a_parked_batch_resumes_only_on_a_fresh_confirmation_and_only_from_its_lane_facts(tmp_path):
    # LANE-NH-01: the parked report tells the user how to continue
    engine, report = parked_pair(tmp_path)
    assert report["batch_state"] == "needs_human"
    assert report["next_action"] == LANE_NEEDS_HUMAN_NEXT_ACTION == PARKED_NEXT
    assert [(c["state"], c["reason"]) for c in report["children"]] == [
        ("needs_human", "batch_correction_limit_reached: QA failure limit reached after 2 coordinator corrections"),
        ("skipped_blocked", "dependency task-a parked")]
    parked = state_bytes(engine)
    run_id = engine.batch.record["children"][0]["lane"]["run_id"]

    # the same confirmation does not resume, and writes nothing
    same = tick_result(engine)
    assert (same.report["batch_state"], same.report["reason"], same.written) == (
        "needs_human", "the parked batch requires a fresh literal-user confirmation", False)
    assert same.report["next_action"] == PARKED_NEXT
    assert state_bytes(engine) == parked

    # LANE-NH-03: a fresh confirmation still refuses while the Lane is not safely recoverable
    fresh = confirm_again(engine)
    assert fresh.batch_id == engine.batch.id and fresh.resumes is True
    lane = engine.lane("task-a")
    store = [claim_path(engine, "task-a"), record_path(engine, "task-a")]
    unresolved = "parked Lane identity or decision is unresolved"
    cases = [
        (lambda: rerun(engine, "task-a", "run-00000000-0000-4000-8000-000000000000"), unresolved),
        (lambda: run_git(lane, "checkout", "-q", "-b", "elsewhere"), unresolved),
        (lambda: record_path(engine, "task-a").write_text("{"), unresolved),
        (lambda: kernel(engine).stop(lane, "the user stopped it"), "parked child has no recoverable owned run"),
    ]
    for damage, reason in cases:
        with edited(*store):
            damage()
            refused = tick_result(engine)
            assert (refused.report["batch_state"], refused.report["reason"], refused.written) == (
                "needs_human", reason, False)
            assert refused.report["next_action"] == PARKED_NEXT
            assert state_bytes(engine) == parked
        run_git(lane, "checkout", "-q", "imm-lane/initiative-slug/task-a")
    with moved_away(lane):
        refused = tick_result(engine)
        assert (refused.report["reason"], refused.written) == (unresolved, False)
        assert state_bytes(engine) == parked

    # LANE-NH-04: resolved, the same run resumes without re-enrolling; the skipped dependent is pending again
    history = lane_record(engine, "task-a")["history"]
    report = engine.tick()
    assert report["batch_state"] == "running"
    assert engine.states() == ["enrolled", "pending"]
    child = report["children"][0]
    assert (child["lane"]["run_id"], child["reason"], child["qa_failures"]) == (run_id, None, 0)
    assert report["children"][1]["reason"] is None
    assert lane_record(engine, "task-a")["history"] == history  # no second enrollment, nothing advanced
    assert engine.batch.record["confirmation_time"] == fresh.confirmation_time
    assert [h["role"] for h in report["handoffs"]] == ["executor"]

    # the resumed run delivers and the dependent then runs to completion
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    assert engine.states() == ["integrated", "pending"]
    lanes = {"task-b": engine.provision("task-b", report)}
    engine.tick(offers=lanes)
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert engine.subjects(engine.batch.record["base_head"]) == ["imm(task-b): Deliver task-b",
                                                                 "imm(task-a): Deliver task-a"]


def test_a_fresh_capability_re_consumes_the_in_flight_slots(tmp_path):
    """rehydrateConsumption: after a fresh confirmation the enrolled children are still this batch's own
    claims, not "claim held by another batch" (what they would be without it: test_observation.py).
    Ports LANE-NH-04."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"])})
    engine.authorize(max_parallel=2)
    enroll(engine, "task-a", "task-b")
    confirm_again(engine)
    report = engine.tick()
    assert report["batch_state"] == "running"
    assert engine.states() == ["enrolled", "enrolled"]
    engine.deliver("task-a", "a.txt", "a\n")
    assert engine.tick()["children"][0]["state"] == "integrated"
    confirm_again(engine)
    engine.deliver("task-b", "b.txt", "b\n")
    assert engine.tick()["batch_state"] == "completed"


def test_a_parked_lane_without_a_recorded_run_cannot_resume(tmp_path):  # LANE-NH-03, no run identity
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"], blocked_by=["task-a"])})
    engine.authorize()
    report = engine.tick()
    lane = engine.provision("task-a", report)
    # the Lane's store holds a file where its tasks directory belongs: admitted, then the enrollment fails
    write_file(lane, ".imm/state/kernel/tasks", "not a directory")
    report = engine.tick(offers={"task-a": lane})
    child = report["children"][0]
    assert report["batch_state"] == "needs_human"
    assert child["state"] == "needs_human" and "is not a directory" in child["reason"]
    assert "run_id" not in child["lane"]
    parked = state_bytes(engine)
    confirm_again(engine)
    refused = tick_result(engine)
    assert (refused.report["reason"], refused.written) == (
        "parked Lane has no recorded run identity; inspect it without re-enrolling", False)
    assert state_bytes(engine) == parked
    assert not claim_path(engine, "task-a").exists()  # never re-enrolled


def test_a_resume_with_another_max_parallel_is_refused_and_writes_nothing(tmp_path):  # batch_parallel_mismatch
    """Ports LANE-INP-08."""
    engine, _ = parked_pair(tmp_path)
    before = batch_files(engine)
    with pytest.raises(ServiceError) as refused:
        prepare_confirmation(engine.deps, engine.slug, BatchOptions(max_parallel=2))
    assert refused.value.code == "batch_parallel_mismatch"
    confirm_again(engine)
    result = tick_result(engine, max_parallel=2)
    assert result.written is False
    assert result.report["batch_state"] == "rejected"
    assert result.report["reason"] == "batch_parallel_mismatch: the recorded batch runs with max_parallel 1"
    assert result.report["next_action"] == NEXT_REJECTED_PARAMETERS
    assert batch_files(engine) == before
    assert tick_result(engine, max_parallel=1).report["batch_state"] == "running"


def test_an_unrecorded_batch_ticked_with_another_max_parallel_writes_nothing(tmp_path):
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize(max_parallel=1)
    head = git_out(engine.root, "rev-parse", "HEAD")
    result = tick_result(engine, max_parallel=3)
    assert (result.report["batch_state"], result.written) == ("rejected", False)
    assert result.report["reason"] == "batch_parallel_mismatch: the authorization covers max_parallel 1"
    assert engine.batch is None and batch_files(engine) == {}
    assert git_out(engine.root, "rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git_out(engine.root, "rev-parse", "HEAD") == head


def test_an_empty_plan_is_refused_before_anything_is_read_or_written(tmp_path):  # batch_plan_empty
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    authorization = initiative(engine.deps, engine.slug).current
    empty = msgspec.structs.replace(authorization, children=[])
    tick = TickInput(root=engine.root, initiative_slug=engine.slug, authorization=empty, now=engine.deps.now())
    outcome = run_tick(engine, tick, None)
    assert (outcome.report["batch_state"], outcome.report["reason"]) == ("rejected",
                                                                         "batch_plan_empty: batch plan is empty")
    assert outcome.written is False and outcome.report["children"] == [] and outcome.report["handoffs"] == []
    assert batch_files(engine) == {} and engine.batch is None
    assert git_out(engine.root, "rev-parse", "--abbrev-ref", "HEAD") == "main"

    engine.tick()
    recorded = state_bytes(engine)
    outcome = run_tick(engine, TickInput(root=engine.root, initiative_slug=engine.slug, authorization=empty,
                                         now=engine.deps.now()), engine.batch)
    assert outcome.report["reason"] == "batch_plan_empty: batch plan is empty"
    assert outcome.report["batch_state"] == "rejected" and outcome.written is False
    assert state_bytes(engine) == recorded


def test_a_preflight_refusal_of_a_new_batch_writes_nothing(tmp_path):
    """Ports LANE-SER-01."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    write_file(engine.root, "stray.txt", "user work\n")
    result = tick_result(engine)
    assert (result.report["batch_state"], result.written) == ("rejected", False)
    assert result.report["reason"].startswith("dirty_working_tree: ")
    assert result.report["next_action"] == NEXT_REJECTED_PARAMETERS
    assert [c["state"] for c in result.report["children"]] == ["pending"]
    assert engine.batch is None and batch_files(engine) == {}
    assert git_out(engine.root, "branch", "--list", "imm/*") == ""
    assert Path(engine.root, "stray.txt").read_text() == "user work\n"


def test_a_recorded_batch_whose_plan_no_longer_matches_its_authorization_is_refused(tmp_path):  # assertPlanMatches
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"])})
    engine.authorize()
    engine.tick()
    recorded = state_bytes(engine)
    # an authorization of the same batch id over another plan: task-b now blocked by task-a
    deps, current = engine.deps, initiative(engine.deps, engine.slug).current
    changed = [msgspec.structs.replace(c, blocked_by=["task-a"] if c.task_id == "task-b" else []) for c in current.children]
    from lanes_es.domain.plan import compute_batch_plan_digest

    found = deps.store.initiative(engine.slug)
    found.authorize(at=deps.now(), batch_id=current.batch_id, plan_digest=compute_batch_plan_digest(changed),
                    base_head=current.base_head, branch=current.branch, budget=current.budget,
                    max_parallel=current.max_parallel, children=changed, confirmation_ref="test-confirmation",
                    final_verification=None, delegate_revisions=False, resumes=False)
    deps.store.save(found)
    with pytest.raises(ServiceError) as refused:
        engine.tick()
    assert refused.value.code == "plan_changed"
    assert "plan_digest mismatch: persisted children do not match the authorized plan" in str(refused.value)
    assert state_bytes(engine) == recorded


def test_the_reference_kernel_is_the_revisions_port(tmp_path):
    """lanes_es/bootstrap.py wires the kernel as the Revisions port because it now applies delegated revisions."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    ports = engine.deps.adapters.tick_ports(engine.root, engine.slug)
    assert isinstance(ports.revisions, ReferenceKernel)
    assert ev.DelegatedRevisionApplied  # the event the tick records for each applied revision


def test_a_child_parked_at_its_lane_commit_resumes_settled_once_the_lane_is_put_right(tmp_path):
    """LANE-NH-04 for a done run: the stray out-of-scope file is removed by hand, and the resume
    commits and integrates the same settled run (state `settled`)."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    enroll(engine, "task-a")
    write_file(engine.lane("task-a"), "stray.txt", "not in scope\n")
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    child = report["children"][0]
    assert report["batch_state"] == "needs_human" and child["reason"].startswith("dirty_outside_scope")
    assert child["lane"]["lane_commit"] is None
    run_id = child["lane"]["run_id"]
    Path(engine.lane("task-a"), "stray.txt").unlink()
    confirm_again(engine)
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert report["children"][0]["lane"]["run_id"] == run_id
    assert engine.subjects(engine.batch.record["base_head"]) == ["imm(task-a): Deliver task-a"]


def test_a_child_parked_at_integration_resumes_with_its_lane_commit_and_no_second_commit(tmp_path):
    """LANE-NH-04 for a committed run: the user reverts the batch-branch edit that conflicted, and the
    resume integrates the lane commit it already has (state `lane_committed`)."""
    engine = make_engine(tmp_path, {"task-a": Task(["base.txt"])})
    engine.authorize()
    enroll(engine, "task-a")
    commit_in_coordinator(engine, "base.txt", "user edit\n")
    engine.deliver("task-a", "base.txt", "lane edit\n")
    report = engine.tick()  # the user's commit is adopted; the Lane's edit of the same line conflicts with it
    assert engine.batch.record["adopted_heads"][-1]["to"] == engine.head()
    child = report["children"][0]
    assert child["reason"].startswith("batch_integration_conflict: ")
    lane_commit = child["lane"]["lane_commit"]
    commit_in_coordinator(engine, "base.txt", "base\n", "revert the user edit")
    confirm_again(engine)
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert report["children"][0]["lane"]["lane_commit"] == lane_commit
    assert git_out(engine.lane("task-a"), "rev-list", "--count", f"{engine.batch.record['base_head']}..HEAD") == "1"
    assert git_out(engine.root, "show", f"imm/{engine.slug}:base.txt") == "lane edit"
    assert engine.subjects(engine.batch.record["base_head"])[0] == "imm(task-a): Deliver task-a"


class _CrashAfterEnrolling(BaseException):
    """The process dies right after the kernel enrolled the task (nothing catches it, as nothing catches a kill)."""


def test_a_crash_between_the_kernels_enrollment_and_its_event_adopts_the_claim(tmp_path, monkeypatch):
    """docs/upstream.md#the-steps-of-a-tick, `lane_admitted` with the claim held: the next tick records `enrolled` with
    "adopted existing lane claim after interruption" and enrolls nothing again (the kernel keeps one run)."""
    from lanes_es.bootstrap import bootstrap

    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    report = engine.tick()
    lane = engine.provision("task-a", report)
    enroll_task = ReferenceKernel.enroll_task

    def enroll_then_crash(self, *args, **kwargs):
        enroll_task(self, *args, **kwargs)
        raise _CrashAfterEnrolling()

    monkeypatch.setattr(ReferenceKernel, "enroll_task", enroll_then_crash)
    with pytest.raises(_CrashAfterEnrolling):
        engine.tick(offers={"task-a": lane})
    monkeypatch.setattr(ReferenceKernel, "enroll_task", enroll_task)
    engine.deps = bootstrap(engine.root, clock=engine.deps.now)  # a new process
    assert engine.states() == ["lane_admitted"]
    claimed = kernel(engine).project_task(lane, "task-a")
    assert claimed.claim_task_id == "task-a" and claimed.run_id
    monkeypatch.setattr(ReferenceKernel, "enroll_task", lambda *a, **k: pytest.fail("enrolled a second time"))
    engine.tick()
    assert engine.states() == ["enrolled"]
    [enrolled] = [e for e in engine.deps.store.events(engine.batch.id) if isinstance(e, ev.Enrolled)]
    assert enrolled.reason == "adopted existing lane claim after interruption"
    assert engine.batch.record["children"][0]["lane"]["run_id"] == claimed.run_id
