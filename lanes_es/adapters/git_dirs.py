"""Where a checkout's git directories are, read from the files git keeps, without spawning git.

Every `lanes-es` command first finds its repository (and `task` commands their Lane's branch);
a git spawn through `sh` costs its import and a process. A plain `.git` directory, or the `.git`
file of a linked worktree with its `commondir`, is read directly; anything else (GIT_DIR and
friends in the environment, a repository owned by another user, which git may refuse as
dubious, an unusual layout) answers None and the caller asks git.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lanes_es.adapters.files import read_capped_text

GIT_FILE_BYTES = 64 * 1024  # HEAD, a `.git` file, `commondir`: a line each, in a Lane an Executor may rewrite


@dataclass(frozen=True)
class Checkout:
    """A worktree's top level, its own git dir and the common dir its worktrees share."""

    top: Path
    git_dir: Path
    common_dir: Path

    def head_ref(self) -> str | None:
        """`refs/heads/...` when HEAD is a branch, "HEAD" when detached, None when unreadable."""
        try:
            head = read_capped_text(self.git_dir / "HEAD", GIT_FILE_BYTES).strip()
        except (OSError, ValueError):  # unreadable, not UTF-8, or far longer than any HEAD
            return None
        if head.startswith("ref: "):
            return head[5:].strip()
        return "HEAD" if len(head) in (40, 64) and all(c in "0123456789abcdef" for c in head) else None


def find_checkout(start: str | os.PathLike[str]) -> Checkout | None:
    """The checkout holding `start`, read from files; None when only git can say."""
    if _git_environment_set():
        return None
    try:
        here = Path(start).resolve()
    except OSError:
        return None
    for directory in (here, *here.parents):
        if directory.name == ".git":  # inside a git dir without a checkout of its own on the way: git's call
            return None
        marker = directory / ".git"
        if marker.is_dir():
            return _checkout(directory, marker)
        if marker.is_file():
            git_dir = _linked_git_dir(marker)
            return _checkout(directory, git_dir) if git_dir is not None else None
        if marker.exists() or marker.is_symlink():
            return None
    return None


def common_dir_of(path: str | os.PathLike[str]) -> Path | None:
    """The git common dir (resolved) of the checkout holding `path`, read from files; None when only git can say.
    Two checkouts with the same one are worktrees of one repository."""
    found = find_checkout(path)
    return found.common_dir.resolve() if found is not None else None


def _git_environment_set() -> bool:
    """Variables that move git's directories: then only git knows where they are."""
    return any(value is not None for value in (
        os.environ.get("GIT_DIR"), os.environ.get("GIT_WORK_TREE"), os.environ.get("GIT_COMMON_DIR"),
        os.environ.get("GIT_CEILING_DIRECTORIES"), os.environ.get("GIT_DISCOVERY_ACROSS_FILESYSTEM")))


def _linked_git_dir(marker: Path) -> Path | None:
    try:
        text = read_capped_text(marker, GIT_FILE_BYTES).strip()
    except (OSError, ValueError):
        return None
    if not text.startswith("gitdir: "):
        return None
    path = Path(text[len("gitdir: "):].strip())
    return (marker.parent / path).resolve() if not path.is_absolute() else path.resolve()


def _checkout(top: Path, git_dir: Path) -> Checkout | None:
    if not (git_dir / "HEAD").is_file():
        return None
    common = git_dir
    commondir = git_dir / "commondir"
    if commondir.exists():
        try:
            named = Path(read_capped_text(commondir, GIT_FILE_BYTES).strip())
        except (OSError, ValueError):
            return None
        common = (git_dir / named).resolve() if not named.is_absolute() else named.resolve()
    try:
        owned = all(os.stat(path).st_uid == os.geteuid() for path in (top, common))
    except OSError:
        return None
    return Checkout(top=top, git_dir=git_dir, common_dir=common) if owned else None
