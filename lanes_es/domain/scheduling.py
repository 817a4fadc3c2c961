"""Which children may start now, and the waves shown at confirmation (upstream's batch_schedule).

A child's scope is its TaskIntent `scope_hint`. Two children may run in parallel
Lanes only when their scopes are *provably* disjoint: anything the scheduler cannot
prove (a wildcard at the start, an absolute path, `..`, an empty list) overlaps
everything. A child is a dict or an object with `task_id`, `state`, `blocked_by` and
`scope_hint`.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Sequence

from .jstext import MAX_SAFE_INTEGER, js_trim

IN_FLIGHT_STATES = frozenset({"lane_admitted", "enrolled", "settled", "lane_committed"})
# `committed` is the serial runner's done state; the oracle of LANE-SCH-11 relies on it.
DONE_STATES = frozenset({"committed", "integrated", "released"})
WILDCARD = re.compile(r"[*?\[\]{}!]")
ACYCLIC_MESSAGE = "Initiative Task dependencies must form an acyclic graph"
OVERLAP_CONTRACT = "assurance_kernel/intent_scope_overlap/v1"


def _field(child: Any, name: str) -> Any:
    return child[name] if isinstance(child, dict) else getattr(child, name)


def scope_prefix(entry: Any) -> list[str]:
    """The literal directory segments an entry is confined to; `[]` means "could be anywhere"."""
    if not isinstance(entry, str):
        return []
    value = js_trim(entry).lower()
    while value.startswith("./"):
        value = value[2:]
    if not value or value.startswith("/") or "\\" in value:
        return []
    wildcard = WILDCARD.search(value)
    # A partial segment before a wildcard proves nothing: cut back to the last `/`.
    literal = value if wildcard is None else value[: value.rfind("/", 0, wildcard.start()) + 1]
    segments = [segment for segment in literal.split("/") if segment]
    if any(segment in (".", "..") for segment in segments):
        return []
    return segments


def _prefixes_overlap(left: list[str], right: list[str]) -> bool:
    shared = min(len(left), len(right))
    return left[:shared] == right[:shared]


def scopes_overlap(left: Sequence[Any], right: Sequence[Any]) -> bool:
    """True unless every pair of entries is provably disjoint. Symmetric."""
    if not left or not right:
        return True
    right_prefixes = [scope_prefix(entry) for entry in right]
    return any(_prefixes_overlap(scope_prefix(entry), other)
               for entry in left for other in right_prefixes)


def _positive_limit(max_parallel: Any) -> float | int:
    if max_parallel == math.inf and not isinstance(max_parallel, bool):
        return math.inf
    valid = (isinstance(max_parallel, (int, float)) and not isinstance(max_parallel, bool)
             and not (isinstance(max_parallel, float) and not max_parallel.is_integer())
             and 0 < max_parallel <= MAX_SAFE_INTEGER)
    if not valid:
        raise ValueError("max_parallel must be a positive safe integer")
    return max_parallel


def startable_children(children: Sequence[Any], limit: Any) -> list[str]:
    """Pending children, in record order, whose blockers are done and whose scope is free, up to `limit` in flight."""
    maximum = _positive_limit(limit)
    done = {_field(child, "task_id") for child in children if _field(child, "state") in DONE_STATES}
    occupied = [_field(child, "scope_hint") for child in children if _field(child, "state") in IN_FLIGHT_STATES]
    startable: list[str] = []
    for child in children:
        if len(occupied) >= maximum:
            break
        if not _is_ready(child, done):
            continue
        scope = _field(child, "scope_hint")
        if any(scopes_overlap(scope, other) for other in occupied):
            continue
        startable.append(_field(child, "task_id"))
        occupied.append(scope)
    return startable


def _is_ready(child: Any, done: set[str]) -> bool:
    return _field(child, "state") == "pending" and all(blocker in done for blocker in _field(child, "blocked_by"))


def project_parallel_groups(children: Sequence[Any]) -> dict[str, Any]:
    """Waves of the plan as the confirmation shows them, and who serializes behind whom."""
    remaining = list(children)
    placed: set[str] = set()
    groups: list[list[str]] = []
    conflicts: dict[str, set[str]] = {}
    while remaining:
        ready = [child for child in remaining if all(b in placed for b in _field(child, "blocked_by"))]
        if not ready:
            raise ValueError(ACYCLIC_MESSAGE)
        wave = _wave(ready, conflicts)
        groups.append([_field(child, "task_id") for child in wave])
        placed.update(_field(child, "task_id") for child in wave)
        remaining = [child for child in remaining if not any(child is member for member in wave)]
    return {"parallel_groups": groups, "scope_conflicts": _scope_conflicts(children, conflicts)}


def _wave(ready: list[Any], conflicts: dict[str, set[str]]) -> list[Any]:
    """The ready children that fit together; the others wait and are noted as conflicts."""
    wave: list[Any] = []
    for child in ready:
        overlapped = [m for m in wave if scopes_overlap(_field(child, "scope_hint"), _field(m, "scope_hint"))]
        if overlapped:
            conflicts.setdefault(_field(child, "task_id"), set()).update(_field(m, "task_id") for m in overlapped)
            continue
        wave.append(child)
    return wave


def _scope_conflicts(children: Iterable[Any], conflicts: dict[str, set[str]]) -> list[dict[str, Any]]:
    return [{"task_id": _field(child, "task_id"), "overlaps_with": sorted(conflicts[_field(child, "task_id")])}
            for child in children if _field(child, "task_id") in conflicts]


def project_scope_overlap(intents: Sequence[Any]) -> dict[str, Any]:
    """The read-only overlap report of several TaskIntents: which pairs share which entries, and the waves."""
    overlaps = []
    for index, left in enumerate(intents):
        for right in intents[index + 1:]:
            pair = _overlap_of(left, right)
            if pair is not None:
                overlaps.append(pair)
    groups = project_parallel_groups([
        {"task_id": _field(intent, "task_id"), "blocked_by": [], "scope_hint": _field(intent, "scope_hint")}
        for intent in intents])
    return {"contract": OVERLAP_CONTRACT, "overlaps": overlaps, "parallel_groups": groups["parallel_groups"]}


def _overlap_of(left: Any, right: Any) -> dict[str, Any] | None:
    left_scope, right_scope = _field(left, "scope_hint"), _field(right, "scope_hint")
    if not scopes_overlap(left_scope, right_scope):
        return None
    entries = [[x, y] for x in left_scope for y in right_scope
               if _prefixes_overlap(scope_prefix(x), scope_prefix(y))]
    return {"task_ids": [_field(left, "task_id"), _field(right, "task_id")], "entries": entries}
