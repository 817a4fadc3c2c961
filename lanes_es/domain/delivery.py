"""The delivery identity a QA verdict reviewed, and the one a lane commit is about to record.

upstream recomputes the reviewed delivery at the lane commit and refuses a commit whose
change drifted from it (docs/upstream.md#the-lane-commit: "batch commit drifted from the reviewed
delivery identity"). Here the identity is the change against the Lane's base within the task's
scope (as upstream's snapshot is taken over the scope): each changed path with its new mode and
blob, `.imm/` left out (the audit pair and the kernel store are written after the review),
hashed in a canonical order. A path outside the scope is no part of the delivery: the lane
commit refuses it on its own (`dirty_outside_scope`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Iterable

from lanes_es.domain.intent import is_path_allowed_for_child

DELIVERY_DRIFTED = "batch commit drifted from the reviewed delivery identity"


def delivery_identity(changes: Iterable[tuple[str, str, str]], task_id: str, scope_hint: list[str]) -> str:
    """`sha256:` over the sorted (path, new mode, new blob) of every change in the scope, outside `.imm/`."""
    kept = sorted((path, mode, blob) for path, mode, blob in changes
                  if path != ".imm" and not path.startswith(".imm/")
                  and is_path_allowed_for_child(path, task_id, scope_hint))
    encoded = json.dumps(kept, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape")
    return "sha256:" + hashlib.sha256(encoded).hexdigest()


def parse_raw_diff(raw: bytes) -> list[tuple[str, str, str]]:
    """`git diff-tree -r -z --raw --no-renames` output as (path, new mode, new blob); a deletion is mode 000000."""
    return [(path, mode, blob) for path, _, mode, blob in parse_raw_diff_with_old_mode(raw)]


def parse_raw_diff_with_old_mode(raw: bytes) -> list[tuple[str, str, str, str]]:
    """The same raw output (`diff-tree` or `diff-index`) as (path, old mode, new mode, new blob)."""
    tokens = raw.decode("utf-8", "surrogateescape").split("\0")
    changes: list[tuple[str, str, str, str]] = []
    index = 0
    while index < len(tokens):
        meta = tokens[index]
        if meta.startswith(":") and index + 1 < len(tokens):
            old_mode, new_mode, _, new_blob, *_ = meta[1:].split(" ")
            changes.append((tokens[index + 1], old_mode, new_mode, new_blob))
            index += 2
            continue
        index += 1
    return changes


NO_ENTRY = "000000"
REGULAR, EXECUTABLE, SYMLINK, GITLINK = "100644", "100755", "120000", "160000"


def tracked_entries_unseen(changes: Iterable[tuple[str, str, str, str]], exists: Callable[[str], bool]) -> bool:
    """Whether HEAD against an index built by `add -A` from nothing shows what only HEAD's own entries
    would have kept: a tracked path still on disk shown deleted (ignored now, an uninitialized
    submodule), an executable bit lost (`core.fileMode` off), a symlink or gitlink turned into
    something else (`core.symlinks` off, a submodule's directory). A real change of that kind (a
    `chmod -x`, a symlink replaced by a file) is also caught: the caller then reads the delivery from
    HEAD, which gives the same identity either way."""
    for path, old_mode, new_mode, _ in changes:
        if old_mode == NO_ENTRY:
            continue
        if new_mode == NO_ENTRY and exists(path):
            return True
        if (old_mode, new_mode) == (EXECUTABLE, REGULAR):
            return True
        if old_mode in (SYMLINK, GITLINK) and new_mode not in (old_mode, NO_ENTRY):
            return True
    return False
