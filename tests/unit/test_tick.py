"""The tick over fakes of its ports: upstream's driver scenarios that need no real git."""

from __future__ import annotations

import pytest

from lanes_es.domain.report import (
    LANE_NEEDS_HUMAN_NEXT_ACTION, NEXT_COORDINATOR, NEXT_EXECUTOR, NEXT_PROVISION, NEXT_REVIEW, TERMINAL_NEXT_ACTIONS,
)
from lanes_es.ports import AdvanceResult, IntegrationError, Lineage, Tombstone
from lanes_es.tick_input import InstructionInput

from .fakes import BASE, SLUG, FakeTracker, Harness, plan_children


def two_dependent(**kwargs) -> Harness:
    return Harness(plan_children(("task-a", []), ("task-b", ["task-a"])), **kwargs)


def two_disjoint(**kwargs) -> Harness:
    harness = Harness(plan_children(("task-a", []), ("task-b", [])), max_parallel=2, **kwargs)
    harness.batch_git.scopes = {"task-a": ["a.txt"], "task-b": ["b.txt"]}
    return harness


def test_first_tick_asks_for_a_lane():  # LANE-ENR-01
    harness = two_dependent()
    report = harness.tick()
    assert report["batch_state"] == "running"
    assert report["handoffs"] == [{"role": "lane-steward", "action": "provision", "task_id": "task-a",
                                   "lane_branch": f"imm-lane/{SLUG}/task-a", "base_head": BASE,
                                   "executor_hosts": ["claude-code", "pi"]}]
    assert "handoff" not in report
    assert report["next_action"] == NEXT_PROVISION
    assert harness.batch.record["contract"] == "assurance_kernel/batch_run_state/v2"
    assert harness.kernel.enrolled == {}


def test_offered_lane_is_admitted_and_enrolled():  # LANE-ENR-02
    harness = two_dependent()
    harness.tick()
    lane = harness.lane_git.add_lane("task-a")
    report = harness.tick([("task-a", lane)])
    assert harness.states() == ["enrolled", "pending"]
    assert harness.kernel.enrolled == {"task-a": lane}
    assert report["handoffs"] == [{"role": "executor", "task_id": "task-a", "run_id": "run-1", "record_revision": 1,
                                   "next_obligation": "submit_assurance", "lane_branch": f"imm-lane/{SLUG}/task-a",
                                   "lane_path": lane}]
    assert report["next_action"] == NEXT_EXECUTOR
    assert harness.kernel.advanced == []
    assert harness.batch.record["children"][0]["lane"]["run_id"] == "run-1"


def test_two_disjoint_children_in_flight_and_one_commit_each():  # LANE-SCH-14 over fakes
    harness = two_disjoint()
    report = harness.tick()
    assert [(h["role"], h["task_id"]) for h in report["handoffs"]] == [("lane-steward", "task-a"), ("lane-steward", "task-b")]
    report = harness.tick([("task-a", harness.lane_git.add_lane("task-a")), ("task-b", harness.lane_git.add_lane("task-b"))])
    assert harness.states() == ["enrolled", "enrolled"]
    assert [h["task_id"] for h in report["handoffs"]] == ["task-a", "task-b"]
    harness.kernel.frozen |= {"task-a", "task-b"}
    report = harness.tick()
    assert report["batch_state"] == "completed"
    assert harness.states() == ["integrated", "integrated"]
    assert len(report["commits"]) == 2
    assert report["reason"] == "all enrollable children integrated"


def test_overlapping_children_serialize():  # LANE-SCH-06 through the tick
    """Ports LANE-ADM-05."""
    harness = Harness(plan_children(("task-a", []), ("task-b", [])), max_parallel=2)
    report = harness.tick()
    assert [h["task_id"] for h in report["handoffs"]] == ["task-a"]
    report = harness.tick([("task-b", harness.lane_git.add_lane("task-b"))])
    assert report["lane_refusals"] == [{"task_id": "task-b", "path": "/lanes/task-b", "reason": "batch_lane_unknown_child"}]
    assert harness.states() == ["pending", "pending"]


