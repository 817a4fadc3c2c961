"""The guarded integration on real repositories and worktrees (docs/upstream.md#the-guarded-integration, #the-descriptor-rerun-and-deterministic-qa;
LANE-INT-01..08, 11, 12, 13, 17): lineage checks, candidate, change identity, descriptor
rerun on the materialized candidate, fast-forward; every refusal leaves everything unmoved."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from lanes_es.adapters import qa
from lanes_es.adapters.git import STATS
from lanes_es.adapters.candidate_git import GitCandidates
from lanes_es.adapters.lane_git import change_identities
from lanes_es.ports import IntegrationChild, IntegrationError, IntegrationRequest
from tests.gitfixtures import (
    add_lane,
    all_refs,
    batch_message,
    checkout_batch_branch,
    commit_all,
    commit_file,
    descriptor,
    fails_if_exists,
    git_out,
    head,
    intent_json,
    intent_path,
    make_repo,
    porcelain,
    rev,
    run_git,
    subjects,
    write_file,
    write_intent,
)

SLUG = "initiative-slug"
BRANCH = f"imm/{SLUG}"
BATCH = "batch-001"


def _intents() -> dict[str, dict]:
    return {
        "task-a": intent_json("task-a", ["a.txt", "b.txt", "g.txt", "base.txt", "shared.txt", "e.txt"]),
        "task-c": intent_json("task-c", ["task-c.txt", "shared.txt"], verification=fails_if_exists("shared.txt")),
        "task-d": intent_json("task-d"),
        "task-s": intent_json("task-s", ["shared.txt"]),
    }


@pytest.fixture
def repo(tmp_path):
    root = make_repo(tmp_path / "repo", intents=_intents())
    checkout_batch_branch(root, SLUG)
    return root


@pytest.fixture
def lanes():
    return GitCandidates()


def _deliver(repo: str, tmp_path, task: str, files: dict[str, str]) -> tuple[str, str, str]:
    """A Lane for `task` at the current batch head with one lane commit; (lane, base, lane commit)."""
    base = head(repo)
    lane = add_lane(repo, SLUG, task, tmp_path / "lanes")
    for relative, content in files.items():
        write_file(lane, relative, content)
    return lane, base, commit_all(lane, batch_message(task, BATCH))


def _request(repo: str, task: str, base: str, lane_commit: str, *, batch_head: str | None = None,
             branch: str = BRANCH, siblings: list[IntegrationChild] | None = None,
             intent: str | None = "default") -> IntegrationRequest:
    return IntegrationRequest(
        root=repo, branch=branch, batch_head=batch_head or head(repo), lane_base=base, lane_commit=lane_commit,
        child=IntegrationChild(task_id=task, intent_path=intent_path(task) if intent == "default" else intent),
        siblings=siblings or [])


def _snapshot(repo: str) -> tuple[str, str, str, bytes, bool]:
    """Everything a refused integration must leave as it was."""
    with open(os.path.join(repo, ".git", "index"), "rb") as index:
        return head(repo), all_refs(repo), porcelain(repo), index.read(), os.path.exists(os.path.join(repo, ".imm"))


def _refused(lanes: GitCandidates, request: IntegrationRequest) -> IntegrationError:
    before = _snapshot(request.root)
    with pytest.raises(IntegrationError) as raised:
        lanes.integrate(request)
    assert _snapshot(request.root) == before
    assert str(raised.value).startswith(raised.value.reason + ": ")
    return raised.value


# ---------------------------------------------------------------- LANE-INT-01, 02, 17


def test_fast_forwards_to_the_lane_commit_itself_when_the_batch_head_is_the_lane_base(tmp_path, repo, lanes):
    """Ports LANE-INT-01."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-a", {"a.txt": "a\n"})
    STATS.reset()
    landed = lanes.integrate(_request(repo, "task-a", base, lane_commit))
    assert landed == lane_commit and head(repo) == lane_commit and rev(repo, BRANCH) == lane_commit
    assert open(os.path.join(repo, "a.txt")).read() == "a\n"
    assert porcelain(repo) == ""
    assert STATS.spawns <= 6


