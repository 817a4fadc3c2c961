"""GitBatch on real repositories and worktrees: the batch-branch preflight (docs/upstream.md#the-batch-branch-preflight), the
lane commit and its lookup (docs/upstream.md#the-lane-commit, docs/upstream.md#finding-a-lane-commit-again; LANE-LCM-10..15) and readTaskIntent (docs/upstream.md#taskintent-v1)."""

from __future__ import annotations

import json
import os
import subprocess

import msgspec
import pytest

from lanes_es.adapters.batch_git import GitBatch, SettledEvidence, commit_message
from lanes_es.adapters.git import STATS
from lanes_es.domain.intent import canonical_intent_hash, parse_task_intent
from lanes_es.ports import PortError
from tests.gitfixtures import (
    add_lane,
    audit_pair_paths,
    batch_message,
    checkout_batch_branch,
    commit_all,
    commit_file,
    current_branch,
    git_out,
    head,
    intent_json,
    make_repo,
    porcelain,
    rev,
    run_git,
    trailer,
    write_audit_pair,
    write_file,
    write_intent,
)

SLUG = "initiative-slug"
BATCH = "batch-001"
LANE_BRANCH = f"imm-lane/{SLUG}/task-a"
SCOPE = ["src", "a.txt"]


@pytest.fixture
def git_batch():
    return GitBatch()


# ---------------------------------------------------------------- preflight (docs/upstream.md#the-batch-branch-preflight)


def test_preflight_creates_the_batch_branch_at_base_head(tmp_path, git_batch):
    """Ports LANE-SER-01."""
    root = make_repo(tmp_path / "repo")
    base = head(root)
    write_file(root, ".imm/state/batches/ignored.json", "{}\n")  # ignored state never makes the tree dirty
    STATS.reset()
    result = git_batch.preflight(root, SLUG, base)
    assert result.ok and result.branch == f"imm/{SLUG}" and result.reason == ""
    assert STATS.spawns <= 4
    assert current_branch(root) == f"imm/{SLUG}" and head(root) == base


def test_preflight_refuses_what_is_not_a_repository_root(tmp_path, git_batch):
    """Ports LANE-SER-01."""
    plain = tmp_path / "plain"
    plain.mkdir()
    assert git_batch.preflight(str(plain), SLUG, "0" * 40).reason == "not_a_git_repository"
    root = make_repo(tmp_path / "repo")
    os.makedirs(os.path.join(root, "sub"))
    result = git_batch.preflight(os.path.join(root, "sub"), SLUG, head(root))
    assert not result.ok and result.reason == "not_repository_root"


@pytest.mark.parametrize("flag", ["--assume-unchanged", "--skip-worktree"])
def test_preflight_refuses_index_flags_that_hide_changes(tmp_path, git_batch, flag):
    """Ports LANE-SER-01."""
    root = make_repo(tmp_path / "repo")
    run_git(root, "update-index", flag, "base.txt")
    write_file(root, "base.txt", "hidden edit\n")
    result = git_batch.preflight(root, SLUG, head(root))
    assert result.reason == "dirty_working_tree" and "base.txt" in result.message
    assert current_branch(root) == "main"


def test_preflight_refuses_a_dirty_tree_and_an_unborn_head(tmp_path, git_batch):
    """Ports LANE-SER-01."""
    root = make_repo(tmp_path / "repo")
    write_file(root, "stray.txt", "x\n")
    result = git_batch.preflight(root, SLUG, head(root))
    assert result.reason == "dirty_working_tree" and "stray.txt" in result.message
    empty = tmp_path / "empty"
    run_git(tmp_path, "init", "-q", "-b", "main", str(empty))
    assert git_batch.preflight(str(empty), SLUG, "0" * 40).reason == "uncommitted_head"