@pytest.mark.parametrize("override, reason", [
    ({"branch": "scratch"}, "batch_lane_branch_mismatch"),
    ({"head": "moved"}, "batch_lane_base_mismatch"),
    ({"clean": False}, "batch_lane_dirty"),
    ({"same_repository": False}, "batch_lane_foreign_repository"),
    ({"real_path": "/coordinator"}, "batch_lane_is_coordinator"),
])
def test_refused_offers_change_no_state(override, reason):  # LANE-ADM-04, 07-09 over fakes
    """Ports LANE-ADM-07, LANE-ADM-08 and LANE-ADM-09."""
    harness = two_dependent()
    harness.tick()
    before = dict(harness.batch.record)
    lane = harness.lane_git.add_lane("task-a", **override)
    report = harness.tick([("task-a", lane)])
    assert report["lane_refusals"] == [{"task_id": "task-a", "path": lane, "reason": reason}]
    assert harness.states() == ["pending", "pending"]
    assert harness.batch.record == before
    assert harness.kernel.enrolled == {}


def test_occupied_lane_is_refused():
    harness = two_dependent()
    harness.tick()
    lane = harness.lane_git.add_lane("task-a")
    harness.kernel.claims[lane] = "task-z"
    assert harness.tick([("task-a", lane)])["lane_refusals"][0]["reason"] == "batch_lane_occupied"


def test_in_flight_never_above_max_parallel():
    """Ports LANE-ADM-05."""
    harness = Harness(plan_children(("a", []), ("b", []), ("c", [])), max_parallel=2)
    harness.batch_git.scopes = {"a": ["a"], "b": ["b"], "c": ["c"]}
    report = harness.tick()
    assert [h["task_id"] for h in report["handoffs"]] == ["a", "b"]
    offers = [(t, harness.lane_git.add_lane(t)) for t in ("a", "b", "c")]
    report = harness.tick(offers)
    assert harness.states() == ["enrolled", "enrolled", "pending"]
    assert report["lane_refusals"] == [{"task_id": "c", "path": "/lanes/c", "reason": "batch_lane_unknown_child"}]


def test_stalled_executor_gets_the_same_handoff_again():  # LANE-OBS-02
    harness = two_disjoint()
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a")), ("task-b", harness.lane_git.add_lane("task-b"))])
    report = harness.tick()
    assert harness.states() == ["enrolled", "enrolled"]
    assert [h["role"] for h in report["handoffs"]] == ["executor", "executor"]
    assert harness.kernel.advanced == []
    harness.kernel.frozen.add("task-a")
    harness.kernel.overrides["task-a"] = {"next_obligation": "run_qa"}
    harness.tick()
    assert harness.kernel.advanced == []


def enrolled_pair(**kwargs) -> Harness:
    harness = two_disjoint(**kwargs)
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a")), ("task-b", harness.lane_git.add_lane("task-b"))])
    return harness


@pytest.mark.parametrize("setup, reason", [
    (lambda h: h.kernel.overrides.__setitem__("task-a", {"run_id": "other-run"}), "batch_lane_run_mismatch"),
    (lambda h: h.kernel.overrides.__setitem__("task-a", {"claim_task_id": None}), "batch_lane_lost"),
    (lambda h: h.kernel.overrides.__setitem__("task-a", {"error": "store vanished"}), "batch_lane_lost"),
    (lambda h: h.kernel.overrides.__setitem__("task-a", {"error": "task record contract must equal v4"}),
     "batch_lane_contract_mismatch: task record contract must equal v4"),
])
def test_in_flight_child_parks_and_sibling_continues(setup, reason):  # LANE-OBS-04
    harness = enrolled_pair()
    setup(harness)
    harness.kernel.frozen.add("task-b")
    report = harness.tick()
    assert harness.states() == ["needs_human", "integrated"]
    assert report["children"][0]["reason"] == reason
    assert report["batch_state"] == "needs_human"
    assert report["reason"] == reason
    assert report["next_action"] == LANE_NEEDS_HUMAN_NEXT_ACTION


def test_park_skips_dependents_transitively():
    """Ports LANE-OBS-04."""
    harness = Harness(plan_children(("a", []), ("b", ["a"]), ("c", ["a", "b"])))
    harness.tick()
    harness.tick([("a", harness.lane_git.add_lane("a"))])
    harness.kernel.advance_results["a"] = AdvanceResult(state="stopped")
    harness.kernel.frozen.add("a")
    report = harness.tick()
    assert harness.states() == ["needs_human", "skipped_blocked", "skipped_blocked"]
    assert report["children"][0]["reason"] == "Kernel reported the child stopped"
    assert report["children"][2]["reason"] == "dependency a parked"


