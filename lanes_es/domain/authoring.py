"""Writing an Initiative and its tasks' intents for the user, in upstream's formats.

Pure: each function takes the current text and the user's values and returns the new text,
or raises `AuthoringError` with what to fix. A check is written the way a user types it on a
command line; it becomes a verification descriptor v2 (encoded as the JSON text upstream's
TaskIntent keeps in `verification`) and runs without a shell, so shell syntax is refused
rather than passed on as literal arguments.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Iterable

from .descriptor import DESCRIPTOR_CONTRACT, InvalidDescriptor, parse_verification_descriptor
from .ids import is_valid_id
from .initiative_file import InvalidInitiative, parse_local_initiative
from .intent import INTENT_CONTRACT, InvalidIntent, parse_task_intent, scope_entry_allows

DEFAULT_TIMEOUT_SECONDS = 300
DEFAULT_MAX_OUTPUT_BYTES = 262_144  # the most a descriptor allows: a chatty test runner is not killed for its output
SHELL_OPERATORS = "|&;<>()`$"
GLOBS = "*?"


class AuthoringError(ValueError):
    """A value that cannot be written into a valid Initiative or intent; the message says what to change."""


def new_initiative_text(title: str) -> str:
    """A new Initiative with no slice yet (`lanes-es initiative add-task` adds them)."""
    if not title.strip() or "\n" in title:
        raise AuthoringError("the title must be one non-empty line")
    return f"# {title.strip()}\n"


def initiative_tasks(text: str, slug: str, path: str) -> list[dict[str, Any]]:
    """The tasks an Initiative's text names so far (none for one without a slice)."""
    try:
        return parse_local_initiative(text, slug, path)["tasks"]
    except InvalidInitiative as error:
        if "declares no Slice" in str(error):
            return []
        raise AuthoringError(f"{path} cannot be read as an Initiative: {error}") from None


def with_task(text: str, slug: str, path: str, task_id: str, title: str, blocked_by: list[str]) -> str:
    """The Initiative's text with a new slice for `task_id` appended."""
    if not is_valid_id(task_id):
        raise AuthoringError(f"{task_id!r} is not a task id: use letters, digits, '.', '_' and '-', starting with a "
                             f"letter or digit (at most 128)")
    tasks = initiative_tasks(text, slug, path)
    known = {task["task_id"] for task in tasks}
    if task_id in known:
        raise AuthoringError(f"{path} already has a task {task_id}")
    unknown = [name for name in blocked_by if name not in known]
    if unknown:
        raise AuthoringError(f"--blocked-by names {', '.join(unknown)}, which {path} does not have; add "
                             f"{'it' if len(unknown) == 1 else 'them'} first (tasks so far: "
                             f"{', '.join(sorted(known)) or 'none'})")
    if "\n" in title or not title.strip():
        raise AuthoringError("the task's title must be one non-empty line")
    slices = {task["slice_id"] for task in tasks}
    number = len(tasks) + 1
    while f"S{number}" in slices:
        number += 1
    lines = [f"## S{number}: {title.strip()}", ""]
    if blocked_by:
        lines += [f"Blocked by: {', '.join(dict.fromkeys(blocked_by))}", ""]
    lines += ["Tasks:", f"- {task_id}", ""]
    return text.rstrip("\n") + "\n\n" + "\n".join(lines)


