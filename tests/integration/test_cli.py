"""The command line as a user meets it: help that answers, refusals that say what to do, tick statistics."""

from __future__ import annotations

import json

import pytest

from tests.engine import Engine, Task
from lanes_es.cli.main import build_parser, main

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")

COMMANDS = ["plan", "authorize", "tick", "status", "rebuild", "retire", "task", "replay", "verify", "export",
            "audit", "demo", "bench", "run", "mcp", "batches"]


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for command in COMMANDS:
        assert command in text
    assert "Exit codes" in text


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_explains_itself(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert len(capsys.readouterr().out.strip().splitlines()) >= 3


def test_tick_before_authorize_names_the_next_step(tmp_path, capsys):
    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"])})
    assert main(["--root", engine.root, "tick", engine.slug]) == 2
    assert f"lanes-es authorize {engine.slug}" in capsys.readouterr().err


def test_invalid_tick_input_is_refused_before_anything_is_read(tmp_path, capsys):
    """Ports LANE-INP-05."""
    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    assert main(["--root", engine.root, "tick", engine.slug, "--max-parallel", "0"]) == 2
    assert "invalid max_parallel: expected a positive integer" in capsys.readouterr().err
    assert main(["--root", engine.root, "tick", engine.slug, "--offer", "task-a="]) == 2
    assert "invalid lane_offers" in capsys.readouterr().err
    assert not (tmp_path / "repo" / ".imm" / "state" / "batches").exists()


def test_outside_a_repository_the_message_says_where_to_run(tmp_path, capsys):
    assert main(["--root", str(tmp_path), "plan", "x"]) == 2
    assert "not inside a git repository" in capsys.readouterr().err


def test_stats_file_gets_one_line_per_tick(tmp_path, monkeypatch, capsys):
    stats = tmp_path / "stats.jsonl"
    monkeypatch.setenv("LANES_ES_STATS", str(stats))
    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"])})
    engine.authorize()
    assert main(["--root", engine.root, "tick", engine.slug, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batch_state"] == "running"
    lines = stats.read_text().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert set(line) == {"git_spawns", "git_seconds", "git_busy_seconds", "store_seconds", "kernel_seconds",
                         "anchor_seconds", "total_seconds", "events_appended"}
    assert line["git_spawns"] > 0 and line["events_appended"] == 2 and line["anchor_seconds"] > 0
    assert line["git_busy_seconds"] <= line["total_seconds"]
    # A second tick in the same process (as under `lanes-es run`) reports its own figures, not the sum.
    from lanes_es.adapters.git import STATS

    before = STATS.spawns
    assert main(["--root", engine.root, "tick", engine.slug, "--json"]) == 0
    spawned = STATS.spawns - before
    second = json.loads(stats.read_text().splitlines()[1])
    assert 0 < second["git_spawns"] <= spawned and second["events_appended"] == 0
    assert second["git_busy_seconds"] <= second["total_seconds"]


def test_parser_builds_without_optional_modules_missing():
    parser = build_parser()
    assert parser.prog == "lanes-es"


def test_every_command_help_ends_with_the_exit_code_table(capsys):
    from lanes_es.exit_codes import EXIT_CODE_TABLE
    from tools.docs_reference import commands_of

    codes = [code for code, _ in EXIT_CODE_TABLE]
    assert codes[:5] == [0, 1, 2, 3, 70]
    parser = build_parser("*")
    helps = {"lanes-es": parser.format_help()} | {command: sub.format_help() for command, _, sub in commands_of(parser)}
    for command, text in helps.items():
        for code, meaning in EXIT_CODE_TABLE:  # a row of its own, never reflowed into a paragraph
            assert f"\n  {code:<4} {meaning}\n" in text + "\n", f"{command} --help lacks exit code {code}"


def test_every_option_and_argument_of_every_command_has_help():
    import argparse

    from tools.docs_reference import commands_of

    parser = build_parser("*")
    missing = []
    for command, _, sub in [("lanes-es", "", parser), *commands_of(parser)]:
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.dest == "rest":
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{command} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"options without help text: {missing}"