def test_preflight_refuses_an_existing_branch_unless_a_settled_batch_may_reuse_it(tmp_path, git_batch):
    """Ports LANE-SER-01."""
    root = make_repo(tmp_path / "repo")
    base = head(root)
    run_git(root, "branch", f"imm/{SLUG}")
    refused = git_batch.preflight(root, SLUG, base)
    assert refused.reason == "batch_branch_exists" and current_branch(root) == "main"
    assert git_batch.preflight(root, SLUG, base, reuse_head=base).reason == "batch_branch_exists"  # not checked out
    run_git(root, "checkout", "-q", f"imm/{SLUG}")
    settled_head = commit_file(root, "a.txt", "a\n", batch_message("task-a", "batch-old"))
    reused = git_batch.preflight(root, SLUG, settled_head, reuse_head=base)
    assert reused.ok and reused.branch == f"imm/{SLUG}"
    assert git_batch.preflight(root, SLUG, base, reuse_head=base).reason == "batch_branch_exists"  # HEAD moved on
    run_git(root, "checkout", "-q", "--detach", base)
    run_git(root, "checkout", "-q", "-B", f"imm/{SLUG}")
    diverged = commit_file(root, "b.txt", "b\n", "elsewhere")
    assert git_batch.preflight(root, SLUG, diverged, reuse_head=settled_head).reason == "batch_branch_exists"


def test_preflight_reports_a_failed_checkout_and_keeps_head(tmp_path, git_batch):
    root = make_repo(tmp_path / "repo")
    base = head(root)
    result = git_batch.preflight(root, SLUG, "1" * 40)
    assert result.reason == "branch_creation_failed"
    assert current_branch(root) == "main" and head(root) == base
    assert git_batch.preflight(root, "bad slug", base).reason == "branch_creation_failed"


# ---------------------------------------------------------------- the lane commit (docs/upstream.md#the-lane-commit)


@pytest.fixture
def lane_repo(tmp_path):
    root = make_repo(tmp_path / "repo", intents={"task-a": intent_json("task-a", SCOPE)},
                     files={"src/existing.ts": "old\n", "src/old-name.ts": "rename me\n"})
    base = checkout_batch_branch(root, SLUG)
    lane = add_lane(root, SLUG, "task-a", tmp_path / "lanes")
    return root, lane, base


def _evidence(task_id: str = "task-a", *, run_id: str = "run-1", lifecycle: str = "done",
              goal: str = "Ship the allowed module\nwith details", scope: list[str] | None = None) -> SettledEvidence:
    record_path, proof_path = audit_pair_paths(task_id, run_id)
    return SettledEvidence(task_id=task_id, run_id=run_id, lifecycle=lifecycle, goal=goal,
                           scope_hint=scope if scope is not None else SCOPE, record_path=record_path,
                           proof_path=proof_path)


def _settle(lane: str, task_id: str = "task-a", **pair) -> None:
    write_file(lane, "src/allowed.ts", "export const x = 1;\n")
    write_audit_pair(lane, task_id, "run-1", **pair)


def _refused_commit(git_batch, lane: str, base: str, evidence, *, branch: str = LANE_BRANCH,
                    expected: str | None = None) -> str:
    with pytest.raises(PortError) as raised:
        git_batch.commit_child(lane, "task-a", BATCH, expected or base, branch, evidence)
    assert head(lane) == base
    assert not os.path.exists(os.path.join(lane, ".imm/state/batches/commits"))
    return str(raised.value)


def test_commit_shape(lane_repo, git_batch, monkeypatch):
    """Ports LANE-LCM-03 and LANE-LCM-11."""
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"):
        monkeypatch.delenv(name, raising=False)
    _, lane, base = lane_repo
    _settle(lane)
    STATS.reset()
    commit = git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    assert STATS.spawns <= 6  # status, index flags, add, write-tree (the commit intent), commit, diff-tree
    assert head(lane) == commit and git_out(lane, "rev-parse", f"{commit}^@") == base
    message = git_out(lane, "cat-file", "commit", commit).split("\n\n", 1)[1] + "\n"
    assert message == f"imm(task-a): Ship the allowed module\n\nImmune-Brain-Batch: {BATCH}\n"
    assert trailer(lane, commit) == BATCH
    assert git_out(lane, "log", "-1", "--format=%an <%ae>|%cn <%ce>", commit) == (
        "Immune-Brain Batch <immune-brain@local>|Immune-Brain Batch <immune-brain@local>")
    files = git_out(lane, "diff-tree", "-r", "--name-only", "--no-commit-id", base, commit).split("\n")
    record_path, proof_path = audit_pair_paths("task-a")
    assert sorted(files) == sorted(["src/allowed.ts", record_path, proof_path])
    assert porcelain(lane) == ""
    evidence = json.loads(open(os.path.join(lane, f".imm/state/batches/commits/{BATCH}-task-a.json")).read())
    assert list(evidence) == ["contract", "batch_id", "task_id", "commit", "parent_head", "created_at"]
    assert evidence["contract"] == "assurance_kernel/batch_commit_evidence/v1"
    assert (evidence["batch_id"], evidence["task_id"], evidence["commit"], evidence["parent_head"]) == (
        BATCH, "task-a", commit, base)


