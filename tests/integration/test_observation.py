"""Observation of in-flight children, QA failure counting and coordinator corrections, on real
repositories with the reference kernel in each Lane (issue 3): LANE-OBS-03/04/06 and
LANE-QA-01/02/05/06/07."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from lanes_es.adapters.kernel import ReferenceKernel
from lanes_es.domain.report import LANE_NEEDS_HUMAN_NEXT_ACTION, NEXT_COORDINATOR, NEXT_REVIEW, RELEASE_SUFFIX
from lanes_es.ports import KernelError
from lanes_es.usecases.tick import STORE_CONDITION_NEXT
from lanes_es.tick import reconcile
from lanes_es.tick_input import InstructionInput
from tests.engine import Engine, Task
from tests.engine_more import (
    claim_path, enroll, kernel, lane_record, make_engine, needs_file, read_json, record_path, rerun, state_bytes,
    write_json,
)
from lanes_es.usecases.tick import tick

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")


def trio(tmp_path: Path, **authorize: Any) -> Engine:
    """task-a and task-b in flight, task-c blocked by task-a."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"]),
                                    "task-c": Task(["c.txt"], blocked_by=["task-a"])})
    engine.authorize(max_parallel=2, **authorize)
    enroll(engine, "task-a", "task-b")
    assert engine.states() == ["enrolled", "enrolled", "pending"]
    return engine


def lose_claim(engine: Engine, monkeypatch: Any) -> None:
    claim_path(engine, "task-a").unlink()


def change_run(engine: Engine, monkeypatch: Any) -> None:
    rerun(engine, "task-a", "run-11111111-1111-4111-8111-111111111111")


def foreign_contract(engine: Engine, monkeypatch: Any) -> None:
    record = read_json(record_path(engine, "task-a"))
    write_json(record_path(engine, "task-a"), {**record, "contract": "assurance_kernel/task_record/v3"})


def unknown_field(engine: Engine, monkeypatch: Any) -> None:
    record = read_json(record_path(engine, "task-a"))
    write_json(record_path(engine, "task-a"), {**record, "schema_extension": 1})


def torn_record(engine: Engine, monkeypatch: Any) -> None:
    record_path(engine, "task-a").write_text("{\"contract\": ")


def stop_task(engine: Engine, monkeypatch: Any) -> None:
    from lanes_es.cli.main import main

    assert main(["--root", engine.lane("task-a"), "task", "stop", "--reason", "the user stopped it"]) == 0


def record_file(engine: Engine) -> str:
    return str(record_path(engine, "task-a"))


@pytest.mark.parametrize("damage, reason", [
    (lose_claim, lambda e: "batch_lane_lost"),
    (torn_record, lambda e: "batch_lane_lost"),
    (change_run, lambda e: "batch_lane_run_mismatch"),
    (foreign_contract, lambda e: (f"batch_lane_contract_mismatch: kernel store {record_file(e)} has unknown contract "
                                  "'assurance_kernel/task_record/v3': contract must equal assurance_kernel/task_record/v4")),
    (unknown_field, lambda e: (f"batch_lane_contract_mismatch: kernel store {record_file(e)} is unreadable: "
                               "Object contains unknown field `schema_extension`")),
    (stop_task, lambda e: "Kernel reported the child stopped"),
], ids=["lost", "torn", "run_mismatch", "contract", "unknown_field", "stopped"])
def test_an_in_flight_child_is_parked_its_dependent_skipped_and_its_sibling_integrates(
        tmp_path, monkeypatch, damage: Callable[..., None], reason: Callable[[Engine], str]):  # LANE-OBS-04
    engine = trio(tmp_path)
    damage(engine, monkeypatch)
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    expected = reason(engine)
    assert [(c["state"], c["reason"]) for c in report["children"]] == [
        ("needs_human", expected), ("integrated", None), ("skipped_blocked", "dependency task-a parked")]
    assert (report["batch_state"], report["reason"]) == ("needs_human", expected)
    assert report["next_action"] == LANE_NEEDS_HUMAN_NEXT_ACTION
    assert Path(engine.lane("task-a")).is_dir()  # the parked Lane is kept


def test_a_claim_this_batch_does_not_own_parks_claim_held_by_another_batch(tmp_path, monkeypatch):  # LANE-OBS-04
    """ownsTaskClaim is the capability's consumption of the child's slot. A claim this batch made is
    re-consumed on every tick (rehydrateConsumption, see test_resume.py); with that step taken out,
    the tick's capability owns no slot, which is how a claim made under another batch looks."""
    engine = trio(tmp_path)
    monkeypatch.setattr(reconcile, "rehydrate_consumption", lambda ctx: None)
    report = engine.tick()
    assert [(c["state"], c["reason"]) for c in report["children"]] == [
        ("needs_human", "claim held by another batch"), ("needs_human", "claim held by another batch"),
        ("skipped_blocked", "dependency task-a parked")]
    assert claim_path(engine, "task-a").exists()  # the Lane and its claim are kept for a human


