"""The user's checkout stays theirs: each batch runs in a coordinator worktree of its own (the default).

Through the real command line, on real repositories, on both store backends:

- one batch, refused by `land` while it runs and retired (its clean worktree removed), then a new one
  (on the same batch branch) run by the autopilot to completion while the user switches branches and
  commits; the user's checkout keeps its branch, its untracked and modified files
  (bytes compared); `land` refuses uncommitted work in the way and a branch it cannot fast-forward, then
  fast-forwards main, removes the coordinator worktree, and `verify` holds in the user's checkout;
- three Initiatives in one repository, each with its own `lanes-es run`, complete side by side while the
  user commits on main.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine import Task, initiative_markdown
from tests.gitfixtures import git_out, intent_json, make_repo, run_git

pytestmark = pytest.mark.coordinator_worktree
PROJECT = Path(__file__).resolve().parents[2]
EXECUTOR = f"{sys.executable} -P -m lanes_es.cli.example_executor"


def lanes_es(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lanes_es_argv(*args), cwd=cwd, env=env(), capture_output=True, text=True, timeout=300)


def lanes_es_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "lanes_es.cli.main", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(PROJECT)}


def run_command(slug: str, lanes: Path) -> list[str]:
    return lanes_es_argv("run", slug, "--max-parallel", "2", "--lanes-dir", str(lanes), "--yes",
                         "--executor", EXECUTOR)


def coordinator(repo: str, slug: str) -> Path:
    return Path(repo, ".git", "lanes-es", "coordinators", slug)


def batch_state(repo: str, slug: str) -> str:
    (state,) = [path for path in Path(coordinator(repo, slug), ".imm/state/batches").glob("*.json")
                if ".report" not in path.name]
    return json.loads(state.read_text())["batch_state"]


def refused(result: subprocess.CompletedProcess[str], reason: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and reason in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def work_files(repo: str, since: str, until: str) -> list[str]:
    """The files the commits since..until changed, outside the audit pairs each lane commit carries."""
    return sorted(path for path in git_out(repo, "diff", "--name-only", since, until).split()
                  if not path.startswith(".imm/"))


def user_view(repo: str, files: list[str]) -> tuple[str, str, str, dict[str, bytes]]:
    """The user's checkout as they see it: its branch, HEAD, status, and the bytes of their files."""
    status = git_out(repo, "status", "--porcelain=v1", "--untracked-files=all")
    return (git_out(repo, "branch", "--show-current"), git_out(repo, "rev-parse", "HEAD"), status,
            {name: Path(repo, name).read_bytes() for name in files})


