"""Finding a checkout from git's files agrees with `git rev-parse` on real repositories and worktrees."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lanes_es.adapters.git_dirs import find_checkout


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def rev_parse(cwd: Path) -> tuple[Path, Path, str]:
    top, common, head = git(cwd, "rev-parse", "--path-format=absolute", "--show-toplevel", "--git-common-dir",
                            "--symbolic-full-name", "HEAD").splitlines()
    return Path(top).resolve(), Path(common).resolve(), head


def make_repository(root: Path) -> Path:
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base")
    (root / "sub" / "deeper").mkdir(parents=True)
    return root


def agrees(start: Path) -> None:
    found = find_checkout(start)
    assert found is not None
    assert (found.top, found.common_dir, found.head_ref()) == rev_parse(start)


def test_a_plain_repository_and_its_subdirectories(tmp_path):
    repo = make_repository(tmp_path / "repo")
    agrees(repo)
    agrees(repo / "sub" / "deeper")


def test_a_linked_worktree_on_a_lane_branch_shares_the_common_dir(tmp_path):
    repo = make_repository(tmp_path / "repo")
    git(repo, "worktree", "add", "-q", "-b", "imm-lane/demo/task-a", str(tmp_path / "lane"))
    agrees(tmp_path / "lane")
    assert find_checkout(tmp_path / "lane").common_dir == (repo / ".git").resolve()


def test_a_detached_head(tmp_path):
    repo = make_repository(tmp_path / "repo")
    git(repo, "checkout", "-q", "--detach")
    assert find_checkout(repo).head_ref() == "HEAD"


def test_outside_any_repository_or_with_git_dir_set_git_is_asked(tmp_path, monkeypatch):
    plain = tmp_path / "plain"
    plain.mkdir()
    assert find_checkout(plain) is None
    repo = make_repository(tmp_path / "repo")
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    assert find_checkout(repo) is None