def test_done_projection_settles_without_advancing():  # LANE-OBS-05
    harness = enrolled_pair()
    harness.kernel.settled.add("task-a")
    harness.tick()
    assert harness.states()[0] == "integrated"
    assert harness.kernel.advanced == []


def test_open_review_reservation():  # LANE-OBS-06
    harness = enrolled_pair()
    harness.kernel.frozen |= {"task-a", "task-b"}
    harness.kernel.advance_results["task-a"] = AdvanceResult(state="review_ready", operation_id="op-1")
    report = harness.tick()
    assert harness.states() == ["enrolled", "integrated"]
    assert report["children"][0]["reason"] == "review reservation op-1 open"
    assert report["reason"] == "child task-a holds an open Review reservation"
    assert report["next_action"] == NEXT_REVIEW


def test_qa_limit_hands_the_child_to_the_coordinator():  # LANE-QA-01
    harness = enrolled_pair(qa_failure_limit=1)
    harness.kernel.reworking.add("task-a")
    harness.kernel.frozen |= {"task-a", "task-b"}
    report = harness.tick()
    assert harness.states() == ["enrolled", "integrated"]
    assert report["children"][0]["qa_failures"] == 1
    assert report["children"][0]["correction_due"] == "QA failure limit reached"
    assert report["children"][1]["qa_failures"] == 0
    assert report["batch_state"] == "running"


def test_two_correction_rounds_then_park():  # LANE-QA-02 and LANE-NH-01
    harness = Harness(plan_children(("task-a", []), ("task-b", ["task-a"])), qa_failure_limit=1)
    harness.tick()
    lane = harness.lane_git.add_lane("task-a")
    harness.tick([("task-a", lane)])
    harness.kernel.reworking.add("task-a")
    for round_number in (1, 2):
        harness.kernel.frozen.add("task-a")
        report = harness.tick()
        assert report["handoffs"][0] == {"role": "coordinator", "action": "correct", "task_id": "task-a",
                                         "reason": "QA failure limit reached", "corrections_used": round_number - 1,
                                         "corrections_left": 3 - round_number, "lane_path": lane}
        assert report["next_action"] == NEXT_COORDINATOR
        advanced = len(harness.kernel.advanced)
        harness.tick()
        assert len(harness.kernel.advanced) == advanced
        refused = harness.tick(lane_instruction=InstructionInput("task-a", "instruction", "try again", "idle"))
        assert refused["lane_instruction"]["accepted"] is False
        assert refused["lane_instruction"]["reason"] == ("batch_lane_instruction_refused: task-a waits for a "
                                                          "design-level correction; send it with kind correction")
        accepted = harness.tick(lane_instruction=InstructionInput("task-a", "correction", "redesign", "idle"))
        assert accepted["lane_instruction"]["accepted"] is True
        child = accepted["children"][0]
        assert (child["state"], child["corrections"], child["qa_failures"]) == ("enrolled", round_number, 0)
        assert "correction_due" not in child
        assert accepted["handoffs"][0]["role"] == "executor"
    harness.kernel.frozen.add("task-a")
    report = harness.tick()
    assert report["batch_state"] == "needs_human"
    assert report["children"][0]["reason"] == ("batch_correction_limit_reached: QA failure limit reached "
                                               "after 2 coordinator corrections")
    assert "correction_due" not in report["children"][0]
    assert report["next_action"] == LANE_NEEDS_HUMAN_NEXT_ACTION


def test_instruction_recorded_before_it_is_sent():  # LANE-QA-05
    harness = two_dependent()
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    report = harness.tick(lane_instruction=InstructionInput("task-a", "instruction", "look at b", "idle"))
    assert report["lane_instruction"] == {"task_id": "task-a", "kind": "instruction", "accepted": True, "reason": None}
    intervention = report["interventions"][0]
    assert intervention["text"] == "look at b" and intervention["text_digest"].startswith("sha256:")
    assert len(intervention["text_digest"]) == len("sha256:") + 64


