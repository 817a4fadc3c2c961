"""The delivery identity a QA verdict reviewed, and the one a lane commit is about to record.

upstream recomputes the reviewed delivery at the lane commit and refuses a commit whose
change drifted from it (contracts §6.4 step 10: "batch commit drifted from the reviewed
delivery identity"). Here the identity is the change against the Lane's base within the task's
scope (as upstream's snapshot is taken over the scope): each changed path with its new mode and
blob, `.imm/` left out (the audit pair and the kernel store are written after the review),
hashed in a canonical order. A path outside the scope is no part of the delivery: the lane
commit refuses it on its own (`dirty_outside_scope`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterable

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
    tokens = raw.decode("utf-8", "surrogateescape").split("\0")
    changes: list[tuple[str, str, str]] = []
    index = 0
    while index < len(tokens):
        meta = tokens[index]
        if meta.startswith(":") and index + 1 < len(tokens):
            _, new_mode, _, new_blob, *_ = meta[1:].split(" ")
            changes.append((tokens[index + 1], new_mode, new_blob))
            index += 2
            continue
        index += 1
    return changes
