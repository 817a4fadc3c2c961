"""The scenarios of upstream's scenario list (tests/SCENARIOS.md) that no other unit test ported, over fakes of the
tick's ports (tests/unit/fakes.py) or as pure functions: LANE-ENR-05, LANE-REL-08, LANE-CMP-06,
LANE-CMP-10, LANE-DEL-01, LANE-DISP-01, LANE-DISP-09, LANE-REC-07 and LANE-SER-02; and the check
that tests/SCENARIOS.md, which maps every scenario to its tests, points only at tests that exist."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lanes_es.domain import events as ev
from lanes_es.domain.aggregate import TransitionRefused
from lanes_es.domain.authority import AuthorizationError, BatchCapability, Binding
from lanes_es.domain.initiative import Initiative
from lanes_es.domain.plan import compute_batch_plan_digest
from lanes_es.domain.record import TERMINAL_BATCH_STATES, fold_record, is_terminal
from lanes_es.domain.report import LANE_NEEDS_HUMAN_NEXT_ACTION, TERMINAL_NEXT_ACTIONS
from lanes_es.ports import KernelError, Lineage, Tombstone, TrackerResult
from lanes_es.usecases.confirmation import Confirmation
from lanes_es.tick import run_lane_batch
from lanes_es.tick_input import TickInput

from .fakes import BASE, NOW, SLUG, FakeKernel, FakeTracker, Harness, authorization, plan_children

PROJECT = Path(__file__).resolve().parents[2]
LINEAGE_BROKEN = "batch_head_lineage_broken: current HEAD x does not match expected_head y"


@dataclass
class EnrollFailingKernel(FakeKernel):
    """FAKE-K whose enrollTask throws for the tasks named in `enroll_errors`."""

    enroll_errors: dict[str, str] = field(default_factory=dict)

    def enroll_task(self, lane_path: str, task_id: str, enrollment: Any) -> None:
        if task_id in self.enroll_errors:
            raise KernelError(self.enroll_errors[task_id])
        super().enroll_task(lane_path, task_id, enrollment)


def parked_and_sibling(kernel: FakeKernel) -> Harness:
    """a (blocked-on by b) and a disjoint c offered together at max_parallel 2."""
    harness = Harness(plan_children(("a", []), ("b", ["a"]), ("c", [])), max_parallel=2, kernel=kernel)
    harness.batch_git.scopes = {"a": ["a.txt"], "b": ["b.txt"], "c": ["c.txt"]}
    report = harness.tick()
    assert [h["task_id"] for h in report["handoffs"]] == ["a", "c"]
    return harness


# ---------------------------------------------------------------- LANE-ENR-05


def test_enr05_an_enrollment_failure_parks_only_that_child():
    harness = parked_and_sibling(EnrollFailingKernel(enroll_errors={"a": "kernel store at /lanes/a is read-only"}))
    report = harness.tick([("a", harness.lane_git.add_lane("a")), ("c", harness.lane_git.add_lane("c"))])
    assert [(c["state"], c["reason"]) for c in report["children"]] == [
        ("needs_human", "kernel store at /lanes/a is read-only"), ("skipped_blocked", "dependency a parked"),
        ("enrolled", None)]
    assert report["batch_state"] == "running"  # the batch keeps going with its other Lane
    harness.kernel.frozen.add("c")
    report = harness.tick()
    assert harness.states() == ["needs_human", "skipped_blocked", "integrated"]
    assert (report["batch_state"], report["next_action"]) == ("needs_human", LANE_NEEDS_HUMAN_NEXT_ACTION)


@pytest.mark.parametrize("projection", [{"error": "kernel store torn"}, {"run_id": None},
                                        {"claim_task_id": "task-z"}], ids=["error", "no_run", "foreign_claim"])
def test_enr05_an_enrolled_lane_without_an_observable_owned_run_parks_the_child(projection):
    kernel = FakeKernel(overrides={"a": projection})
    harness = parked_and_sibling(kernel)
    report = harness.tick([("a", harness.lane_git.add_lane("a")), ("c", harness.lane_git.add_lane("c"))])
    assert [(c["state"], c["reason"]) for c in report["children"]] == [
        ("needs_human", "enrolled Lane has no observable owned run"), ("skipped_blocked", "dependency a parked"),
        ("enrolled", None)]
    assert report["batch_state"] == "running"


def test_enr05_an_enrollment_that_breaks_the_lineage_fails_the_batch():
    harness = parked_and_sibling(EnrollFailingKernel(enroll_errors={"a": LINEAGE_BROKEN}))
    report = harness.tick([("a", harness.lane_git.add_lane("a"))])
    assert report["batch_state"] == "failed"
    assert [(c["state"], c["reason"]) for c in report["children"]] == [
        ("needs_human", LINEAGE_BROKEN), ("skipped_blocked", "dependency a parked"), ("pending", None)]
    assert report["next_action"] == TERMINAL_NEXT_ACTIONS["failed"]
    assert harness.batch.report is not None and harness.batch.report["batch_state"] == "failed"  # written


# ---------------------------------------------------------------- LANE-REL-08


def test_rel08_no_release_for_an_enrolled_lane_even_with_a_reachable_audit_pair():
    harness = Harness(plan_children(("task-a", []), ("task-b", ["task-a"])))
    harness.lane_git.audit.add("task-a")  # the pair looks reachable on the batch branch already
    harness.tick()
    report = harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    assert harness.states() == ["enrolled", "pending"]
    report = harness.tick()
    assert harness.states() == ["enrolled", "pending"]
    assert [h for h in report["handoffs"] if h.get("action") == "release"] == []
    assert [h["role"] for h in report["handoffs"]] == ["executor"]


# ---------------------------------------------------------------- LANE-CMP-06


def kinds(report: dict[str, Any]) -> list[str]:
    return sorted(h.get("action") if h["role"] == "lane-steward" else h["role"] for h in report["handoffs"])


def test_cmp06_next_action_follows_the_handoffs():
    harness = Harness(plan_children(("task-a", []), ("task-b", [])), max_parallel=2)
    harness.batch_git.scopes = {"task-a": ["a.txt"], "task-b": ["b.txt"]}
    harness.lane_git.audit |= {"task-a", "task-b"}
    report = harness.tick()
    assert [h["action"] for h in report["handoffs"]] == ["provision", "provision"]
    assert "Provide a Lane" in report["next_action"]
    harness.tick([("task-a", harness.lane_git.add_lane("task-a")), ("task-b", harness.lane_git.add_lane("task-b"))])
    harness.kernel.frozen.add("task-a")
    report = harness.tick()
    assert harness.states() == ["integrated", "enrolled"]
    assert kinds(report) == ["executor", "release"]
    assert "Provide a Lane" not in report["next_action"]
    assert "Run each executor handoff" in report["next_action"]


# ---------------------------------------------------------------- LANE-CMP-10


def test_cmp10_the_next_action_of_each_terminal_state_is_upstreams():
    assert {state: TERMINAL_NEXT_ACTIONS[state] for state in sorted(TERMINAL_BATCH_STATES)} == {
        "budget_stopped": "The child budget stopped new enrollments; re-confirm to continue under a new authorization.",
        "completed": "The batch integrated every enrollable child; review the commits and the tracker.",
        "failed": "A lineage failure stopped the batch; inspect the failing child and the branch state.",
        "rejected": "The batch was rejected before any enrollment; correct the stated reason and re-confirm.",
        "superseded": "The plan moved past this record and an explicit disposition retired it; it grants no "
                      "handoff and no child delivery.",
    }


@dataclass
class GatedTracker(FakeTracker):
    """FAKE-TRACKER that fails every close until `reachable` is set."""

    reachable: bool = False

    def mark_terminal(self, root: str, task_id: str, phase: str, terminal_event_id: str) -> TrackerResult:
        self.calls.append((task_id, terminal_event_id))
        if not self.reachable:
            return TrackerResult(status="retryable_failure", message="gh unavailable")
        return TrackerResult(status="updated", message="terminal Task Issue closure confirmed")


def settled(state: str) -> Harness:
    """A batch settled in `state`, every integrated Lane clean with its audit pair reachable, and each
    integrated child's Issue still open (the tracker was unreachable)."""
    harness = Harness(plan_children(("task-a", []), ("task-b", [])), max_children=1 if state == "budget_stopped" else None,
                      tracker=GatedTracker())
    for task_id in ("task-a", "task-b"):
        harness.kernel.tombstones[task_id] = Tombstone(task_id=task_id, lifecycle_status="terminal",
                                                       terminal_lifecycle="done", terminal_event_id=f"ev-{task_id}")
    harness.batch_git.scopes = {"task-a": ["a.txt"], "task-b": ["b.txt"]}
    harness.lane_git.audit |= {"task-a", "task-b"}
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    harness.kernel.frozen.add("task-a")
    if state != "budget_stopped":
        harness.tick()
        harness.tick([("task-b", harness.lane_git.add_lane("task-b"))])
        assert harness.states() == ["integrated", "enrolled"]
    if state == "failed":
        harness.lane_git.lineage_override = Lineage(kind="broken", head="x", message=LINEAGE_BROKEN)
    harness.kernel.frozen.add("task-b")
    assert harness.tick()["batch_state"] == state
    harness.lane_git.lineage_override = None  # the branch is whole again when the record is read
    return harness