@pytest.mark.parametrize("task, session, fragment", [
    ("task-a", "blocked", "blocked on a dialog only the user may answer"),
    ("task-a", "working", "task-a's session is working; text goes only to an idle session"),
    ("task-b", "idle", "task-b has no Lane"),
])
def test_instruction_refusals_record_nothing(task, session, fragment):  # LANE-QA-06
    harness = two_dependent()
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    report = harness.tick(lane_instruction=InstructionInput(task, "instruction", "hello", session))
    assert report["lane_instruction"]["accepted"] is False
    assert report["lane_instruction"]["reason"].startswith("batch_lane_instruction_refused: ")
    assert fragment in report["lane_instruction"]["reason"]
    assert "interventions" not in harness.batch.record


def test_qa_rework_below_the_limit_counts():  # LANE-QA-07
    harness = two_dependent()
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    harness.kernel.reworking.add("task-a")
    harness.kernel.frozen.add("task-a")
    harness.tick()
    assert harness.batch.record["children"][0]["qa_failures"] == 1
    harness.kernel.reworking.clear()
    harness.kernel.frozen.add("task-a")
    harness.tick()
    child = harness.batch.record["children"][0]
    assert child["state"] == "integrated" and child["qa_failures"] == 0


def test_integration_failure_parks_skips_dependents_and_keeps_going():  # LANE-INT-15 over fakes
    harness = Harness(plan_children(("a", []), ("b", ["a"]), ("c", [])), max_parallel=2)
    harness.batch_git.scopes = {"a": ["a"], "b": ["b"], "c": ["c"]}
    harness.lane_git.integrate_errors["a"] = IntegrationError("batch_integration_check_failed",
                                                              "batch_integration_check_failed: a:A1 failed on candidate x")
    harness.tick()
    harness.tick([("a", harness.lane_git.add_lane("a")), ("c", harness.lane_git.add_lane("c"))])
    harness.kernel.frozen |= {"a", "c"}
    report = harness.tick()
    assert harness.states() == ["needs_human", "skipped_blocked", "integrated"]
    assert report["children"][0]["reason"] == "batch_integration_check_failed: a:A1 failed on candidate x"
    assert report["batch_state"] == "needs_human"
    assert len(report["commits"]) == 1


def test_plain_integration_error_is_prefixed_as_conflict():
    """Ports LANE-INT-15."""
    harness = two_dependent()
    harness.lane_git.integrate_errors["task-a"] = IntegrationError("batch_integration_conflict", "merge-tree conflict")
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    harness.kernel.frozen.add("task-a")
    report = harness.tick()
    assert report["children"][0]["reason"] == "batch_integration_conflict: merge-tree conflict"


def test_lineage_break_in_commit_fails_the_batch():  # LANE-LCM-04
    harness = two_disjoint()
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a")), ("task-b", harness.lane_git.add_lane("task-b"))])
    harness.batch_git.commit_errors["task-a"] = "batch_head_lineage_broken: current HEAD x does not match expected_head y"
    harness.kernel.frozen.add("task-a")
    report = harness.tick()
    assert report["batch_state"] == "failed"
    assert report["children"][0]["state"] == "needs_human"
    assert report["next_action"] == TERMINAL_NEXT_ACTIONS["failed"]


def test_existing_lane_commit_is_adopted_not_recommitted():
    """Ports LANE-LCM-04."""
    harness = two_dependent()
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    harness.batch_git.existing["task-a"] = "e" * 40
    harness.kernel.frozen.add("task-a")
    harness.tick()
    assert harness.batch_git.commits == []
    assert harness.batch.record["children"][0]["lane"]["lane_commit"] == "e" * 40


def test_release_handoff_then_released():  # LANE-REL-01..03 over fakes
    """Ports LANE-REL-01, LANE-REL-02 and LANE-REL-03."""
    harness = two_dependent()
    harness.tick()
    lane_a = harness.lane_git.add_lane("task-a")
    harness.tick([("task-a", lane_a)])
    assert not any(h.get("action") == "release" for h in harness.tick()["handoffs"])
    harness.kernel.frozen.add("task-a")
    harness.lane_git.audit.add("task-a")
    report = harness.tick()
    assert harness.states() == ["integrated", "pending"]
    assert {"role": "lane-steward", "action": "release", "task_id": "task-a",
            "lane_branch": f"imm-lane/{SLUG}/task-a"} in report["handoffs"]
    del harness.lane_git.facts[lane_a]
    report = harness.tick([("task-b", harness.lane_git.add_lane("task-b"))])
    assert harness.states() == ["released", "enrolled"]
    assert not any(h.get("action") == "release" for h in report["handoffs"])
    harness.kernel.frozen.add("task-b")
    harness.lane_git.audit.add("task-b")
    report = harness.tick()
    assert report["batch_state"] == "completed"
    assert harness.states() == ["released", "integrated"]
    assert [h["task_id"] for h in report["handoffs"]] == ["task-b"]


