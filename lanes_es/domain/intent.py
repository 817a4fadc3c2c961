"""TaskIntent v1: parsing, its canonical hash, revisions, delegation bounds and the commit scope.

A TaskIntent (`docs/plans/<task>.intent.json`) is what the user confirmed a child may
do: its goal, its acceptance items with their verification descriptors, and its
`scope_hint`, the paths the child may change. The parser reports every violation at
once, joined by "; ", and returns the normalized intent; the content hash covers that
normalized form, never the file bytes (docs/upstream.md#taskintent-v1).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from functools import lru_cache
from typing import Any

from .jstext import code_unit_key, escape_lone_surrogates, is_round_trip_utf8, js_length, js_trim, safe_integer
from .scheduling import WILDCARD, scopes_overlap

INTENT_CONTRACT = "assurance_kernel/task_intent/v1"
INTENT_FIELDS = ("contract", "task_id", "goal", "acceptance", "scope_hint", "risk", "revision", "owner")
ACCEPTANCE_FIELDS = ("id", "assertion", "verification")
RISKS = ("routine", "material", "critical")
MAX_TASK_ID, MAX_GOAL, MAX_ITEM_ID, MAX_ITEM_TEXT, MAX_SCOPE_ENTRY = 128, 2000, 64, 2000, 200
UNSCOPED_ENTRIES = frozenset({".", "*", "**", "**/*"})
DRIVE_LETTER = re.compile(r"^[A-Za-z]:")
# Paths whose change needs at least a material review, whatever the intent says.
RISK_FLOOR_SCOPE_PREFIXES = (
    "plugins/immune-brain/runtime/kernel",
    "plugins/immune-brain/runtime/authority_commit_receipts.ts",
    "plugins/immune-brain/runtime/assurance",
    "plugins/immune-brain/runtime/claude/interaction.ts",
    "plugins/immune-brain/runtime/claude/capability.ts",
    "plugins/immune-brain/runtime/claude/review_host.ts",
    "plugins/immune-brain/runtime/claude/kernel_ports.ts",
    "plugins/immune-brain/runtime/claude/mcp_server.ts",
    "plugins/immune-brain/.pi-extension",
)
SPEC_PATH = re.compile(r"docs/specs/(?!archive/)[^/]+\.spec\.md")


class InvalidIntent(ValueError):
    """A TaskIntent that breaks one or more rules; the message lists them joined by "; "."""


# ---------------------------------------------------------------- parsing


def parse_task_intent(value: Any) -> dict[str, Any]:
    """The normalized TaskIntent v1, or InvalidIntent naming every violation."""
    if not isinstance(value, dict):
        raise InvalidIntent("TaskIntent must be a JSON object")
    violations = [f"unknown field {_shown(key)}" for key in value if key not in INTENT_FIELDS]
    _check_scalars(value, violations)
    acceptance = _parse_acceptance(value.get("acceptance"), violations)
    scope = _parse_scope_hint(value.get("scope_hint"), violations)
    if violations:
        raise InvalidIntent("; ".join(violations))
    return {
        "contract": INTENT_CONTRACT, "task_id": value["task_id"], "goal": value["goal"], "acceptance": acceptance,
        "scope_hint": scope, "risk": _risk_with_floor(value["risk"], scope),
        "revision": safe_integer(value["revision"]), "owner": "user",
    }


def _shown(key: Any) -> str:
    text = str(key)
    return text if len(text) <= 64 else text[:64] + "..."


def _is_text(value: Any, limit: int) -> bool:
    return isinstance(value, str) and value != "" and js_length(value) <= limit


def _check_scalars(value: dict[str, Any], violations: list[str]) -> None:
    if value.get("contract") != INTENT_CONTRACT:
        violations.append(f"contract must equal {INTENT_CONTRACT}")
    if not _is_text(value.get("task_id"), MAX_TASK_ID):
        violations.append(f"task_id must be a non-empty string of at most {MAX_TASK_ID} characters")
    if not _is_text(value.get("goal"), MAX_GOAL):
        violations.append(f"goal must be a non-empty string of at most {MAX_GOAL} characters")
    if not isinstance(value.get("risk"), str) or value["risk"] not in RISKS:
        violations.append("risk must be routine, material or critical")
    revision = safe_integer(value.get("revision"))
    if revision is None or revision <= 0:
        violations.append("revision must be a positive integer")
    if value.get("owner") != "user":
        violations.append("owner must equal user")


def _parse_acceptance(items: Any, violations: list[str]) -> list[dict[str, str]]:
    if not isinstance(items, list) or not items:
        violations.append("acceptance must be a non-empty array")
        return []
    parsed, seen = [], set()
    for index, item in enumerate(items):
        entry = _parse_acceptance_item(index, item, violations)
        if entry is None:
            continue
        if entry["id"] in seen:
            violations.append(f"acceptance id {entry['id']} is duplicated")
        seen.add(entry["id"])
        parsed.append(entry)
    return parsed


def _parse_acceptance_item(index: int, item: Any, violations: list[str]) -> dict[str, str] | None:
    if not isinstance(item, dict) or set(item) != set(ACCEPTANCE_FIELDS):
        violations.append(f"acceptance[{index}] must hold exactly id, assertion and verification")
        return None
    limits = {"id": MAX_ITEM_ID, "assertion": MAX_ITEM_TEXT, "verification": MAX_ITEM_TEXT}
    broken = [name for name in ACCEPTANCE_FIELDS if not _is_text(item[name], limits[name])]
    for name in broken:
        violations.append(f"acceptance[{index}].{name} must be a non-empty string of at most {limits[name]} characters")
    return None if broken else {name: item[name] for name in ACCEPTANCE_FIELDS}


# ---------------------------------------------------------------- scope_hint


def _parse_scope_hint(entries: Any, violations: list[str]) -> list[str]:
    if not isinstance(entries, list) or not entries:
        violations.append("scope_hint must be a non-empty array")
        return []
    stripped = []
    for index, entry in enumerate(entries):
        problem = _scope_entry_problem(entry)
        if problem:
            violations.append(f"scope_hint[{index}] {problem}")
        else:
            stripped.append(entry.rstrip("/"))
    violations.extend(_case_collisions(stripped))
    return _normalize_scope(stripped)


def _scope_entry_problem(entry: Any) -> str | None:
    """Why an entry cannot name repository paths, or None."""
    if not _is_text(entry, MAX_SCOPE_ENTRY):
        return f"must be a non-empty string of at most {MAX_SCOPE_ENTRY} characters"
    if js_trim(entry) != entry:
        return "must not have surrounding whitespace"
    if not is_round_trip_utf8(entry) or unicodedata.normalize("NFC", entry) != entry:
        return "must be NFC-normalized UTF-8"
    value = entry.rstrip("/")
    if (value in UNSCOPED_ENTRIES or "\x00" in value or "\\" in value or entry.startswith("/")
            or DRIVE_LETTER.match(value) or any(s in ("", ".", "..") for s in value.split("/"))):
        return f"is not a repository path scope: {entry}"
    return None


def _case_collisions(entries: list[str]) -> list[str]:
    """Two entries whose path prefixes differ only by case would name one directory on some disks."""
    spelled: dict[str, str] = {}
    found: list[str] = []
    for entry in dict.fromkeys(entries):
        segments = entry.split("/")
        for depth in range(1, len(segments) + 1):
            prefix = "/".join(segments[:depth])
            other = spelled.setdefault(prefix.lower(), prefix)
            if other != prefix:
                found.append(f"scope_hint entries {other} and {prefix} differ only by case")
                break
    return found


def _normalize_scope(entries: list[str]) -> list[str]:
    """Dedupe, sort by code unit, and drop every entry lying under another wildcard-free entry."""
    unique = sorted(set(entries), key=code_unit_key)
    literal = {entry for entry in unique if not WILDCARD.search(entry)}
    return [entry for entry in unique if not _lies_under(entry, literal)]


def _lies_under(entry: str, literal: set[str]) -> bool:
    segments = entry.split("/")
    return any("/".join(segments[:depth]) in literal for depth in range(1, len(segments)))


def _risk_with_floor(risk: str, scope: list[str]) -> str:
    if risk == "routine" and scopes_overlap(scope, RISK_FLOOR_SCOPE_PREFIXES):
        return "material"
    return risk


# ---------------------------------------------------------------- hash and revisions


def canonical_json(value: Any) -> str:
    """canonical_json's stableStringify: sorted keys, ", " and ": " separators."""
    return escape_lone_surrogates(json.dumps(value, sort_keys=True, ensure_ascii=False))