def test_the_subject_falls_back_to_the_task_id():
    assert commit_message("task-a", "  \nsecond line", BATCH) == f"imm(task-a): task-a\n\nImmune-Brain-Batch: {BATCH}\n"
    assert commit_message("task-a", "  Padded goal  \r\nmore", "b").startswith("imm(task-a): Padded goal\n\n")


def test_nothing_is_committed_before_the_kernel_reports_the_child_done(lane_repo, git_batch):
    """Ports LANE-LCM-10."""
    _, lane, base = lane_repo
    write_file(lane, "src/allowed.ts", "x\n")
    assert "not settled done (no settled run)" in _refused_commit(git_batch, lane, base, None)
    assert "not settled done (audit pair missing)" in _refused_commit(git_batch, lane, base, _evidence())
    assert "not settled done (lifecycle is stopped)" in _refused_commit(git_batch, lane, base,
                                                                        _evidence(lifecycle="stopped"))
    write_audit_pair(lane, "task-a", "run-1", lifecycle="stopped")
    assert "not settled done (lifecycle is stopped)" in _refused_commit(git_batch, lane, base, _evidence())


def test_a_tampered_audit_pair_is_refused(lane_repo, git_batch):
    """Ports LANE-LCM-10."""
    _, lane, base = lane_repo
    _settle(lane)
    record_path, _ = audit_pair_paths("task-a")
    with open(os.path.join(lane, record_path), "a") as record:
        record.write(" ")
    message = _refused_commit(git_batch, lane, base, _evidence())
    assert message.startswith("batch commit exported audit pair does not match the settled run")
    _settle(lane, proof_overrides={"task_id": "task-b"})
    assert _refused_commit(git_batch, lane, base, _evidence()) == "cannot commit child task-a: audit task id mismatch"
    _settle(lane, proof_overrides={"terminal_lifecycle": "stopped"})
    assert _refused_commit(git_batch, lane, base, _evidence()) == (
        "cannot commit child task-a: terminal proof lifecycle is not done")
    _settle(lane)
    other_run = msgspec.structs.replace(_evidence(), run_id="run-2")  # names run-2 but points at run-1's pair
    assert "does not match the settled run" in _refused_commit(git_batch, lane, base, other_run)
    assert "(audit pair missing)" in _refused_commit(git_batch, lane, base, _evidence(run_id="run-2"))


def test_the_scope_comes_from_the_settled_run_and_escapes_are_refused(lane_repo, git_batch):
    """Ports LANE-LCM-12."""
    root, lane, base = lane_repo
    _settle(lane)
    write_intent(lane, intent_json("task-a", [*SCOPE, "rogue.txt"]))  # a widened sidecar changes nothing
    write_file(lane, "rogue.txt", "rogue\n")
    assert _refused_commit(git_batch, lane, base, _evidence()).startswith("dirty_outside_scope: ")
    run_git(lane, "checkout", "-q", "--", "docs")
    os.remove(os.path.join(lane, "rogue.txt"))
    for stray in ("src/trailing.ts ", ".imm/audit/task-b/run-1/task-record.json", "src\\allowed.ts"):
        write_file(lane, stray, "x\n")
        assert _refused_commit(git_batch, lane, base, _evidence()).startswith("dirty_outside_scope: ")
        os.remove(os.path.join(lane, stray))


@pytest.mark.parametrize("flag", ["--assume-unchanged", "--skip-worktree"])
def test_out_of_scope_edits_hidden_by_index_flags_are_refused(lane_repo, git_batch, flag):
    """Ports LANE-LCM-12."""
    _, lane, base = lane_repo
    _settle(lane)
    run_git(lane, "update-index", flag, "base.txt")
    write_file(lane, "base.txt", "hidden\n")
    assert _refused_commit(git_batch, lane, base, _evidence()).startswith("dirty_outside_scope: index flags")


def test_lineage_and_branch_are_checked_before_committing(lane_repo, git_batch):
    """Ports LANE-LCM-13."""
    root, lane, base = lane_repo
    _settle(lane)
    moved = commit_file(root, "other.txt", "o\n", "moved")
    message = _refused_commit(git_batch, lane, base, _evidence(), expected=moved)
    assert message.startswith("batch_head_lineage_broken: current HEAD")
    run_git(lane, "checkout", "-q", "-b", "decoy")  # same commit, another branch
    message = _refused_commit(git_batch, lane, base, _evidence())
    assert message == f"batch_head_lineage_broken: current branch decoy does not match expected branch {LANE_BRANCH}"