def test_no_release_without_the_audit_pair():  # LANE-REL-05
    harness = two_dependent()
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    harness.kernel.frozen.add("task-a")
    report = harness.tick()
    assert harness.states() == ["integrated", "pending"]
    assert [h for h in report["handoffs"] if h.get("action") == "release"] == []


def test_missed_integration_is_adopted():
    """A crash after the fast-forward but before the record: the next tick finds the commit and adopts it."""
    harness = two_dependent()
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    harness.kernel.frozen.add("task-a")
    harness.lane_git.integrate_errors["task-a"] = RuntimeError("crash after the fast-forward")  # type: ignore[assignment]
    with pytest.raises(RuntimeError):
        harness.tick()
    assert harness.states() == ["lane_committed", "pending"]
    harness.lane_git.integrate_errors.clear()
    harness.lane_git.integrated["task-a"] = "f" * 40
    harness.lane_git.head = "f" * 40
    report = harness.tick()
    assert harness.states() == ["integrated", "pending"]
    assert report["commits"] == ["f" * 40]
    assert "adopted_heads" not in report


def test_parked_batch_needs_a_fresh_confirmation():  # LANE-NH-01, NH-03, NH-04
    """Ports LANE-NH-03 and LANE-NH-04."""
    harness = Harness(plan_children(("task-a", []), ("task-b", ["task-a"])), qa_failure_limit=1, max_children=2)
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    harness.kernel.overrides["task-a"] = {"run_id": "foreign"}
    report = harness.tick()
    assert report["batch_state"] == "needs_human"
    parked = dict(harness.batch.record)
    harness.kernel.overrides.clear()
    # the same confirmation does not resume
    report = harness.tick()
    assert report["batch_state"] == "needs_human"
    assert report["reason"] == "the parked batch requires a fresh literal-user confirmation"
    assert harness.batch.record == parked
    # a fresh confirmation with an unresolved Lane still refuses, writing nothing
    harness.confirmation_time = "2026-06-01T00:00:00.000Z"
    for override, reason in [({"run_id": "foreign-run"}, "parked Lane identity or decision is unresolved"),
                             ({"open_user_decision_count": 1}, "parked Lane identity or decision is unresolved"),
                             ({"replan_required_ids": ["decision"]}, "parked Lane identity or decision is unresolved"),
                             ({"lifecycle": "stopped"}, "parked child has no recoverable owned run")]:
        harness.kernel.overrides["task-a"] = override
        report = harness.tick()
        assert (report["batch_state"], report["reason"]) == ("needs_human", reason)
        assert harness.batch.record == parked
    harness.kernel.overrides.clear()
    enrolled_before = dict(harness.kernel.enrolled)
    report = harness.tick()
    assert report["batch_state"] == "running"
    assert harness.states() == ["enrolled", "pending"]
    assert harness.kernel.enrolled == enrolled_before
    assert harness.batch.record["confirmation_time"] == "2026-06-01T00:00:00.000Z"
    assert report["children"][0]["reason"] is None


def test_budget_stopped_when_over_budget_and_nothing_parked():  # LANE-BUD-02
    harness = Harness(plan_children(("a", []), ("b", [])), max_children=1)
    harness.batch_git.scopes = {"a": ["a"], "b": ["b"]}
    harness.tick()
    harness.tick([("a", harness.lane_git.add_lane("a"))])
    harness.kernel.frozen.add("a")
    report = harness.tick()
    assert report["batch_state"] == "budget_stopped"
    assert report["reason"] == "max_children budget exhausted (1)"
    assert report["next_action"] == TERMINAL_NEXT_ACTIONS["budget_stopped"]


