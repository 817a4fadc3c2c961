"""Delegated in-Lane Intent revisions (docs/upstream.md#delegated-intent-revisions) on real repositories and the reference kernel:
the grant at confirmation (LANE-DEL-05/07), in-bounds revisions applied in the Lane as a delegated
approval (LANE-DEL-05), out-of-bounds ones refused with the Lane untouched (LANE-DEL-06), and the
reseal of plan_digest at integration, only for the delegated revision (LANE-DEL-08).

task-a's scope holds `docs/plans`, as in upstream's fixture: a revised sidecar is part of the
lane commit only when the scope covers it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lanes_es.domain.inputs import parse_lane_revision
from lanes_es.domain.intent import canonical_intent_hash
from lanes_es.tick_input import RevisionInput
from tests.engine import Engine, Task
from tests.engine_more import confirm_again, enroll, lane_record, make_engine, state_bytes
from tests.gitfixtures import git_out, run_git, write_file
from lanes_es.usecases.confirmation import prepare_confirmation
from lanes_es.usecases.load import initiative

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")

FALLBACK = ("the Executor requests approve_breaking_intent_revision through its own native gate "
            "for the user to answer")
SIDECAR = "docs/plans/task-a.intent.json"


def delegated_pair(tmp_path: Path, delegate: bool = True) -> Engine:
    engine = make_engine(tmp_path, {"task-a": Task(["docs/plans", "a.txt"]),
                                    "task-b": Task(["b.txt"], blocked_by=["task-a"])})
    engine.authorize(delegate_revisions=delegate)
    enroll(engine, "task-a")
    assert engine.states() == ["enrolled", "pending"]
    return engine


def authorized_intent(engine: Engine) -> dict[str, Any]:
    return json.loads(Path(engine.root, SIDECAR).read_text())


def revision(engine: Engine, **changes: Any) -> RevisionInput:
    """A lane_revision of task-a as the CLI and MCP parse it: revision 2 with A1 reworded, plus `changes`."""
    intent = authorized_intent(engine)
    reworded = [{**intent["acceptance"][0], "assertion": "task-a holds, said better"}]
    next_intent = {**intent, "revision": 2, "acceptance": reworded, **changes}
    parsed = parse_lane_revision({"task_id": "task-a", "next_intent": next_intent})
    return RevisionInput(task_id=parsed.task_id, next_intent=parsed.next_intent)


def lane_sidecar(engine: Engine) -> bytes:
    return Path(engine.lane("task-a"), SIDECAR).read_bytes()


def staged(engine: Engine) -> str:
    return git_out(engine.lane("task-a"), "diff", "--cached", "--name-only")


def test_an_in_bounds_breaking_revision_is_a_delegated_approval_traceable_to_the_batch(tmp_path):  # LANE-DEL-05
    engine = delegated_pair(tmp_path)
    authorization = initiative(engine.deps, engine.slug).current
    assert engine.batch.record["revision_delegation"] == {"confirmation_time": authorization.confirmation_time}
    request = revision(engine)
    report = engine.tick(revision=request)
    assert report["lane_revision"] == {"task_id": "task-a", "accepted": True, "reason": None}
    ref = f"delegated-batch:{engine.batch.id}@{authorization.confirmation_time}"
    content_hash = canonical_intent_hash(request.next_intent)
    assert report["delegated_revisions"] == engine.batch.record["delegated_revisions"]
    [entry] = engine.batch.record["delegated_revisions"]
    assert {k: v for k, v in entry.items() if k != "at"} == {
        "task_id": "task-a", "from_revision": 1, "to_revision": 2, "intent_content_hash": content_hash,
        "confirmation_ref": ref}
    record = lane_record(engine, "task-a")
    assert record["intent_snapshot"]["revision"] == 2
    assert record["intent_ref"] == {"path": SIDECAR, "revision": 2, "content_hash": content_hash}
    assert record["history"][-1]["type"] == "approve_breaking_intent_revision"
    assert record["history"][-1]["authority"] == {"authority_kind": "user", "actor_id": "batch-coordinator",
                                                  "confirmation_ref": ref}
    # the revised sidecar is written in the Lane as 2-space JSON and staged for the lane commit
    assert json.loads(lane_sidecar(engine)) == request.next_intent
    assert lane_sidecar(engine).endswith(b"}\n") and b'\n  "task_id"' in lane_sidecar(engine)
    assert staged(engine) == SIDECAR
    assert engine.states() == ["enrolled", "pending"]


@pytest.mark.parametrize("fresh_confirmation", [False, True], ids=["same_authorization", "fresh_confirmation"])
def test_plan_digest_is_resealed_at_integration_for_the_delegated_revision_and_the_batch_goes_on(
        tmp_path, fresh_confirmation):  # LANE-DEL-08
    engine = delegated_pair(tmp_path)
    old_digest = engine.batch.record["plan_digest"]
    request = revision(engine)
    engine.tick(revision=request)
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    record = engine.batch.record
    assert engine.states() == ["integrated", "pending"]
    [reseal] = record["reseals"]
    content_hash = canonical_intent_hash(request.next_intent)
    assert {k: v for k, v in reseal.items() if k not in ("at", "to_digest")} == {
        "task_id": "task-a", "from_digest": old_digest, "intent_revision": 2, "intent_content_hash": content_hash}
    assert record["plan_digest"] == reseal["to_digest"] != old_digest
    assert record["intent_identities"]["task-a"] == {"intent_path": SIDECAR, "intent_revision": 2,
                                                     "intent_content_hash": content_hash}
    assert report["reseals"] == record["reseals"] and report["commits"] == record["commits"]
    assert json.loads(git_out(engine.root, "show", f"imm/{engine.slug}:{SIDECAR}"))["revision"] == 2
    # a fresh confirmation would confirm the resealed plan; with or without one the dependent runs on
    assert prepare_confirmation(engine.deps, engine.slug).plan_digest == reseal["to_digest"]
    if fresh_confirmation:
        confirm_again(engine)
    report = engine.tick()
    assert report["batch_state"] == "running"
    lane = engine.provision("task-b", report)
    engine.tick(offers={"task-b": lane})
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert report["commits"] == record["commits"] + [report["children"][1]["commit"]]
    assert engine.batch.record["reseals"] == [reseal]


def test_no_reseal_for_a_revision_the_delegation_did_not_approve(tmp_path):  # LANE-DEL-08, only the delegated one
    engine = delegated_pair(tmp_path)
    old_digest = engine.batch.record["plan_digest"]
    engine.tick(revision=revision(engine))
    # the Executor then rewrites the sidecar to another revision the coordinator never approved
    other = {**authorized_intent(engine), "revision": 3, "goal": "Deliver task-a"}
    other["acceptance"] = [{**other["acceptance"][0], "assertion": "task-a holds, said differently"}]
    write_file(engine.lane("task-a"), SIDECAR, json.dumps(other, indent=2) + "\n")
    engine.deliver("task-a", "a.txt", "a\n")
    report = engine.tick()
    assert engine.states() == ["integrated", "pending"]
    assert json.loads(git_out(engine.root, "show", f"imm/{engine.slug}:{SIDECAR}"))["revision"] == 3
    assert "reseals" not in engine.batch.record and "reseals" not in report
    assert engine.batch.record["plan_digest"] == old_digest
    assert engine.batch.record["intent_identities"]["task-a"]["intent_revision"] == 1


def refused(engine: Engine, request: RevisionInput, fragment: str) -> None:
    """The revision is refused with upstream's prefix and fallback, and nothing moved anywhere."""
    sidecar, record, state = lane_sidecar(engine), lane_record(engine, "task-a"), state_bytes(engine)
    report = engine.tick(revision=request)
    outcome = report["lane_revision"]
    assert outcome["accepted"] is False
    assert outcome["reason"].startswith("batch_delegation_refused: ") and fragment in outcome["reason"]
    assert outcome["fallback"] == FALLBACK
    assert lane_sidecar(engine) == sidecar and staged(engine) == ""
    assert lane_record(engine, "task-a") == record and record["intent_snapshot"]["revision"] == 1
    assert state_bytes(engine) == state
    assert "delegated_revisions" not in engine.batch.record