def test_hooks_are_bypassed(lane_repo, git_batch):
    """Ports LANE-LCM-14."""
    root, lane, base = lane_repo
    hooks = os.path.join(root, ".git", "hooks")
    os.makedirs(hooks, exist_ok=True)
    scripts = {
        "pre-commit": "echo rogue > rogue.txt\ngit add rogue.txt\n",
        "prepare-commit-msg": "echo hijacked > \"$1\"\n",
        "commit-msg": "exit 1\n",
        "post-commit": "echo bad > bad.txt\n",
    }
    for name, body in scripts.items():
        write_file(hooks, name, "#!/bin/sh\n" + body, mode=0o755)
    run_git(root, "config", "core.hooksPath", hooks)
    _settle(lane)
    commit = git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    assert git_out(lane, "log", "-1", "--format=%s", commit) == "imm(task-a): Ship the allowed module"
    assert not os.path.exists(os.path.join(lane, "bad.txt")) and not os.path.exists(os.path.join(lane, "rogue.txt"))
    assert "rogue.txt" not in git_out(lane, "ls-tree", "-r", "--name-only", commit)


def test_the_lane_commit_starts_no_git_maintenance(lane_repo, git_batch, tmp_path, monkeypatch):
    """git's own `commit` starts `git maintenance run --auto` (a second process, and past git's thresholds a
    repack of the user's repository during the tick); the runner's commit does not."""
    root, lane, base = lane_repo
    plain_trace, runner_trace = tmp_path / "plain.trace", tmp_path / "runner.trace"
    subprocess.run(["git", "-C", root, "commit", "-q", "--allow-empty", "-m", "user's own"], check=True,
                   env={**os.environ, "GIT_TRACE": str(plain_trace)})
    assert "run_command: git maintenance run --auto" in plain_trace.read_text()  # what the runner turns off
    _settle(lane)
    monkeypatch.setenv("GIT_TRACE", str(runner_trace))
    commit = git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    monkeypatch.delenv("GIT_TRACE")
    traced = runner_trace.read_text()
    assert "built-in: git commit" in traced and "maintenance" not in traced
    assert head(lane) == commit


def test_staged_deletions_and_renames_in_scope_are_committed(lane_repo, git_batch):
    """Ports LANE-LCM-14."""
    _, lane, base = lane_repo
    _settle(lane)
    run_git(lane, "rm", "-q", "src/existing.ts")
    run_git(lane, "mv", "src/old-name.ts", "src/new-name.ts")
    write_file(lane, "src/new-name.ts", "renamed and edited\n")  # an unstaged edit on top of the staged rename
    commit = git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    tree = git_out(lane, "ls-tree", "-r", "--name-only", commit).split("\n")
    assert "src/existing.ts" not in tree and "src/old-name.ts" not in tree and "src/new-name.ts" in tree
    assert git_out(lane, "show", f"{commit}:src/new-name.ts") == "renamed and edited"
    assert porcelain(lane) == ""


def test_an_empty_delivery_is_a_commit_failure(lane_repo, git_batch):
    _, lane, base = lane_repo
    write_audit_pair(lane, "task-a", "run-1")
    commit_all(lane, "pair committed by hand", batch_identity=False)
    expected = head(lane)
    with pytest.raises(PortError) as raised:
        git_batch.commit_child(lane, "task-a", BATCH, expected, LANE_BRANCH, _evidence())
    assert str(raised.value).startswith("commit_failed: ")
    assert head(lane) == expected and base != expected


# ---------------------------------------------------------------- the lookup (docs/upstream.md#finding-a-lane-commit-again)


def test_the_lookup_returns_the_runner_own_commit(lane_repo, git_batch):
    """Ports LANE-LCM-15."""
    _, lane, base = lane_repo
    STATS.reset()
    assert git_batch.lookup_batch_commit(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence()) is None
    assert STATS.spawns == 1
    _settle(lane)
    commit = git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    STATS.reset()
    assert git_batch.lookup_batch_commit(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence()) == commit
    assert STATS.spawns <= 3
    assert git_batch.lookup_batch_commit(lane, "task-a", "batch-other", base, LANE_BRANCH, _evidence()) is None


