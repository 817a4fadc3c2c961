"""The reference kernel on real git worktrees: enrollment into the Lane's own store (LANE-ENR-03),
refusals that write nothing, the submit / QA / review / stop lifecycle, the audit pair and the
tombstone reader."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from itertools import count
from pathlib import Path

import pytest

from lanes_es.adapters.batch_git import GitBatch, SettledEvidence
from lanes_es.adapters.git import STATS
from lanes_es.adapters.delivery import worktree_delivery
from lanes_es.adapters.kernel import ReferenceKernel
from lanes_es.domain import events as ev
from lanes_es.domain.audit_pair import verify_pair
from lanes_es.domain.authority import BatchCapability, BatchEnrollment
from lanes_es.domain.intent import canonical_intent_hash, parse_task_intent
from lanes_es.ports import KernelError
from lanes_es.tick import lane_unreadable_reason
from tests.gitfixtures import (
    add_lane,
    checkout_batch_branch,
    commit_all,
    commit_file,
    git_out,
    head,
    intent_json,
    make_repo,
    porcelain,
    requires_file,
    write_file,
)

SLUG = "initiative-slug"
BATCH = "batch-001"


def clock():
    """Canonical timestamps one second apart, so every change has its own time."""
    ticks = count()
    return lambda: f"2026-05-01T10:00:{next(ticks):02d}.000Z"


def plan_child(task_id: str, intent: dict, slice_id: str = "S1") -> ev.PlanChild:
    return ev.PlanChild(task_id=task_id, slice_id=slice_id, blocked_by=[],
                        intent_path=f"docs/plans/{task_id}.intent.json", intent_revision=intent["revision"],
                        intent_content_hash=canonical_intent_hash(parse_task_intent(intent)))


def capability(children: list[ev.PlanChild], base: str, max_children: int | None = None) -> BatchCapability:
    granted = ev.BatchAuthorized(
        originator_id=f"initiative:{SLUG}", originator_version=2, timestamp=datetime.now(timezone.utc),
        at="2026-05-01T09:00:00.000Z", batch_id=BATCH, plan_digest="sha256:test", base_head=base,
        branch=f"imm/{SLUG}", budget=ev.Budget(max_children=max_children or len(children), qa_failure_limit=2),
        max_parallel=2, children=children, confirmation_time="2026-05-01T09:00:00.000Z", confirmation_ref="confirm")
    return BatchCapability(authorization=granted, initiative_slug=SLUG)


class World:
    """A coordinator on imm/<slug>, intents committed at base, and Lanes made as a steward would."""

    def __init__(self, tmp_path: Path, intents: dict[str, dict], gitignore: str = ".imm/state/\n") -> None:
        self.tmp_path = tmp_path
        self.intents = intents
        self.root = make_repo(tmp_path / "repo", intents=intents, gitignore=gitignore)
        self.base = checkout_batch_branch(self.root, SLUG)
        self.kernel = ReferenceKernel(clock=clock())
        self.capability = capability([plan_child(task, intent) for task, intent in intents.items()], self.base)

    def lane(self, task_id: str) -> str:
        return add_lane(self.root, SLUG, task_id, self.tmp_path / "lanes")

    def enrollment(self, expected_head: str | None = None) -> BatchEnrollment:
        return BatchEnrollment(capability=self.capability, batch_id=BATCH, expected_head=expected_head or self.base)

    def enroll(self, task_id: str) -> str:
        lane = self.lane(task_id)
        self.kernel.enroll_task(lane, task_id, self.enrollment())
        return lane


def store_files(lane: str) -> list[str]:
    store = Path(lane, ".imm/state/kernel")
    return sorted(str(path.relative_to(store)) for path in store.rglob("*")) if store.exists() else []


def history_types(lane: str, task_id: str) -> list[str]:
    record = json.loads(Path(lane, f".imm/state/kernel/tasks/{task_id}.json").read_text())
    return [entry["type"] for entry in record["history"]]


@pytest.fixture
def world(tmp_path):
    return World(tmp_path, {"task-a": intent_json("task-a", ["a.txt"]), "task-b": intent_json("task-b", ["b.txt"])})


# ---------------------------------------------------------------- enrollment


def test_enrollment_writes_into_the_lanes_own_store_not_the_coordinators(world):
    """Ports LANE-ENR-03."""
    lane = world.lane("task-a")
    assert world.kernel.active_claim_task_id(lane) is None
    world.kernel.enroll_task(lane, "task-a", world.enrollment())
    assert world.kernel.active_claim_task_id(lane) == "task-a"
    assert world.kernel.active_claim_task_id(world.root) is None
    assert Path(lane, ".imm/state/kernel/tasks/task-a.json").is_file()
    assert not Path(world.root, ".imm").exists()
    assert world.capability.is_child_consumed("task-a")


def test_an_enrolled_task_projects_an_active_owned_run(world):
    lane = world.enroll("task-a")
    projection = world.kernel.project_task(lane, "task-a")
    assert projection.error is None
    assert projection.claim_task_id == "task-a"
    assert projection.run_id.startswith("run-") and len(projection.run_id) == 40
    assert (projection.record_revision, projection.lifecycle, projection.artifact_state,
            projection.next_obligation, projection.completion_ready) == (1, "active", "active", "submit_assurance",
                                                                          False)
    claim = json.loads(Path(lane, ".imm/state/kernel/claim.json").read_text())
    assert {key: claim[key] for key in ("task_id", "run_id", "batch_id")} == \
        {"task_id": "task-a", "run_id": projection.run_id, "batch_id": BATCH}
    assert claim["claimed_at"] == "2026-05-01T10:00:00.000Z"


def test_the_store_is_written_0600_and_keeps_the_lane_clean_even_when_git_does_not_ignore_it(tmp_path):
    world = World(tmp_path, {"task-a": intent_json("task-a", ["a.txt"])}, gitignore="# nothing ignored\n")
    lane = world.enroll("task-a")
    assert porcelain(lane) == ""
    assert os.stat(Path(lane, ".imm/state/kernel/claim.json")).st_mode & 0o777 == 0o600
    assert os.stat(Path(lane, ".imm/state/kernel/tasks/task-a.json")).st_mode & 0o777 == 0o600


def test_enrollment_costs_one_git_spawn(world):
    lane = world.lane("task-a")
    before = STATS.spawns
    world.kernel.enroll_task(lane, "task-a", world.enrollment())
    assert STATS.spawns - before == 1


def test_a_lane_whose_head_is_not_the_expected_head_is_refused_with_nothing_written(world):
    """Ports LANE-LIN-05."""
    lane = world.lane("task-a")
    moved = commit_file(lane, "extra.txt", "x\n")
    with pytest.raises(KernelError) as refused:
        world.kernel.enroll_task(lane, "task-a", world.enrollment())
    assert str(refused.value) == (f"batch_head_lineage_broken: current HEAD {moved} does not match "
                                  f"expected_head {world.base}")
    assert store_files(lane) == []
    assert not world.capability.is_child_consumed("task-a")


def test_a_changed_intent_is_refused_with_nothing_written(world):
    """Ports LANE-SER-02."""
    lane = world.lane("task-a")
    changed = intent_json("task-a", ["a.txt"], goal="Something else")
    commit_file(lane, "docs/plans/task-a.intent.json", json.dumps(changed))
    with pytest.raises(KernelError) as refused:
        world.kernel.enroll_task(lane, "task-a", world.enrollment(expected_head=head(lane)))
    assert str(refused.value) == "batch_child_intent_changed: task-a"
    assert store_files(lane) == []
    assert not world.capability.is_child_consumed("task-a")


@pytest.mark.parametrize("damage", ["absent", "untracked_edit", "symlink", "invalid"])
def test_an_unreadable_intent_is_refused_with_nothing_written(world, damage):
    lane = world.lane("task-a")
    sidecar = Path(lane, "docs/plans/task-a.intent.json")
    expected = world.base
    if damage == "absent":
        sidecar.unlink()
        expected = commit_all(lane, "edit intent", batch_identity=False)
    elif damage == "untracked_edit":
        sidecar.write_text(sidecar.read_text().replace("Deliver", "Deliver more"))
    elif damage == "symlink":
        target = write_file(lane, "elsewhere.json", sidecar.read_text())
        sidecar.unlink()
        os.symlink(target, sidecar)
        expected = commit_all(lane, "edit intent", batch_identity=False)
    else:
        sidecar.write_text("{not json")
        expected = commit_all(lane, "edit intent", batch_identity=False)
    with pytest.raises(KernelError) as refused:
        world.kernel.enroll_task(lane, "task-a", world.enrollment(expected_head=expected))
    assert str(refused.value) == "batch_child_intent_changed: task-a intent sidecar is unreadable"
    assert store_files(lane) == []


def test_capability_refusals_are_upstreams_and_write_nothing(world):
    """Ports LANE-SER-02."""
    lane = world.lane("task-a")
    with pytest.raises(KernelError, match="^batch_child_not_in_plan: task-z$"):
        world.kernel.enroll_task(lane, "task-z", world.enrollment())
    world.capability.consumed.add("task-a")
    with pytest.raises(KernelError, match="^batch_child_slot_consumed: task-a$"):
        world.kernel.enroll_task(lane, "task-a", world.enrollment())
    assert store_files(lane) == []


def test_an_exhausted_budget_is_refused(tmp_path):
    """Ports LANE-SER-02."""
    intents = {"task-a": intent_json("task-a", ["a.txt"]), "task-b": intent_json("task-b", ["b.txt"])}
    world = World(tmp_path, intents)
    world.capability = capability([plan_child(t, i) for t, i in intents.items()], world.base, max_children=1)
    world.capability.consumed.add("task-b")
    lane = world.lane("task-a")
    with pytest.raises(KernelError, match=r"^max_children budget exhausted \(1\)$"):
        world.kernel.enroll_task(lane, "task-a", world.enrollment())
    assert store_files(lane) == []


def test_a_lane_claimed_by_another_task_is_refused(world):
    lane = world.enroll("task-a")
    files = store_files(lane)
    before = Path(lane, ".imm/state/kernel/claim.json").read_bytes()
    with pytest.raises(KernelError, match="^batch_lane_occupied: the Lane already holds a claim for task-a"):
        world.kernel.enroll_task(lane, "task-b", world.enrollment())
    assert store_files(lane) == files
    assert Path(lane, ".imm/state/kernel/claim.json").read_bytes() == before
    assert not world.capability.is_child_consumed("task-b")


def test_an_enrollment_interrupted_before_its_claim_resumes_the_same_run(world):
    lane = world.enroll("task-a")
    run_id = world.kernel.project_task(lane, "task-a").run_id
    os.unlink(Path(lane, ".imm/state/kernel/claim.json"))  # the crash came between the two writes
    world.capability.consumed.clear()  # the next tick rehydrates: the child is still lane_admitted
    world.kernel.enroll_task(lane, "task-a", world.enrollment())
    projection = world.kernel.project_task(lane, "task-a")
    assert (projection.claim_task_id, projection.run_id, projection.record_revision) == ("task-a", run_id, 1)


# ---------------------------------------------------------------- lifecycle


def test_a_routine_task_submits_passes_qa_and_completes_with_a_verified_audit_pair(world):
    lane = world.enroll("task-a")
    run_id = world.kernel.project_task(lane, "task-a").run_id
    write_file(lane, "a.txt", "a\n")
    world.kernel.submit(lane)
    submitted = world.kernel.project_task(lane, "task-a")
    assert (submitted.artifact_state, submitted.next_obligation, submitted.record_revision) == ("frozen", "complete", 2)

    result = world.kernel.advance_task(lane, "task-a")

    assert result.state == "completed"
    done = world.kernel.project_task(lane, "task-a")
    assert (done.lifecycle, done.artifact_state, done.completion_ready, done.run_id) == ("done", "frozen", True, run_id)
    assert done.claim_task_id is None
    assert world.kernel.active_claim_task_id(lane) is None
    record_bytes = Path(lane, f".imm/audit/task-a/{run_id}/task-record.json").read_bytes()
    proof_bytes = Path(lane, f".imm/audit/task-a/{run_id}/terminal-proof.json").read_bytes()
    assert verify_pair("task-a", record_bytes, proof_bytes) is None
    assert record_bytes == Path(lane, ".imm/state/kernel/tasks/task-a.json").read_bytes()
    record = json.loads(record_bytes)
    assert record["history"][-1] == {"type": "complete", "at": record["history"][-1]["at"],
                                     "from_state": "active:frozen", "to_state": "done:frozen"}
    assert history_types(lane, "task-a") == ["enroll", "submit", "qa", "complete"]
    assert sorted(porcelain(lane).splitlines()) == ["?? .imm/audit/task-a/" + run_id + "/task-record.json",
                                                     "?? .imm/audit/task-a/" + run_id + "/terminal-proof.json",
                                                     "?? a.txt"]


def test_a_failed_qa_is_rework_with_findings_and_the_artifact_active_again(tmp_path):
    world = World(tmp_path, {"task-a": intent_json("task-a", ["a.txt"], verification=requires_file("never.txt"))})
    lane = world.enroll("task-a")
    world.kernel.submit(lane)

    result = world.kernel.advance_task(lane, "task-a")

    assert (result.state, result.operation) == ("rework", "qa")
    assert result.reason.startswith("task-a:A1: python3 exited with code 1")
    projection = world.kernel.project_task(lane, "task-a")
    assert (projection.lifecycle, projection.artifact_state, projection.next_obligation) == \
        ("active", "active", "submit_assurance")
    status = world.kernel.status(lane)
    assert [finding.id for finding in status.findings] == ["task-a:A1"]
    assert porcelain(lane) == ""  # QA ran on a copy: the Lane holds nothing it did not write

    write_file(lane, "never.txt", "delivered\n")
    world.kernel.submit(lane)
    assert world.kernel.advance_task(lane, "task-a").state == "completed"
    assert history_types(lane, "task-a") == ["enroll", "submit", "qa", "submit", "qa", "complete"]


def test_an_unsubmitted_artifact_is_left_to_the_executor(world):
    lane = world.enroll("task-a")
    result = world.kernel.advance_task(lane, "task-a")
    assert (result.state, result.operation) == ("rework", "submit")
    assert world.kernel.project_task(lane, "task-a").record_revision == 1


def test_a_material_task_waits_for_its_review_then_completes_on_approval(tmp_path):
    world = World(tmp_path, {"task-a": intent_json("task-a", ["a.txt"], risk="material")})
    lane = world.enroll("task-a")
    world.kernel.submit(lane)

    opened = world.kernel.advance_task(lane, "task-a")
    assert (opened.state, opened.operation) == ("review_ready", "review")
    assert opened.operation_id.startswith("review-")
    again = world.kernel.advance_task(lane, "task-a")
    assert (again.state, again.operation_id) == ("review_ready", opened.operation_id)
    assert world.kernel.project_task(lane, "task-a").next_obligation == "run_review"

    world.kernel.review(lane, approve=True, text="looks right")
    assert world.kernel.advance_task(lane, "task-a").state == "completed"
    assert history_types(lane, "task-a") == ["enroll", "submit", "qa", "review_opened", "review", "complete"]
    run_id = world.kernel.project_task(lane, "task-a").run_id
    pair = [Path(lane, f".imm/audit/task-a/{run_id}/{name}").read_bytes()
            for name in ("task-record.json", "terminal-proof.json")]
    assert verify_pair("task-a", *pair) is None


def test_a_rejected_review_is_rework_and_a_new_review_opens_after_the_next_pass(tmp_path):
    world = World(tmp_path, {"task-a": intent_json("task-a", ["a.txt"], risk="material")})
    lane = world.enroll("task-a")
    world.kernel.submit(lane)
    first = world.kernel.advance_task(lane, "task-a").operation_id

    world.kernel.review(lane, approve=False, text="rename the helper")
    result = world.kernel.advance_task(lane, "task-a")

    assert (result.state, result.operation, result.reason) == ("rework", "review", "rename the helper")
    assert world.kernel.project_task(lane, "task-a").artifact_state == "active"
    world.kernel.submit(lane)
    second = world.kernel.advance_task(lane, "task-a")
    assert second.state == "review_ready" and second.operation_id != first


def test_review_refusals(world):
    lane = world.enroll("task-a")
    with pytest.raises(KernelError, match="has no open Review reservation"):
        world.kernel.review(lane, approve=True)
    world.kernel.submit(lane)
    with pytest.raises(KernelError, match="already submitted"):
        world.kernel.submit(lane)


def test_a_stopped_task_is_reported_stopped_and_keeps_its_claim(world):
    lane = world.enroll("task-a")
    world.kernel.stop(lane, "the approach is wrong")
    result = world.kernel.advance_task(lane, "task-a")
    assert result.state == "stopped"
    assert "the approach is wrong" in result.reason
    projection = world.kernel.project_task(lane, "task-a")
    assert (projection.lifecycle, projection.artifact_state, projection.claim_task_id) == \
        ("stopped", "frozen", "task-a")
    with pytest.raises(KernelError, match="its lifecycle is stopped"):
        world.kernel.submit(lane)
    with pytest.raises(KernelError, match="needs a reason"):
        world.kernel.stop(lane, "  ")


def test_a_completed_task_whose_audit_pair_was_lost_gets_it_back_byte_for_byte(world):
    lane = world.enroll("task-a")
    world.kernel.submit(lane)
    world.kernel.advance_task(lane, "task-a")
    run_id = world.kernel.project_task(lane, "task-a").run_id
    proof = Path(lane, f".imm/audit/task-a/{run_id}/terminal-proof.json")
    original = proof.read_bytes()
    proof.unlink()
    assert world.kernel.advance_task(lane, "task-a").state == "completed"
    assert proof.read_bytes() == original


# ---------------------------------------------------------------- settled evidence and the lane commit


def test_settled_evidence_names_the_done_run_and_its_audit_pair(world):
    lane = world.enroll("task-a")
    with pytest.raises(KernelError, match=r"^cannot commit child task-a: task is not settled done \(lifecycle is "
                                          r"active\)$"):
        world.kernel.settled_evidence(lane, "task-a")
    with pytest.raises(KernelError, match=r"\(no settled run\)$"):
        world.kernel.settled_evidence(lane, "task-b")
    world.kernel.submit(lane)
    world.kernel.advance_task(lane, "task-a")
    evidence = world.kernel.settled_evidence(lane, "task-a")
    run_id = world.kernel.project_task(lane, "task-a").run_id
    assert evidence == SettledEvidence(task_id="task-a", run_id=run_id, lifecycle="done", goal="Deliver task-a",
                                       scope_hint=["a.txt"], record_path=f".imm/audit/task-a/{run_id}/task-record.json",
                                       proof_path=f".imm/audit/task-a/{run_id}/terminal-proof.json",
                                       delivery_identity=worktree_delivery(lane, "task-a", ["a.txt"]))
    # the identity QA reviewed: the Lane's change outside .imm/ (the audit pair came after the review)
    assert evidence.delivery_identity.startswith("sha256:")


def test_the_lane_commit_carries_the_kernels_audit_pair(world):
    lane = world.enroll("task-a")
    write_file(lane, "a.txt", "a\n")
    world.kernel.submit(lane)
    world.kernel.advance_task(lane, "task-a")
    evidence = world.kernel.settled_evidence(lane, "task-a")

    commit = GitBatch().commit_child(lane, "task-a", BATCH, world.base, f"imm-lane/{SLUG}/task-a", evidence)

    committed = git_out(lane, "diff-tree", "--no-commit-id", "--name-only", "-r", commit).splitlines()
    assert sorted(committed) == sorted(["a.txt", evidence.record_path, evidence.proof_path])
    assert world.kernel.read_tombstone(lane, "task-a").terminal_lifecycle == "done"


# ---------------------------------------------------------------- unreadable stores


def test_a_half_written_claim_is_a_projection_error_and_an_unreadable_claim(world):
    """Ports LANE-ADM-03."""
    lane = world.enroll("task-a")
    Path(lane, ".imm/state/kernel/claim.json").write_text('{"contract": "lanes_es/lane_cl')
    projection = world.kernel.project_task(lane, "task-a")
    assert "kernel store" in projection.error and "is unreadable" in projection.error
    assert world.kernel.active_claim_task_id(lane) == "unreadable"


@pytest.mark.parametrize("edit", ["contract", "field"])
def test_a_foreign_record_is_a_contract_mismatch_for_the_tick(world, edit):
    lane = world.enroll("task-a")
    path = Path(lane, ".imm/state/kernel/tasks/task-a.json")
    record = json.loads(path.read_text())
    if edit == "contract":
        record["contract"] = "assurance_kernel/task_record/v9"
    else:
        record["schema_extension"] = 1
    path.write_text(json.dumps(record))
    error = world.kernel.project_task(lane, "task-a").error
    assert lane_unreadable_reason(error) == f"batch_lane_contract_mismatch: {error}"
    with pytest.raises(KernelError, match="kernel store"):
        world.kernel.advance_task(lane, "task-a")


def test_a_symlinked_store_is_refused(world):
    lane = world.lane("task-a")
    os.makedirs(Path(lane, ".imm/state"))
    os.symlink(world.tmp_path, Path(lane, ".imm/state/kernel"))
    assert "is a symlink" in world.kernel.project_task(lane, "task-a").error
    with pytest.raises(KernelError, match="is a symlink"):
        world.kernel.enroll_task(lane, "task-a", world.enrollment())


# ---------------------------------------------------------------- tombstones


def test_read_tombstone_reads_the_single_run_proof(world):
    lane = world.enroll("task-a")
    world.kernel.submit(lane)
    world.kernel.advance_task(lane, "task-a")
    found = world.kernel.read_tombstone(lane, "task-a")
    assert (found.task_id, found.lifecycle_status, found.terminal_lifecycle) == ("task-a", "terminal", "done")
    assert found.terminal_event_id.startswith("complete:task-a:2026-05-01T10:00:")
    assert world.kernel.read_tombstone(world.root, "task-a") is None


def test_read_tombstone_falls_back_to_the_flat_legacy_proof_and_refuses_symlinks(world):
    proof = {"contract": "assurance_kernel/task_tombstone/v2", "task_id": "task-a", "lifecycle_status": "terminal",
             "terminal_lifecycle": "done", "terminal_event_id": "ev-task-a", "final_record_hash": "sha256:" + "a" * 64,
             "terminalized_at": "2026-05-01T10:00:00.000Z"}
    root = world.root
    for run in ("run-1", "run-2"):
        os.makedirs(Path(root, f".imm/audit/task-a/{run}"))
    write_file(root, ".imm/audit/task-a/terminal-proof.json", json.dumps(proof))
    assert world.kernel.read_tombstone(root, "task-a").terminal_event_id == "ev-task-a"
    os.symlink(world.tmp_path, Path(root, ".imm/audit/task-b"))
    with pytest.raises(KernelError, match="symlink"):
        world.kernel.read_tombstone(root, "task-b")
    write_file(root, ".imm/audit/task-c/terminal-proof.json", "{}")
    with pytest.raises(KernelError, match="malformed"):
        world.kernel.read_tombstone(root, "task-c")
