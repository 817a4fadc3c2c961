"""GitLaneInspector on real repositories and worktrees: coordinator view, Lane facts, lineage, audit pair,
crash recovery (docs/upstream.md#lane-inspection-and-admission, #the-batch-lineage, #the-guarded-integration findIntegratedCandidate; LANE-ADM-03, LANE-REL-09, docs/upstream.md#the-batch-lineage)."""

from __future__ import annotations

import os

import pytest

from lanes_es.adapters.git import STATS
from lanes_es.adapters.lane_git import GitLaneInspector, parse_status_v2
from tests.gitfixtures import (
    add_lane,
    batch_message,
    checkout_batch_branch,
    commit_all,
    commit_file,
    head,
    make_repo,
    run_git,
    write_audit_pair,
    write_file,
)

SLUG = "initiative-slug"
BATCH = "batch-001"


@pytest.fixture
def repo(tmp_path):
    root = make_repo(tmp_path / "repo")
    checkout_batch_branch(root, SLUG)
    return root


@pytest.fixture
def lanes():
    return GitLaneInspector()


# ---------------------------------------------------------------- coordinator view


def test_coordinator_view_reads_branch_head_and_entries_in_one_spawn(repo, lanes):
    write_file(repo, "base.txt", "changed\n")
    write_file(repo, "new dir/untracked file.txt", "x\n")
    write_file(repo, "staged.txt", "s\n")
    run_git(repo, "add", "staged.txt")
    write_file(repo, ".imm/state/ignored.json", "{}\n")
    STATS.reset()
    view = lanes.coordinator_view(repo)
    assert STATS.spawns == 1
    assert view.branch == f"imm/{SLUG}"
    assert view.head == head(repo)
    assert sorted(view.entries) == [(" M", "base.txt"), ("??", "new dir/untracked file.txt"), ("A ", "staged.txt")]


def test_coordinator_view_of_a_detached_head_and_of_an_unborn_branch(tmp_path, repo, lanes):
    run_git(repo, "checkout", "-q", "--detach")
    view = lanes.coordinator_view(repo)
    assert view.branch is None and view.head == head(repo) and view.entries == []
    empty = tmp_path / "empty"
    run_git(tmp_path, "init", "-q", "-b", "main", str(empty))
    unborn = lanes.coordinator_view(str(empty))
    assert unborn.branch == "main" and unborn.head is None


def test_porcelain_v2_records_convert_to_v1_codes():
    raw = (b"# branch.oid (initial)\0# branch.head main\0"
           b"1 .M N... 100644 100644 100644 aaa aaa a b.txt\0"
           b"2 R. N... 100644 100644 100644 aaa aaa R100 new.txt\0old.txt\0"
           b"u UU N... 100644 100644 100644 100644 a b c conflict.txt\0"
           b"1 .M S.M. 160000 160000 160000 aaa aaa sub\0"
           b"? spaced name.txt\0")
    read = parse_status_v2(raw)
    assert read.head is None and read.branch == "main"
    assert read.entries == [(" M", "a b.txt"), ("R ", "new.txt"), ("UU", "conflict.txt"), (" M", "sub"),
                            ("??", "spaced name.txt")]
    assert read.dirty_submodules == ["sub"]


# ---------------------------------------------------------------- LANE-ADM-03


def test_inspect_lane_reads_real_facts_from_a_real_worktree(tmp_path, repo, lanes):
    """Ports LANE-ADM-03."""
    base = head(repo)
    lane = add_lane(repo, SLUG, "task-a", tmp_path / "lanes")
    facts = lanes.inspect_lane(repo, lane)
    assert facts.exists and facts.real_path == lane
    assert facts.same_repository and facts.is_worktree_root
    assert facts.branch == f"imm-lane/{SLUG}/task-a"
    assert facts.head == base
    assert facts.clean
    assert facts.active_claim_task_id is None
    assert lanes.inspect_lane(repo, repo).real_path == lanes.resolve_root(repo)


def test_inspect_lane_reports_dirt_foreign_repository_missing_path_and_subdirectory(tmp_path, repo, lanes):
    """Ports LANE-ADM-03."""
    lane = add_lane(repo, SLUG, "task-a", tmp_path / "lanes")
    write_file(lane, "stray.txt", "x\n")
    assert lanes.inspect_lane(repo, lane).clean is False

    foreign = make_repo(tmp_path / "foreign")
    facts = lanes.inspect_lane(repo, foreign)
    assert facts.exists and not facts.same_repository and not facts.is_worktree_root and facts.branch is None

    missing = lanes.inspect_lane(repo, str(tmp_path / "nowhere"))
    assert missing.exists is False and missing.real_path is None

    write_file(lane, "sub/keep.txt", "k\n")
    sub = lanes.inspect_lane(repo, os.path.join(lane, "sub"))
    assert sub.same_repository and sub.is_worktree_root is False