@pytest.mark.parametrize("state, releases", [("completed", ["task-a", "task-b"]), ("budget_stopped", []),
                                             ("failed", [])])
def test_cmp10_a_terminal_record_replays_its_reason_and_recomputes_releases_only_when_completed(state, releases):
    harness = settled(state)
    record = dict(harness.batch.record)
    calls = len(harness.tracker.calls)
    assert calls >= 1  # task-a's close was tried after its integration, and failed
    harness.tracker.reachable = True
    report = harness.tick()
    assert report["batch_state"] == state
    assert report["reason"] == f"terminal state already reached: {state}"
    assert report["next_action"] == TERMINAL_NEXT_ACTIONS[state]
    assert [h["task_id"] for h in report["handoffs"] if h.get("action") == "release"] == releases
    # a close that failed earlier is retried for a completed batch only
    retried = [task_id for task_id, _ in harness.tracker.calls[calls:]]
    assert retried == (["task-a", "task-b"] if state == "completed" else [])
    if state != "completed":
        assert harness.batch.record == record
    assert [c.get("tracker_closed", False) for c in harness.batch.record["children"]] == [state == "completed"] * 2


# ---------------------------------------------------------------- LANE-DEL-01 (the MCP gate)


def confirmation_facts(max_parallel: int = 2) -> dict[str, Any]:
    children = plan_children(("task-a", []), ("task-b", []))
    return Confirmation(slug=SLUG, batch_id="batch-001", resumes=False,
                        plan={"parallel_groups": [["task-a", "task-b"]], "scope_conflicts": []}, children=children,
                        plan_digest=compute_batch_plan_digest(children), base_head=BASE,
                        budget=ev.Budget(max_children=2, qa_failure_limit=2), max_parallel=max_parallel,
                        final_verification=None, delegate_revisions=False).facts()