def test_replays_a_lane_change_onto_a_moved_batch_head_and_keeps_its_identity(tmp_path, repo, lanes):
    """Ports LANE-INT-02."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-a", {"b.txt": "b\n"})
    moved = commit_file(repo, "other.txt", "other\n", "unrelated")
    landed = lanes.integrate(_request(repo, "task-a", base, lane_commit))
    assert landed != lane_commit and head(repo) == landed
    assert rev(repo, "HEAD^") == moved
    lane_change, landed_change = change_identities(repo, [(base, lane_commit), (moved, landed)])
    assert lane_change == landed_change and set(lane_change) == {"b.txt"}
    assert open(os.path.join(repo, "b.txt")).read() == "b\n"


def test_the_candidate_keeps_the_lane_message_and_author_and_takes_the_batch_committer(tmp_path, repo, lanes,
                                                                                     monkeypatch):
    """Ports LANE-INT-17."""
    lane, base = add_lane(repo, SLUG, "task-a", tmp_path / "lanes"), head(repo)
    write_file(lane, "b.txt", "b\n")
    message = "imm(task-a): deliver b\n\nbody line\n\nImmune-Brain-Batch: batch-001\n"
    run_git(lane, "add", "b.txt")
    run_git(lane, "commit", "-q", "-F", "-", input=message,
            env={"GIT_AUTHOR_NAME": "Lane Author", "GIT_AUTHOR_EMAIL": "lane@example.invalid",
                 "GIT_AUTHOR_DATE": "2021-02-03T04:05:06+07:00"})
    lane_commit = head(lane)
    commit_file(repo, "other.txt", "other\n", "unrelated")
    monkeypatch.delenv("GIT_COMMITTER_NAME", raising=False)
    monkeypatch.delenv("GIT_COMMITTER_EMAIL", raising=False)
    landed = lanes.integrate(_request(repo, "task-a", base, lane_commit))
    fmt = "%an%n%ae%n%aI%n%cn%n%ce"
    assert git_out(repo, "log", "-1", f"--format={fmt}", landed).split("\n") == [
        "Lane Author", "lane@example.invalid", "2021-02-03T04:05:06+07:00", "Immune-Brain Batch",
        "immune-brain@local"]
    stored = lambda commit: subprocess.run(["git", "-C", repo, "cat-file", "commit", commit], check=True,  # noqa: E731
                                           capture_output=True).stdout.split(b"\n\n", 1)[1]
    assert stored(lane_commit) == message.encode()
    # docs/upstream.md#the-guarded-integration: the candidate's message is `git log -n 1 --format=%B <lane_commit>` taken raw,
    # that is the lane commit's message followed by the newline log ends its format with
    percent_b = subprocess.run(["git", "-C", repo, "log", "-n", "1", "--format=%B", lane_commit], check=True,
                               capture_output=True).stdout
    assert percent_b == message.encode() + b"\n"
    assert stored(landed) == percent_b
    assert git_out(repo, "log", "-1", "--format=%(trailers:key=Immune-Brain-Batch,valueonly)", landed) == "batch-001"


def test_the_committer_follows_the_environment(tmp_path, repo, lanes, monkeypatch):
    """Ports LANE-INT-17."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-a", {"b.txt": "b\n"})
    commit_file(repo, "other.txt", "other\n", "unrelated")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Night Shift")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "night@example.invalid")
    landed = lanes.integrate(_request(repo, "task-a", base, lane_commit))
    assert git_out(repo, "log", "-1", "--format=%cn <%ce>", landed) == "Night Shift <night@example.invalid>"


# ---------------------------------------------------------------- LANE-INT-03, 04, 05, 06, 12


