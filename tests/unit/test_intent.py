"""TaskIntent v1: parsing, normalization, hash, revisions, delegation bounds and commit scope (docs/upstream.md#taskintent-v1, #delegated-intent-revisions, #the-lane-commit)."""

from __future__ import annotations

import hashlib
import json
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes_es.domain.intent import (
    InvalidIntent, bound_spec_path, canonical_intent_hash, classify_intent_revision, delegated_revision_refusal,
    is_path_allowed_for_child, parse_task_intent, path_matches_scope,
)


def raw(**change) -> dict:
    value = {"contract": "assurance_kernel/task_intent/v1", "task_id": "task-a", "goal": "Deliver a",
             "acceptance": [{"id": "A1", "assertion": "a exists", "verification": "{}"}],
             "scope_hint": ["src/a.ts", "src/b.ts"], "risk": "material", "revision": 1, "owner": "user"}
    value.update(change)
    return value


def parsed(**change) -> dict:
    return parse_task_intent(raw(**change))


def violations_of(value: object) -> list[str]:
    with pytest.raises(InvalidIntent) as raised:
        parse_task_intent(value)
    return str(raised.value).split("; ")


# ---------------------------------------------------------------- parsing


def test_a_valid_intent_parses_to_its_normalized_form():
    assert parsed() == raw()
    assert list(parsed()) == ["contract", "task_id", "goal", "acceptance", "scope_hint", "risk", "revision", "owner"]


@pytest.mark.parametrize("value", [None, [], "intent", 3])
def test_an_intent_must_be_an_object(value):
    assert violations_of(value) == ["TaskIntent must be a JSON object"]


def test_every_violation_is_reported_at_once_joined_by_semicolons():
    found = violations_of(raw(contract="x", goal="", risk="low", revision=0, owner="agent", extra=1))
    assert found == [
        "unknown field extra", "contract must equal assurance_kernel/task_intent/v1",
        "goal must be a non-empty string of at most 2000 characters", "risk must be routine, material or critical",
        "revision must be a positive integer", "owner must equal user",
    ]


@pytest.mark.parametrize("field", ["contract", "task_id", "goal", "acceptance", "scope_hint", "risk", "revision", "owner"])
def test_every_field_is_required(field):
    value = raw()
    del value[field]
    assert len(violations_of(value)) == 1


@pytest.mark.parametrize("change, fragment", [
    ({"task_id": "t" * 129}, "task_id must be"),
    ({"task_id": 7}, "task_id must be"),
    ({"goal": "g" * 2001}, "goal must be"),
    ({"goal": "\U0001f600" * 1001}, "goal must be"),
    ({"revision": True}, "revision must be a positive integer"),
    ({"revision": 1.5}, "revision must be a positive integer"),
    ({"revision": 2**53}, "revision must be a positive integer"),
    ({"revision": "1"}, "revision must be a positive integer"),
    ({"acceptance": []}, "acceptance must be a non-empty array"),
    ({"acceptance": {"id": "A1"}}, "acceptance must be a non-empty array"),
    ({"acceptance": ["A1"]}, "acceptance[0] must hold exactly id, assertion and verification"),
    ({"acceptance": [{"id": "A1", "assertion": "a"}]}, "acceptance[0] must hold exactly"),
    ({"acceptance": [{"id": "A1", "assertion": "a", "verification": "v", "x": 1}]}, "acceptance[0] must hold exactly"),
    ({"acceptance": [{"id": "", "assertion": "a", "verification": "v"}]}, "acceptance[0].id must be"),
    ({"acceptance": [{"id": "i" * 65, "assertion": "a", "verification": "v"}]}, "acceptance[0].id must be"),
    ({"acceptance": [{"id": "A1", "assertion": "a" * 2001, "verification": "v"}]}, "acceptance[0].assertion must be"),
    ({"acceptance": [{"id": "A1", "assertion": "a", "verification": {}}]}, "acceptance[0].verification must be"),
    ({"acceptance": [{"id": "A1", "assertion": "a", "verification": "v"}] * 2}, "acceptance id A1 is duplicated"),
])
def test_field_rules(change, fragment):
    found = violations_of(raw(**change))
    assert len(found) == 1 and fragment in found[0], found


def test_limits_themselves_are_accepted():
    intent = parsed(task_id="t" * 128, goal="g" * 2000, revision=2**53 - 1,
                    acceptance=[{"id": "i" * 64, "assertion": "a" * 2000, "verification": "v" * 2000}],
                    scope_hint=["s" * 200])
    assert intent["scope_hint"] == ["s" * 200]


# ---------------------------------------------------------------- scope_hint


