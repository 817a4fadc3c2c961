"""The lane-aware completion verifier (docs/upstream.md#the-completion-verifier, LANE-CMP-08/09, LANE-LIN-02) on hand-built repositories."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Callable

from lanes_es.adapters.git import STATS
from lanes_es.audit.completion import OBSERVATION_CONTRACT, verify_completion
from lanes_es.projections.files import report_path, state_path
from tests.gitfixtures import all_refs, commit_file, head, identity_env, porcelain, run_git, write_file
from tests.integration.audit_repo import BATCH, SLUG, Built, completed, deliver, make_batch, write_documents

def edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document, indent=2) + "\n")


def edit_both(built: Built, change: Callable[[dict[str, Any]], None]) -> None:
    edit_json(state_path(built.root, BATCH), change)
    edit_json(report_path(built.root, BATCH), change)


def code_of(built: Built) -> tuple[str | None, int]:
    observation = verify_completion(built.root, BATCH)
    return observation.code, observation.exit_code


# ---------------------------------------------------------------- acceptance


def test_a_completed_lane_batch_is_accepted_in_commit_order(tmp_path: Path):
    """Ports LANE-CMP-08."""
    built = completed(tmp_path)
    refs, status = all_refs(built.root), porcelain(built.root)
    STATS.reset()
    observation = verify_completion(built.root, BATCH)
    assert observation.complete, observation.message
    assert observation.exit_code == 0
    shown = observation.as_json()
    assert list(shown) == ["contract", "batch_id", "complete", "batch_state", "report_state", "children", "code"]
    assert shown["contract"] == OBSERVATION_CONTRACT and shown["code"] is None
    assert (shown["batch_state"], shown["report_state"]) == ("completed", "completed")
    (s1, c1, run1), (s0, c0, run0) = built.delivered
    assert shown["children"] == [
        {"task_id": "task-s1", "run_id": run1, "commit": c1, "parent": built.base},
        {"task_id": "task-s0", "run_id": run0, "commit": c0, "parent": c1},
    ]
    assert STATS.spawns == 4  # branch and HEAD, the log, the blobs, the stability re-read
    assert (all_refs(built.root), porcelain(built.root)) == (refs, status)


def test_released_children_are_accepted(tmp_path: Path):
    """Ports LANE-CMP-09."""
    built = completed(tmp_path)

    def release(document: dict[str, Any]) -> None:
        for child in document["children"]:
            child["state"] = "released"

    edit_both(built, release)
    assert code_of(built) == (None, 0)


# ---------------------------------------------------------------- the documents (LANE-CMP-09)


def test_a_parked_state_is_a_state_report_mismatch(tmp_path: Path):
    """Ports LANE-CMP-09."""
    built = make_batch(tmp_path, ["task-s0", "task-s1"])
    deliver(built, "task-s1")
    write_documents(built, ["task-s0", "task-s1"], final_state="needs_human")
    assert code_of(built) == ("state_report_mismatch", 1)


def test_a_record_that_contradicts_itself(tmp_path: Path):
    """Ports LANE-CMP-09 and LANE-REC-02."""
    built = completed(tmp_path)
    edit_json(state_path(built.root, BATCH), lambda d: d["children"][0].update(state="needs_human", reason="x"))
    assert code_of(built) == ("state_report_mismatch", 1)


def test_report_max_parallel_differs(tmp_path: Path):
    """Ports LANE-CMP-09."""
    built = completed(tmp_path)
    edit_json(report_path(built.root, BATCH), lambda d: d.update(max_parallel=3))
    assert code_of(built) == ("state_report_mismatch", 1)


def test_report_without_handoffs_or_with_a_serial_handoff_is_malformed(tmp_path: Path):
    """Ports LANE-CMP-09."""
    built = completed(tmp_path)
    edit_json(report_path(built.root, BATCH), lambda d: d.pop("handoffs"))
    assert code_of(built) == ("malformed_report", 2)
    edit_json(report_path(built.root, BATCH), lambda d: d.update(handoffs=[], handoff={"role": "executor"}))
    assert code_of(built) == ("malformed_report", 2)


def test_a_duplicated_commit(tmp_path: Path):
    """Ports LANE-CMP-09."""
    built = completed(tmp_path)
    edit_both(built, lambda d: d["commits"].append(d["commits"][0]))
    assert code_of(built) == ("commit_order_mismatch", 1)


def test_reversed_commits_and_a_moved_base_break_the_lineage(tmp_path: Path):
    """Ports LANE-CMP-09."""
    built = completed(tmp_path)
    edit_both(built, lambda d: d["commits"].reverse())
    assert code_of(built) == ("lineage_mismatch", 1)
    edit_both(built, lambda d: d["commits"].reverse())
    assert code_of(built) == (None, 0)
    edit_json(state_path(built.root, BATCH), lambda d: d.update(base_head=built.delivered[0][1]))
    assert code_of(built) == ("lineage_mismatch", 1)


def test_unreadable_inputs(tmp_path: Path):
    """Ports LANE-REC-03."""
    built = completed(tmp_path)
    assert verify_completion(built.root, "../etc").code == "invalid_input"
    assert verify_completion(built.root, "batch-unknown").code == "read_failed"
    edit_json(state_path(built.root, BATCH), lambda d: d.update(contract="assurance_kernel/batch_run_state/v1"))
    assert code_of(built) == ("read_failed", 2)


# ---------------------------------------------------------------- the batch branch


def test_a_rewritten_batch_branch(tmp_path: Path):
    built = completed(tmp_path)
    run_git(built.root, "commit", "-q", "--amend", "--no-edit", "--allow-empty")
    observation = verify_completion(built.root, BATCH)
    assert (observation.code, observation.exit_code) == ("lineage_mismatch", 1)
    assert "is not the expected batch head" in observation.message


def test_a_commit_out_of_integration_order(tmp_path: Path):
    built = make_batch(tmp_path, ["task-a", "task-b", "task-c"])
    for task in ("task-a", "task-b", "task-c"):
        deliver(built, task)
    built.delivered[0], built.delivered[1] = built.delivered[1], built.delivered[0]
    write_documents(built, ["task-a", "task-b", "task-c"])
    observation = verify_completion(built.root, BATCH)
    assert (observation.code, observation.exit_code) == ("commit_order_mismatch", 1)
    assert "against the recorded integration order" in observation.message


def test_a_missing_audit_pair(tmp_path: Path):
    built = make_batch(tmp_path, ["task-s0", "task-s1"])
    deliver(built, "task-s1")
    deliver(built, "task-s0", pair=False)
    write_documents(built, ["task-s0", "task-s1"])
    observation = verify_completion(built.root, BATCH)
    assert (observation.code, observation.exit_code) == ("missing_commit_evidence", 1)
    assert "carries no audit pair" in observation.message


def amend_last(built: Built, *, message: str | None = None) -> None:
    """Amend HEAD (staged changes included) and record the amended commit as the last child's."""
    run_git(built.root, "add", "-A")
    args = ["commit", "-q", "--amend", "--no-verify"] + (["-m", message] if message else ["--no-edit"])
    run_git(built.root, *args, env=identity_env())
    task, _, run_id = built.delivered[-1]
    built.delivered[-1] = (task, head(built.root), run_id)
    write_documents(built, ["task-s0", "task-s1"])


