"""Reading a Lane's delivery identity from git (the pure identity: lanes_es/domain/delivery.py).

At QA the delivery is the Lane's working tree (tracked and untracked, not ignored), read
into a throwaway index so the Lane's own index is never touched; at the lane commit it is
the tree about to be committed. Both are compared against the Lane's HEAD, its base.
"""

from __future__ import annotations

import os
import tempfile

from lanes_es.adapters.git import git
from lanes_es.domain.delivery import delivery_identity, parse_raw_diff


def tree_delivery(lane_path: str, base: str, tree: str, task_id: str, scope_hint: list[str]) -> str:
    """The identity of the task's change from `base` to `tree` (one spawn)."""
    raw = git(lane_path, "diff-tree", "-r", "-z", "--raw", "--no-renames", "--no-ext-diff", base, tree).stdout
    return delivery_identity(parse_raw_diff(raw), task_id, scope_hint)


def worktree_delivery(lane_path: str, task_id: str, scope_hint: list[str]) -> str:
    """The identity of the Lane's working tree against its HEAD (four spawns, the Lane's index untouched)."""
    handle, index = tempfile.mkstemp(prefix="lanes-es-delivery-index-")
    os.close(handle)
    os.unlink(index)  # git writes a fresh index there
    env = {"GIT_INDEX_FILE": index}
    try:
        git(lane_path, "read-tree", "HEAD", env=env)
        git(lane_path, "add", "-A", "--", ".", env=env)
        tree = git(lane_path, "write-tree", env=env).text
        return tree_delivery(lane_path, "HEAD", tree, task_id, scope_hint)
    finally:
        if os.path.exists(index):
            os.unlink(index)