def test_out_of_bounds_revisions_are_refused_and_the_lane_is_untouched(tmp_path):  # LANE-DEL-06
    engine = delegated_pair(tmp_path)
    intent = authorized_intent(engine)
    refused(engine, revision(engine, scope_hint=["a.txt", "b.txt", "docs/plans"]),
            "widening scope_hint is outside the delegation: b.txt")
    refused(engine, revision(engine, risk="material"), "a risk change is outside the delegation")
    additive = intent["acceptance"] + [{"id": "A2", "assertion": "more holds", "verification": intent["acceptance"][0]["verification"]}]
    refused(engine, revision(engine, acceptance=additive), "only a breaking revision needs this approval")
    refused(engine, revision(engine, goal="Deliver something else"),
            "goal, owner and task identity are outside the delegation")
    refused(engine, revision(engine, revision=1), "the revision number must increase")


def test_without_the_grant_every_revision_is_refused(tmp_path):  # LANE-DEL-07
    engine = delegated_pair(tmp_path, delegate=False)
    assert "revision_delegation" not in engine.batch.record
    refused(engine, revision(engine), "this batch's confirmation did not delegate Intent revisions")


def test_a_child_not_running_in_its_lane_is_refused(tmp_path):  # LANE-DEL-07
    engine = delegated_pair(tmp_path)
    request = revision(engine)
    other = RevisionInput(task_id="task-b", next_intent={**request.next_intent, "task_id": "task-b"})
    report = engine.tick(revision=other)
    assert report["lane_revision"]["reason"] == "batch_delegation_refused: task-b is not running in its Lane"