def test_head_amended_without_the_trailer(tmp_path: Path):
    """Ports LANE-CMP-09."""
    built = completed(tmp_path)
    amend_last(built, message="imm(task-s0): deliver")
    assert code_of(built) == ("missing_commit_evidence", 1)


def test_a_tampered_proof_hash(tmp_path: Path):
    """Ports LANE-CMP-09."""
    built = completed(tmp_path)
    task, _, run_id = built.delivered[-1]
    proof = Path(built.root) / f".imm/audit/{task}/{run_id}/terminal-proof.json"
    edit_json(proof, lambda d: d.update(final_record_hash="sha256:" + "1" * 64))
    amend_last(built)
    assert code_of(built) == ("wrong_run_evidence", 1)


def test_an_extra_file_outside_the_scope(tmp_path: Path):
    """Ports LANE-CMP-09."""
    built = completed(tmp_path)
    write_file(built.root, "other.ts", "export {}\n")
    amend_last(built)
    observation = verify_completion(built.root, BATCH)
    assert (observation.code, observation.exit_code) == ("scope_mismatch", 1)
    assert "other.ts" in observation.message


def test_a_stopped_child(tmp_path: Path):
    built = make_batch(tmp_path, ["task-s0", "task-s1"])
    deliver(built, "task-s1")
    deliver(built, "task-s0", lifecycle="stopped")
    write_documents(built, ["task-s0", "task-s1"])
    assert code_of(built) == ("stopped_lifecycle", 1)


