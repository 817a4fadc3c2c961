"""The Local Initiative carrier (tests/SCENARIOS.md, LANE-LOC-01..04, 09/10 parse parts; docs/upstream.md#the-local-initiative)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes_es.domain.initiative_file import InvalidInitiative, local_initiative_path, parse_local_initiative
from lanes_es.domain.plan import InvalidPlan, normalize_observation

PATH = "docs/initiatives/local-batch.md"
CARRIER = """# Local batch

Some introduction that mentions Tasks: nothing.

## S1: Alpha exists
Tasks:
- local-alpha

Exit criteria: alpha.txt exists.

## S2: Beta exists
Tasks:
- `local-beta`

Exit criteria: beta.txt exists.

## S3: Gamma follows alpha
Blocked by: local-alpha
Tasks:
- local-gamma

Exit criteria: gamma.txt exists.
"""


def parse(text: str, slug: str = "local-batch") -> dict:
    return parse_local_initiative(text, slug, local_initiative_path(slug))


def test_loc01_each_slices_task_and_its_blocked_by_line_are_read():
    assert parse(CARRIER) == {
        "contract": "immune_brain/local_initiative_observation/v1",
        "initiative_id": "local-batch",
        "path": PATH,
        "tasks": [
            {"task_id": "local-alpha", "slice_id": "S1", "blocked_by": []},
            {"task_id": "local-beta", "slice_id": "S2", "blocked_by": []},
            {"task_id": "local-gamma", "slice_id": "S3", "blocked_by": ["local-alpha"]},
        ],
    }


def test_loc02_slice_shaped_text_in_a_fenced_block_is_ignored():
    text = CARRIER + "\n```markdown\n## S9: Example only\nTasks:\n- not-a-task\n```\n"
    assert [task["slice_id"] for task in parse(text)["tasks"]] == ["S1", "S2", "S3"]


@pytest.mark.parametrize("slice_text", [
    "## S1: Two tasks\nTasks:\n- one\n- two\n",
    "## S1: No task\nTasks:\n\nExit criteria: none.\n",
    "## S1: No list\n- loose-bullet\n",
])
def test_loc03_a_slice_must_name_exactly_one_task(slice_text):
    with pytest.raises(InvalidInitiative) as raised:
        parse("# Title\n" + slice_text)
    assert str(raised.value) == "Local Initiative Slice S1 must name exactly one Task to run as a batch child"


def test_loc04_a_carrier_with_no_slice_is_refused():
    with pytest.raises(InvalidInitiative) as raised:
        parse("# Goal only")
    assert str(raised.value) == f"Local Initiative {PATH} declares no Slice"


@pytest.mark.parametrize("slug", ["../x", "", "-x", "a" * 129, "a/b"])
def test_loc10_a_slug_must_be_an_id(slug):
    with pytest.raises(InvalidInitiative, match="^initiative_slug is invalid$"):
        parse_local_initiative(CARRIER, slug, "docs/initiatives/x.md")


def test_loc09_unknown_and_self_dependencies_are_refused_by_normalization():
    unknown = parse(CARRIER.replace("Blocked by: local-alpha", "Blocked by: elsewhere"))
    with pytest.raises(InvalidPlan, match="depends on unknown Task elsewhere"):
        normalize_observation(unknown, "local-batch")
    itself = parse(CARRIER.replace("Blocked by: local-alpha", "Blocked by: local-gamma"))
    with pytest.raises(InvalidPlan, match="invalid blocked_by dependencies"):
        normalize_observation(itself, "local-batch")


def test_blocked_by_is_case_insensitive_comma_separated_repeatable_and_unquoted():
    text = ("## S1: a\nTasks:\n- a\n## S2: b\nTasks:\n- b\n## S3: c\n"
            "BLOCKED BY : `a`, , b\nblocked by:`x`\nTasks:\n- c\n")
    assert parse(text)["tasks"][2] == {"task_id": "c", "slice_id": "S3", "blocked_by": ["a", "b", "x"]}


def test_a_blocked_by_line_closes_the_task_list():
    text = "## S1: a\nTasks:\n- a\nBlocked by: z\n- not-a-task\n"
    assert parse(text)["tasks"] == [{"task_id": "a", "slice_id": "S1", "blocked_by": ["z"]}]


def test_blank_lines_keep_the_task_list_open_and_other_text_closes_it():
    assert parse("## S1: a\nTasks:\n\n* a\n")["tasks"][0]["task_id"] == "a"
    with pytest.raises(InvalidInitiative, match="exactly one Task"):
        parse("## S1: a\nTasks:\nsome prose\n- a\n")


def test_headings_need_a_colon_and_lines_are_trimmed():
    text = "##S0: not a slice\n## Notes without colon\n   ##   S1  : spaced   \r\n  Tasks:  \r\n   -   a  \r\n"
    assert parse(text)["tasks"] == [{"task_id": "a", "slice_id": "S1", "blocked_by": []}]


def test_lines_before_the_first_heading_are_ignored():
    assert parse("Tasks:\n- stray\nBlocked by: x\n## S1: a\nTasks:\n- a\n")["tasks"] == [
        {"task_id": "a", "slice_id": "S1", "blocked_by": []}]


def test_only_one_pair_of_backticks_is_removed():
    assert parse("## S1: a\nTasks:\n- ``a``\n")["tasks"][0]["task_id"] == "`a`"


def test_javascript_whitespace_not_pythons():
    # U+001F is whitespace to Python's str.strip, not to JavaScript's trim: the bullet keeps it.
    assert parse("## S1: a\nTasks:\n- a\x1f\n")["tasks"][0]["task_id"] == "a\x1f"
    # U+FEFF is whitespace to JavaScript only.
    assert parse("\ufeff## S1: a\nTasks:\n-\ufeffa\n")["tasks"][0]["task_id"] == "a"


LINES = st.sampled_from(["## S1: one", "## S2: two", "Tasks:", "- a", "- `b`", "* c", "Blocked by: a, `b`", "",
                         "```", "prose", "  ", "\r", "## : x", "tasks :", "- "])


@settings(max_examples=300)
@given(st.lists(LINES, max_size=20), st.text(max_size=30))
def test_any_text_parses_or_is_refused_with_invalid_initiative(lines, noise):
    try:
        observation = parse("\n".join(lines) + noise)
    except InvalidInitiative:
        return
    assert observation["tasks"]
    # Task ids are checked later, by normalize_observation, as upstream does.
    assert all(set(task) == {"task_id", "slice_id", "blocked_by"} for task in observation["tasks"])