def test_final_verification_failure_completes_without_rollback():  # LANE-CMP-02 over fakes
    harness = Harness(plan_children(("a", [])), final_verification=["git status", "make check"])
    harness.verifier.failing.add("make check")
    harness.tick()
    harness.tick([("a", harness.lane_git.add_lane("a"))])
    harness.kernel.frozen.add("a")
    report = harness.tick()
    assert report["batch_state"] == "completed"
    assert report["final_verification"]["passed"] is False
    assert report["reason"] == "all enrollable children integrated; final verification did not pass: make check"
    assert len(report["commits"]) == 1


def test_terminal_record_replays_its_state():  # LANE-CMP-10
    harness = Harness(plan_children(("a", [])))
    harness.tick()
    harness.tick([("a", harness.lane_git.add_lane("a"))])
    harness.kernel.frozen.add("a")
    harness.tick()
    report = harness.tick()
    assert report["reason"] == "terminal state already reached: completed"
    assert report["next_action"] == TERMINAL_NEXT_ACTIONS["completed"]


def test_tracker_closes_once_after_integration_and_retries():  # LANE-TRK-01, TRK-05
    harness = two_dependent(tracker=FakeTracker(fail_first=True))
    harness.kernel.tombstones["task-a"] = Tombstone(task_id="task-a", lifecycle_status="terminal",
                                                    terminal_lifecycle="done", terminal_event_id="ev-task-a")
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    assert harness.tracker.calls == []
    harness.kernel.frozen.add("task-a")
    report = harness.tick()
    assert report["tracker_observations"] == [{"task_id": "task-a", "status": "retryable_failure", "message": "gh unavailable"}]
    assert "tracker_closed" not in report["children"][0]
    report = harness.tick()
    assert report["tracker_observations"][0]["status"] == "updated"
    assert report["children"][0]["tracker_closed"] is True
    report = harness.tick()
    assert "tracker_observations" not in report
    assert len(harness.tracker.calls) == 2


def test_tracker_reports_a_missing_proof():
    """Ports LANE-TRK-05."""
    harness = two_dependent(tracker=FakeTracker())
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    harness.kernel.frozen.add("task-a")
    report = harness.tick()
    assert report["tracker_observations"] == [{"task_id": "task-a", "status": "retryable_failure",
                                               "message": "integrated child has no done terminal proof on the batch branch"}]
    assert harness.tracker.calls == []


def test_parallel_mismatch_refuses_without_writing():  # LANE-INP-08
    harness = two_dependent()
    harness.tick()
    record = dict(harness.batch.record)
    report = harness.tick(max_parallel=2)
    assert report["batch_state"] == "rejected"
    assert report["reason"] == "batch_parallel_mismatch: the recorded batch runs with max_parallel 1"
    assert report["next_action"] == "Correct the lane-mode parameters and call start_unattended_batch again."
    assert harness.batch.record == record
    assert harness.tick()["batch_state"] == "running"


def test_broken_lineage_fails_every_in_flight_child():
    harness = enrolled_pair()
    harness.lane_git.lineage_override = Lineage(kind="broken", head="x",
                                                message="batch_head_lineage_broken: recorded commit c is no longer reachable from HEAD")
    report = harness.tick()
    assert report["batch_state"] == "failed"
    assert harness.states() == ["needs_human", "needs_human"]
    assert report["handoffs"] == []


def test_a_fast_forward_by_someone_else_is_adopted_in_the_same_tick_and_later_lanes_start_from_it():
    """docs/upstream.md#the-steps-of-a-tick: a user's fast-forward of the batch branch is adopted (`adopted_heads`
    gets {from: the expected head, to: the head}) and the tick goes on under the same confirmation: the offer
    made with it is admitted at the adopted head (only a head moved without a fast-forward blocks reuse)."""
    harness = two_dependent()
    harness.tick()
    harness.lane_git.head = "d" * 40
    lane = harness.lane_git.add_lane("task-a")  # cut from the new head, as the steward would now
    report = harness.tick(offers=[("task-a", lane)])
    assert report["batch_state"] == "running" and report["reason"] is None
    assert harness.batch.record["adopted_heads"] == [{"from": BASE, "to": "d" * 40}]
    assert harness.states() == ["enrolled", "pending"]
    assert harness.batch.record["children"][0]["lane"]["base_head"] == "d" * 40
    assert harness.tick()["batch_state"] == "running"  # adopted once: the next tick finds the head it expects
    assert harness.batch.record["adopted_heads"] == [{"from": BASE, "to": "d" * 40}]