def test_the_lookup_refuses_an_external_commit_on_top(lane_repo, git_batch):
    """Ports LANE-LCM-15."""
    _, lane, base = lane_repo
    _settle(lane)
    git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    commit_file(lane, "src/later.ts", "later\n", "external")
    with pytest.raises(PortError, match="batch_head_lineage_broken"):
        git_batch.lookup_batch_commit(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())


def test_the_lookup_refuses_a_forged_commit_without_durable_evidence(lane_repo, git_batch):
    """Ports LANE-LCM-15."""
    _, lane, base = lane_repo
    _settle(lane)
    forged = commit_all(lane, batch_message("task-a", BATCH))
    with pytest.raises(PortError, match="lacks durable batch runner production evidence") as raised:
        git_batch.lookup_batch_commit(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    assert str(raised.value) == (f"batch_head_lineage_broken: commit {forged} lacks durable batch runner production "
                                 f"evidence")


def test_the_lookup_checks_the_author_and_the_settled_run(lane_repo, git_batch, monkeypatch):
    _, lane, base = lane_repo
    _settle(lane)
    commit = git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Someone Else")
    with pytest.raises(PortError, match="adopted commit author Immune-Brain Batch does not match batch authority"):
        git_batch.lookup_batch_commit(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    monkeypatch.delenv("GIT_AUTHOR_NAME")
    with pytest.raises(PortError, match="not settled done"):
        git_batch.lookup_batch_commit(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence(lifecycle="stopped"))
    assert git_batch.lookup_batch_commit(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence()) == commit
    with pytest.raises(PortError, match="batch_head_lineage_broken: commit parent"):
        git_batch.lookup_batch_commit(lane, "task-a", BATCH, "2" * 40, LANE_BRANCH, _evidence())


# ---------------------------------------------------------------- readTaskIntent (docs/upstream.md#taskintent-v1)


@pytest.fixture
def intent_repo(tmp_path):
    archived = intent_json("task-old")
    root = make_repo(tmp_path / "repo", intents={"task-a": intent_json("task-a", ["src/b", "src"])})
    write_intent(root, archived, archived=True)
    commit_all(root, "archive", batch_identity=False)
    return root


def test_read_intent_returns_the_normalized_intent_and_its_hash(intent_repo, git_batch):
    STATS.reset()
    read = git_batch.read_intent(intent_repo, "task-a", "docs/plans/task-a.intent.json")
    assert STATS.spawns == 1
    expected = parse_task_intent(intent_json("task-a", ["src/b", "src"]))
    assert read.intent == expected and read.intent["scope_hint"] == ["src"]
    assert read.content_hash == canonical_intent_hash(expected)
    assert read.path == "docs/plans/task-a.intent.json"
    STATS.reset()
    assert git_batch.read_intent(intent_repo, "task-a", None).path == "docs/plans/task-a.intent.json"
    assert git_batch.read_intent(intent_repo, "task-old", None).path == "docs/plans/archive/task-old.intent.json"
    assert STATS.spawns == 0


def _read_error(git_batch, root: str, task_id: str, path: str | None) -> str:
    with pytest.raises(PortError) as raised:
        git_batch.read_intent(root, task_id, path)
    return str(raised.value)


def test_read_intent_refuses_other_paths_and_untracked_or_missing_files(intent_repo, git_batch):
    assert _read_error(git_batch, intent_repo, "task-a", "docs/plans/task-b.intent.json").startswith("invalid: ")
    assert _read_error(git_batch, intent_repo, "../x", None).startswith("invalid: ")
    write_intent(intent_repo, intent_json("task-new"))
    assert _read_error(git_batch, intent_repo, "task-new", None).startswith("missing: ")
    os.remove(os.path.join(intent_repo, "docs/plans/task-a.intent.json"))
    assert _read_error(GitBatch(), intent_repo, "task-a", None).startswith("missing: ")


def test_read_intent_refuses_symlinks_on_the_path(tmp_path, git_batch):
    root = make_repo(tmp_path / "repo")
    elsewhere = tmp_path / "elsewhere"
    write_intent(elsewhere, intent_json("task-a"))
    os.symlink(elsewhere / "docs/plans/task-a.intent.json", os.path.join(root, "linked.json"))
    os.makedirs(os.path.join(root, "docs/plans"))
    os.symlink("../../linked.json", os.path.join(root, "docs/plans/task-a.intent.json"))
    commit_all(root, "a symlinked intent", batch_identity=False)
    assert "symlink" in _read_error(git_batch, root, "task-a", None)
    os.remove(os.path.join(root, "docs/plans/task-a.intent.json"))
    os.rmdir(os.path.join(root, "docs/plans"))
    os.rmdir(os.path.join(root, "docs"))
    os.symlink(elsewhere / "docs", os.path.join(root, "docs"))  # the file is tracked, the directory is a link
    assert _read_error(git_batch, root, "task-a", None).startswith("invalid: ")


def test_read_intent_refuses_oversize_unparsable_invalid_and_foreign_intents(tmp_path, git_batch):
    root = make_repo(tmp_path / "repo")
    write_file(root, "docs/plans/task-big.intent.json", " " * (64 * 1024 + 1))
    write_file(root, "docs/plans/task-bad.intent.json", "{ nope")
    write_file(root, "docs/plans/task-rule.intent.json", json.dumps({**intent_json("task-rule"), "risk": "wild"}))
    write_file(root, "docs/plans/task-other.intent.json", json.dumps(intent_json("task-a")))
    commit_all(root, "intents", batch_identity=False)
    assert "larger than 65536 bytes" in _read_error(git_batch, root, "task-big", None)
    assert _read_error(git_batch, root, "task-bad", None).startswith("invalid: TaskIntent docs/plans/task-bad")
    assert _read_error(git_batch, root, "task-rule", None).startswith("invalid: TaskIntent docs/plans/task-rule")
    assert "names task task-a" in _read_error(git_batch, root, "task-other", None)


def test_a_lane_commit_passes_the_guarded_integration(lane_repo, git_batch):
    """End to end: the lane commit made here is what the guard integrates (LANE-LCM-01 shape)."""
    from lanes_es.adapters.candidate_git import GitCandidates
    from lanes_es.adapters.lane_git import GitLaneInspector
    from lanes_es.ports import IntegrationChild, IntegrationRequest

    root, lane, base = lane_repo
    _settle(lane)
    commit = git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    landed = GitCandidates().integrate(IntegrationRequest(
        root=root, branch=f"imm/{SLUG}", batch_head=base, lane_base=base, lane_commit=commit,
        child=IntegrationChild(task_id="task-a", intent_path="docs/plans/task-a.intent.json"), siblings=[]))
    assert landed == commit == rev(root, f"imm/{SLUG}") == rev(root, LANE_BRANCH)
    assert GitLaneInspector().audit_reachable(root, landed, "task-a")


def test_read_intent_lists_again_when_an_intent_was_tracked_since(intent_repo, git_batch):
    assert git_batch.read_intent(intent_repo, "task-a", None).path == "docs/plans/task-a.intent.json"
    write_intent(intent_repo, intent_json("task-new"))
    commit_all(intent_repo, "a new intent lands (an integration)", batch_identity=False)
    STATS.reset()
    assert git_batch.read_intent(intent_repo, "task-new", None).intent["task_id"] == "task-new"
    assert STATS.spawns == 1


def test_many_unstaged_paths_are_staged_literally(lane_repo, git_batch):
    _, lane, base = lane_repo
    _settle(lane)
    names = [f"src/many/file-{index:04d}[*].ts" for index in range(300)]
    for name in names:
        write_file(lane, name, "x\n")
    commit = git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    tree = git_out(lane, "ls-tree", "-r", "--name-only", commit)
    assert all(name in tree for name in names) and porcelain(lane) == ""


def test_a_commit_interrupted_before_its_evidence_is_recognized_by_its_intent(lane_repo, git_batch):
    """A crash between `git commit` and the evidence file: the intent written before the commit names
    this tree on this parent, so the lookup adopts the commit and writes the evidence (issue 3)."""
    _, lane, base = lane_repo
    _settle(lane)
    commit = git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    evidence = os.path.join(lane, ".imm/state/batches/commits", f"{BATCH}-task-a.json")
    intent = os.path.join(lane, ".imm/state/batches/commits", f"{BATCH}-task-a.intent.json")
    assert not os.path.exists(intent)
    os.unlink(evidence)
    with pytest.raises(PortError, match="lacks durable batch runner production evidence"):
        git_batch.lookup_batch_commit(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    tree = git_out(lane, "rev-parse", f"{commit}^{{tree}}")
    with open(intent, "w") as handle:
        json.dump({"contract": "lanes_es/lane_commit_intent/v1", "batch_id": BATCH, "task_id": "task-a",
                   "tree": tree, "parent_head": base}, handle)
    assert git_batch.lookup_batch_commit(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence()) == commit
    assert os.path.exists(evidence) and not os.path.exists(intent)


@pytest.mark.usefixtures("store_url")  # the whole engine, on each backend
def test_a_lane_commit_whose_change_drifted_from_the_reviewed_delivery_is_refused(tmp_path):
    """docs/upstream.md#the-lane-commit, #reason-codes: QA reviewed one delivery; the Executor changed an
    in-scope file while the Review was open; the lane commit is refused with upstream's text, the
    Lane's HEAD is unmoved, its files are as the Executor left them, and the child parks."""
    from lanes_es.domain.delivery import DELIVERY_DRIFTED
    from tests.engine import Task
    from tests.engine_more import enroll, make_engine
    from tests.gitfixtures import git_out

    engine = make_engine(tmp_path, {"s1": Task(["one.txt"], risk="material")})
    engine.authorize()
    enroll(engine, "s1")
    engine.deliver("s1", "one.txt", "reviewed\n")
    report = engine.tick()
    assert report["reason"] == "child s1 holds an open Review reservation"
    lane = engine.lane("s1")
    base = git_out(lane, "rev-parse", "HEAD")
    with open(os.path.join(lane, "one.txt"), "w") as handle:
        handle.write("changed after the review\n")
    from lanes_es.adapters.kernel import ReferenceKernel

    ReferenceKernel(clock=engine.deps.now).review(lane, approve=True, text="ok")
    report = engine.tick()
    assert engine.states() == ["needs_human"]
    assert report["batch_state"] == "needs_human"
    assert report["reason"] == DELIVERY_DRIFTED == "batch commit drifted from the reviewed delivery identity"
    assert git_out(lane, "rev-parse", "HEAD") == base
    assert open(os.path.join(lane, "one.txt")).read() == "changed after the review\n"
    assert git_out(lane, "diff", "--cached", "--name-only") == ""  # what the commit staged is unstaged
    assert engine.batch.record["commits"] == []


def test_a_commit_that_lands_on_another_parent_breaks_the_lineage(lane_repo, git_batch, monkeypatch):
    """docs/upstream.md#the-lane-commit: "commit parent P does not match expected_head E". Something moved the Lane's
    HEAD between the checks and `git commit` (here: a commit made the moment the commit intent was
    written); the lane commit is not recorded as this batch's (no evidence file)."""
    import lanes_es.adapters.batch_git as batch_git

    _, lane, base = lane_repo
    _settle(lane)
    moved: list[str] = []
    write_state_document = batch_git._write_state_document

    def and_someone_commits(*args, **kwargs):
        write_state_document(*args, **kwargs)
        tree = git_out(lane, "rev-parse", f"{base}^{{tree}}")
        moved.append(git_out(lane, "commit-tree", tree, "-p", base, "-m", "someone else"))
        run_git(lane, "update-ref", "HEAD", moved[0])

    monkeypatch.setattr(batch_git, "_write_state_document", and_someone_commits)
    with pytest.raises(PortError) as raised:
        git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    assert str(raised.value) == (f"batch_head_lineage_broken: commit parent {moved[0]} does not match expected_head "
                                 f"{base}")
    assert not os.path.exists(os.path.join(lane, f".imm/state/batches/commits/{BATCH}-task-a.json"))


def test_the_lookup_refuses_a_batch_commit_on_another_parent(lane_repo, git_batch):
    """docs/upstream.md#finding-a-lane-commit-again: the runner's own lane commit, looked up for a batch head it was not made on."""
    _, lane, base = lane_repo
    _settle(lane)
    commit = git_batch.commit_child(lane, "task-a", BATCH, base, LANE_BRANCH, _evidence())
    elsewhere = git_out(lane, "commit-tree", git_out(lane, "rev-parse", f"{base}^{{tree}}"), "-p", base, "-m", "x")
    with pytest.raises(PortError) as raised:
        git_batch.lookup_batch_commit(lane, "task-a", BATCH, elsewhere, LANE_BRANCH, _evidence())
    assert str(raised.value) == (f"batch_head_lineage_broken: commit parent {base} does not match expected_head "
                                 f"{elsewhere}")
    assert head(lane) == commit