@pytest.mark.parametrize("entry", [".", "*", "**", "**/*", "./", "/etc", "/", "C:/x", "c:x", "a\\b", "a\x00b",
                                   "a//b", "./a", "a/./b", "a/..", "../a", "", " a", "a ", "a\u3000", "s" * 201,
                                   "cafe\u0301", "a\ud800", 5, None])
def test_scope_entries_that_name_no_repository_path_are_refused(entry):
    found = violations_of(raw(scope_hint=["ok/path", entry]))
    assert len(found) == 1 and found[0].startswith("scope_hint[1] "), found


@pytest.mark.parametrize("value", [[], "src", None, {"a": 1}])
def test_scope_hint_must_be_a_non_empty_array(value):
    assert violations_of(raw(scope_hint=value)) == ["scope_hint must be a non-empty array"]


@pytest.mark.parametrize("scope", [["src/A.ts", "src/a.ts"], ["Docs/x.md", "docs/y.md"], ["docs", "DOCS/**"]])
def test_a_case_fold_collision_between_path_prefixes_is_a_violation(scope):
    found = violations_of(raw(scope_hint=scope))
    assert len(found) == 1 and "differ only by case" in found[0]


def test_scope_is_deduped_sorted_by_code_unit_and_stripped_of_trailing_slashes():
    scope = parsed(scope_hint=["src/b.ts", "src/a.ts/", "src/a.ts", "\uff41.txt", "\U0001f600.txt", "B.md"])["scope_hint"]
    # Code units: "\U0001f600" is the surrogate pair d83d de00, which sorts before U+FF41.
    assert scope == ["B.md", "src/a.ts", "src/b.ts", "\U0001f600.txt", "\uff41.txt"]


def test_entries_under_a_wildcard_free_entry_are_dropped():
    scope = parsed(scope_hint=["src", "src/a.ts", "src/**", "srcs/x", "docs/*.md", "docs/*.md/x", "tests/a/b"])
    assert scope["scope_hint"] == ["docs/*.md", "docs/*.md/x", "src", "srcs/x", "tests/a/b"]


@pytest.mark.parametrize("scope", [["plugins/immune-brain/runtime/kernel/store.ts"], ["plugins"],
                                   ["plugins/immune-brain/runtime/claude/mcp_server.ts"], ["**/*.ts"],
                                   ["plugins/immune-brain/.pi-extension/x"], ["Plugins/Immune-Brain/runtime/assurance"]])
def test_the_risk_floor_raises_routine_to_material(scope):
    assert parsed(scope_hint=scope, risk="routine")["risk"] == "material"


def test_the_risk_floor_leaves_other_risks_and_other_paths_alone():
    assert parsed(scope_hint=["plugins/immune-brain/runtime/kernel"], risk="critical")["risk"] == "critical"
    assert parsed(scope_hint=["plugins/immune-brain/runtime/claude/other.ts"], risk="routine")["risk"] == "routine"
    assert parsed(scope_hint=["src/a.ts"], risk="routine")["risk"] == "routine"


# ---------------------------------------------------------------- canonical hash


def test_the_canonical_hash_is_sorted_spaced_json_of_the_normalized_intent():
    intent = parsed(scope_hint=["src/b.ts", "src/a.ts"], goal="Fix caf\u00e9")
    text = ('{"acceptance": [{"assertion": "a exists", "id": "A1", "verification": "{}"}], '
            '"contract": "assurance_kernel/task_intent/v1", "goal": "Fix caf\u00e9", "owner": "user", '
            '"revision": 1, "risk": "material", "scope_hint": ["src/a.ts", "src/b.ts"], "task_id": "task-a"}')
    assert canonical_intent_hash(intent) == "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_the_hash_covers_the_normalized_intent_not_the_spelling():
    assert canonical_intent_hash(parsed(scope_hint=["src/a.ts/", "src/a.ts"])) == canonical_intent_hash(
        parsed(scope_hint=["src/a.ts"]))
    assert canonical_intent_hash(parsed()) != canonical_intent_hash(parsed(revision=2))


def test_a_lone_surrogate_is_hashed_as_javascript_escapes_it():
    intent = parsed(goal="a\ud800b")
    assert canonical_intent_hash(intent) == "sha256:" + hashlib.sha256(
        canonical_json_reference(intent).encode("utf-8")).hexdigest()


def canonical_json_reference(intent: dict) -> str:
    return json.dumps(intent, sort_keys=True, ensure_ascii=False).replace("\ud800", "\\ud800")


# ---------------------------------------------------------------- revisions


def test_only_a_revision_bump_is_unchanged():
    assert classify_intent_revision(parsed(), parsed(revision=5)) == "unchanged"
    assert classify_intent_revision(parsed(), parsed()) == "unchanged"


