"""The Lane's reviewed delivery at QA: the two-spawn read gives the very identity of the read from HEAD.

`worktree_delivery` adds the working tree into an empty throwaway index; `_worktree_delivery_from_head`
is the read it replaced (`read-tree HEAD` first). Real repositories, each with a case where an empty
index could see less than HEAD's entries would have kept.
"""

from __future__ import annotations

import os
from pathlib import Path


from lanes_es.adapters import delivery
from lanes_es.adapters.git import STATS, git

SCOPE = ["src/**"]


def _repository(tmp_path: Path, config: dict[str, str] | None = None) -> Path:
    root = tmp_path / "lane"
    root.mkdir()
    git(str(root), "init", "-q", "-b", "main")
    for key, value in {"user.name": "T", "user.email": "t@example.invalid", **(config or {})}.items():
        git(str(root), "config", key, value)
    (root / "src").mkdir()
    (root / "src" / "a.txt").write_text("a\n")
    (root / "src" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "src" / "run.sh", 0o755)
    (root / "src" / "gone.txt").write_text("gone\n")
    os.symlink("a.txt", root / "src" / "link")
    git(str(root), "add", "-A")
    git(str(root), "update-index", "--chmod=+x", "src/run.sh")
    git(str(root), "commit", "-q", "-m", "base")
    return root


def _both(root: Path) -> tuple[str, int, str]:
    STATS.reset()
    fast = delivery.worktree_delivery(str(root), "t", SCOPE)
    spawns = STATS.spawns
    return fast, spawns, delivery._worktree_delivery_from_head(str(root), "t", SCOPE)


def _edit(root: Path) -> None:
    (root / "src" / "a.txt").write_text("edited\n")
    (root / "src" / "new.txt").write_text("new\n")
    (root / "src" / "gone.txt").unlink()
    (root / "src" / "build.log").write_text("ignored\n")
    (root / ".gitignore").write_text("*.log\n")


def test_an_ordinary_change_is_read_in_two_spawns_to_the_same_identity(tmp_path):
    root = _repository(tmp_path)
    _edit(root)
    index_before = (root / ".git" / "index").read_bytes()
    fast, spawns, exact = _both(root)
    assert (fast, spawns) == (exact, 2)
    assert (root / ".git" / "index").read_bytes() == index_before  # the Lane's own index untouched
    (root / "src" / "new.txt").write_text("other\n")
    assert delivery.worktree_delivery(str(root), "t", SCOPE) != fast


def test_a_tracked_file_the_ignore_rules_now_hide_falls_back_to_the_read_from_head(tmp_path):
    root = _repository(tmp_path)
    (root / ".gitignore").write_text("src/a.txt\n")
    (root / "src" / "a.txt").write_text("edited while ignored\n")
    fast, spawns, exact = _both(root)
    assert (fast, spawns) == (exact, 5)
    (root / "src" / "a.txt").write_text("edited again\n")
    assert delivery.worktree_delivery(str(root), "t", SCOPE) != fast  # still part of the delivery


def test_core_filemode_off_falls_back_to_the_read_from_head(tmp_path):
    root = _repository(tmp_path, {"core.fileMode": "false"})
    _edit(root)
    os.chmod(root / "src" / "run.sh", 0o644)  # git keeps HEAD's executable bit: no change to deliver
    fast, spawns, exact = _both(root)
    assert (fast, spawns) == (exact, 5)


def test_core_symlinks_off_falls_back_to_the_read_from_head(tmp_path):
    root = _repository(tmp_path, {"core.symlinks": "false"})
    _edit(root)
    (root / "src" / "link").unlink()
    (root / "src" / "link").write_text("a.txt")  # as a checkout without symlinks writes it
    fast, spawns, exact = _both(root)
    assert (fast, spawns) == (exact, 5)
