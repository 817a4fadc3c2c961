"""The coordinator's working-tree preflight, decided from facts (docs/upstream.md#lane-leak-restore, #reason-codes).

A lane batch keeps every delivery in its Lanes, so a dirty coordinator checkout is either a
Lane Executor's write that leaked there by mistake, or someone's own work. Each dirty path is
classified: (a) bytes a Lane of this batch provably wrote (the adapter proves it against the
Lanes' worktrees and branches) are restored, with a reversible backup recorded in the log;
(b) anything else has an unknown origin and the whole preflight refuses, touching no file.
Staged work is never a Lane's write and is never restored; `.imm/` is never restored.

upstream's recovery text for `working_tree_unstaged` tells the user to `git add` the changes
(its serial mode stages in-flight work in the coordinator). In lane mode that would fold the
user's own file into the batch, so lanes-es says instead which path and why, and to move it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

UNSTAGED = "working_tree_unstaged"
DIRTY = "working_tree_dirty"
_UNSTAGED_REASON = "branch preflight failed: working tree has unstaged or untracked changes"
_DIRTY_REASON = "branch preflight failed: working tree is dirty"


@dataclass(frozen=True)
class Unprovable:
    """The first dirty path no Lane of this batch provably wrote, and why."""

    path: str
    detail: str
    unreadable: bool = False  # this user cannot read it: lanes-es cannot tell whether it changed at all


@dataclass(frozen=True)
class ProvablePath:
    path: str
    kind: str  # "modified" | "untracked"
    lane_task_id: str


@dataclass(frozen=True)
class WorkingTreeRefusal:
    code: str
    reason: str  # upstream's reason text, with the path and why
    message: str  # what to do next

    @property
    def text(self) -> str:
        return f"{self.reason}; {self.message}"


def leak_kind(code: str, path: str) -> str | Unprovable:
    """What a porcelain entry could be as a Lane's leak: modified or untracked; anything else is not one."""
    if path == ".imm" or path.startswith(".imm/"):
        return Unprovable(path, "Immune-Brain state is never restored")
    if code == "??":
        return "untracked"
    if code == " M":
        return "modified"
    return Unprovable(path, f"status {code} is not a Lane write")


def is_unstaged(code: str) -> bool:
    return code == "??" or code[1:2] != " "


def decide_working_tree(entries: Sequence[tuple[str, str]], plan: Sequence[ProvablePath] | Unprovable,
                        slug: str) -> WorkingTreeRefusal | None:
    """None when the checkout is clean or every dirty path is a Lane's (to restore); else the refusal."""
    if not entries or not isinstance(plan, Unprovable):
        return None
    code, base = (UNSTAGED, _UNSTAGED_REASON) if any(is_unstaged(c) for c, _ in entries) else (DIRTY, _DIRTY_REASON)
    if plan.unreadable:
        return unreadable_file_refusal(plan.path, slug, code=code, base=base)
    reason = f"{base} (not restored: {plan.path}: {plan.detail})"
    message = (f"{plan.path} is not a write of this batch's Lanes, so lanes-es touches no file of the checkout; "
               f"move it out of the coordinator checkout (or stash it), then run `lanes-es tick {slug}` again")
    return WorkingTreeRefusal(code=code, reason=reason, message=message)


def unreadable_file_refusal(path: str, slug: str, *, code: str = UNSTAGED, base: str = _UNSTAGED_REASON) -> WorkingTreeRefusal:
    """A file of the checkout this user cannot read: whether git lists it depends on its stat cache,
    so the plan's own files are checked directly too, and either way the refusal is this one."""
    reason = f"{base} (not restored: {path}: it cannot be read by this user (permission denied))"
    message = (f"{path} cannot be read by this user, so neither git nor lanes-es can tell whether it changed; "
               f"lanes-es touches no file of the checkout: fix its owner or mode (chmod u+r {path}), then "
               f"run `lanes-es tick {slug}` again")
    return WorkingTreeRefusal(code=code, reason=reason, message=message)
