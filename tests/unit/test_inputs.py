"""The tick's untrusted parameters (tests/SCENARIOS.md, LANE-INP-01..04 and 06)."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes_es.domain.inputs import (
    InvalidInput, LaneInstruction, LaneOffer, LaneRevision, parse_final_verification, parse_lane_instruction,
    parse_lane_offers, parse_lane_revision, parse_max_parallel, resolve_lane_parallel,
)
from lanes_es.domain.jstext import JS_WHITESPACE, WS


def intent(**change) -> dict:
    value = {"contract": "assurance_kernel/task_intent/v1", "task_id": "task-a", "goal": "Deliver a",
             "acceptance": [{"id": "A1", "assertion": "a exists", "verification": "{}"}],
             "scope_hint": ["a.txt"], "risk": "routine", "revision": 2, "owner": "user"}
    value.update(change)
    return value


# ---------------------------------------------------------------- max_parallel


def test_inp01_absent_max_parallel_is_none():
    assert parse_max_parallel(None) is None


@pytest.mark.parametrize("value", [1, 2, 1.0, 2**53 - 1])
def test_inp01_positive_safe_integers_are_accepted(value):
    assert parse_max_parallel(value) == int(value)
    assert type(parse_max_parallel(value)) is int


@pytest.mark.parametrize("value", [0, -1, 1.5, "1", math.nan, math.inf, {}, [], True, False, 2**53])
def test_inp01_anything_else_is_refused(value):
    with pytest.raises(InvalidInput) as raised:
        parse_max_parallel(value)
    assert str(raised.value) == "invalid max_parallel: expected a positive integer"


# ---------------------------------------------------------------- lane_offers


def test_inp02_absent_offers_are_none_and_a_valid_offer_is_returned_unchanged():
    assert parse_lane_offers(None) is None
    assert parse_lane_offers([{"task_id": "task-a", "path": "/tmp/x"}]) == [LaneOffer(task_id="task-a", path="/tmp/x")]
    assert parse_lane_offers([]) == []


@pytest.mark.parametrize("value, message", [
    ("x", "invalid lane_offers: expected an array"),
    ({"task_id": "task-a", "path": "/x"}, "invalid lane_offers: expected an array"),
    ([{"task_id": f"t{i}", "path": f"/l/{i}"} for i in range(65)], "invalid lane_offers: at most 64 offers"),
    (["x"], "invalid lane_offers: each offer must be an object"),
    ([None], "invalid lane_offers: each offer must be an object"),
    ([[]], "invalid lane_offers: each offer must be an object"),
    ([{"task_id": "task-a", "path": "/x", "extra": 1}], "invalid lane_offers: unknown offer field"),
    ([{"task_id": "../escape", "path": "/x"}], "invalid lane_offers: task_id is not a valid task id"),
    ([{"path": "/x"}], "invalid lane_offers: task_id is not a valid task id"),
    ([{"task_id": 7, "path": "/x"}], "invalid lane_offers: task_id is not a valid task id"),
    ([{"task_id": "a" * 129, "path": "/x"}], "invalid lane_offers: task_id is not a valid task id"),
    ([{"task_id": "task-a", "path": "relative"}], "invalid lane_offers: path must be an absolute path"),
    ([{"task_id": "task-a", "path": ""}], "invalid lane_offers: path must be an absolute path"),
    ([{"task_id": "task-a"}], "invalid lane_offers: path must be an absolute path"),
    ([{"task_id": "task-a", "path": "/x\x00y"}], "invalid lane_offers: path must be an absolute path"),
    ([{"task_id": "task-a", "path": "/" + "x" * 4096}], "invalid lane_offers: path must be an absolute path"),
    ([{"task_id": "task-a", "path": "/" + "\U0001f600" * 2048}], "invalid lane_offers: path must be an absolute path"),
    ([{"task_id": "task-a", "path": "/a"}, {"task_id": "task-a", "path": "/b"}],
     "invalid lane_offers: duplicate offer for task-a"),
])
def test_inp02_offers_are_shape_checked_as_untrusted_input(value, message):
    with pytest.raises(InvalidInput) as raised:
        parse_lane_offers(value)
    assert str(raised.value) == message


def test_inp02_the_limits_themselves_are_accepted():
    offers = [{"task_id": f"t{i}", "path": f"/l/{i}"} for i in range(64)]
    assert len(parse_lane_offers(offers)) == 64
    assert parse_lane_offers([{"task_id": "t", "path": "/" + "x" * 4095}])[0].path.startswith("/x")


# ---------------------------------------------------------------- lane_instruction


def test_inp03_kind_defaults_to_instruction():
    parsed = parse_lane_instruction({"task_id": "task-a", "text": "use the fixture", "session_state": "idle"})
    assert parsed == LaneInstruction(task_id="task-a", kind="instruction", text="use the fixture", session_state="idle")
    assert parse_lane_instruction(None) is None


@pytest.mark.parametrize("change, message", [
    ({"keys": 1}, "invalid lane_instruction: unknown field"),
    ({"task_id": "../x"}, "invalid lane_instruction: task_id is not a valid task id"),
    ({"kind": "order"}, "invalid lane_instruction: kind must be instruction or correction"),
    ({"kind": None}, "invalid lane_instruction: kind must be instruction or correction"),
    ({"text": ""}, "invalid lane_instruction: text must be 1 to 4000 characters"),
    ({"text": " \t\n\u3000"}, "invalid lane_instruction: text must be 1 to 4000 characters"),
    ({"text": "x" * 4001}, "invalid lane_instruction: text must be 1 to 4000 characters"),
    ({"text": 5}, "invalid lane_instruction: text must be 1 to 4000 characters"),
    ({"session_state": "asleep"}, "invalid lane_instruction: session_state must be idle, working, blocked or done"),
    ({"session_state": None}, "invalid lane_instruction: session_state must be idle, working, blocked or done"),
])
def test_inp03_instruction_shape_checks(change, message):
    value = {"task_id": "task-a", "kind": "correction", "text": "rethink", "session_state": "idle", **change}
    with pytest.raises(InvalidInput) as raised:
        parse_lane_instruction(value)
    assert str(raised.value) == message


@pytest.mark.parametrize("value", ["x", [], 3])
def test_inp03_an_instruction_must_be_an_object(value):
    with pytest.raises(InvalidInput, match="^invalid lane_instruction: expected an object$"):
        parse_lane_instruction(value)


def test_inp03_text_of_exactly_4000_characters_is_accepted():
    assert parse_lane_instruction({"task_id": "t", "text": "x" * 4000, "session_state": "done"}).kind == "instruction"


# ---------------------------------------------------------------- final_verification


def test_inp04_commands_are_plain_argv_with_whitespace_collapsed():
    assert parse_final_verification(None) is None
    assert parse_final_verification(["bun test", "bun  run   typecheck"]) == ["bun test", "bun run typecheck"]
    assert parse_final_verification(["  make\tcheck  "]) == ["make check"]


@pytest.mark.parametrize("command", ["bun test && rm -rf /", "a | b", "a; b", "a > f", "a < f", "echo `x`",
                                     "echo $HOME", "a $(b)", "f() {}"])
def test_inp04_shell_syntax_is_refused(command):
    with pytest.raises(InvalidInput, match="shell"):
        parse_final_verification([command])


@pytest.mark.parametrize("command", ['bun test "x y"', "bun test 'x y'", "bun test x\\ y"])
def test_inp04_quoting_is_refused(command):
    with pytest.raises(InvalidInput, match="quoting"):
        parse_final_verification([command])


@pytest.mark.parametrize("value", [[], ["x"] * 9, "bun test", [""], ["   "], ["a\nb"], ["a\rb"], ["a\x00b"],
                                   ["x" * 513], [3], [None]])
def test_inp04_count_length_and_line_rules(value):
    with pytest.raises(InvalidInput, match="^invalid final_verification: "):
        parse_final_verification(value)


def test_inp04_the_limits_themselves_are_accepted():
    assert len(parse_final_verification(["make"] * 8)) == 8
    assert parse_final_verification(["x" * 512]) == ["x" * 512]


# ---------------------------------------------------------------- lane_revision


def test_lane_revision_parses_the_next_intent():
    parsed = parse_lane_revision({"task_id": "task-a", "next_intent": intent(scope_hint=["b.txt", "a.txt/"])})
    assert isinstance(parsed, LaneRevision)
    assert parsed.task_id == "task-a"
    assert parsed.next_intent["scope_hint"] == ["a.txt", "b.txt"]
    assert parse_lane_revision(None) is None


@pytest.mark.parametrize("value, fragment", [
    ("x", "expected an object"),
    ({"task_id": "task-a"}, "expected exactly task_id and next_intent"),
    ({"task_id": "task-a", "next_intent": intent(), "x": 1}, "expected exactly task_id and next_intent"),
    ({"task_id": "../a", "next_intent": intent()}, "task_id is not a valid task id"),
    ({"task_id": "task-a", "next_intent": "{}"}, "TaskIntent must be a JSON object"),
    ({"task_id": "task-a", "next_intent": intent(revision=0)}, "revision must be a positive integer"),
    ({"task_id": "task-b", "next_intent": intent()}, "next_intent.task_id must equal task_id"),
])
def test_lane_revision_refusals_start_with_its_name(value, fragment):
    with pytest.raises(InvalidInput) as raised:
        parse_lane_revision(value)
    assert str(raised.value).startswith("invalid lane_revision: ")
    assert fragment in str(raised.value)


# ---------------------------------------------------------------- resolve_lane_parallel


def test_inp06_offers_without_max_parallel_need_a_recorded_lane_batch():
    with pytest.raises(InvalidInput) as raised:
        resolve_lane_parallel(None, True, False, None)
    assert str(raised.value) == "lane_offers requires max_parallel unless a recorded lane batch is being resumed"


def test_inp06_an_instruction_without_max_parallel_names_itself():
    with pytest.raises(InvalidInput) as raised:
        resolve_lane_parallel(None, False, True, None)
    assert str(raised.value) == "lane_instruction requires max_parallel unless a recorded lane batch is being resumed"


def test_inp06_offers_name_themselves_first_when_both_are_given():
    with pytest.raises(InvalidInput, match="^lane_offers requires"):
        resolve_lane_parallel(None, True, True, None)


def test_inp07_offers_alone_resume_with_the_recorded_max_parallel():
    assert resolve_lane_parallel(None, True, False, 2) == 2
    assert resolve_lane_parallel(None, False, True, 3) == 3


def test_an_explicit_max_parallel_or_no_lane_input_is_passed_through():
    assert resolve_lane_parallel(4, True, True, None) == 4
    assert resolve_lane_parallel(None, False, False, None) is None
    assert resolve_lane_parallel(None, False, False, 2) is None


# ---------------------------------------------------------------- hostile input


def deep(levels: int) -> object:
    value: object = []
    for _ in range(levels):
        value = [value]
    return value


# Made when a test asks for one: built at import, the deep lists and megabyte strings stayed in every
# test worker's memory for the whole run (10 MB), and each git spawn forks the whole worker.
HOSTILE = [lambda: deep(50_000), lambda: {"task_id": deep(50_000)}, lambda: "\x00" * 10, lambda: "x" * 1_000_000,
           lambda: 10**400, lambda: -0.0, lambda: b"bytes", lambda: {1: 2}, lambda: {("t",): 1},
           lambda: [{"task_id": "t", "path": "/" + "x" * 1_000_000}], lambda: {"next_intent": deep(10_000)},
           lambda: [{"task_id": "a", "path": "/a"}] * 65,
           lambda: {"task_id": "t", "next_intent": {"scope_hint": deep(10_000)}}]
PARSERS = [parse_max_parallel, parse_lane_offers, parse_lane_instruction, parse_lane_revision, parse_final_verification]


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("make_value", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_input_raises_only_invalid_input(parser, make_value):
    with pytest.raises(InvalidInput):
        parser(make_value())


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=20)
KEYED = st.fixed_dictionaries({}, optional={
    "task_id": st.one_of(st.sampled_from(["task-a", "t", "../x", ""]), JSON_VALUES),
    "path": st.one_of(st.sampled_from(["/lane", "rel", "/a\x00"]), JSON_VALUES),
    "kind": st.one_of(st.sampled_from(["instruction", "correction"]), JSON_VALUES),
    "text": JSON_VALUES, "session_state": st.one_of(st.sampled_from(["idle", "done"]), JSON_VALUES),
    "next_intent": st.one_of(st.builds(intent), JSON_VALUES),
})
ANY_INPUT = st.one_of(JSON_VALUES, KEYED, st.lists(KEYED, max_size=3))


@settings(max_examples=400)
@given(ANY_INPUT)
def test_parsers_fed_arbitrary_json_raise_only_invalid_input(value):
    for parser in PARSERS:
        try:
            parser(value)
        except InvalidInput:
            pass


@given(st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=30), min_size=1, max_size=8))
def test_accepted_commands_are_one_line_and_keep_their_words(commands):
    try:
        parsed = parse_final_verification(commands)
    except InvalidInput:
        return
    for raw, stored in zip(commands, parsed):
        # JavaScript's whitespace, not Python's: "\x1f" is a character upstream keeps.
        assert stored and "  " not in stored and stored == stored.strip(JS_WHITESPACE)
        assert stored.split(" ") == re.split(f"[{WS}]+", raw.strip(JS_WHITESPACE))
