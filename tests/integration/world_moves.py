"""Someone moves the world under a running batch: the moves of issue 14, on a real coordinator
(the Initiative or an intent edited, the batch branch fast-forwarded, rewritten or switched away
from, the checkout dirtied).

Each move returns what the user's own files hold afterwards (path -> bytes), so a test can check
they are byte-identical once the engine has refused or parked. Run as a module, it is an
Executor for `lanes-es run`: it makes the move named by LANES_ES_EXECUTOR_TEST_MOVE in the coordinator
(LANES_ES_ROOT) once, then delivers as lanes_es.cli.example_executor does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

USER = ["-c", "user.name=Some User", "-c", "user.email=user@example.invalid"]


def _git(root: str, *args: str) -> str:
    return subprocess.run(["git", "-C", root, *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(root: str, path: str, message: str) -> None:
    _git(root, "add", "--", path)
    _git(root, *USER, "commit", "-q", "-m", message)


def edit_initiative(root: str, slug: str) -> dict[str, bytes]:
    """The Initiative's last Slice gains a `Blocked by:` line, committed on the coordinator's branch."""
    path = f"docs/initiatives/{slug}.md"
    text = Path(root, path).read_text()
    last = text.rindex("\n## ")
    first_task = text.split("- ", 2)[1].split("\n", 1)[0]
    head, tail = text[:last], text[last:]
    title, rest = tail.split("\n\n", 1)
    Path(root, path).write_text(f"{head}{title}\n\nBlocked by: {first_task}\n\n{rest}")
    _commit(root, path, "the user re-plans the Initiative")
    return {path: Path(root, path).read_bytes()}


def edit_intent(root: str, task_id: str, *, commit: bool = True) -> dict[str, bytes]:
    """A task's intent gets a new goal: committed on the coordinator's branch, or left in the checkout."""
    path = f"docs/plans/{task_id}.intent.json"
    intent = json.loads(Path(root, path).read_text())
    intent["goal"] = "A goal the user rewrote"
    Path(root, path).write_text(json.dumps(intent, indent=2) + "\n")
    if commit:
        _commit(root, path, "the user rewrites an intent")
    return {path: Path(root, path).read_bytes()}


def move_branch(root: str) -> dict[str, bytes]:
    """A commit of the user's own on the batch branch, in the coordinator: a fast-forward."""
    path = "notes/user.txt"
    Path(root, "notes").mkdir(exist_ok=True)
    Path(root, path).write_text("the user's note\n")
    _commit(root, path, "the user's own commit")
    return {path: Path(root, path).read_bytes()}


def switch_branch(root: str) -> dict[str, bytes]:
    """The user switches the coordinator away from the batch branch (to main); the branch itself stays."""
    _git(root, "checkout", "-q", "main")
    return {}


def rewrite_branch(root: str) -> dict[str, bytes]:
    """The user rewrites the batch branch's last commit (same tree, a new id): not a fast-forward."""
    _git(root, *USER, "commit", "-q", "--amend", "--allow-empty", "-m", "the user rewrites history")
    return {}


def dirty_coordinator(root: str) -> dict[str, bytes]:
    """An untracked file of the user's own in the coordinator checkout."""
    path = "scratch/mine.txt"
    Path(root, "scratch").mkdir(exist_ok=True)
    Path(root, path).write_bytes(b"the user's own bytes\n\x00\xff")
    return {path: Path(root, path).read_bytes()}


def make_move(kind: str, root: str, slug: str, other_task: str) -> dict[str, bytes]:
    if kind == "initiative":
        return edit_initiative(root, slug)
    if kind == "intent":
        return edit_intent(root, other_task)
    if kind == "intent_uncommitted":
        return edit_intent(root, other_task, commit=False)
    if kind == "branch":
        return move_branch(root)
    if kind == "switch":
        return switch_branch(root)
    if kind == "rewrite":
        return rewrite_branch(root)
    if kind == "dirty":
        return dirty_coordinator(root)
    raise ValueError(kind)


def main() -> int:
    """The Executor: the move once (its record in LANES_ES_EXECUTOR_TEST_MOVED), then the example delivery."""
    marker = Path(os.environ["LANES_ES_EXECUTOR_TEST_MOVED"])
    if not marker.exists():
        root = os.environ["LANES_ES_ROOT"]
        branch = _git(root, "symbolic-ref", "--short", "HEAD")
        head_before = _git(root, "rev-parse", "HEAD")
        files = make_move(os.environ["LANES_ES_EXECUTOR_TEST_MOVE"], root, branch.split("/", 1)[1],
                          os.environ["LANES_ES_EXECUTOR_TEST_OTHER_TASK"])
        marker.write_text(json.dumps({"head_before": head_before, "head_after": _git(root, "rev-parse", branch),
                                      "files": {path: data.hex() for path, data in files.items()}}))
    from lanes_es.cli.example_executor import main as deliver

    return deliver()


if __name__ == "__main__":
    sys.exit(main())
