"""Provisioning and removing Lanes: the only code that runs `git worktree add` and `git worktree remove`.

The runtime never makes, switches or deletes a worktree or branch (docs/architecture.md, LANE-STAT-01/02);
the steward does, and never by force: a Lane is made or found, brought forward by fast-forward
only, and removed only when git itself agrees it is clean.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lanes_es.adapters.git import git, git_ok
from lanes_es.ports import GitFailure


class StewardRefusal(Exception):
    """The steward cannot make a task's Lane without a person; the message says what to do."""

    def __init__(self, task_id: str, message: str) -> None:
        super().__init__(message)
        self.task_id = task_id


@dataclass(frozen=True)
class Worktree:
    path: str  # real path
    head: str | None
    branch: str | None  # refs/heads/..., None when detached


# git reads each worktree's `commondir` file as it lists them, and dies ("failed to read .../commondir") on one
# that is there but empty: a `git worktree add` or `remove` of another coordinator of the repository caught
# half-way. The list is read again, these many seconds apart, before that is a failure.
LIST_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8)


def list_worktrees(root: str, sleep: Callable[[float], None] = time.sleep) -> dict[str, Worktree]:
    """Every worktree of the repository, by real path, from one `git worktree list --porcelain -z` (or a few,
    while another git command is adding or removing one); GitFailure saying what to do when it stays unreadable."""
    listed = git_ok(root, "worktree", "list", "--porcelain", "-z")
    for pause in LIST_PAUSES:
        if listed.exit_code == 0 or "failed to read" not in listed.error_text:
            break
        sleep(pause)
        listed = git_ok(root, "worktree", "list", "--porcelain", "-z")
    if listed.exit_code != 0:
        hint = (f"; another git command kept adding or removing a worktree of this repository for "
                f"{sum(LIST_PAUSES):g} s, or one stopped half-way and left that file empty: once no other git "
                f"command runs, remove the directory holding it (a worktree's entry under .git/worktrees/, not the "
                f"worktree's own files) and run again" if "failed to read" in listed.error_text else "")
        raise GitFailure(f"git worktree list failed ({listed.exit_code}): {listed.error_text}{hint}")
    fields = listed.stdout.decode("utf-8", "replace").split("\0")
    found: dict[str, Worktree] = {}
    block: dict[str, str] = {}
    for item in fields + [""]:
        if item:
            key, _, value = item.partition(" ")
            block[key] = value
            continue
        if "worktree" in block:
            path = os.path.realpath(block["worktree"])
            found[path] = Worktree(path=path, head=block.get("HEAD"), branch=block.get("branch"))
        block = {}
    return found


