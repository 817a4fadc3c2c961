"""The v2 record validator against LANE-REC-06's invariants (docs/upstream.md#the-run-state-record-and-its-validator), as negative cases."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from lanes_es.domain.validator import InvalidRecord, validate_record

BATCH = "batch-001"
T0 = "2026-01-01T00:00:00.000Z"


def lane(lane_commit: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"path": "/lanes/a", "branch": "imm-lane/s/a", "base_head": "base", "lane_commit": lane_commit, **extra}


def valid_record() -> dict[str, Any]:
    return {
        "contract": "assurance_kernel/batch_run_state/v2", "batch_id": BATCH, "initiative_slug": "s",
        "plan_digest": "sha256:abc", "base_head": "base", "branch": "imm/s", "confirmation_time": T0,
        "budget": {"max_children": 3, "qa_failure_limit": 2}, "max_parallel": 2, "batch_state": "running",
        "children": [
            {"task_id": "a", "slice_id": "S1", "blocked_by": [], "state": "integrated", "reason": None, "commit": "c1",
             "lane": lane("l1", run_id="run-1"), "qa_failures": 0, "tracker_closed": True},
            {"task_id": "b", "slice_id": "S2", "blocked_by": ["a"], "state": "enrolled", "reason": None,
             "commit": None, "lane": lane(), "qa_failures": 1, "corrections": 1, "correction_due": "QA failure limit reached"},
            {"task_id": "c", "slice_id": "S3", "blocked_by": ["b"], "state": "pending", "reason": None, "commit": None,
             "lane": None, "qa_failures": 0},
        ],
        "commits": ["c1"], "created_at": T0, "updated_at": T0,
        "adopted_heads": [{"from": "c1", "to": "c2"}],
        "restores": [{"at": T0, "backup": ".imm/state/batches/restores/x", "paths": []}],
        "final_verification": ["make check"],
        "interventions": [{"at": T0, "task_id": "b", "kind": "correction", "text": "t", "text_digest": "sha256:1"}],
    }


def test_the_baseline_record_is_valid():
    validate_record(valid_record(), BATCH)


def child(record: dict[str, Any], task_id: str) -> dict[str, Any]:
    return next(c for c in record["children"] if c["task_id"] == task_id)


def setter(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set a top-level key, or `<task>.<key>` on a child, or `<task>.lane.<key>` on its lane."""
    def apply(record: dict[str, Any]) -> None:
        parts = path.split(".")
        target = record if len(parts) == 1 else child(record, parts[0])
        if len(parts) == 3:
            target = target["lane"]
        if value is DELETE:
            del target[parts[-1]]
        else:
            target[parts[-1]] = value
    return apply


DELETE = object()


MUTATIONS = [
    # record level
    (setter("contract", "assurance_kernel/batch_run_state/v1"), "has an unknown contract"),
    (setter("batch_id", "batch-002"), "carries batch_id batch-002"),
    (setter("plan_digest", ""), "has an invalid plan_digest"),
    (setter("base_head", ""), "has an invalid base_head"),
    (setter("base_head", None), "has an invalid base_head"),
    (setter("branch", ""), "has an invalid branch"),
    (setter("branch", 5), "has an invalid branch"),
    (setter("confirmation_time", "2026-01-01T00:00:00Z"), "has an invalid confirmation_time"),
    (setter("confirmation_time", "2026-02-30T00:00:00.000Z"), "has an invalid confirmation_time"),
    (setter("created_at", "yesterday"), "has invalid state timestamps"),
    (setter("updated_at", DELETE), "has invalid state timestamps"),
    (setter("children", []), "has no children"),
    (setter("children", {}), "has no children"),
    (setter("batch_state", "paused"), "has an invalid batch_state"),
    (setter("max_parallel", 0), "has an invalid max_parallel"),
    (setter("max_parallel", 1.5), "has an invalid max_parallel"),
    (setter("max_parallel", 2**53), "has an invalid max_parallel"),
    (setter("max_parallel", True), "has an invalid max_parallel"),
    (setter("budget", {"max_children": 0, "qa_failure_limit": 2}), "has an invalid budget"),
    (setter("budget", {"max_children": 1, "qa_failure_limit": 1.5}), "has an invalid budget"),
    (setter("budget", None), "has an invalid budget"),
    (setter("commits", ["c1", 2]), "has an invalid commits list"),
    (setter("commits", "c1"), "has an invalid commits list"),
    (setter("adopted_heads", [{"from": "c1", "to": ""}]), "has an invalid adopted_heads list"),
    (setter("adopted_heads", [{"from": "c1"}]), "has an invalid adopted_heads list"),
    (setter("restores", [{"backup": 1, "paths": []}]), "has an invalid restores list"),
    (setter("final_verification", []), "has an invalid final_verification list"),
    (setter("final_verification", [""]), "has an invalid final_verification list"),
    (setter("interventions", [{"task_id": "b", "kind": "order", "text": "t", "text_digest": "d"}]),
     "has an invalid interventions list"),
    # each child
    (setter("children", [None]), "has an invalid child entry"),
    (setter("a.task_id", ""), "has an invalid child entry"),
    (setter("a.slice_id", DELETE), "has an invalid child entry"),
    (setter("a.state", "committed"), "child a has an invalid state"),
    (setter("c.blocked_by", [1]), "child c has an invalid blocked_by"),
    (setter("c.blocked_by", "b"), "child c has an invalid blocked_by"),
    (setter("c.reason", 5), "child c has invalid terminal fields"),
    (setter("c.commit", DELETE), "child c has invalid terminal fields"),
    (setter("c.qa_failures", -1), "child c has an invalid qa_failures"),
    (setter("c.qa_failures", 0.5), "child c has an invalid qa_failures"),
    (setter("b.corrections", 3), "child b has an invalid corrections count"),
    (setter("b.correction_due", ""), "child b has an invalid correction_due"),
    (setter("c.correction_due", "QA failure limit reached"), "child c has an invalid correction_due"),
    (setter("a.tracker_closed", False), "child a closed its tracker Issue before integration"),
    (setter("b.tracker_closed", True), "child b closed its tracker Issue before integration"),
    (setter("a.lane", "x"), "child a has an invalid lane"),
    (setter("a.lane", DELETE), "child a has an invalid lane"),
    (setter("a.lane.path", ""), "child a has an invalid lane"),
    (setter("a.lane.branch", None), "child a has an invalid lane"),
    (setter("a.lane.base_head", ""), "child a has an invalid lane"),
    (setter("a.lane.lane_commit", 5), "child a has an invalid lane"),
    (setter("a.lane.run_id", ""), "child a has an invalid lane"),
    (setter("b.lane", None), "child b is enrolled without a lane"),
    (setter("c.lane", lane()), "child c is pending but holds a lane"),
    (setter("a.commit", None), "child a is integrated without a commit"),
    (setter("a.lane.lane_commit", None), "child a is integrated without a lane commit"),
    (setter("b.commit", "c1"), "child b has a commit but is not integrated"),
    (setter("c.state", "skipped_blocked"), "child c needs a terminal reason"),
    (setter("c.reason", None), None),  # a pending child may have no reason
    (setter("a.commit", "c9"), "child a commit is missing from commits"),
]


