"""Reading a Lane's delivery identity from git (the pure identity: lanes_es/domain/delivery.py).

At QA the delivery is the Lane's working tree (tracked and untracked, not ignored), read
into a throwaway index so the Lane's own index is never touched; at the lane commit it is
the tree about to be committed. Both are compared against the Lane's HEAD, its base.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from typing import Iterator

from lanes_es.adapters.git import git
from lanes_es.domain.delivery import (
    delivery_identity, parse_raw_diff, parse_raw_diff_with_old_mode, tracked_entries_unseen,
)

RAW_DIFF = ("-r", "-z", "--raw", "--no-renames", "--no-ext-diff")


def tree_delivery(lane_path: str, base: str, tree: str, task_id: str, scope_hint: list[str]) -> str:
    """The identity of the task's change from `base` to `tree` (one spawn)."""
    raw = git(lane_path, "diff-tree", *RAW_DIFF, base, tree).stdout
    return delivery_identity(parse_raw_diff(raw), task_id, scope_hint)


def worktree_delivery(lane_path: str, task_id: str, scope_hint: list[str]) -> str:
    """The identity of the Lane's working tree against its HEAD, the Lane's index untouched.

    What it is about: HEAD's tracked files as they now are in the working tree, plus the untracked
    files that are not ignored (`read-tree HEAD`, `add -A` into a throwaway index). Usually two spawns:
    `add -A` into an empty index (the same files, hashed the same way: a fresh `read-tree` index has
    no stat data, so `add -A` hashes every file either way), then `diff-index --cached HEAD`. An empty
    index does not know what HEAD tracks, so whenever that could matter (a tracked file the ignore
    rules hide, an uninitialized submodule, `core.fileMode` or `core.symlinks` off) the change shows a
    tracked entry that still exists on disk as deleted or retyped, and the identity is read again the
    exact way, from HEAD (four spawns)."""
    with _throwaway_index() as env:
        git(lane_path, "add", "-A", "--", ".", env=env)
        changes = _index_changes(lane_path, env)
    if not tracked_entries_unseen(changes, lambda path: os.path.lexists(os.path.join(lane_path, path))):
        return delivery_identity([(path, mode, blob) for path, _, mode, blob in changes], task_id, scope_hint)
    return _worktree_delivery_from_head(lane_path, task_id, scope_hint)


def _worktree_delivery_from_head(lane_path: str, task_id: str, scope_hint: list[str]) -> str:
    with _throwaway_index() as env:
        git(lane_path, "read-tree", "HEAD", env=env)
        git(lane_path, "add", "-A", "--", ".", env=env)
        changes = _index_changes(lane_path, env)
    return delivery_identity([(path, mode, blob) for path, _, mode, blob in changes], task_id, scope_hint)


def _index_changes(lane_path: str, env: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """HEAD against the throwaway index (the very raw diff `diff-tree HEAD $(write-tree)` prints)."""
    raw = git(lane_path, "diff-index", "--cached", *RAW_DIFF, "HEAD", env=env).stdout
    return parse_raw_diff_with_old_mode(raw)


@contextmanager
def _throwaway_index() -> Iterator[dict[str, str]]:
    handle, index = tempfile.mkstemp(prefix="lanes-es-delivery-index-")
    os.close(handle)
    os.unlink(index)  # git writes a fresh index there
    try:
        yield {"GIT_INDEX_FILE": index}
    finally:
        if os.path.exists(index):
            os.unlink(index)