def test_del01_the_mcp_gate_offers_one_delegation_boolean_default_false():
    from lanes_es.usecases.gate import REVISION_DELEGATION_TEXT, confirmation_text
    from lanes_es.mcp_server import confirm_schema

    facts = confirmation_facts()
    assert facts["lane_mode"]["offer_revision_delegation"] is True  # lanes-es always runs lane mode
    schema = confirm_schema(True)
    assert schema["type"] == "object" and sorted(schema["properties"]) == ["confirm", "delegate_in_lane_revisions"]
    delegation = schema["properties"]["delegate_in_lane_revisions"]
    assert (delegation["type"], delegation["default"]) == ("boolean", False)
    assert delegation["description"] == REVISION_DELEGATION_TEXT
    assert REVISION_DELEGATION_TEXT in confirmation_text(facts)
    # the retirement gate confirms no lane facts: no delegation offered, no delegation text
    assert sorted(confirm_schema(False)["properties"]) == ["confirm"]
    assert REVISION_DELEGATION_TEXT not in confirmation_text(facts, with_delegation=False)


# ---------------------------------------------------------------- LANE-DISP-01, LANE-DISP-09


def test_disp01_superseded_is_terminal():
    assert is_terminal("superseded")
    assert "superseded" in TERMINAL_BATCH_STATES
    assert not is_terminal("needs_human") and not is_terminal("running")