def test_a_higher_revision_that_keeps_every_promise_is_compatible():
    added = [{"id": "A1", "assertion": "a exists", "verification": "{}"},
             {"id": "A2", "assertion": "more", "verification": "{}"}]
    assert classify_intent_revision(parsed(), parsed(revision=2, acceptance=added)) == "compatible"
    new_check = [{"id": "A1", "assertion": "a exists", "verification": "{\"x\": 1}"}]
    assert classify_intent_revision(parsed(), parsed(revision=2, acceptance=new_check)) == "compatible"
    assert classify_intent_revision(parsed(), parsed(revision=2, risk="critical")) == "compatible"


def test_a_compatible_change_without_a_higher_revision_is_breaking():
    added = [{"id": "A1", "assertion": "a exists", "verification": "{}"}, {"id": "A2", "assertion": "m", "verification": "v"}]
    assert classify_intent_revision(parsed(revision=2), parsed(revision=2, acceptance=added)) == "breaking"
    assert classify_intent_revision(parsed(revision=2), parsed(revision=1, acceptance=added)) == "breaking"


@pytest.mark.parametrize("change", [
    {"goal": "Other goal"}, {"task_id": "task-b"}, {"scope_hint": ["src/a.ts"]}, {"scope_hint": ["src/b.ts", "src/a.ts", "x"]},
    {"risk": "routine"}, {"acceptance": [{"id": "A2", "assertion": "a exists", "verification": "{}"}]},
    {"acceptance": [{"id": "A1", "assertion": "reworded", "verification": "{}"}]},
])
def test_breaking_changes(change):
    assert classify_intent_revision(parsed(), parsed(revision=2, **change)) == "breaking"


# ---------------------------------------------------------------- delegation bounds (LANE-DEL-03)


def reworded(**change) -> dict:
    return parsed(revision=2, acceptance=[{"id": "A1", "assertion": "a exists, reworded", "verification": "{}"}],
                  **change)


def test_del03_an_in_bounds_breaking_revision_is_allowed():
    base = parsed()
    assert delegated_revision_refusal(base, base, reworded()) is None


def test_del03_narrowing_scope_is_allowed():
    base = parsed()
    assert delegated_revision_refusal(base, base, reworded(scope_hint=["src/a.ts"])) is None


def test_del03_widening_scope_is_refused_naming_the_entries():
    base = parsed()
    refusal = delegated_revision_refusal(base, base, reworded(scope_hint=["src/a.ts", "src/c.ts", "src/d.ts"]))
    assert refusal == "widening scope_hint is outside the delegation: src/c.ts, src/d.ts"


def test_del03_a_risk_change_is_refused():
    base = parsed()
    assert "risk" in delegated_revision_refusal(base, base, reworded(risk="critical"))
    assert delegated_revision_refusal(base, base, reworded(risk="critical")) == "a risk change is outside the delegation"
    current = parsed(revision=1, risk="critical")
    assert delegated_revision_refusal(base, current, reworded()) == "a risk change is outside the delegation"


def test_del03_a_goal_change_is_refused():
    base = parsed()
    refusal = delegated_revision_refusal(base, base, reworded(goal="Something else"))
    assert refusal == "goal, owner and task identity are outside the delegation"


def test_delegation_needs_a_breaking_revision_with_a_higher_number():
    base = parsed()
    additive = parsed(revision=2, acceptance=[{"id": "A1", "assertion": "a exists", "verification": "{}"},
                                              {"id": "A2", "assertion": "b", "verification": "{}"}])
    assert delegated_revision_refusal(base, base, additive) == (
        "only a breaking revision needs this approval; apply a compatible one with revise_intent")
    current = parsed(revision=3)
    assert delegated_revision_refusal(base, current, reworded()) == "the revision number must increase"


def test_delegation_refuses_a_change_of_the_bound_spec():
    spec_scope = ["docs/specs/a.spec.md", "docs/specs/archive/a.spec.md", "src/a.ts"]
    base = parsed(scope_hint=spec_scope)
    unbound = reworded(scope_hint=["docs/specs/a.spec.md", "src/a.ts"])
    assert delegated_revision_refusal(base, base, unbound) == "a change of the bound Spec is outside the delegation"


def test_bound_spec_path_needs_the_archive_path_in_scope_too():
    assert bound_spec_path(parsed(scope_hint=["docs/specs/a.spec.md", "docs/specs/archive/a.spec.md"])) == (
        "docs/specs/a.spec.md")
    assert bound_spec_path(parsed(scope_hint=["docs/specs/a.spec.md"])) is None
    assert bound_spec_path(parsed(scope_hint=["docs/specs/archive/a.spec.md"])) is None
    assert bound_spec_path(parsed(scope_hint=["docs/specs/x/a.spec.md", "docs/specs/archive/a.spec.md"])) is None