def test_a_batch_runs_and_lands_while_the_user_works_in_their_checkout(tmp_path, store_url):
    slug = "work"
    tasks = {"one": Task(["one.txt"]), "two": Task(["two.txt"])}
    repo = make_repo(tmp_path / "repo", intents={task: intent_json(task, task_scope.scope)
                                                 for task, task_scope in tasks.items()},
                     files={f"docs/initiatives/{slug}.md": initiative_markdown(tasks)})
    Path(repo, "notes.txt").write_bytes(b"my notes, not the batch's\n")
    Path(repo, "base.txt").write_bytes(b"base\nmy edit in progress\n")
    before = user_view(repo, ["notes.txt", "base.txt"])

    assert lanes_es("authorize", slug, "--max-parallel", "2", "--yes", cwd=repo).returncode == 0
    assert lanes_es("tick", slug, cwd=repo).returncode == 0  # started in its worktree: the checkout is dirty
    refused(lanes_es("land", slug, cwd=repo), "batch_not_completed")
    status = lanes_es("status", slug, cwd=repo)
    assert f"coordinator: worktree {coordinator(repo, slug)} on imm/{slug}" in status.stdout
    retired = lanes_es("retire", slug, "--yes", cwd=repo)  # says what it leaves: the (clean) worktree goes
    assert f"removed its coordinator worktree {coordinator(repo, slug)}" in retired.stdout, retired.stderr
    assert not coordinator(repo, slug).exists()
    assert user_view(repo, ["notes.txt", "base.txt"]) == before

    autopilot = subprocess.Popen(run_command(slug, tmp_path / "lanes"), cwd=repo, env=env(), text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # The user goes on working meanwhile: another branch, a commit there, and back.
    run_git(repo, "switch", "-q", "-c", "feature")
    Path(repo, "feature.txt").write_text("the user's feature\n")
    run_git(repo, "add", "feature.txt")
    run_git(repo, "commit", "-q", "-m", "the user's feature")
    run_git(repo, "switch", "-q", "main")
    output, _ = autopilot.communicate(timeout=300)
    assert autopilot.returncode == 0, output
    assert f"the batch ran in its coordinator worktree {coordinator(repo, slug)}" in output
    assert f"`lanes-es land {slug}`" in output
    assert batch_state(repo, slug) == "completed"
    assert user_view(repo, ["notes.txt", "base.txt"]) == before
    assert not Path(repo, ".imm").exists()

    Path(repo, "one.txt").write_text("the user's own one.txt\n")  # a file the batch adds: in the way
    refused(lanes_es("land", slug, cwd=repo), "uncommitted_work_in_the_way")
    os.remove(Path(repo, "one.txt"))
    refused(lanes_es("land", slug, "--onto", "feature", cwd=repo), "not_a_fast_forward")
    assert git_out(repo, "rev-parse", "HEAD") == before[1]

    landed = lanes_es("land", slug, cwd=repo)
    assert landed.returncode == 0, landed.stderr
    assert f"removed its coordinator worktree {coordinator(repo, slug)}" in landed.stdout
    assert git_out(repo, "rev-parse", "main") == git_out(repo, "rev-parse", f"imm/{slug}")
    assert work_files(repo, before[1], "main") == ["one.txt", "two.txt"]
    assert not coordinator(repo, slug).exists()
    assert {name: Path(repo, name).read_bytes() for name in before[3]} == before[3]
    assert git_out(repo, "status", "--porcelain=v1", "--untracked-files=all") == before[2]
    verified = lanes_es("verify", slug, cwd=repo)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    again = lanes_es("land", slug, cwd=repo)
    assert again.returncode == 0 and "main already holds" in again.stdout


def test_three_initiatives_run_side_by_side_in_one_repository(tmp_path, store_url):
    slugs = ("alpha", "beta", "gamma")
    intents, files = {}, {}
    for slug in slugs:
        tasks = {f"{slug}-{n}": Task([f"{slug}/{n}.txt"]) for n in (1, 2)}
        intents.update({task: intent_json(task, entry.scope) for task, entry in tasks.items()})
        files[f"docs/initiatives/{slug}.md"] = initiative_markdown(tasks)
    repo = make_repo(tmp_path / "repo", intents=intents, files=files)

    autopilots = {slug: subprocess.Popen(run_command(slug, tmp_path / f"lanes-{slug}"), cwd=repo, env=env(),
                                         text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                  for slug in slugs}
    for n in (1, 2):  # the user commits on main meanwhile
        Path(repo, f"user-{n}.txt").write_text(f"the user's commit {n}\n")
        run_git(repo, "add", f"user-{n}.txt")
        run_git(repo, "commit", "-q", "-m", f"the user's commit {n}")
    mine = git_out(repo, "rev-parse", "HEAD")
    outputs = {slug: process.communicate(timeout=300)[0] for slug, process in autopilots.items()}
    assert {slug: process.returncode for slug, process in autopilots.items()} == dict.fromkeys(slugs, 0), outputs

    for slug in slugs:
        assert batch_state(repo, slug) == "completed"
        assert git_out(str(coordinator(repo, slug)), "branch", "--show-current") == f"imm/{slug}"
        assert work_files(repo, f"imm/{slug}~2", f"imm/{slug}") == [f"{slug}/1.txt", f"{slug}/2.txt"]
        assert f"coordinator: worktree {coordinator(repo, slug)}" in lanes_es("status", slug, cwd=repo).stdout
    assert (git_out(repo, "branch", "--show-current"), git_out(repo, "rev-parse", "HEAD")) == ("main", mine)
    assert git_out(repo, "status", "--porcelain=v1", "--untracked-files=all") == ""
