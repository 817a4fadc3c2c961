"""What a check's verdict is about: the acceptance it ran and the tree it saw. Pure.

A verdict is a fact about a command on a set of inputs. A task's check (its acceptance items, run
in order on one fresh tree) reads nothing but that tree, the interpreter and tools on PATH, and
an empty HOME and TMPDIR (adapters/qa.py): so within one batch, on one machine, the same
acceptance on a byte-identical tree gives the same verdict, and a passing one need not run again.

The tree a check sees is every entry of the candidate (or of the Lane's delivery, for QA) with its
git mode and content, except `.imm/audit/`: the audit records of finished tasks, which lanes-es
writes and which differ on every run (run ids, times), are not the project's code, and a check
does not see them (the Lane's QA could not: they are written after it). That makes the tree QA
saw and the Lane's first candidate, when the batch head is still the Lane's base, the same.

Its identity (`tree_identity`) is a digest over each entry's path, mode and git object id, so a
changed byte, a mode bit, a symlink's target, a file added or removed all change it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable

HIDDEN_FROM_CHECKS = ".imm/audit"
REGULAR, EXECUTABLE, SYMLINK, GITLINK = "100644", "100755", "120000", "160000"


def hidden_from_checks(path: str) -> bool:
    """Whether a tree path is left out of what a check sees (the audit records under `.imm/audit/`)."""
    return path == HIDDEN_FROM_CHECKS or path.startswith(HIDDEN_FROM_CHECKS + "/")


def blob_id(content: bytes) -> str:
    """git's object id of a blob holding `content` (SHA-1 repositories)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def tree_identity(entries: Iterable[tuple[str, str, str]]) -> str:
    """`sha256:` over the (path, git mode, object id) of every entry a check sees, in path order."""
    digest = hashlib.sha256()
    for path, mode, oid in sorted(entries):
        if not hidden_from_checks(path):
            digest.update(f"{mode} {oid}\t".encode() + path.encode("utf-8", "surrogateescape") + b"\0")
    return "sha256:" + digest.hexdigest()


def acceptance_digest(intent: dict[str, Any]) -> str:
    """`sha256:` of the task's acceptance items as they run (ids, assertions and descriptors), canonical JSON."""
    items = intent.get("acceptance") if isinstance(intent, dict) else None
    text = json.dumps(items, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def reuse_key(task_id: str, acceptance: str, tree: str) -> str:
    """The same task's check (same acceptance) on the same tree: a passing verdict of one stands for the other."""
    return f"{task_id}\0{acceptance}\0{tree}"