def test_refuses_a_conflicting_change_and_leaves_the_branch_unmoved(tmp_path, repo, lanes):
    """Ports LANE-INT-03."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-a", {"base.txt": "lane\n"})
    commit_file(repo, "base.txt", "batch\n", "batch edit")
    error = _refused(lanes, _request(repo, "task-a", base, lane_commit))
    assert error.reason == "batch_integration_conflict"
    assert "does not apply cleanly" in str(error)


@pytest.mark.parametrize("case", ["branch", "head", "base"])
def test_refuses_a_broken_lineage(tmp_path, repo, lanes, case):
    """Ports LANE-INT-04."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-a", {"a.txt": "a\n"})
    request = {
        "branch": _request(repo, "task-a", base, lane_commit, branch="imm/other"),
        "head": _request(repo, "task-a", base, lane_commit, batch_head=lane_commit),
        "base": _request(repo, "task-a", lane_commit, lane_commit),
    }[case]
    error = _refused(lanes, request)
    assert error.reason == "batch_head_lineage_broken"
    assert head(repo) == base
    assert str(error) == {
        "branch": f"batch_head_lineage_broken: current branch {BRANCH} does not match expected branch imm/other",
        "head": f"batch_head_lineage_broken: current HEAD {base} does not match expected batch head {lane_commit}",
        "base": f"batch_head_lineage_broken: lane commit {lane_commit} does not descend from lane base {lane_commit}",
    }[case]


def test_refuses_a_lane_commit_with_two_parents_and_a_base_off_the_batch_history(tmp_path, repo, lanes):
    """Ports LANE-INT-04."""
    base = head(repo)
    lane = add_lane(repo, SLUG, "task-a", tmp_path / "lanes")
    run_git(lane, "checkout", "-q", "-b", "side")
    side = commit_file(lane, "side.txt", "s\n", "side")
    run_git(lane, "checkout", "-q", f"imm-lane/{SLUG}/task-a")
    write_file(lane, "a.txt", "a\n")
    commit_all(lane, "pre")
    run_git(lane, "merge", "-q", "--no-ff", "-m", batch_message("task-a", BATCH), "side")
    merge = head(lane)
    error = _refused(lanes, _request(repo, "task-a", base, merge))
    assert str(error) == f"batch_head_lineage_broken: lane commit {merge} has 2 parents, expected exactly one"

    write_file(lane, "a.txt", "again\n")
    off_history = commit_all(lane, batch_message("task-a", BATCH))
    error = _refused(lanes, _request(repo, "task-a", merge, off_history))
    assert str(error) == f"batch_head_lineage_broken: lane base {merge} is not an ancestor of batch head {base}"
    assert side


def test_refuses_a_candidate_that_no_longer_carries_the_lane_change(tmp_path, repo, lanes):
    """Ports LANE-INT-05."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-a", {"g.txt": "same\n"})
    commit_file(repo, "g.txt", "same\n", "the same edit, made on the batch branch")
    branch_before = rev(repo, BRANCH)
    error = _refused(lanes, _request(repo, "task-a", base, lane_commit))
    assert error.reason == "batch_integration_conflict"
    assert "does not carry the lane commit" in str(error)
    assert rev(repo, BRANCH) == branch_before


def test_change_identity_distinguishes_content_and_mode(tmp_path, repo):
    """Ports LANE-INT-06."""
    base = head(repo)
    first = add_lane(repo, SLUG, "task-a", tmp_path / "one")
    second = add_lane(repo, SLUG, "task-x", tmp_path / "two")
    third = add_lane(repo, SLUG, "task-y", tmp_path / "three")
    write_file(first, "e.txt", "one\n")
    write_file(second, "e.txt", "two\n")
    write_file(third, "e.txt", "one\n", mode=0o755)
    commits = [commit_all(lane, "e") for lane in (first, second, third)]
    identities = change_identities(repo, [(base, commit) for commit in commits])
    assert identities[0] != identities[1] and identities[0] != identities[2]
    assert identities[0]["e.txt"].startswith("100644 ") and identities[2]["e.txt"].startswith("100755 ")


def test_reports_a_plumbing_conflict_with_a_sibling_as_a_conflict(tmp_path, repo, lanes):
    """Ports LANE-INT-12."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-c", {"shared.txt": "lane\n"})
    sibling = commit_file(repo, "shared.txt", "sibling\n", batch_message("task-s", BATCH))
    error = _refused(lanes, _request(repo, "task-c", base, lane_commit, siblings=[
        IntegrationChild(task_id="task-s", intent_path=intent_path("task-s"), commit=sibling)]))
    assert error.reason == "batch_integration_conflict"


