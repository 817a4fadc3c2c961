"""Coordinator worktrees on real git: made or reused for a new batch, removed when nothing in them is
uncommitted, and the fast-forward that lands a batch branch (docs/concepts/coordinator.md).

The user's checkout is only read here (its branch, its status for the paths a landing touches), and
written only by the one `git merge --ff-only` the user asked for with `lanes-es land`.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from lanes_es.adapters.git import git_ok
from lanes_es.adapters.git_dirs import common_dir_of, find_checkout
from lanes_es.adapters.lane_git import STATUS_ARGS, branch_and_head, parse_status_v2
from lanes_es.errors import ServiceError


@dataclass(frozen=True)
class Landing:
    """What `land` did: the branch moved (from, to), or nothing when it already held the batch."""

    onto: str
    before: str
    after: str
    worktree: str | None  # the checkout the branch is checked out in (the merge ran there), None: a ref update


class GitCoordinators:
    def prepare(self, repo_root: str, path: str, branch: str, head: str, slug: str) -> None:
        """A worktree at `path` for a new batch on `head`: reused when it is one of this repository (brought
        to `head` when it stands at an ancestor of it), else made there, on `branch` when that branch exists
        (it must be an ancestor of `head`: the last batch landed), else detached at `head` (the batch's first
        tick makes `branch` there). Whatever is still in the way is left for the preflight to refuse."""
        with _one_at_a_time(repo_root):  # confirmations given at once: one makes it, the others reuse it whole
            self._prepare(repo_root, path, branch, head, slug)

    def _prepare(self, repo_root: str, path: str, branch: str, head: str, slug: str) -> None:
        place = Path(path)
        if (place / ".git").exists() and _same_repository(repo_root, path):
            self._bring_to(path, branch, head, slug)
            return
        if place.exists() and any(place.iterdir()):
            raise ServiceError("coordinator_place_used",
                               f"{path} is not empty and is no worktree of this repository; nothing was confirmed: "
                               f"empty it, or name another place with --coordinator DIR")
        tip = _branch_tip(repo_root, branch)
        if tip is not None:
            _require_landed(repo_root, branch, tip, head, slug)
            self._add(repo_root, path, branch, slug)
            if tip != head:
                _fast_forward(path, head, slug)
        else:
            self._add(repo_root, path, "--detach", slug, head)

    @staticmethod
    def _bring_to(path: str, branch: str, head: str, slug: str) -> None:
        current, at = branch_and_head(path)
        if at == head or at is None:
            return
        if current == branch:
            _require_landed(path, branch, at, head, slug)
            _fast_forward(path, head, slug)
        elif current is None:
            git_ok(path, "checkout", "-q", "--detach", head)  # a dirty worktree stays as it is: the preflight says

    @staticmethod
    def _add(repo_root: str, path: str, what: str, slug: str, *more: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        added = git_ok(repo_root, "worktree", "add", "-q", path, what, *more)
        if added.exit_code != 0 and "already registered" in added.error_text:
            git_ok(repo_root, "worktree", "prune")  # a coordinator removed by hand: its registration goes first
            added = git_ok(repo_root, "worktree", "add", "-q", path, what, *more)
        if added.exit_code != 0:
            raise ServiceError("coordinator_unavailable",
                               f"git could not make the coordinator worktree {path} ({added.error_text.strip()}); "
                               f"nothing was confirmed: fix that (a batch branch checked out in your checkout: "
                               f"`git switch` away from it), or run in place with `--coordinator .`; then run "
                               f"`lanes-es authorize {slug}` again")

    def restore(self, repo_root: str, path: str, branch: str, base_head: str) -> bool:
        """A coordinator of a running batch that was removed (by hand): made again on its branch (or detached
        at the base before the first tick made the branch). False when git cannot."""
        tip = _branch_tip(repo_root, branch)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        git_ok(repo_root, "worktree", "prune")
        args = (branch,) if tip is not None else ("--detach", base_head)
        return git_ok(repo_root, "worktree", "add", "-q", path, *args).exit_code == 0

    def remove_if_clean(self, repo_root: str, path: str) -> str | None:
        """Remove the worktree at `path` when it holds nothing uncommitted; else why it was kept (None: removed or
        already gone). Its ignored files (the projections, derived from the log) go with it."""
        if not (Path(path) / ".git").exists():
            return None
        status = git_ok(path, *STATUS_ARGS)
        if status.exit_code != 0:
            return f"git status failed there: {status.error_text.strip()}"
        entries = parse_status_v2(status.stdout).entries
        if entries:
            listed = ", ".join(p for _, p in entries[:5]) + (" ..." if len(entries) > 5 else "")
            return f"it holds uncommitted changes ({listed})"
        removed = git_ok(repo_root, "worktree", "remove", path)
        if removed.exit_code != 0:
            return f"git worktree remove failed: {removed.error_text.strip()}"
        _remove_empty_places(Path(path))
        return None

    def current_branch(self, checkout: str) -> str | None:
        found = find_checkout(checkout)
        ref = found.head_ref() if found is not None else None
        if ref is not None:
            return ref[len("refs/heads/"):] if ref.startswith("refs/heads/") else None
        return branch_and_head(checkout)[0]

    def land(self, repo_root: str, branch: str, head: str, onto: str, slug: str) -> Landing:
        """Fast-forward `onto` to `branch` at `head` (the batch's recorded head), in the worktree that has `onto`
        checked out (only when no uncommitted path there is one the fast-forward changes), or as a ref update;
        refused otherwise."""
        tips = [_branch_tip(repo_root, name) or "" for name in (branch, onto)]
        if not tips[1]:
            raise ServiceError("branch_not_found", f"there is no branch {onto}; nothing was landed: name the branch "
                                                   f"to land on with `lanes-es land {slug} --onto BRANCH`")
        if tips[0] != head:
            raise ServiceError("batch_branch_moved",
                               f"{branch} is at {tips[0][:12] or 'nothing'}, not at the batch's verified head "
                               f"{head[:12]}; nothing was landed: put it back (`git branch -f {branch} {head}`) or "
                               f"land it yourself")
        tip, before = tips
        if tip == before:
            return Landing(onto=onto, before=before, after=tip, worktree=None)
        if git_ok(repo_root, "merge-base", "--is-ancestor", before, tip).exit_code != 0:
            raise ServiceError("not_a_fast_forward",
                               f"{onto} has commits {branch} does not have, so {branch} cannot land on it by "
                               f"fast-forward; nothing was landed: merge it yourself (`git merge {branch}` on "
                               f"{onto}), or rebase {onto}'s commits onto it")
        worktree = _checked_out_in(repo_root, onto)
        if worktree is None:
            git_ok(repo_root, "update-ref", f"refs/heads/{onto}", tip, before)
            return Landing(onto=onto, before=before, after=tip, worktree=None)
        _require_untouched(worktree, before, tip, onto, slug)
        merged = git_ok(worktree, "merge", "--ff-only", "-q", tip)
        if merged.exit_code != 0:
            raise ServiceError("land_failed", f"git merge --ff-only in {worktree} failed "
                                              f"({merged.error_text.strip()}); nothing was landed: fix that, then "
                                              f"run `lanes-es land {slug}` again")
        return Landing(onto=onto, before=before, after=tip, worktree=worktree)


@contextmanager
def _one_at_a_time(repo_root: str) -> Iterator[None]:
    """An exclusive flock on the repository's git common dir (a directory: no file is left behind), held while a
    coordinator worktree is made or brought to a head, so that another process never sees one half made."""
    found = find_checkout(repo_root)
    common_dir = found.common_dir if found is not None else Path(repo_root, ".git")
    try:
        descriptor = os.open(common_dir, os.O_RDONLY)
    except OSError:
        yield  # git says what is wrong when it is asked
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _same_repository(repo_root: str, path: str) -> bool:
    """Whether the checkout at `path` is a worktree of the repository `repo_root` is in (read from git's files)."""
    here, there = common_dir_of(repo_root), common_dir_of(path)
    if here is None or there is None:  # only git can say: ask it once
        asked = [git_ok(root, "rev-parse", "--path-format=absolute", "--git-common-dir").text
                 for root in (repo_root, path)]
        return asked[0] == asked[1] and bool(asked[0])
    return here == there


def _branch_tip(root: str, branch: str) -> str | None:
    probe = git_ok(root, "rev-parse", "--verify", "-q", f"refs/heads/{branch}^{{commit}}")
    return probe.text if probe.exit_code == 0 and probe.text else None


def _require_landed(root: str, branch: str, tip: str, head: str, slug: str) -> None:
    """A new batch starts on the user's HEAD: the batch branch may only be behind it (its last batch landed)."""
    if tip != head and git_ok(root, "merge-base", "--is-ancestor", tip, head).exit_code != 0:
        raise ServiceError("batch_branch_not_landed",
                           f"{branch} holds commits your HEAD {head[:12]} does not have (an earlier batch's, not "
                           f"landed); nothing was confirmed: land them (`lanes-es land {slug}` for a completed batch, "
                           f"else `git merge {branch}`) or drop them (`git branch -D {branch}`), then run "
                           f"`lanes-es authorize {slug}` again")


def _fast_forward(path: str, head: str, slug: str) -> None:
    moved = git_ok(path, "merge", "--ff-only", "-q", head)
    if moved.exit_code != 0:
        raise ServiceError("coordinator_unavailable",
                           f"the coordinator worktree {path} cannot move to your HEAD {head[:12]} "
                           f"({moved.error_text.strip()}); nothing was confirmed: commit or remove what is "
                           f"uncommitted there, then run `lanes-es authorize {slug}` again")


def _checked_out_in(root: str, branch: str) -> str | None:
    listed = git_ok(root, "worktree", "list", "--porcelain", "-z")
    path = None
    for field in listed.stdout.decode("utf-8", "surrogateescape").split("\0"):
        if field.startswith("worktree "):
            path = field[len("worktree "):]
        elif field == f"branch refs/heads/{branch}":
            return path
    return None


def _require_untouched(worktree: str, before: str, tip: str, onto: str, slug: str) -> None:
    """Refused when an uncommitted path of the checkout is one the fast-forward would write."""
    status = git_ok(worktree, *STATUS_ARGS)
    dirty = {path for _, path in parse_status_v2(status.stdout).entries} if status.exit_code == 0 else set()
    if not dirty:
        return
    changed = set(git_ok(worktree, "diff", "--name-only", "-z", before, tip).stdout.decode(
        "utf-8", "surrogateescape").split("\0")) - {""}
    touched = sorted(dirty & changed)
    if touched:
        listed = ", ".join(touched[:5]) + (" ..." if len(touched) > 5 else "")
        raise ServiceError("uncommitted_work_in_the_way",
                           f"{worktree} has uncommitted changes to {listed}, which landing on {onto} would "
                           f"overwrite; nothing was landed: commit or stash them, then run `lanes-es land "
                           f"{slug}` again")


def _remove_empty_places(path: Path) -> None:
    """lanes-es's own directories above a removed coordinator (`<git common dir>/lanes-es/coordinators`), when
    nothing else is left in them: a confirmation refused on a new repository leaves no `.git/lanes-es`."""
    for parent, name in ((path.parent, "coordinators"), (path.parent.parent, "lanes-es")):
        if parent.name != name:
            return
        try:
            parent.rmdir()
        except OSError:  # not empty: another coordinator, the store, the repository id
            return
