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
from functools import lru_cache
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
    return list(_prefix_of(entry)) if isinstance(entry, str) else []


@lru_cache(maxsize=65536)
def _prefix_of(entry: str) -> tuple[str, ...]:
    """`scope_prefix` of a text entry, kept: a plan compares each entry with many others."""
    value = js_trim(entry).lower()
    while value.startswith("./"):
        value = value[2:]
    if not value or value.startswith("/") or "\\" in value:
        return ()
    wildcard = WILDCARD.search(value)
    # A partial segment before a wildcard proves nothing: cut back to the last `/`.
    literal = value if wildcard is None else value[: value.rfind("/", 0, wildcard.start()) + 1]
    segments = tuple(segment for segment in literal.split("/") if segment)
    if any(segment in (".", "..") for segment in segments):
        return ()
    return segments


def _prefixes(scope: Sequence[Any]) -> list[tuple[str, ...]] | None:
    """Each entry's prefix; None for an empty scope, which overlaps everything."""
    if not scope:
        return None
    return [_prefix_of(entry) if isinstance(entry, str) else () for entry in scope]


def _prefixes_overlap(left: Sequence[str], right: Sequence[str]) -> bool:
    shared = min(len(left), len(right))
    return tuple(left[:shared]) == tuple(right[:shared])


def scopes_overlap(left: Sequence[Any], right: Sequence[Any]) -> bool:
    """True unless every pair of entries is provably disjoint. Symmetric."""
    left_prefixes, right_prefixes = _prefixes(left), _prefixes(right)
    if left_prefixes is None or right_prefixes is None:
        return True
    return any(_prefixes_overlap(mine, other) for mine in left_prefixes for other in right_prefixes)


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
    """Waves of the plan as the confirmation shows them, and who serializes behind whom.

    Wave by wave: the children whose blockers are all in earlier waves, in record order, each joining
    the wave unless its scope overlaps a member's (then it waits, and the members it overlapped are
    noted). Near-linear: blockers are counted down (Kahn), and a wave's scopes sit in a prefix tree, so
    a child is checked against the wave in the length of its entries, not the size of the wave."""
    ids = [_field(child, "task_id") for child in children]
    scopes = [_prefixes(_field(child, "scope_hint")) for child in children]
    waiting: list[int] = []  # per child, its distinct blockers not yet placed
    dependents: dict[str, list[int]] = {}
    for index, child in enumerate(children):
        blockers = set(_field(child, "blocked_by"))
        waiting.append(len(blockers))
        for blocker in blockers:
            dependents.setdefault(blocker, []).append(index)
    ready = [index for index, count in enumerate(waiting) if count == 0]
    groups: list[list[str]] = []
    conflicts: dict[str, set[str]] = {}
    left = len(children)
    while left:
        if not ready:
            raise ValueError(ACYCLIC_MESSAGE)
        wave, ready = _wave(sorted(ready), ids, scopes, conflicts)
        groups.append([ids[index] for index in wave])
        left -= len(wave)
        for index in wave:
            for dependent in dependents.get(ids[index], ()):
                waiting[dependent] -= 1
                if waiting[dependent] == 0:
                    ready.append(dependent)
    return {"parallel_groups": groups, "scope_conflicts": _scope_conflicts(children, conflicts)}


class _ScopeTree:
    """The entries of a wave's members as a tree of path segments: which members an entry overlaps is
    the members ending on its path (a prefix of it) and those below its end (it is a prefix of theirs)."""

    def __init__(self) -> None:
        self.root: dict[str, Any] = {}
        self.ending: dict[int, list[int]] = {}  # id(node) -> members with an entry ending there
        self.below: dict[int, list[int]] = {}  # id(node) -> members with an entry through or ending there
        self.everything: list[int] = []  # members with an empty scope: they overlap everything
        self.members: list[int] = []

    def add(self, member: int, prefixes: list[tuple[str, ...]] | None) -> None:
        self.members.append(member)
        if prefixes is None:
            self.everything.append(member)
            return
        for prefix in prefixes:
            node = self.root
            self.below.setdefault(id(node), []).append(member)
            for segment in prefix:
                node = node.setdefault(segment, {})
                self.below.setdefault(id(node), []).append(member)
            self.ending.setdefault(id(node), []).append(member)

    def overlapping(self, prefixes: list[tuple[str, ...]] | None) -> set[int]:
        if prefixes is None:
            return set(self.members)
        found = set(self.everything)
        for prefix in prefixes:
            node: dict[str, Any] | None = self.root
            for segment in prefix:
                found.update(self.ending.get(id(node), ()))
                node = node.get(segment)
                if node is None:
                    break
            if node is not None:
                found.update(self.below.get(id(node), ()))
        return found


def _wave(ready: list[int], ids: list[str], scopes: list[Any], conflicts: dict[str, set[str]]
          ) -> tuple[list[int], list[int]]:
    """The ready children (in record order) that fit together, and those that wait; a waiting child's
    conflicts note the wave members it overlapped."""
    tree = _ScopeTree()
    wave: list[int] = []
    waits: list[int] = []
    for index in ready:
        overlapped = tree.overlapping(scopes[index]) if wave else set()
        if overlapped:
            conflicts.setdefault(ids[index], set()).update(ids[member] for member in overlapped)
            waits.append(index)
            continue
        wave.append(index)
        tree.add(index, scopes[index])
    return wave, waits


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
