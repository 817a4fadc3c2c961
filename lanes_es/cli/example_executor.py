"""A scripted Executor for `lanes-es run` and the demo: one edit inside the task's scope, then submit.

`lanes-es run` starts it in the Lane with the task in its environment (LANES_ES_TASK_ID,
LANES_ES_LANE_PATH, LANES_ES_INTENT, LANES_ES_NEXT_OBLIGATION). It writes one file and says
it is done with `lanes-es task submit`, as a person in the Lane would:

- With LANES_ES_EXECUTOR_HINT, a JSON object: either `{"path": P, "content": C}` for every
  task, or `{"<task id>": {"path": P, "content": C}, ...}`, it appends C to P in the Lane
  (unless P already holds C, so running it twice changes nothing).
- `--hints FILE` reads the same JSON from FILE (`lanes-es demo --no-run` writes the demo's).
- Without a hint it appends the task's goal to the first plain file of its scope_hint.

The path must be inside the task's scope_hint: a lane commit refuses anything else. It does
nothing for a task that waits for something other than its submission (a Review, say), and
exits 2 when it cannot work, with the reason on stderr.

    lanes-es run SLUG --max-parallel 3 --lanes-dir ../lanes --executor "python -m lanes_es.cli.example_executor"
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from lanes_es.domain.intent import is_path_allowed_for_child

EXIT_OK, EXIT_CANNOT_WORK = 0, 2


class CannotWork(Exception):
    """The Executor has nothing it may deliver; the message says why."""


def hint_for(task_id: str, text: str | None) -> tuple[str, str] | None:
    """The (path, content) the hint names for `task_id`, None without a hint for it."""
    if not text:
        return None
    try:
        hint = json.loads(text)
    except json.JSONDecodeError as error:
        raise CannotWork(f"LANES_ES_EXECUTOR_HINT is not JSON: {error.msg}") from None
    except RecursionError:
        raise CannotWork("LANES_ES_EXECUTOR_HINT is not a hint: its JSON nests too deeply") from None
    if isinstance(hint, dict) and "path" not in hint:
        hint = hint.get(task_id)
        if hint is None:
            return None
    if not isinstance(hint, dict) or not isinstance(hint.get("path"), str) or not isinstance(hint.get("content"), str):
        raise CannotWork('LANES_ES_EXECUTOR_HINT must be {"path": ..., "content": ...} or map task ids to such objects')
    return hint["path"], hint["content"]


def default_delivery(intent: dict[str, Any]) -> tuple[str, str]:
    """The goal, appended to the first scope entry that names a plain file."""
    for entry in intent.get("scope_hint", []):
        if isinstance(entry, str) and not any(char in entry for char in "*?") and not entry.endswith("/"):
            return entry, f"{intent.get('goal', intent['task_id'])}\n"
    raise CannotWork("the task's scope_hint names no plain file to write and LANES_ES_EXECUTOR_HINT gives none")


def deliver(lane: Path, task_id: str, scope: list[str], relative: str, content: str) -> bool:
    """Append `content` to `relative` in the Lane; False when it is there already."""
    if relative.startswith("/") or ".." in relative.split("/") or not is_path_allowed_for_child(relative, task_id, scope):
        raise CannotWork(f"{relative} is outside the task's scope_hint {scope}; a lane commit would refuse it")
    target = lane / relative
    previous = target.read_text(encoding="utf-8") if target.exists() else ""
    if content in previous:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(previous + content, encoding="utf-8")
    return True


def submit(lane: Path) -> int:
    """`lanes-es task submit` in the Lane, through this interpreter, which imported lanes-es to run this
    module (-P: the Lane's files never shadow lanes-es)."""
    return subprocess.run([sys.executable, "-P", "-m", "lanes_es.cli.main", "--root", str(lane), "task", "submit"],
                          cwd=lane).returncode


def hint_text(argv: list[str]) -> str | None:
    """The hint JSON: `--hints FILE` when given, else LANES_ES_EXECUTOR_HINT."""
    if argv[:1] != ["--hints"]:
        if argv:
            raise CannotWork(f"unknown arguments {argv}; the only one is --hints FILE")
        return os.environ.get("LANES_ES_EXECUTOR_HINT")
    if len(argv) != 2:
        raise CannotWork("--hints needs one FILE (the JSON of LANES_ES_EXECUTOR_HINT)")
    from lanes_es.adapters.files import MiB, read_capped_text

    try:
        return read_capped_text(argv[1], MiB)
    except (OSError, ValueError) as error:  # unreadable, not UTF-8, or over 1 MiB: no hint file is
        raise CannotWork(f"cannot read the hints {argv[1]}: {error}") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    task_id = os.environ.get("LANES_ES_TASK_ID", "")
    lane = Path(os.environ.get("LANES_ES_LANE_PATH") or os.getcwd())
    obligation = os.environ.get("LANES_ES_NEXT_OBLIGATION") or "submit_assurance"
    try:
        if not task_id:
            raise CannotWork("LANES_ES_TASK_ID is not set; `lanes-es run` starts this Executor with its task")
        if obligation != "submit_assurance":
            print(f"example executor: {task_id} needs {obligation}, which a scripted Executor does not do")
            return EXIT_OK
        try:
            intent = json.loads(os.environ.get("LANES_ES_INTENT") or "")
        except (json.JSONDecodeError, RecursionError):
            raise CannotWork("LANES_ES_INTENT does not hold the task's TaskIntent JSON") from None
        relative, content = hint_for(task_id, hint_text(argv)) or default_delivery(intent)
        wrote = deliver(lane, task_id, list(intent.get("scope_hint", [])), relative, content)
        print(f"example executor: {'wrote' if wrote else 'found already'} {relative} in {lane}")
    except CannotWork as error:
        print(f"example executor: {error}", file=sys.stderr)
        return EXIT_CANNOT_WORK
    return submit(lane)


if __name__ == "__main__":
    sys.exit(main())