def test_disp09_a_batch_with_a_child_in_flight_cannot_be_superseded():
    harness = Harness(plan_children(("task-a", []), ("task-b", [])), max_parallel=2)
    harness.batch_git.scopes = {"task-a": ["a.txt"], "task-b": ["b.txt"]}
    harness.tick()
    harness.tick([("task-a", harness.lane_git.add_lane("task-a"))])
    with pytest.raises(TransitionRefused, match="still mid-flight"):
        harness.batch.supersede(NOW, "retired", "")
    assert harness.batch.batch_state == "running"
    assert harness.batch.collect_events() == []  # nothing was recorded


# ---------------------------------------------------------------- LANE-REC-07


def test_rec07_a_new_record_is_prepared_then_running_once_persisted():
    children = plan_children(("task-a", []), ("task-b", ["task-a"]))
    harness = Harness(children)
    saved: list[Any] = []

    def persist(batch: Any) -> None:
        saved.extend(batch.collect_events())

    tick = TickInput(root="/coordinator", initiative_slug=SLUG, authorization=authorization(children), now=NOW,
                     max_parallel=1)
    outcome = run_lane_batch(tick, None, harness.ports(), persist)
    prepared = fold_record(saved[:1])
    assert isinstance(saved[0], ev.BatchPrepared)
    assert (prepared["contract"], prepared["batch_state"], prepared["branch"]) == (
        "assurance_kernel/batch_run_state/v2", "prepared", f"imm/{SLUG}")
    assert prepared["commits"] == []
    assert [{k: c[k] for k in ("state", "reason", "commit", "lane", "qa_failures")} for c in prepared["children"]] \
        == [{"state": "pending", "reason": None, "commit": None, "lane": None, "qa_failures": 0}] * 2
    assert fold_record(saved)["batch_state"] == "running"  # the first tick moved it and persisted that
    assert outcome.batch.batch_state == "running"


# ---------------------------------------------------------------- LANE-SER-02 (the batch capability)


def capability(max_children: int = 2) -> BatchCapability:
    children = plan_children(("task-a", []), ("task-b", ["task-a"]))
    return BatchCapability(authorization=authorization(children, max_children=max_children), initiative_slug=SLUG)


def binding_of(granted: BatchCapability, **changes: Any) -> Binding:
    values = dict(batch_id="batch-001", plan_digest=granted.authorization.plan_digest, base_head=BASE,
                  initiative_slug=SLUG, budget=granted.authorization.budget)
    values.update(changes)
    return Binding(**values)


def test_ser02_the_plan_digest_is_stable_under_key_order_and_moves_with_order_and_revision():
    children = plan_children(("task-a", []), ("task-b", ["task-a"]))
    reordered = [dict(reversed(list(child.plain().items()))) for child in children]
    assert compute_batch_plan_digest(reordered) == compute_batch_plan_digest(children)
    assert compute_batch_plan_digest(list(reversed(children))) != compute_batch_plan_digest(children)
    revised = [children[0], ev.PlanChild(**{**children[1].plain(), "intent_revision": 2})]
    assert compute_batch_plan_digest(revised) != compute_batch_plan_digest(children)