@pytest.mark.parametrize("mutate, fragment", MUTATIONS, ids=range(len(MUTATIONS)))
def test_rec06_each_invariant_is_enforced(mutate, fragment):
    record = valid_record()
    mutate(record)
    if fragment is None:
        validate_record(record, BATCH)
        return
    with pytest.raises(InvalidRecord) as raised:
        validate_record(record, BATCH)
    message = str(raised.value)
    assert message.startswith(f"batch run state {BATCH} "), message
    assert fragment in message, message


def test_rec06_lane_committed_needs_a_lane_commit():
    record = valid_record()
    child(record, "b").pop("correction_due")
    child(record, "b")["state"] = "lane_committed"
    with pytest.raises(InvalidRecord, match="child b is lane_committed without a lane commit"):
        validate_record(record, BATCH)
    child(record, "b")["lane"]["lane_commit"] = "l2"
    validate_record(record, BATCH)


def test_rec06_needs_human_needs_a_terminal_reason():
    record = valid_record()
    child(record, "b").pop("correction_due")
    child(record, "b")["state"] = "needs_human"
    with pytest.raises(InvalidRecord, match="child b needs a terminal reason"):
        validate_record(record, BATCH)
    child(record, "b")["reason"] = "batch_lane_lost"
    validate_record(record, BATCH)


def test_rec06_duplicate_children_are_refused():
    record = valid_record()
    record["children"].append(copy.deepcopy(child(record, "c")))
    with pytest.raises(InvalidRecord, match="has a duplicate child c"):
        validate_record(record, BATCH)


@pytest.mark.parametrize("state", ["budget_stopped", "failed", "rejected", "superseded"])
def test_rec06_a_settled_batch_with_a_child_mid_flight_is_refused(state):
    """Ports LANE-DISP-09."""
    record = valid_record()
    record["batch_state"] = state
    with pytest.raises(InvalidRecord, match=f"is {state} but a child is still mid-flight"):
        validate_record(record, BATCH)
    for entry in record["children"]:
        entry.pop("correction_due", None)
        if entry["state"] == "enrolled":
            entry["state"], entry["reason"] = "needs_human", "parked"
    validate_record(record, BATCH)


def test_rec06_completed_needs_every_child_integrated():
    record = valid_record()
    record["batch_state"] = "completed"
    with pytest.raises(InvalidRecord, match="is completed but a child is not integrated"):
        validate_record(record, BATCH)


def test_the_first_broken_rule_names_the_refusal():
    record = valid_record()
    record["plan_digest"] = ""
    record["children"] = []
    with pytest.raises(InvalidRecord, match="invalid plan_digest"):
        validate_record(record, BATCH)


def test_a_record_that_is_not_an_object_is_refused():
    with pytest.raises(InvalidRecord, match=f"^batch run state {BATCH} is not an object$"):
        validate_record([], BATCH)


# Divergence found while porting LANE-REC-06: upstream compares `String(state)` against its sets, so any
# value is refused with "has an invalid ...". The Python validator tests membership in a frozenset, which
# raises TypeError for an unhashable value (a hand-edited file with "batch_state": []). Reported, not fixed
# here (validator.py is not this change's file); strict, so the fix turns these into failures to remove.
@pytest.mark.parametrize("mutate", [setter("batch_state", []), setter("a.state", {"x": 1})])
def test_an_unhashable_state_is_refused_as_invalid(mutate):
    record = valid_record()
    mutate(record)
    with pytest.raises(InvalidRecord):
        validate_record(record, BATCH)