def test_bound_spec_path_refuses_two_bound_specs():
    scope = ["docs/specs/a.spec.md", "docs/specs/archive/a.spec.md", "docs/specs/b.spec.md",
             "docs/specs/archive/b.spec.md"]
    with pytest.raises(InvalidIntent, match="more than one Spec"):
        bound_spec_path(parsed(scope_hint=scope))


# ---------------------------------------------------------------- commit scope


@pytest.mark.parametrize("path, entry, matches", [
    ("src/a.ts", "src/*.ts", True),
    ("src/deep/a.ts", "src/*.ts", False),
    ("src/deep/a.ts", "src/**", True),
    ("src/deep/a.ts", "src/**/*.ts", True),
    ("src/a.ts", "src/?.ts", True),
    ("src/ab.ts", "src/?.ts", False),
    ("src/a/b", "src/?/b", True),
    ("src//b", "src/?/b", False),
    ("srcXa.ts", "src.a.ts", False),
    ("src/(a).ts", "src/(a).ts", True),
])
def test_path_matches_scope_globs(path, entry, matches):
    assert path_matches_scope(path, entry) is matches


@pytest.mark.parametrize("path, allowed", [
    ("src/a.ts", True),
    ("./src/a.ts", True),
    ("src/a.ts/inner", True),
    ("src/a.tsx", False),
    ("lib/x.py", True),
    ("lib/deep/x.py", False),
    ("docs/any/where.md", True),
    (".imm/audit/task-a/run-1/task-record.json", True),
    (".imm/audit/task-a", True),
    (".imm/audit/task-b/run-1/task-record.json", False),
    (".imm/audit/task-ab", False),
    ("other.txt", False),
    ("src/a.ts/", False),
    ("src//a.ts", False),
    ("src\\a.ts", False),
    (" src/a.ts", False),
    ("src/a.ts ", False),
    ("", False),
])
def test_is_path_allowed_for_child(path, allowed):
    assert is_path_allowed_for_child(path, "task-a", ["src/a.ts", "lib/*.py", "docs/**"]) is allowed


# ---------------------------------------------------------------- properties


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=12)
SCOPE_ENTRY = st.one_of(st.text(alphabet="aA/.*?\\ \u0301\u00e9", max_size=10), JSON_VALUES)
INTENTS = st.fixed_dictionaries({}, optional={
    "contract": st.one_of(st.just("assurance_kernel/task_intent/v1"), JSON_VALUES),
    "task_id": st.one_of(st.just("task-a"), JSON_VALUES), "goal": st.one_of(st.just("g"), JSON_VALUES),
    "acceptance": st.one_of(st.just([{"id": "A1", "assertion": "a", "verification": "v"}]), JSON_VALUES),
    "scope_hint": st.one_of(st.lists(SCOPE_ENTRY, max_size=4), JSON_VALUES),
    "risk": st.one_of(st.sampled_from(["routine", "material", "critical"]), JSON_VALUES),
    "revision": st.one_of(st.integers(min_value=1, max_value=9), JSON_VALUES),
    "owner": st.one_of(st.just("user"), JSON_VALUES),
})


@settings(max_examples=400)
@given(st.one_of(INTENTS, JSON_VALUES))
def test_the_parser_raises_only_invalid_intent_and_its_output_is_a_fixed_point(value):
    try:
        intent = parse_task_intent(value)
    except InvalidIntent:
        return
    assert parse_task_intent(intent) == intent
    assert canonical_intent_hash(intent).startswith("sha256:")
    assert all(unicodedata.is_normalized("NFC", entry) for entry in intent["scope_hint"])


@given(st.lists(st.sampled_from(["src", "src/a", "src/a/b", "src/*", "docs/x", "Docs2", "a/**/b"]), min_size=1))
def test_normalized_scope_is_sorted_unique_and_keeps_no_entry_under_a_literal(scope):
    result = parsed(scope_hint=scope)["scope_hint"]
    assert result == sorted(set(result))
    literal = [entry for entry in result if "*" not in entry]
    assert not any(entry.startswith(other + "/") for entry in result for other in literal)


@given(st.text(alphabet="ab/.*? ", max_size=12))
def test_the_own_audit_directory_is_always_allowed(suffix):
    path = ".imm/audit/task-a/" + "run-1/" + (suffix or "x")
    segments = path.split("/")
    if all(segment and segment == segment.strip() for segment in segments):
        assert is_path_allowed_for_child(path, "task-a", ["elsewhere"])