def test_inspect_lane_ignores_ignored_state_and_resolves_a_symlinked_path(tmp_path, repo, lanes):
    lane = add_lane(repo, SLUG, "task-a", tmp_path / "lanes")
    write_file(lane, ".imm/state/kernel/claim.json", "{}\n")
    link = tmp_path / "link-to-lane"
    link.symlink_to(lane)
    facts = lanes.inspect_lane(repo, str(link))
    assert facts.real_path == lane and facts.is_worktree_root and facts.clean


def test_inspect_lane_costs_one_spawn_per_lane(tmp_path, repo, lanes):
    """The git directories are read from git's files; the status is the one spawn."""
    paths = [add_lane(repo, SLUG, task, tmp_path / "lanes") for task in ("task-a", "task-b", "task-c")]
    STATS.reset()
    for path in paths:
        assert lanes.inspect_lane(repo, path).same_repository
    assert STATS.spawns == 3
    STATS.reset()
    lanes.inspect_lane(repo, str(tmp_path / "gone"))
    assert STATS.spawns == 0


def test_inspect_lane_asks_git_where_only_git_can_say_and_agrees(tmp_path, repo, lanes, monkeypatch):
    """With GIT_CEILING_DIRECTORIES set (a variable that changes how git finds directories) the
    directories are git's answer: one more spawn per Lane, the same facts."""
    lane = add_lane(repo, SLUG, "task-a", tmp_path / "lanes")
    read_from_files = lanes.inspect_lane(repo, lane)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path / "elsewhere"))
    asked = type(lanes)()
    STATS.reset()
    assert asked.inspect_lane(repo, lane) == read_from_files
    assert STATS.spawns == 3  # the coordinator's and the Lane's rev-parse, the status
    sub = os.path.join(lane, "sub")
    os.makedirs(sub)
    assert asked.inspect_lane(repo, sub).is_worktree_root is False


def test_resolve_root_keeps_a_missing_path(tmp_path, lanes):
    assert lanes.resolve_root(str(tmp_path / "missing")) == str(tmp_path / "missing")


# ---------------------------------------------------------------- lineage (docs/upstream.md#the-batch-lineage)


def _child_commit(repo: str, task: str) -> str:
    write_file(repo, f"{task}.txt", f"{task}\n")
    return commit_all(repo, batch_message(task, BATCH))


def test_lineage_is_equal_at_the_expected_head_without_a_spawn_given_a_view(repo, lanes):
    first = _child_commit(repo, "task-a")
    view = lanes.coordinator_view(repo)
    STATS.reset()
    lineage = lanes.classify_lineage(repo, f"imm/{SLUG}", first, [first], BATCH, view=view)
    assert lineage.kind == "equal" and lineage.head == first
    assert STATS.spawns == 0
    STATS.reset()
    assert lanes.classify_lineage(repo, f"imm/{SLUG}", first, [first], BATCH).kind == "equal"
    assert STATS.spawns == 1


def test_lineage_adopts_a_user_fast_forward(repo, lanes):
    first = _child_commit(repo, "task-a")
    user = commit_file(repo, "outside.txt", "user\n", "user work")
    lineage = lanes.classify_lineage(repo, f"imm/{SLUG}", first, [first], BATCH)
    assert lineage.kind == "fast_forward" and lineage.head == user and lineage.message == ""


def test_lineage_breaks_on_a_foreign_commit_claiming_the_batch(repo, lanes):
    first = _child_commit(repo, "task-a")
    forged = commit_file(repo, "forged.txt", "f\n", batch_message("task-z", BATCH))
    lineage = lanes.classify_lineage(repo, f"imm/{SLUG}", first, [first], BATCH)
    assert lineage.kind == "broken"
    assert lineage.message == f"batch_head_lineage_broken: commit {forged} claims batch {BATCH} without recorded evidence"


def test_lineage_breaks_on_a_rewritten_branch(repo, lanes):
    base = head(repo)
    first = _child_commit(repo, "task-a")
    run_git(repo, "reset", "-q", "--hard", base)
    rewritten = commit_file(repo, "other.txt", "o\n", "rewrite")
    lineage = lanes.classify_lineage(repo, f"imm/{SLUG}", first, [first], BATCH)
    assert lineage.kind == "broken" and lineage.head == rewritten
    assert lineage.message == (f"batch_head_lineage_broken: current HEAD {rewritten} does not descend from expected "
                               f"batch head {first}")


def test_lineage_breaks_when_a_recorded_commit_left_the_history(repo, lanes):
    base = head(repo)
    first = _child_commit(repo, "task-a")
    run_git(repo, "reset", "-q", "--hard", base)
    user = commit_file(repo, "other.txt", "o\n", "user")
    # an adoption recorded base -> user would make `user` the expected head while `first` is lost
    lineage = lanes.classify_lineage(repo, f"imm/{SLUG}", base, [first], BATCH)
    assert lineage.kind == "broken"
    assert lineage.message == f"batch_head_lineage_broken: recorded commit {first} is no longer reachable from HEAD"
    assert lineage.head == user