def test_a_pair_edited_in_the_checkout_after_the_commit(tmp_path: Path):
    built = completed(tmp_path)
    task, _, run_id = built.delivered[0]
    path = Path(built.root) / f".imm/audit/{task}/{run_id}/task-record.json"
    path.write_text(path.read_text() + " ")
    assert code_of(built) == ("wrong_run_evidence", 1)


def test_a_lane_run_that_is_not_the_committed_one(tmp_path: Path):
    built = completed(tmp_path)
    edit_json(state_path(built.root, BATCH), lambda d: d["children"][0]["lane"].update(run_id=f"run-{uuid.uuid4()}"))
    assert code_of(built) == ("wrong_run_evidence", 1)


# ---------------------------------------------------------------- adopted user commits (LANE-LIN-02)


def with_user_commit_between(tmp_path: Path, *, recorded: bool) -> Built:
    built = make_batch(tmp_path, ["task-s0", "task-s1"])
    first = deliver(built, "task-s0")
    user = commit_file(built.root, "outside.txt", "by hand\n", "a user commit")
    if recorded:
        built.adopted.append((first, user))
    deliver(built, "task-s1")
    write_documents(built, ["task-s0", "task-s1"])
    return built


def test_an_adopted_user_commit_between_children_is_accepted(tmp_path: Path):
    """Ports LANE-LIN-02."""
    built = with_user_commit_between(tmp_path, recorded=True)
    observation = verify_completion(built.root, BATCH)
    assert observation.complete, observation.message
    user = run_git(built.root, "rev-parse", f"{built.delivered[1][1]}^").stdout.decode().strip()
    assert user != built.delivered[0][1]
    assert [child.parent for child in observation.children] == [built.base, user]


def test_an_unrecorded_user_commit_between_children(tmp_path: Path):
    """Ports LANE-LIN-02."""
    built = with_user_commit_between(tmp_path, recorded=False)
    assert code_of(built) == ("missing_commit_evidence", 1)


def test_an_unrecorded_user_commit_after_the_last_child(tmp_path: Path):
    """Ports LANE-LIN-02."""
    built = completed(tmp_path)
    commit_file(built.root, "outside.txt", "by hand\n", "a user commit")
    assert code_of(built) == ("lineage_mismatch", 1)


def test_an_adopted_user_commit_after_the_last_child_is_accepted(tmp_path: Path):
    """Ports LANE-LIN-02."""
    built = make_batch(tmp_path, ["task-s0", "task-s1"])
    deliver(built, "task-s1")
    last = deliver(built, "task-s0")
    built.adopted.append((last, commit_file(built.root, "outside.txt", "by hand\n", "a user commit")))
    write_documents(built, ["task-s0", "task-s1"])
    assert code_of(built) == (None, 0)


def test_an_adoption_pointing_back_breaks_the_lineage(tmp_path: Path):
    """Ports LANE-LIN-02."""
    built = completed(tmp_path)
    first, last = built.delivered[0][1], built.delivered[1][1]
    edit_both(built, lambda d: d.setdefault("adopted_heads", []).append({"from": last, "to": first}))
    assert code_of(built) == ("lineage_mismatch", 1)


def test_a_checkout_off_the_batch_branch_judges_the_batch_branch(tmp_path: Path):
    """The batch branch is judged, not HEAD: a checkout switched to main (to land the batch) is no finding."""
    built = completed(tmp_path)
    run_git(built.root, "checkout", "-q", "--detach", "HEAD~1")
    assert code_of(built) == (None, 0)
    run_git(built.root, "branch", "-f", f"imm/{SLUG}", "HEAD")  # the batch branch itself moved back
    observation = verify_completion(built.root, BATCH)
    assert (observation.code, observation.exit_code) == ("lineage_mismatch", 1)
    assert "is not the expected batch head" in observation.message


def test_a_landed_and_deleted_batch_branch_is_judged_by_its_recorded_head(tmp_path: Path):
    built = completed(tmp_path)
    run_git(built.root, "checkout", "-q", "--detach")
    run_git(built.root, "branch", "-D", f"imm/{SLUG}")
    observation = verify_completion(built.root, BATCH)
    assert (observation.code, observation.exit_code) == (None, 0)
    assert "is gone" in observation.note


def test_a_hostile_base_head_never_reaches_git_as_an_option(tmp_path: Path):
    built = completed(tmp_path)
    target = tmp_path / "written-by-git"
    edit_json(state_path(built.root, BATCH), lambda d: d.update(base_head=f"--output={target}"))
    assert code_of(built) == ("lineage_mismatch", 1)
    assert not target.exists()