def canonical_intent_hash(intent: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(intent).encode("utf-8")).hexdigest()


def classify_intent_revision(previous: dict[str, Any], following: dict[str, Any]) -> str:
    """unchanged, compatible (a higher revision that keeps every promise) or breaking."""
    if _hash_without_revision(previous) == _hash_without_revision(following):
        return "unchanged"
    if _breaks(previous, following):
        return "breaking"
    return "compatible" if following["revision"] > previous["revision"] else "breaking"


def _hash_without_revision(intent: dict[str, Any]) -> str:
    return canonical_intent_hash({key: item for key, item in intent.items() if key != "revision"})


def _breaks(previous: dict[str, Any], following: dict[str, Any]) -> bool:
    if any(previous[key] != following[key] for key in ("contract", "task_id", "owner", "goal", "scope_hint")):
        return True
    if RISKS.index(following["risk"]) < RISKS.index(previous["risk"]):
        return True
    assertions = {item["id"]: item["assertion"] for item in following["acceptance"]}
    return any(assertions.get(item["id"]) != item["assertion"] for item in previous["acceptance"])


# ---------------------------------------------------------------- delegation (docs/upstream.md#delegated-intent-revisions)


def bound_spec_path(intent: dict[str, Any]) -> str | None:
    """The Spec the intent binds: an active spec path whose archive path is in scope too."""
    scope = intent["scope_hint"]
    bound = [entry for entry in scope if SPEC_PATH.fullmatch(entry)
             and "docs/specs/archive/" + entry.rsplit("/", 1)[1] in scope]
    if len(bound) > 1:
        raise InvalidIntent(f"TaskIntent {intent['task_id']} binds more than one Spec: {', '.join(bound)}")
    return bound[0] if bound else None