def test_a_fast_forward_the_coordinator_checkout_refuses_is_a_conflict(tmp_path, repo, lanes):
    _, base, lane_commit = _deliver(repo, tmp_path, "task-a", {"a.txt": "a\n"})
    write_file(repo, "a.txt", "an untracked file the merge would overwrite\n")
    error = _refused(lanes, _request(repo, "task-a", base, lane_commit))
    assert error.reason == "batch_integration_conflict"
    assert f"could not fast-forward to {lane_commit}" in str(error)


# ---------------------------------------------------------------- LANE-INT-07, 08, 13


def test_a_passing_descriptor_rerun_fast_forwards(tmp_path, repo, lanes):
    """Ports LANE-INT-07."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-c", {"task-c.txt": "c\n"})
    assert lanes.integrate(_request(repo, "task-c", base, lane_commit)) == lane_commit
    assert rev(repo, BRANCH) == lane_commit and head(repo) == lane_commit


def _sibling_breaks_c(tmp_path, repo) -> tuple[str, str, str, IntegrationChild]:
    lane, base, lane_commit = _deliver(repo, tmp_path, "task-c", {"task-c.txt": "c\n"})
    sibling = commit_file(repo, "shared.txt", "shared\n", batch_message("task-s", BATCH), batch_identity=True)
    return lane, base, lane_commit, IntegrationChild(task_id="task-s", intent_path=intent_path("task-s"),
                                                     commit=sibling)


def test_a_sibling_change_that_breaks_the_child_descriptor_is_refused(tmp_path, repo, lanes):
    """Ports LANE-INT-08."""
    _, base, lane_commit, sibling = _sibling_breaks_c(tmp_path, repo)
    error = _refused(lanes, _request(repo, "task-c", base, lane_commit, siblings=[sibling]))
    assert error.reason == "batch_integration_check_failed"
    assert str(error).startswith("batch_integration_check_failed: task-c:A1 failed on candidate ")
    assert head(repo) == sibling.commit and rev(repo, BRANCH) == sibling.commit
    assert porcelain(repo) == "" and not os.path.exists(os.path.join(repo, ".imm"))


def test_a_disjoint_child_still_integrates_after_another_child_guard_failed(tmp_path, repo, lanes):
    """Ports LANE-INT-13."""
    lane_c, base, c_commit, sibling = _sibling_breaks_c(tmp_path, repo)
    with pytest.raises(IntegrationError):
        lanes.integrate(_request(repo, "task-c", base, c_commit, siblings=[sibling]))
    _, d_base, d_commit = _deliver(repo, tmp_path, "task-d", {"task-d.txt": "d\n"})
    landed = lanes.integrate(_request(repo, "task-d", d_base, d_commit, siblings=[sibling]))
    assert rev(repo, BRANCH) == landed
    assert subjects(repo, f"{base}..HEAD") == ["imm(task-d): deliver", "imm(task-s): deliver"]
    assert rev(repo, f"imm-lane/{SLUG}/task-c") == c_commit and os.path.isdir(lane_c)


def test_each_sibling_landed_after_the_lane_base_is_rerun_and_older_ones_are_not(tmp_path, repo, lanes):
    # task-s's own descriptor fails once task-c.txt exists: it only matters if s landed after c's base
    write_intent(repo, intent_json("task-s", ["shared.txt"], verification=fails_if_exists("task-c.txt")))
    commit_all(repo, "tighten task-s", batch_identity=False)
    early = commit_file(repo, "shared.txt", "s\n", batch_message("task-s", BATCH))
    _, base, lane_commit = _deliver(repo, tmp_path, "task-c", {"task-c.txt": "c\n"})
    old_sibling = IntegrationChild(task_id="task-s", intent_path=intent_path("task-s"), commit=early)
    # task-c's descriptor fails on shared.txt too; give it one that passes for this case
    write_intent(repo, intent_json("task-c", ["task-c.txt"]))
    moved = commit_all(repo, "relax task-c", batch_identity=False)
    landed = lanes.integrate(_request(repo, "task-c", base, lane_commit, siblings=[old_sibling]))
    assert rev(repo, "HEAD^") == moved and landed == head(repo)

    _, base2, second = _deliver(repo, tmp_path, "task-d", {"task-d.txt": "d\n"})
    late = commit_file(repo, "task-c.txt", "c again\n", batch_message("task-s", BATCH))
    late_sibling = IntegrationChild(task_id="task-s", intent_path=intent_path("task-s"), commit=late)
    error = _refused(lanes, _request(repo, "task-d", base2, second, siblings=[late_sibling]))
    assert "task-s:A1 failed on candidate" in str(error)


def test_an_export_ignore_attribute_cannot_hide_a_sibling_file_from_the_rerun(tmp_path, repo, lanes):
    """Ports LANE-INT-17."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-c", {"task-c.txt": "c\n"})
    write_file(repo, "shared.txt", "shared\n")
    write_file(repo, ".gitattributes", "shared.txt export-ignore\n.gitattributes export-ignore\n")
    sibling = commit_all(repo, batch_message("task-s", BATCH))
    error = _refused(lanes, _request(repo, "task-c", base, lane_commit, siblings=[
        IntegrationChild(task_id="task-s", intent_path=intent_path("task-s"), commit=sibling)]))
    assert error.reason == "batch_integration_check_failed"