def test_a_fresh_confirmation_withdraws_or_replaces_the_grant_at_once(tmp_path):
    engine = delegated_pair(tmp_path)
    confirm_again(engine, delegate_revisions=False)
    engine.tick()
    assert "revision_delegation" not in engine.batch.record
    refused(engine, revision(engine), "did not delegate")
    fresh = confirm_again(engine, delegate_revisions=True)
    report = engine.tick(revision=revision(engine))
    assert engine.batch.record["revision_delegation"] == {"confirmation_time": fresh.confirmation_time}
    assert report["lane_revision"]["accepted"] is True
    assert engine.batch.record["delegated_revisions"][0]["confirmation_ref"] == (
        f"delegated-batch:{engine.batch.id}@{fresh.confirmation_time}")


def test_a_lane_without_an_active_run_refuses_in_the_kernel_and_keeps_its_sidecar(tmp_path):
    engine = delegated_pair(tmp_path)
    Path(engine.lane("task-a"), ".imm/state/kernel/claim.json").unlink()
    sidecar = lane_sidecar(engine)
    report = engine.tick(revision=revision(engine))
    assert report["lane_revision"]["reason"].startswith("batch_delegation_refused: the Lane at ")
    assert "holds no active run of task-a" in report["lane_revision"]["reason"]
    assert lane_sidecar(engine) == sidecar and staged(engine) == ""
    assert report["children"][0]["reason"] == "batch_lane_lost"  # observed after the decision, as upstream


def test_a_lane_without_a_task_record_refuses_before_the_kernel_and_keeps_its_sidecar(tmp_path):
    """docs/upstream.md#delegated-intent-revisions: the revision is judged against the Lane's TaskRecord's intent_snapshot; without a
    record there is nothing to judge it by: "the Lane has no TaskRecord for <task>"."""
    from tests.engine_more import record_path

    engine = delegated_pair(tmp_path)
    record_path(engine, "task-a").unlink()
    sidecar = lane_sidecar(engine)
    report = engine.tick(revision=revision(engine))
    assert report["lane_revision"] == {"task_id": "task-a", "accepted": False,
                                       "reason": "batch_delegation_refused: the Lane has no TaskRecord for task-a",
                                       "fallback": FALLBACK}
    assert lane_sidecar(engine) == sidecar and staged(engine) == ""
    assert not engine.batch.record.get("delegated_revisions")


def test_a_failed_record_write_puts_the_prior_sidecar_back(tmp_path, monkeypatch):
    from lanes_es.adapters import kernel as kernel_module

    engine = delegated_pair(tmp_path)
    sidecar, record = lane_sidecar(engine), lane_record(engine, "task-a")

    def full_disk(self: Any, record: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kernel_module.LaneStore, "write_record", full_disk)
    report = engine.tick(revision=revision(engine))
    assert report["lane_revision"]["reason"] == ("batch_delegation_refused: the delegated revision of task-a was "
                                                 "not applied: No space left on device")
    assert lane_sidecar(engine) == sidecar and staged(engine) == ""
    assert lane_record(engine, "task-a") == record
    assert "delegated_revisions" not in engine.batch.record
    run_git(engine.lane("task-a"), "diff", "--quiet")  # the worktree matches the index again


def test_a_revision_approved_in_the_lane_but_not_recorded_is_adopted_on_the_next_tick(tmp_path):
    """A crash between the kernel's approval and the batch's record: the same lane_revision again adopts the
    Lane's approval once, instead of refusing it as no longer breaking (issue 3, convergence)."""
    from lanes_es.adapters.kernel import ReferenceKernel

    engine = delegated_pair(tmp_path)
    authorization = initiative(engine.deps, engine.slug).current
    ref = f"delegated-batch:{engine.batch.id}@{authorization.confirmation_time}"
    request = revision(engine)
    applied = ReferenceKernel(clock=engine.deps.now).apply_delegated_revision(
        engine.lane("task-a"), "task-a", request.next_intent, ref, engine.deps.now())
    assert applied[:2] == (1, 2)
    history = len(lane_record(engine, "task-a")["history"])
    report = engine.tick(revision=request)
    assert report["lane_revision"] == {"task_id": "task-a", "accepted": True, "reason": None}
    assert [(r["from_revision"], r["to_revision"]) for r in engine.batch.record["delegated_revisions"]] == [(1, 2)]
    assert len(lane_record(engine, "task-a")["history"]) == history  # not approved a second time
    again = engine.tick(revision=request)
    assert again["lane_revision"]["accepted"] is False
    assert "only a breaking revision" in again["lane_revision"]["reason"]
    assert len(engine.batch.record["delegated_revisions"]) == 1
