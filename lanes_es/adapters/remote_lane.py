"""A Lane's files sent to a Ray node for an Executor attempt, and the attempt's delivery written back.

The Lane stays a worktree of the coordinator's repository (admission, QA, the lane commit: unchanged).
What travels to the node is what the Lane holds now (the base plus the work so far: tracked and
untracked files git does not ignore, as QA's copy sees them), as git-shaped entries; what comes back
is each file the attempt changed, added or removed. The delivery is hostile input: every path must be
one a lane commit of the task may touch (its scope, docs/upstream.md#the-lane-commit), or nothing is
written; it is written without following a symlink out of the Lane.
"""

from __future__ import annotations

import hashlib
import os
import stat

from typing import Any, Iterator

from lanes_es.adapters.git import git
from lanes_es.domain.check_inputs import blob_id
from lanes_es.adapters.ray_host import DeliveredFile, TreeFile, TreePayload
from lanes_es.domain.intent import is_path_allowed_for_child
from lanes_es.errors import Refusal

SYMLINK, EXECUTABLE, REGULAR = "120000", "100755", "100644"


class DeliveryRefused(Refusal):
    """The attempt delivered a path its task may not touch, or one that cannot be written safely."""


def lane_files(lane: str) -> Iterator[tuple[str, str, bytes]]:
    """What the Lane holds now: (path, git mode, bytes) of each tracked and untracked file git does not ignore,
    a link's bytes its target (one git spawn: the listing)."""
    listed = git(lane, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--")
    for path in dict.fromkeys(part for part in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if part):
        full = os.path.join(lane, path)
        try:
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                mode, content = SYMLINK, os.fsencode(os.readlink(full))
            elif stat.S_ISREG(info.st_mode):
                mode = EXECUTABLE if info.st_mode & 0o111 else REGULAR
                with open(full, "rb") as handle:
                    content = handle.read()
            else:
                continue  # a directory (a submodule's) or a special file: nothing an agent edits
        except OSError:
            continue  # listed, then removed: not there
        yield path, mode, content


def lane_tree(lane: str) -> Any:
    """The Lane's files as the tree its QA sees (`CheckTree`: git blob ids, `.imm/audit/` left out), whose
    identity is the one QA records locally (`qa.materialized_tree`), so a candidate reuses its verdict."""
    from lanes_es.adapters.check_runner import CheckTree, TreeEntry

    entries: dict[str, TreeEntry] = {}
    blobs: dict[str, bytes] = {}
    for path, mode, content in lane_files(lane):
        sha = blob_id(content)
        blobs[sha] = content
        entries[path] = TreeEntry(mode, "blob", sha)
    return CheckTree(entries, blobs)


def lane_payload(lane: str) -> TreePayload:
    """What the Lane holds now, as entries and their bytes (one git spawn: the listing)."""
    entries: list[TreeFile] = []
    blobs: dict[str, bytes] = {}
    for path, mode, content in lane_files(lane):
        key = hashlib.sha256(content).hexdigest()
        blobs[key] = content
        entries.append(TreeFile(path, mode, "blob", key))
    identity = hashlib.sha256("\0".join(f"{e.mode} {e.sha} {e.path}" for e in entries).encode(
        "utf-8", "surrogateescape")).hexdigest()
    return TreePayload(identity=identity, entries=entries, blobs=blobs)


def refused_paths(task_id: str, scope_hint: list[str], delivery: list[DeliveredFile]) -> list[str]:
    """The delivered paths the task may not touch (its scope and its own audit directory)."""
    return [item.path for item in delivery if not is_path_allowed_for_child(item.path, task_id, scope_hint)
            or item.mode not in (SYMLINK, EXECUTABLE, REGULAR, "")
            or any(part in ("", ".", "..") or part.lower() == ".git" for part in item.path.split("/"))]


def write_delivery(lane: str, task_id: str, scope_hint: list[str], delivery: list[DeliveredFile]) -> None:
    """Write the delivery into the Lane, all of it or nothing (DeliveryRefused naming the paths)."""
    refused = refused_paths(task_id, scope_hint, delivery)
    if refused:
        raise DeliveryRefused(f"the attempt's delivery touches paths outside the scope of {task_id}: "
                              f"{', '.join(sorted(refused)[:5])}" + (f" and {len(refused) - 5} more"
                                                                     if len(refused) > 5 else ""))
    root = os.path.realpath(lane)
    targets = [(item, _inside(root, item.path)) for item in delivery]
    unsafe = [item.path for item, target in targets if target is None]
    if unsafe:
        raise DeliveryRefused(f"the attempt's delivery would write through a link out of the Lane: {', '.join(unsafe[:5])}")
    for item, target in targets:
        assert target is not None
        if not item.mode:
            if os.path.lexists(target) and not os.path.isdir(target) or os.path.islink(target):
                os.unlink(target)
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.lexists(target):
            os.unlink(target)
        if item.mode == SYMLINK:
            os.symlink(os.fsdecode(item.content), target)
            continue
        mode = 0o755 if item.mode == EXECUTABLE else 0o644
        handle = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            view = memoryview(item.content)
            while view:
                view = view[os.write(handle, view):]
            os.fchmod(handle, mode)
        finally:
            os.close(handle)


def _inside(root: str, path: str) -> str | None:
    """root/path when its directory resolves inside `root` (no link on the way leads out), else None."""
    target = os.path.join(root, *path.split("/"))
    parent = os.path.realpath(os.path.dirname(target))
    if parent != root and not parent.startswith(root + os.sep):
        return None
    return os.path.join(parent, os.path.basename(target))