def delegated_revision_refusal(authorized: dict[str, Any], current: dict[str, Any],
                               following: dict[str, Any]) -> str | None:
    """Why the coordinator may not approve this breaking revision on the user's behalf, or None."""
    if classify_intent_revision(current, following) != "breaking":
        return "only a breaking revision needs this approval; apply a compatible one with revise_intent"
    if following["revision"] <= current["revision"]:
        return "the revision number must increase"
    if any(following[key] != authorized[key] for key in ("goal", "owner", "task_id")):
        return "goal, owner and task identity are outside the delegation"
    if following["risk"] != authorized["risk"] or following["risk"] != current["risk"]:
        return "a risk change is outside the delegation"
    try:
        if bound_spec_path(following) != bound_spec_path(authorized):
            return "a change of the bound Spec is outside the delegation"
    except InvalidIntent as error:
        return str(error)
    widened = [entry for entry in following["scope_hint"] if entry not in authorized["scope_hint"]]
    if widened:
        return f"widening scope_hint is outside the delegation: {', '.join(widened)}"
    return None


# ---------------------------------------------------------------- commit scope (docs/upstream.md#the-lane-commit)


@lru_cache(maxsize=1024)
def _glob(entry: str) -> re.Pattern[str]:
    """`*` stays within a segment, `**` crosses segments, `?` is one character other than `/`."""
    parts = re.split(r"(\*\*|\*|\?)", entry)
    wild = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wild.get(part, re.escape(part)) for part in parts), re.DOTALL)


def path_matches_scope(path: str, entry: str) -> bool:
    return _glob(entry).fullmatch(path) is not None


def is_path_allowed_for_child(path: str, task_id: str, scope_hint: list[str]) -> bool:
    """May a lane commit of `task_id` touch `path`? Its own audit directory always; else its scope."""
    if "\\" in path or any(not segment or js_trim(segment) != segment for segment in path.split("/")):
        return False
    value = path[2:] if path.startswith("./") else path
    audit = f".imm/audit/{task_id}"
    if value == audit or value.startswith(audit + "/"):
        return True
    return any(scope_entry_allows(value, entry) for entry in scope_hint)


def scope_entry_allows(path: str, entry: str) -> bool:
    if "*" in entry or "?" in entry:
        return path_matches_scope(path, entry)
    return path == entry or path.startswith(entry + "/")