def test_a_kernel_store_condition_is_a_rejection_that_writes_nothing(tmp_path, monkeypatch):  # LANE-OBS-03
    """Ports LANE-REL-10."""
    engine = trio(tmp_path)
    engine.deliver("task-a", "a.txt", "a\n")
    engine.tick()
    engine.submit("task-b")
    before = state_bytes(engine)

    def busy(self: Any, lane_path: str, task_id: str) -> Any:
        raise KernelError("kernel store is busy")

    monkeypatch.setattr(ReferenceKernel, "advance_task", busy)
    result = tick(engine.deps, engine.slug)
    report = result.report
    assert (report["batch_state"], result.written) == ("rejected", False)
    assert "kernel store is busy" in report["reason"]
    assert [(c["task_id"], c["state"]) for c in report["children"]] == [
        ("task-a", "integrated"), ("task-b", "enrolled"), ("task-c", "pending")]
    assert report["children"][1]["lane"]["path"] == engine.lane("task-b")
    assert "handoff" not in report and report["max_parallel"] == 2
    # only the safe release handoff: task-a's clean Lane
    assert report["handoffs"] == [{"role": "lane-steward", "action": "release", "task_id": "task-a",
                                   "lane_branch": "imm-lane/initiative-slug/task-a"}]
    assert report["next_action"] == STORE_CONDITION_NEXT + RELEASE_SUFFIX
    assert state_bytes(engine) == before
    assert engine.batch.batch_state == "running"


def test_open_review_reservations_hold_their_children_while_others_move(tmp_path):  # LANE-OBS-06
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"], risk="material"),
                                    "task-b": Task(["b.txt"], risk="material"), "task-c": Task(["c.txt"])})
    engine.authorize(max_parallel=3)
    enroll(engine, "task-a", "task-b", "task-c")
    for task_id in ("task-a", "task-b", "task-c"):
        engine.deliver(task_id, f"{task_id[-1]}.txt", f"{task_id}\n")
    report = engine.tick()
    assert engine.states() == ["enrolled", "enrolled", "integrated"]
    assert report["reason"] == "children task-a, task-b hold open Review reservations"
    assert report["next_action"] == NEXT_REVIEW
    for child, task_id in zip(report["children"][:2], ("task-a", "task-b")):
        operation = lane_record(engine, task_id)["review"]["operation_id"]
        assert child["reason"] == f"review reservation {operation} open"
    # while the reservations stay open, a tick reports them again and writes nothing (upstream's
    # write is a no-op when the record is unchanged)
    before = state_bytes(engine)
    assert engine.tick()["reason"] == "children task-a, task-b hold open Review reservations"
    assert state_bytes(engine) == before
    kernel(engine).review(engine.lane("task-a"), approve=True)
    report = engine.tick()
    assert engine.states() == ["integrated", "enrolled", "integrated"]
    assert report["reason"] == "child task-b holds an open Review reservation"
    # a rejected Review is the Executor's rework, then a new Review opens after the next QA pass
    kernel(engine).review(engine.lane("task-b"), approve=False, text="name the file properly")
    report = engine.tick()
    assert report["reason"] is None and [h["role"] for h in report["handoffs"] if h["task_id"] == "task-b"] == ["executor"]
    engine.submit("task-b")
    assert engine.tick()["reason"] == "child task-b holds an open Review reservation"
    kernel(engine).review(engine.lane("task-b"), approve=True)
    assert engine.tick()["batch_state"] == "completed"


