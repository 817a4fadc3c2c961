"""The Local Initiative carrier, `docs/initiatives/<slug>.md`, read as upstream reads it.

Each `## <slice-id>: ...` heading starts a Slice; its `Tasks:` list must name exactly
one Task (the batch child) and its `Blocked by:` lines name the Tasks it waits for.
Fenced blocks are examples and are skipped. The reading is line by line and
forgiving about everything else in the file (docs/upstream.md#the-local-initiative).
"""

from __future__ import annotations

import re
from typing import Any

from .ids import is_valid_id
from .jstext import LINE_TERMINATORS, WS, js_trim

LOCAL_OBSERVATION_CONTRACT = "immune_brain/local_initiative_observation/v1"
# JavaScript's `\s`, and `.` that stops at a line terminator; ASCII-only case folding as JS /i.
_ANY = f"[^{LINE_TERMINATORS}]"
SLICE_HEADING = re.compile(f"##[{WS}]+([^{WS}:]+)[{WS}]*:")
BLOCKED_BY = re.compile(f"blocked by[{WS}]*:({_ANY}*)", re.IGNORECASE | re.ASCII)
TASKS = re.compile(f"tasks[{WS}]*:[{WS}]*", re.IGNORECASE | re.ASCII)
BULLET = re.compile(f"[-*][{WS}]+({_ANY}*)")
BACKTICKED = re.compile(f"`({_ANY}*)`")
LINE_BREAK = re.compile(r"\r?\n")


class InvalidInitiative(ValueError):
    """The carrier cannot be read as a Local Initiative; the message is upstream's."""


def local_initiative_path(slug: str) -> str:
    return f"docs/initiatives/{slug}.md"


def _unquote(value: str) -> str:
    """Trim, then drop one pair of wrapping backticks."""
    value = js_trim(value)
    quoted = BACKTICKED.fullmatch(value)
    return quoted.group(1) if quoted else value


class _Slice:
    def __init__(self, slice_id: str) -> None:
        self.slice_id = slice_id
        self.tasks: list[str] = []
        self.blocked_by: list[str] = []


def parse_local_initiative(text: str, slug: str, path: str) -> dict[str, Any]:
    """The local initiative observation of the carrier's text."""
    if not is_valid_id(slug):
        raise InvalidInitiative("initiative_slug is invalid")
    slices = _read_slices(text)
    if not slices:
        raise InvalidInitiative(f"Local Initiative {path} declares no Slice")
    return {"contract": LOCAL_OBSERVATION_CONTRACT, "initiative_id": slug, "path": path,
            "tasks": [_task_of(piece) for piece in slices]}


def _task_of(piece: _Slice) -> dict[str, Any]:
    if len(piece.tasks) != 1:
        raise InvalidInitiative(
            f"Local Initiative Slice {piece.slice_id} must name exactly one Task to run as a batch child")
    return {"task_id": piece.tasks[0], "slice_id": piece.slice_id, "blocked_by": piece.blocked_by}


def _read_slices(text: str) -> list[_Slice]:
    slices: list[_Slice] = []
    in_tasks = fenced = False
    for raw in LINE_BREAK.split(text):
        line = js_trim(raw)
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            continue
        elif heading := SLICE_HEADING.match(line):
            slices.append(_Slice(heading.group(1)))
            in_tasks = False
        elif slices:
            in_tasks = _read_slice_line(slices[-1], line, in_tasks)
    return slices


def _read_slice_line(piece: _Slice, line: str, in_tasks: bool) -> bool:
    """Apply one line inside a Slice; returns whether the Tasks list is still open."""
    if TASKS.fullmatch(line):
        return True
    blocked = BLOCKED_BY.fullmatch(line)
    if blocked:
        piece.blocked_by.extend(part for part in map(_unquote, blocked.group(1).split(",")) if part)
        return False
    bullet = BULLET.fullmatch(line)
    if in_tasks and bullet:
        piece.tasks.append(_unquote(bullet.group(1)))
        return True
    return in_tasks and not line