def test_ser02_a_capability_covers_only_its_own_binding():
    granted = capability()
    assert granted.validate(binding_of(granted)) == granted.issued_at
    for changes, message in [
        ({"batch_id": "batch-002"}, "batch authorization covers batch batch-001, not batch-002"),
        ({"initiative_slug": "other"}, "batch authorization covers another Initiative"),
        ({"plan_digest": "sha256:" + "f" * 64}, "batch plan digest does not match the confirmed child plan"),
        ({"base_head": "c" * 40}, "batch authorization base_head does not match"),
        ({"budget": ev.Budget(max_children=1, qa_failure_limit=3)}, "batch authorization budget does not match"),
    ]:
        with pytest.raises(AuthorizationError) as refused:
            granted.validate(binding_of(granted, **changes))
        assert str(refused.value) == message
    assert granted.consumed == set()  # validating consumes nothing


def test_ser02_each_child_consumes_one_slot_once():
    granted = capability(max_children=1)
    granted.consume_child("task-a")
    assert granted.is_child_consumed("task-a") and not granted.is_child_consumed("task-b")
    for task_id, message in [("task-z", "batch_child_not_in_plan: task-z"),
                             ("task-a", "batch_child_slot_consumed: task-a"),
                             ("task-b", "max_children budget exhausted (1)")]:
        with pytest.raises(AuthorizationError) as refused:
            granted.consume_child(task_id)
        assert str(refused.value) == message
    assert granted.consumed == {"task-a"}


def test_ser02_an_empty_plan_cannot_be_confirmed_and_confirmations_only_move_forward():
    initiative = Initiative.register(at="2026-01-01T00:00:00.000Z", slug=SLUG)
    granted = authorization(plan_children(("task-a", [])))
    terms = dict(batch_id="batch-001", plan_digest=granted.plan_digest, base_head=BASE, branch=f"imm/{SLUG}",
                 budget=granted.budget, max_parallel=1, confirmation_ref="confirm", final_verification=None,
                 delegate_revisions=False, resumes=False)
    with pytest.raises(TransitionRefused, match="no enrollable children"):
        initiative.authorize(at="2026-01-02T00:00:00.000Z", children=[], **terms)
    initiative.authorize(at="2026-01-02T00:00:00.000Z", children=list(granted.children), **terms)
    with pytest.raises(TransitionRefused, match="must be newer"):
        initiative.authorize(at="2026-01-02T00:00:00.000Z", children=list(granted.children), **terms)
    assert [a.confirmation_time for a in initiative.authorizations] == ["2026-01-02T00:00:00.000Z"]



# ---------------------------------------------------------------- tests/SCENARIOS.md


def scenario_rows() -> list[tuple[str, str]]:
    """(scenario id, tests cell) of each row of the coverage map."""
    text = (PROJECT / "tests" / "SCENARIOS.md").read_text(encoding="utf-8")
    return [(match.group(1), match.group(2)) for match in
            re.finditer(r"^\| (LANE-[A-Z]+-\d+) \| .*? \| (.*) \|$", text, re.MULTILINE)]


def functions_of(relative: str) -> dict[str, str]:
    """Each test function of a file with the source text of its name, docstring and body."""
    source = (PROJECT / relative).read_text(encoding="utf-8")
    lines = source.splitlines()
    return {node.name: "\n".join(lines[node.lineno - 1:node.end_lineno]) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}


def test_the_scenario_map_points_at_tests_that_exist():
    rows = scenario_rows()
    ids = [scenario for scenario, _ in rows]
    assert len(ids) == len(set(ids)) == 154  # every heading of scenarios.md, once
    sources: dict[str, dict[str, str]] = {}
    for scenario, cell in rows:
        references = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", cell)
        assert references or cell.startswith("not applicable: "), scenario
        short = re.sub(r"LANE-([A-Z]+)-(\d+)", lambda m: m.group(1).lower() + m.group(2), scenario)
        for relative, name in references:
            functions = sources.setdefault(relative, functions_of(relative))
            assert name in functions, f"{scenario}: {relative}::{name} does not exist"
            assert scenario in functions[name] or re.search(rf"(^|_){short}(_|$)", name), \
                f"{scenario}: {relative}::{name} does not name its scenario"