def failing_pair(tmp_path: Path, qa_failure_limit: int = 1) -> Engine:
    """task-a's QA passes only once a.txt exists; task-b is disjoint; both enrolled."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"], verification=needs_file("a.txt")),
                                    "task-b": Task(["b.txt"])})
    engine.authorize(max_parallel=2, qa_failure_limit=qa_failure_limit)
    enroll(engine, "task-a", "task-b")
    return engine


def test_the_qa_failure_limit_applies_per_child_and_hands_the_child_to_the_coordinator(tmp_path):  # LANE-QA-01
    engine = failing_pair(tmp_path)
    engine.submit("task-a")
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert engine.states() == ["enrolled", "integrated"]
    a, b = report["children"]
    assert (a["qa_failures"], a["correction_due"]) == (1, "QA failure limit reached")
    assert b["qa_failures"] == 0 and "correction_due" not in b
    assert report["batch_state"] == "running"
    assert report["handoffs"][0] == {"role": "coordinator", "action": "correct", "task_id": "task-a",
                                     "reason": "QA failure limit reached", "corrections_used": 0,
                                     "corrections_left": 2, "lane_path": engine.lane("task-a")}
    assert report["next_action"] == NEXT_COORDINATOR
    findings = kernel(engine).status(engine.lane("task-a")).findings
    assert [finding.id for finding in findings] == ["task-a:A1"]  # the round's findings stay readable in the Lane


def test_two_correction_rounds_then_the_child_parks_with_its_own_reason(tmp_path):  # LANE-QA-02
    engine = failing_pair(tmp_path)
    run_id = engine.batch.record["children"][0]["lane"]["run_id"]
    for round_number in (1, 2):
        engine.submit("task-a")
        report = engine.tick()
        assert report["handoffs"][0] == {"role": "coordinator", "action": "correct", "task_id": "task-a",
                                         "reason": "QA failure limit reached", "corrections_used": round_number - 1,
                                         "corrections_left": 3 - round_number, "lane_path": engine.lane("task-a")}
        history = lane_record(engine, "task-a")["history"]
        engine.tick()
        assert lane_record(engine, "task-a")["history"] == history  # not advanced while the correction is due
        refused = engine.tick(instruction=InstructionInput("task-a", "instruction", "try again", "idle"))
        assert refused["lane_instruction"] == {
            "task_id": "task-a", "kind": "instruction", "accepted": False,
            "reason": "batch_lane_instruction_refused: task-a waits for a design-level correction; send it with "
                      "kind correction"}
        accepted = engine.tick(instruction=InstructionInput("task-a", "correction", f"redesign {round_number}", "idle"))
        assert accepted["lane_instruction"]["accepted"] is True
        child = accepted["children"][0]
        assert (child["state"], child["corrections"], child["qa_failures"]) == ("enrolled", round_number, 0)
        assert "correction_due" not in child
        assert accepted["handoffs"][0] == {"role": "executor", "task_id": "task-a", "run_id": run_id,
                                           "record_revision": lane_record(engine, "task-a")["record_revision"],
                                           "next_obligation": "submit_assurance",
                                           "lane_branch": "imm-lane/initiative-slug/task-a",
                                           "lane_path": engine.lane("task-a")}
    engine.submit("task-a")
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert [(c["state"], c["reason"]) for c in report["children"]] == [
        ("needs_human", "batch_correction_limit_reached: QA failure limit reached after 2 coordinator corrections"),
        ("integrated", None)]
    assert "correction_due" not in report["children"][0] and report["children"][0]["qa_failures"] == 1
    assert [i["text"] for i in engine.batch.record["interventions"]] == ["redesign 1", "redesign 2"]


def test_an_instruction_to_an_idle_session_is_recorded_before_it_is_sent(tmp_path):  # LANE-QA-05
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    enroll(engine, "task-a")
    text = "Keep a.txt to one line."
    report = engine.tick(instruction=InstructionInput("task-a", "instruction", text, "idle"))
    assert report["lane_instruction"] == {"task_id": "task-a", "kind": "instruction", "accepted": True, "reason": None}
    digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()
    [intervention] = report["interventions"]
    assert {k: v for k, v in intervention.items() if k != "at"} == {
        "task_id": "task-a", "kind": "instruction", "text": text, "text_digest": digest}
    # durable before the Parent sends the text
    assert json.loads(engine.state_file().read_text())["interventions"] == report["interventions"]
    assert [(h["role"], h["task_id"]) for h in report["handoffs"]] == [("executor", "task-a")]
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    assert report["batch_state"] == "completed" and len(report["interventions"]) == 1
    assert json.loads(engine.report_file().read_text())["interventions"][0]["text"] == text


@pytest.mark.parametrize("request_, reason", [
    (InstructionInput("task-a", "instruction", "hello", "blocked"),
     "task-a's session is blocked on a dialog only the user may answer; send nothing and tell the user"),
    (InstructionInput("task-a", "instruction", "hello", "working"),
     "task-a's session is working; text goes only to an idle session"),
    (InstructionInput("task-a", "correction", "hello", "idle"),
     "task-a has not exhausted its rework budget; send an ordinary instruction instead"),
    (InstructionInput("task-c", "instruction", "hello", "idle"), "task-c has no Lane in this batch"),
], ids=["blocked", "working", "correction_not_due", "no_lane"])
def test_an_instruction_is_refused_and_records_nothing(tmp_path, request_, reason):  # LANE-QA-06
    engine = trio(tmp_path)
    before = state_bytes(engine)
    report = engine.tick(instruction=request_)
    assert report["lane_instruction"] == {"task_id": request_.task_id, "kind": request_.kind, "accepted": False,
                                          "reason": f"batch_lane_instruction_refused: {reason}"}
    assert "interventions" not in report
    assert state_bytes(engine) == before


def test_an_instruction_to_a_parked_child_is_refused(tmp_path):  # LANE-QA-06, not running in its Lane
    engine = trio(tmp_path)
    claim_path(engine, "task-a").unlink()
    engine.tick()
    report = engine.tick(instruction=InstructionInput("task-a", "instruction", "hello", "idle"))
    assert report["lane_instruction"]["reason"] == ("batch_lane_instruction_refused: task-a is needs_human, "
                                                    "not running in its Lane")


def test_qa_rework_below_the_limit_counts_and_a_completion_resets_it(tmp_path):  # LANE-QA-07
    engine = failing_pair(tmp_path, qa_failure_limit=2)
    engine.submit("task-a")
    report = engine.tick()
    child = report["children"][0]
    assert (child["state"], child["qa_failures"], "correction_due" in child) == ("enrolled", 1, False)
    assert [h["role"] for h in report["handoffs"]] == ["executor", "executor"]
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    child = report["children"][0]
    assert (child["state"], child["qa_failures"]) == ("integrated", 0)