def test_the_rerun_sees_modes_and_symlinks_of_the_candidate_and_leaves_no_tree_behind(tmp_path, repo, lanes,
                                                                                   monkeypatch):
    """Ports LANE-INT-17."""
    check = descriptor([], executable="./tools/check.sh")
    link = descriptor(["-c", "import os,sys; sys.exit(0 if os.readlink('link.txt') == 'task-c.txt' else 1)"])
    write_intent(repo, intent_json("task-c", ["task-c.txt", "tools", "link.txt"], acceptance=[
        {"id": "A1", "assertion": "the tool runs", "verification": check},
        {"id": "A2", "assertion": "the link is a link", "verification": link}]))
    commit_all(repo, "task-c checks", batch_identity=False)
    lane, base = add_lane(repo, SLUG, "task-c", tmp_path / "lanes"), head(repo)
    write_file(lane, "task-c.txt", "c\n")
    write_file(lane, "tools/check.sh", "#!/bin/sh\nexit 0\n", mode=0o755)
    os.symlink("task-c.txt", os.path.join(lane, "link.txt"))
    lane_commit = commit_all(lane, batch_message("task-c", BATCH))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert lanes.integrate(_request(repo, "task-c", base, lane_commit)) == lane_commit
    assert [name for name in os.listdir(scratch) if name.startswith("lanes-es-candidate-")] == []
    assert git_out(repo, "worktree", "list").count("\n") == 1  # the coordinator and the Lane only


# ---------------------------------------------------------------- LANE-INT-11