class Steward:
    """Makes and removes Lanes: the only code that runs `git worktree add` and `git worktree remove`."""

    def __init__(self, root: str, lanes_dir: Path) -> None:
        self.root = root
        self.lanes_dir = lanes_dir
        self._worktrees: dict[str, Worktree] | None = None
        self._branches: dict[str, str] | None = None  # refs/heads/... -> the commit it names

    def lane_path(self, task_id: str) -> Path:
        return self.lanes_dir / task_id

    def begin_round(self) -> None:
        """Forget the worktree and branch lists: one `git worktree list` and one `for-each-ref` serve every move
        of a round."""
        self._worktrees = None
        self._branches = None

    def branch_tip(self, ref: str) -> str | None:
        """The commit a local branch names, None when there is none (or it names no commit)."""
        if self._branches is None:
            listed = git(self.root, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(objecttype)",
                         "refs/heads/")
            self._branches = {}
            for line in listed.stdout.decode("utf-8", "surrogateescape").splitlines():
                name, sha, kind = (line.split("\0") + ["", ""])[:3]
                if kind == "commit":
                    self._branches[name] = sha
        return self._branches.get(ref)

    def worktrees(self) -> dict[str, Worktree]:
        if self._worktrees is None:
            self._worktrees = list_worktrees(self.root)
        return self._worktrees

    def _added(self, path: Path, lane_branch: str, head: str) -> None:
        real = os.path.realpath(path)
        self.worktrees()[real] = Worktree(path=real, head=head, branch=f"refs/heads/{lane_branch}")
        if self._branches is not None:
            self._branches[f"refs/heads/{lane_branch}"] = head

    def provision(self, task_id: str, lane_branch: str, base_head: str) -> str:
        """The task's Lane on `lane_branch` at `base_head`, made or found; StewardRefusal otherwise.

        A Lane or branch left by an earlier run is reused: at `base_head` as it is, behind it
        (clean, never admitted) brought forward by fast-forward. Nothing is ever reset or deleted.
        """
        path = self.lane_path(task_id)
        ref = f"refs/heads/{lane_branch}"
        worktrees = self.worktrees()
        existing = worktrees.get(os.path.realpath(path))
        if existing is not None:
            if existing.branch != ref:
                shown = existing.branch.removeprefix("refs/heads/") if existing.branch else "a detached HEAD"
                raise StewardRefusal(task_id, f"{path} is a worktree on {shown}, not {lane_branch}; move it away "
                                              f"(or remove it by hand), then run again")
            self._bring_forward(task_id, str(path), existing.head or "", base_head)
            return str(path)
        if os.path.lexists(path):
            raise StewardRefusal(task_id, f"{path} exists and is not a worktree of this repository; move it away, "
                                          f"then run again")
        holder = next((w for w in worktrees.values() if w.branch == ref), None)
        if holder is not None:
            raise StewardRefusal(task_id, f"branch {lane_branch} is checked out at {holder.path}; offer that Lane "
                                          f"by hand (lanes-es tick --offer) or remove it, then run again")
        tip = self.branch_tip(ref)
        self.lanes_dir.mkdir(parents=True, exist_ok=True)
        if tip is None:
            added = git_ok(self.root, "worktree", "add", "-q", "-b", lane_branch, str(path), base_head)
            if added.exit_code == 0:
                self._added(path, lane_branch, base_head)
                return str(path)
            # The branch may have been made since the round listed them (git refuses -b before it makes
            # anything): listed again, it is taken as found.
            self._branches = None
            tip = self.branch_tip(ref)
            if tip is None:
                raise GitFailure(f"git worktree add failed ({added.exit_code}): {added.error_text}")
        self._check_forward(task_id, lane_branch, tip, base_head)
        git(self.root, "worktree", "add", "-q", str(path), lane_branch)
        self._added(path, lane_branch, tip)
        self._bring_forward(task_id, str(path), tip, base_head)
        return str(path)

    def _check_forward(self, task_id: str, lane_branch: str, head: str, base_head: str) -> None:
        if head == base_head:
            return
        if git_ok(self.root, "merge-base", "--is-ancestor", head, base_head).exit_code != 0:
            raise StewardRefusal(task_id, f"branch {lane_branch} is at {head[:12]}, which the batch head "
                                          f"{base_head[:12]} does not contain: it holds other work; inspect it, "
                                          f"rename or delete it by hand, then run again")

    def _bring_forward(self, task_id: str, path: str, head: str, base_head: str) -> None:
        """A clean Lane behind the batch head (the batch moved since it was made) is fast-forwarded."""
        if head == base_head:
            return
        self._check_forward(task_id, f"of {path}", head, base_head)
        status = git(path, "status", "--porcelain", "--untracked-files=all")
        if status.text:
            raise StewardRefusal(task_id, f"{path} is behind the batch head and not clean; commit nothing in a "
                                          f"Lane before it is admitted: move the changes away, then run again")
        git(path, "merge", "--ff-only", "-q", base_head)

    def release(self, path: str, lane_branch: str, integrated_commit: str | None = None) -> str | None:
        """Remove a released Lane; None when removed (or already gone), else why it is kept.

        The tick offers a release only for a clean Lane, and the steward checks again: an
        Executor may have written since. `git worktree remove` runs without --force.
        """
        if not os.path.lexists(path):
            return None
        try:
            existing = self.worktrees().get(os.path.realpath(path))
        except GitFailure as error:  # kept, with git's words: its removal waits for a readable list
            return str(error)
        if existing is None:
            return "it is not a worktree of this repository any more"
        if existing.branch != f"refs/heads/{lane_branch}":
            return f"it is not on {lane_branch} any more"
        # git removes only a clean worktree (no change to a tracked file, no untracked file: what `dirt` lists);
        # what made it refuse is read only then, to say it.
        removed = git_ok(self.root, "worktree", "remove", path)
        if removed.exit_code != 0:
            return self.dirt(path) or f"git worktree remove refused: {removed.error_text}"
        self.worktrees().pop(os.path.realpath(path), None)
        if integrated_commit is not None:
            # The batch branch holds the Lane's work: its branch goes too, and only while it still points
            # at the lane commit that was integrated (a compare-and-delete); anything else is kept.
            git_ok(self.root, "update-ref", "-d", f"refs/heads/{lane_branch}", integrated_commit)
            if self._branches is not None:
                self._branches.pop(f"refs/heads/{lane_branch}", None)
        return None

    def dirt(self, path: str) -> str | None:
        """None for a clean Lane, else what makes it dirty (ignored files, like its kernel store, do not)."""
        status = git_ok(path, "status", "--porcelain", "--untracked-files=all")
        if status.exit_code != 0:
            return f"its status cannot be read: {status.error_text}"
        if not status.text:
            return None
        changed = status.text.splitlines()
        shown = ", ".join(line[3:] for line in changed[:3]) + (", ..." if len(changed) > 3 else "")
        return f"it is dirty ({len(changed)} changed path{'s' if len(changed) != 1 else ''}: {shown})"

