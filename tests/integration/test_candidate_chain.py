"""A round's chain of stacked candidates on real git (GitCandidates.build_chain, candidate_checks, the local runner).

The chain must build the very commits serial builds (same tree, parent, author, message:
with one committer date, the same ids), fail where serial fails with serial's message, and
cost few spawns, counted here as counts: one log for the lane commits, a merge-tree and a
commit-tree per candidate, one diff-tree, one ls-tree and one cat-file; the verification of
a built candidate then reads nothing more from git.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lanes_es.adapters.check_runner import LocalCheckRunner, run_in_turn
from lanes_es.adapters.git import STATS
from lanes_es.adapters.candidate_git import CandidateTree, GitCandidates
from lanes_es.ports import CandidateBuild, IntegrationChild, IntegrationError, IntegrationRequest
from tests.gitfixtures import (
    add_lane,
    batch_message,
    checkout_batch_branch,
    commit_all,
    commit_file,
    descriptor,
    head,
    intent_json,
    make_repo,
    run_git,
    write_file,
    write_intent,
)

SLUG = "initiative-slug"
BATCH = "batch-001"


@pytest.fixture(autouse=True)
def one_committer_date(monkeypatch):
    """Candidates made at different seconds differ only by their committer date; fix it to compare ids."""
    monkeypatch.setenv("GIT_COMMITTER_DATE", "1700000000 +0000")
    monkeypatch.setattr(GitCandidates, "_merge_tree_has_merge_base", False)  # asked once per process otherwise


def lane_with(root: str, tmp_path: Path, task_id: str, files: dict[str, str], message: str | None = None,
              base: str = "HEAD") -> tuple[str, str]:
    """A Lane from `base` committing `files`; (lane base, lane commit)."""
    lane = add_lane(root, SLUG, task_id, tmp_path / "lanes", base=base)
    for relative, content in files.items():
        write_file(lane, relative, content)
    lane_base = head(lane)
    return lane_base, commit_all(lane, message or batch_message(task_id, BATCH))


def serial_candidates(root: str, parent: str, lanes: list[tuple[str, str]]) -> list[str]:
    """What serial builds: each lane commit on the candidate before it, through the serial path."""
    built, on = [], parent
    for base, lane in lanes:
        request = IntegrationRequest(root=root, branch=f"imm/{SLUG}", batch_head=on, lane_base=base, lane_commit=lane,
                                     child=IntegrationChild(task_id="t", intent_path=None), siblings=[])
        on, _ = GitCandidates()._candidate_on(request, [base])
        built.append(on)
    return built


@pytest.fixture
def repo(tmp_path):
    root = make_repo(tmp_path / "repo")
    checkout_batch_branch(root, SLUG)
    return root


def test_a_chain_builds_the_commits_serial_builds_in_few_spawns(tmp_path, repo):
    base = head(repo)
    lanes = [lane_with(repo, tmp_path, "a", {"a.txt": "a\n"}),
             lane_with(repo, tmp_path, "b", {"b.txt": "b\n", "dir/run.sh": "#!/bin/sh\n"}, message="no newline"),
             lane_with(repo, tmp_path, "c", {"c.txt": "c\n"})]
    assert all(lane_base == base for lane_base, _ in lanes)
    expected = serial_candidates(repo, base, lanes)
    chain = GitCandidates()
    STATS.reset()
    built = chain.build_chain(repo, base, lanes)
    # log (all lane commits) + merge-tree and commit-tree for b and c (a's candidate is its lane commit)
    # + one diff-tree + ls-tree of the base + cat-file of the chain's blobs.
    assert STATS.spawns == 1 + 2 * 2 + 3
    assert [build.commit for build in built] == expected
    assert expected[0] == lanes[0][1]
    assert [build.landed_since_base for build in built] == [[], [expected[0]], sorted(expected[:2])]
    for commit in expected:  # the tree the chain remembered is the tree git holds
        remembered, read = chain._candidate_tree(repo, commit), CandidateTree.read(repo, commit)
        assert remembered.entries == read.entries
        assert {path: remembered.file(path) for path in read.entries} == {path: read.file(path) for path in read.entries}


def test_a_chain_on_a_moved_head_asks_git_for_the_ancestry_and_still_matches_serial(tmp_path, repo):
    base = head(repo)
    lanes = [lane_with(repo, tmp_path, "a", {"a.txt": "a\n"}), lane_with(repo, tmp_path, "b", {"b.txt": "b\n"})]
    moved = commit_file(repo, "user.txt", "user\n")  # the batch head is no longer the lanes' base
    expected = serial_candidates(repo, moved, lanes)
    STATS.reset()
    built = GitCandidates().build_chain(repo, moved, lanes)
    assert [build.commit for build in built] == expected
    assert built[0].landed_since_base == [moved] and built[1].landed_since_base == sorted([moved, expected[0]])
    assert STATS.spawns == 1 + 3 * 2 + 3  # rev-list, merge-tree, commit-tree per candidate


def test_a_lane_that_does_not_apply_ends_the_chain_with_serials_message(tmp_path, repo):
    base = head(repo)
    lanes = [lane_with(repo, tmp_path, "a", {"same.txt": "a\n"}), lane_with(repo, tmp_path, "b", {"same.txt": "b\n"}),
             lane_with(repo, tmp_path, "c", {"c.txt": "c\n"})]
    built = GitCandidates().build_chain(repo, base, lanes)
    assert len(built) == 2 and isinstance(built[0], CandidateBuild) and isinstance(built[1], IntegrationError)
    with pytest.raises(IntegrationError) as serial:
        serial_candidates(repo, base, lanes[:2])
    assert str(built[1]) == str(serial.value)
    assert "does not apply cleanly" in str(built[1])


def test_a_lane_commit_git_cannot_read_fails_its_link_as_serial_does(tmp_path, repo):
    base = head(repo)
    good = lane_with(repo, tmp_path, "a", {"a.txt": "a\n"})
    built = GitCandidates().build_chain(repo, base, [good, (base, "0" * 40)])
    assert isinstance(built[0], CandidateBuild)
    assert isinstance(built[1], IntegrationError) and f"failed to read parents of {'0' * 40}" in str(built[1])


def test_checks_on_one_candidate_each_get_their_own_tree(tmp_path, repo):
    """A check that writes into its tree (here over a protected file) changes nothing another check sees,
    nor the candidate's objects kept for the next verification."""
    writer = descriptor(["-c", "open('shared.txt', 'w').write('written\\n')"])
    reader = descriptor(["-c", "import sys; sys.exit(open('shared.txt').read() != 'original\\n')"])
    write_file(repo, "shared.txt", "original\n")
    write_intent(repo, intent_json("w", ["w.txt"], verification=writer))
    write_intent(repo, intent_json("r", ["r.txt"], verification=reader))
    base = commit_all(repo, "intents", batch_identity=False)
    first = lane_with(repo, tmp_path, "w", {"w.txt": "w\n"})
    second = lane_with(repo, tmp_path, "r", {"r.txt": "r\n"})
    chain = GitCandidates()
    built = chain.build_chain(repo, base, [first, second])
    request = IntegrationRequest(
        root=repo, branch=f"imm/{SLUG}", batch_head=built[0].commit, lane_base=second[0], lane_commit=second[1],
        child=IntegrationChild(task_id="r", intent_path="docs/plans/r.intent.json"),
        siblings=[IntegrationChild(task_id="w", intent_path="docs/plans/w.intent.json", commit=built[0].commit)])
    STATS.reset()
    planned = chain.candidate_checks(request, built[1])
    assert STATS.spawns == 0  # the chain remembered the tree
    runner = LocalCheckRunner()
    with ThreadPoolExecutor(2) as pool:  # at once, as a round runs them
        runs = list(pool.map(lambda check: runner.run_check(planned.tree, check.task_id, check.intent),
                             planned.checks))
    assert STATS.spawns == 0
    by_task = {run.task_id: run.findings for run in runs}
    assert by_task["r"] == []  # the reader saw the original bytes
    assert by_task["w"] == ["w:A1"]  # the writer changed a protected input: its own verdict fails
    again = run_in_turn(chain.candidate_checks(request, built[1]))
    assert {check.task_id: check.findings for check in again.checks} == by_task
    assert chain._candidate_tree(repo, built[1].commit).file("shared.txt") == b"original\n"
