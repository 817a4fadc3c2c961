"""Lane leak restore (docs/upstream.md#lane-leak-restore): coordinator files that a Lane Executor wrote by mistake.

A dirty coordinator path is restored only when its bytes are provably a Lane's: they
differ from the Lane's base and equal the Lane's worktree bytes or a commit on its
branch. Nothing is touched unless every dirty path is provable; `.imm/` is never
restored; staged work (any code but `??` and ` M`) is never a Lane write. The backup
under `.imm/state/batches/restores/<batch_id>/<stamp>/` makes every restore reversible.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from lanes_es.adapters.git import git, git_ok
from lanes_es.domain import events as ev
from lanes_es.ports import PortError
from lanes_es.domain.working_tree import ProvablePath, Unprovable, leak_kind

# lanes-es's one porcelain diff: without these flags a textconv or external diff driver (a program the
# repository's config names) would run to make the patch.
PATCH_ARGS = ("diff", "--no-ext-diff", "--no-textconv", "--binary", "HEAD", "--")


def plan_lane_leak_restore(root: str, record: dict[str, Any],
                           entries: list[tuple[str, str]]) -> list[ProvablePath] | Unprovable:
    """Every entry's Lane of origin, or the first path that cannot be proven."""
    planned: list[ProvablePath] = []
    for code, path in entries:
        kind = leak_kind(code, path)
        if isinstance(kind, Unprovable):
            return kind
        blob = _hash_file(root, path)
        if blob is None:
            if os.path.isfile(Path(root) / path) and not os.access(Path(root) / path, os.R_OK):
                return Unprovable(path, "it cannot be read by this user (permission denied)", unreadable=True)
            return Unprovable(path, "its bytes cannot be read")
        origin = _lane_origin(root, record, path, blob)
        if origin is None:
            return Unprovable(path, "its bytes match no Lane of this batch")
        planned.append(ProvablePath(path, kind, origin))
    return planned


def _hash_file(directory: str, path: str) -> str | None:
    full = Path(directory) / path
    if full.is_symlink() or not full.is_file():
        return None
    result = git_ok(directory, "hash-object", "--no-filters", "--", path)
    return result.text if result.exit_code == 0 else None


def _lane_origin(root: str, record: dict[str, Any], path: str, blob: str) -> str | None:
    """Worktrees share one object store, so every lookup runs at the coordinator."""
    for child in record["children"]:
        lane = child["lane"]
        if not lane:
            continue
        base = git_ok(root, "rev-parse", "--verify", "--quiet", f"{lane['base_head']}:{path}")
        if base.exit_code == 0 and base.text == blob:
            continue  # the Lane's base already had these bytes: not the Lane's write
        if Path(lane["path"], path).is_file() and _hash_file(lane["path"], path) == blob:
            return child["task_id"]
        if _on_lane_branch(root, lane, path, blob):
            return child["task_id"]
    return None


def _on_lane_branch(root: str, lane: dict[str, Any], path: str, blob: str) -> bool:
    commits = git_ok(root, "rev-list", f"{lane['base_head']}..{lane['branch']}")
    if commits.exit_code != 0:
        return False
    for commit in commits.text.split():
        found = git_ok(root, "rev-parse", "--verify", "--quiet", f"{commit}:{path}")
        if found.exit_code == 0 and found.text == blob:
            return True
    return False


class GitLeakRestorer:
    """The tick's LeakRestorer port: plan (the preflight's classification), back up, then restore."""

    def plan(self, root: str, record: dict[str, Any],
             entries: list[tuple[str, str]]) -> list[ProvablePath] | Unprovable:
        """Each dirty path's Lane of origin, or the first path of unknown origin; reads only."""
        return plan_lane_leak_restore(root, record, entries)

    def restore(self, root: str, record: dict[str, Any], entries: list[tuple[str, str]],
                now: str) -> tuple[str, list[ev.RestoredPath]] | None:
        planned = plan_lane_leak_restore(root, record, entries)
        if isinstance(planned, Unprovable):
            return None
        stamp = "".join(ch for ch in now if ch.isdigit() or ch in "TZ")
        backup = f".imm/state/batches/restores/{record['batch_id']}/{stamp}"
        files = Path(root) / backup / "files"
        files.mkdir(parents=True, exist_ok=True)
        modified = [p.path for p in planned if p.kind == "modified"]
        if modified:
            patch = git(root, *PATCH_ARGS, *modified).stdout
            (Path(root) / backup / "restore.patch").write_bytes(patch)
        for item in planned:
            if item.kind == "modified":
                _copy(Path(root) / item.path, files / item.path)
        paths = [ev.RestoredPath(path=p.path, kind=p.kind, lane_task_id=p.lane_task_id) for p in planned]
        manifest = {"at": now, "backup": backup, "paths": [p.plain() for p in paths],
                    "undo": "copy each file under files/ back to the same repository path"}
        (Path(root) / backup / "restore.json").write_text(json.dumps(manifest, indent=2) + "\n")
        # The modified files first, in one git call: when git cannot restore them (another git process
        # holds the index lock), nothing in the checkout has changed yet, and the backup holds every byte.
        if modified:
            result = git_ok(root, "--literal-pathspecs", "restore", "--source=HEAD", "--worktree", "--", *modified)
            if result.exit_code != 0:
                raise PortError(f"failed to restore {', '.join(modified)} from HEAD; its bytes are backed up under "
                                f"{backup} (git: {result.error_text.splitlines()[0] if result.error_text else 'failed'})")
        for item in planned:
            if item.kind == "untracked":
                target = files / item.path
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(Path(root) / item.path, target)
        return backup, paths


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)
