"""Writing an Initiative and its intents for the user (lanes_es/domain/authoring.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanes_es.domain.authoring import (AuthoringError, check_descriptor, initiative_tasks, new_initiative_text,
                                       shell_syntax, task_intent, unmatched_scope, with_task)
from lanes_es.domain.descriptor import parse_verification_descriptor
from lanes_es.domain.initiative_file import parse_local_initiative
from lanes_es.domain.intent import parse_task_intent, scope_entry_allows

PATH = "docs/initiatives/g.md"


@pytest.mark.parametrize("line, found", [
    ("pytest -q | tee log", "'|'"),
    ("make && make test", "'&'"),
    ("echo $HOME", "'$'"),
    ("echo `date`", "'`'"),
    ("pytest > out.txt", "'>'"),
    ('python3 -c "print($X)"', "'$' inside double quotes expands in a shell"),
    ("ls tests/*.py", "the wildcard '*'"),
    ("cat ~/x", "'~' for the home directory"),
    ("true; false", "';'"),
])
def test_shell_syntax_outside_quotes_is_found(line: str, found: str) -> None:
    assert shell_syntax(line) == found


@pytest.mark.parametrize("line", [
    "python3 -m pytest -q tests",
    "python3 -c \"from greet import greet; assert greet('Ada') == 'Hello, Ada!'\"",
    "grep -q 'a|b*' file.txt",
    "echo a\\|b",
    "node x.js --name=a~b",
])
def test_quoted_or_escaped_characters_are_plain_arguments(line: str) -> None:
    assert shell_syntax(line) is None


def test_a_check_becomes_a_descriptor_that_runs_without_a_shell() -> None:
    descriptor = check_descriptor("python3 -c \"print('a b')\"", timeout_seconds=5)
    assert descriptor["command"]["executable"] == "python3"
    assert descriptor["command"]["argv"] == ["-c", "print('a b')"]
    assert descriptor["command"]["timeout_ms"] == 5000
    parse_verification_descriptor(descriptor)


def test_a_repository_script_is_spelled_as_descriptor_v2_asks() -> None:
    assert check_descriptor("scripts/check.sh --fast")["command"]["executable"] == "./scripts/check.sh"
    assert check_descriptor("./check.sh")["command"]["executable"] == "./check.sh"


@pytest.mark.parametrize("line, said", [
    ("/usr/bin/python3 -V", "absolute path"),
    ("pytest | tee x", "uses shell syntax"),
    ("", "is empty"),
    ("python3 -c 'unclosed", "cannot be split"),
    ("python3 -c 'a\x07b'", "control character"),
])
def test_a_check_that_cannot_run_is_refused_with_what_to_do(line: str, said: str) -> None:
    with pytest.raises(AuthoringError, match=said):
        check_descriptor(line)


def test_the_intent_is_upstreams_with_the_descriptor_as_json_text() -> None:
    intent = task_intent("greet", "Write greet", ["greet.py"], ["python3 -m pytest -q", "python3 -c pass"])
    assert parse_task_intent(intent)["acceptance"] == intent["acceptance"]
    assert [item["id"] for item in intent["acceptance"]] == ["A1", "A2"]
    assert json.loads(intent["acceptance"][0]["verification"])["command"]["argv"] == ["-m", "pytest", "-q"]


def test_an_invalid_scope_names_the_option() -> None:
    with pytest.raises(AuthoringError, match=r"--scope\[0\]"):
        task_intent("greet", "Write greet", ["../outside"], ["true"])


def test_tasks_are_appended_as_slices_that_upstreams_reader_reads() -> None:
    text = new_initiative_text("Greeting")
    assert initiative_tasks(text, "g", PATH) == []
    text = with_task(text, "g", PATH, "greet", "Write greet", [])
    text = with_task(text, "g", PATH, "cli", "A command line", ["greet"])
    tasks = parse_local_initiative(text, "g", PATH)["tasks"]
    assert tasks == [{"task_id": "greet", "slice_id": "S1", "blocked_by": []},
                     {"task_id": "cli", "slice_id": "S2", "blocked_by": ["greet"]}]


@pytest.mark.parametrize("task, blocked_by, said", [
    ("greet", [], "already has a task greet"),
    ("cli", ["nope"], "--blocked-by names nope"),
    ("../x", [], "is not a task id"),
])
def test_a_task_that_cannot_be_added_is_refused(task: str, blocked_by: list[str], said: str) -> None:
    text = with_task(new_initiative_text("G"), "g", PATH, "greet", "Write greet", [])
    with pytest.raises(AuthoringError, match=said):
        with_task(text, "g", PATH, task, "t", blocked_by)


def test_scope_entries_that_match_nothing() -> None:
    tree = ["src/a.py", "docs/guide.md"]
    assert unmatched_scope(["src", "docs/*.md", "src/b.py", "tests"], tree) == ["src/b.py", "tests"]


PARTS = st.sampled_from(["src", "a", "b.py", "docs", "x", "", "*", "?.md", "a*"])
PATHS = st.lists(PARTS.filter(bool), min_size=1, max_size=3).map("/".join)
ENTRIES = st.one_of(PATHS, st.lists(PARTS, min_size=1, max_size=3).map("/".join), st.sampled_from(["src/", "/", ""]))


@given(st.lists(PATHS, max_size=8), st.lists(ENTRIES, max_size=6))
def test_the_index_agrees_with_matching_every_path(tree, scope) -> None:
    """The plan indexes HEAD's tree once (4,000 tasks over 4,000 files took seconds scanning the tree per entry)."""
    expected = [entry for entry in scope if not any(scope_entry_allows(path, entry) for path in tree)]
    assert unmatched_scope(scope, tree) == expected