def test_a_rerun_without_an_intent_is_a_failure(tmp_path, repo, lanes):
    """Ports LANE-INT-11."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-c", {"task-c.txt": "c\n"})
    absent = _refused(lanes, _request(repo, "task-c", base, lane_commit, intent="docs/plans/absent.intent.json"))
    assert absent.reason == "batch_integration_check_failed"
    assert str(absent) == (f"batch_integration_check_failed: intent docs/plans/absent.intent.json of task-c is "
                           f"absent from candidate {lane_commit}")
    missing = _refused(lanes, _request(repo, "task-c", base, lane_commit, intent=None))
    assert str(missing) == "batch_integration_check_failed: task-c has no intent to rerun"


def test_an_unreadable_intent_or_an_invalid_descriptor_is_a_failure(tmp_path, repo, lanes):
    """Ports LANE-INT-11."""
    lane, base = add_lane(repo, SLUG, "task-c", tmp_path / "lanes"), head(repo)
    write_file(lane, "task-c.txt", "c\n")
    write_file(lane, intent_path("task-c"), "{ not json\n")
    broken = commit_all(lane, batch_message("task-c", BATCH))
    error = _refused(lanes, _request(repo, "task-c", base, broken))
    assert error.reason == "batch_integration_check_failed"
    assert str(error).startswith(f"batch_integration_check_failed: intent of task-c is unreadable in candidate {broken}")

    bad = descriptor(["-c", "pass"], executable="/bin/sh")  # an absolute executable is not a v2 tool name
    write_intent(lane, intent_json("task-c", ["task-c.txt"], verification=bad))
    run_git(lane, "commit", "-q", "--amend", "-a", "--no-edit")
    invalid = head(lane)
    error = _refused(lanes, _request(repo, "task-c", base, invalid))
    assert str(error).startswith("batch_integration_check_failed: a verification descriptor is invalid: ")


def test_a_rerun_that_cannot_complete_is_a_failure(tmp_path, repo, lanes, monkeypatch):
    """Ports LANE-INT-11."""
    _, base, lane_commit = _deliver(repo, tmp_path, "task-c", {"task-c.txt": "c\n"})

    def explode(*_args, **_kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(qa, "run_acceptance_with_outputs", explode)  # what the candidate rerun calls
    error = _refused(lanes, _request(repo, "task-c", base, lane_commit))
    assert str(error) == ("batch_integration_check_failed: the descriptor rerun could not complete: "
                          "no space left on device")


def test_a_failing_descriptor_names_every_failed_item(tmp_path, repo, lanes):
    """Ports LANE-INT-11."""
    fail = descriptor(["-c", "import sys; sys.exit(3)"])
    write_intent(repo, intent_json("task-c", ["task-c.txt"], acceptance=[
        {"id": "A1", "assertion": "passes", "verification": fails_if_exists("nothing.txt")},
        {"id": "A2", "assertion": "fails", "verification": fail},
        {"id": "A3", "assertion": "fails too", "verification": fail}]))
    commit_all(repo, "task-c items", batch_identity=False)
    _, base, lane_commit = _deliver(repo, tmp_path, "task-c", {"task-c.txt": "c\n"})
    error = _refused(lanes, _request(repo, "task-c", base, lane_commit))
    assert str(error) == f"batch_integration_check_failed: task-c:A2, task-c:A3 failed on candidate {lane_commit}"


def test_a_lane_commit_already_on_the_batch_branch_is_a_conflict(tmp_path, repo, lanes):
    _, base, lane_commit = _deliver(repo, tmp_path, "task-a", {"a.txt": "a\n"})
    run_git(repo, "merge", "-q", "--ff-only", lane_commit)
    commit_file(repo, "later.txt", "later\n", "later work")
    error = _refused(lanes, _request(repo, "task-a", base, lane_commit))
    assert error.reason == "batch_integration_conflict" and "is already in batch head" in str(error)


def test_a_replay_with_a_sibling_to_rerun_costs_at_most_ten_spawns(tmp_path, repo, lanes):
    _, base, lane_commit = _deliver(repo, tmp_path, "task-a", {"b.txt": "b\n"})
    sibling = commit_file(repo, "shared.txt", "s\n", batch_message("task-s", BATCH))
    lanes.integrate(_request(repo, "task-a", base, lane_commit, siblings=[  # warms the merge-tree capability probe
        IntegrationChild(task_id="task-s", intent_path=intent_path("task-s"), commit=sibling)]))
    _, base2, second = _deliver(repo, tmp_path, "task-d", {"task-d.txt": "d\n"})
    moved = commit_file(repo, "shared.txt", "s2\n", batch_message("task-s", BATCH))
    STATS.reset()
    lanes.integrate(_request(repo, "task-d", base2, second, siblings=[
        IntegrationChild(task_id="task-s", intent_path=intent_path("task-s"), commit=moved)]))
    assert STATS.spawns <= 10