def check_descriptor(command_line: str, timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
                     max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> dict[str, Any]:
    """The verification descriptor v2 of a check typed as a command line, run from the repository root."""
    problem = shell_syntax(command_line)
    if problem is not None:
        raise AuthoringError(
            f"--check {command_line!r} uses shell syntax ({problem}), but a check runs without a shell, so it would "
            f"reach the program as a literal argument; put the command in a script in the repository and check "
            f"with --check ./path/to/script, or quote it for a shell yourself: --check \"sh -c '...'\"")
    try:
        argv = shlex.split(command_line)
    except ValueError as error:
        raise AuthoringError(f"--check {command_line!r} cannot be split into words: {error}") from None
    if not argv:
        raise AuthoringError("--check is empty; give the command a check runs, e.g. --check 'python3 -m pytest -q'")
    executable = argv[0]
    if executable.startswith("/"):
        raise AuthoringError(f"--check names {executable}, an absolute path: a check runs on every machine the "
                             f"batch runs on, so name a program on PATH (python3, pytest) or a file in the "
                             f"repository (./scripts/check.sh)")
    if "/" in executable and not executable.startswith("./"):
        executable = "./" + executable  # a file in the repository, as descriptor v2 spells it
    descriptor = {
        "contract": DESCRIPTOR_CONTRACT,
        "command": {"executable": executable, "argv": argv[1:], "cwd": ".", "timeout_ms": timeout_seconds * 1000,
                    "max_output_bytes": max_output_bytes},
        "environment": {"prepare": None, "writable_paths": []},
    }
    try:
        parse_verification_descriptor(descriptor)
    except InvalidDescriptor as error:
        raise AuthoringError(f"--check {command_line!r}: {error}") from None
    return descriptor


def shell_syntax(command_line: str) -> str | None:
    """The first shell operator, expansion or glob outside quotes, described, or None."""
    quote: str | None = None
    escaped = False
    word_start = True
    for char in command_line:
        if escaped:
            escaped, word_start = False, False
        elif quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\":
            escaped = True
        elif quote == '"':
            if char in "$`":
                return f"{char!r} inside double quotes expands in a shell"
            quote = None if char == '"' else quote
        elif char in "'\"":
            quote, word_start = char, False
        elif char in SHELL_OPERATORS:
            return f"{char!r}"
        elif char in GLOBS:
            return f"the wildcard {char!r}"
        elif char == "~" and word_start:
            return "'~' for the home directory"
        elif char == "\n":
            return "a line break"
        else:
            word_start = char.isspace()
    return None


def task_intent(task_id: str, goal: str, scope: list[str], checks: list[str], risk: str = "routine",
                timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS) -> dict[str, Any]:
    """A new TaskIntent v1, valid as upstream's parser reads it."""
    if not checks:
        raise AuthoringError("a task needs at least one --check: the command that shows it is done")
    acceptance = []
    for index, command_line in enumerate(checks, start=1):
        descriptor = check_descriptor(command_line, timeout_seconds)
        acceptance.append({"id": f"A{index}", "assertion": f"`{command_line}` exits 0",
                           "verification": json.dumps(descriptor)})
    intent = {"contract": INTENT_CONTRACT, "task_id": task_id, "goal": goal, "acceptance": acceptance,
              "scope_hint": scope, "risk": risk, "revision": 1, "owner": "user"}
    try:
        parse_task_intent(intent)
    except InvalidIntent as error:
        raise AuthoringError(f"the intent of {task_id} would be invalid: {_as_options(str(error))}") from None
    return intent


def _as_options(violations: str) -> str:
    """The intent parser's field names, as the options that set them."""
    for field, option in (("scope_hint", "--scope"), ("goal", "--goal"), ("task_id", "TASK"), ("risk", "--risk")):
        violations = violations.replace(field, option)
    return violations


def intent_text(intent: dict[str, Any]) -> str:
    return json.dumps(intent, indent=2, ensure_ascii=False) + "\n"


class ScopeIndex:
    """A tree's paths, indexed once: whether a scope entry names any of them costs a set lookup (a wildcard entry,
    a scan, kept), so a plan of thousands of tasks over a tree of thousands of files stays linear."""

    def __init__(self, tree: list[str]) -> None:
        self.tree = tree
        self.paths = set(tree)
        # every directory above a path: an entry E names it when some path starts with E + "/"
        self.directories = {path[:at] for path in tree for at, char in enumerate(path) if char == "/"}
        self._wildcards: dict[str, bool] = {}

    def names_nothing(self, entry: str) -> bool:
        if "*" in entry or "?" in entry:
            if entry not in self._wildcards:
                self._wildcards[entry] = not any(scope_entry_allows(path, entry) for path in self.tree)
            return self._wildcards[entry]
        return entry not in self.paths and entry not in self.directories


def unmatched_scope(scope: Iterable[str], tree: "list[str] | ScopeIndex") -> list[str]:
    """The scope entries of a task that name no path of `tree` (a typo, or a file the task will create)."""
    index = tree if isinstance(tree, ScopeIndex) else ScopeIndex(tree)
    return [entry for entry in scope if index.names_nothing(entry)]