def test_lineage_breaks_on_another_branch_a_detached_head_or_an_unknown_commit(repo, lanes):
    first = _child_commit(repo, "task-a")
    other = lanes.classify_lineage(repo, "imm/other", first, [first], BATCH)
    assert other.message == f"batch_head_lineage_broken: current branch imm/{SLUG} does not match expected branch imm/other"
    run_git(repo, "checkout", "-q", "--detach")
    detached = lanes.classify_lineage(repo, f"imm/{SLUG}", first, [first], BATCH)
    assert detached.kind == "broken" and "current branch (detached)" in detached.message
    run_git(repo, "checkout", "-q", f"imm/{SLUG}")
    user = commit_file(repo, "u.txt", "u\n", "user")
    unknown = "0" * 40
    lineage = lanes.classify_lineage(repo, f"imm/{SLUG}", first, [first, unknown], BATCH)
    assert lineage.kind == "broken" and lineage.head == user
    assert lineage.message == f"batch_head_lineage_broken: recorded commit {unknown} is no longer reachable from HEAD"


def test_lineage_fast_forward_costs_two_spawns_given_a_view(repo, lanes):
    first = _child_commit(repo, "task-a")
    second = _child_commit(repo, "task-b")
    commit_file(repo, "outside.txt", "user\n", "user work")
    view = lanes.coordinator_view(repo)
    STATS.reset()
    assert lanes.classify_lineage(repo, f"imm/{SLUG}", second, [first, second], BATCH, view=view).kind == "fast_forward"
    assert STATS.spawns == 2


# ---------------------------------------------------------------- LANE-REL-09


def test_audit_pair_is_found_only_complete_for_the_named_task_at_the_given_head(repo, lanes):
    """Ports LANE-REL-09."""
    base = head(repo)
    record_path, proof_path = write_audit_pair(repo, "task-a", "run-1")
    os.remove(os.path.join(repo, proof_path))
    only_record = commit_all(repo, "record only", batch_identity=False)
    write_audit_pair(repo, "task-a", "run-1")
    both = commit_all(repo, "pair", batch_identity=False)
    STATS.reset()
    assert lanes.audit_reachable(repo, only_record, "task-a") is False
    assert lanes.audit_reachable(repo, both, "task-a") is True
    assert lanes.audit_reachable(repo, both, "task-b") is False
    assert lanes.audit_reachable(repo, base, "task-a") is False
    assert lanes.audit_reachable(repo, both, "task-a") is True
    assert STATS.spawns == 3  # one listing per commit, whatever the tasks asked about
    assert record_path.startswith(".imm/audit/task-a/run-1/")


def test_audit_pair_of_a_task_id_prefix_does_not_count(repo, lanes):
    """Ports LANE-REL-09."""
    write_audit_pair(repo, "task-ab", "run-1")
    pair = commit_all(repo, "pair of task-ab", batch_identity=False)
    assert lanes.audit_reachable(repo, pair, "task-a") is False
    assert lanes.audit_reachable(repo, pair, "../etc") is False


# ---------------------------------------------------------------- findIntegratedCandidate


def test_find_integrated_adopts_an_integration_a_crash_interrupted(tmp_path, repo, lanes):
    base = head(repo)
    lane = add_lane(repo, SLUG, "task-a", tmp_path / "lanes")
    write_file(lane, "a.txt", "a\n")
    lane_commit = commit_all(lane, batch_message("task-a", BATCH))
    other = commit_file(repo, "other.txt", "o\n", "user work")
    # the guarded integration replayed the lane commit onto the moved head, then the tick crashed
    run_git(repo, "cherry-pick", "--allow-empty", lane_commit)
    replayed = head(repo)
    STATS.reset()
    found = lanes.find_integrated(repo, "task-a", BATCH, base, base, lane_commit)
    assert found == replayed
    assert STATS.spawns == 2
    assert lanes.find_integrated(repo, "task-a", "batch-other", base, base, lane_commit) is None
    assert lanes.find_integrated(repo, "task-b", BATCH, base, base, lane_commit) is None
    assert lanes.find_integrated(repo, "task-a", BATCH, replayed, base, lane_commit) is None
    assert other != replayed


def test_find_integrated_refuses_a_commit_whose_change_differs(tmp_path, repo, lanes):
    base = head(repo)
    lane = add_lane(repo, SLUG, "task-a", tmp_path / "lanes")
    write_file(lane, "a.txt", "a\n")
    lane_commit = commit_all(lane, batch_message("task-a", BATCH))
    write_file(repo, "a.txt", "different\n")
    commit_all(repo, batch_message("task-a", BATCH))
    assert lanes.find_integrated(repo, "task-a", BATCH, base, base, lane_commit) is None


def test_find_integrated_finds_the_lane_commit_itself_after_a_fast_forward(tmp_path, repo, lanes):
    base = head(repo)
    lane = add_lane(repo, SLUG, "task-a", tmp_path / "lanes")
    write_file(lane, "a.txt", "a\n")
    lane_commit = commit_all(lane, batch_message("task-a", BATCH))
    run_git(repo, "merge", "--ff-only", "-q", lane_commit)
    assert lanes.find_integrated(repo, "task-a", BATCH, base, base, lane_commit) == lane_commit
