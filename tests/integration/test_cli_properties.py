"""A property of the whole command line: random argument lists never crash it, and a refusal writes nothing.

Hypothesis draws a command and an argument list from words a user might type (numbers at the
edges, paths that do not exist or escape, broken JSON, real and unknown ids, every option of the
parser) and runs `lanes-es` on a real repository with a started batch and a real store (once on SQLite, once on PostgreSQL).
For every draw: the exit code is never 70 (internal error) and nothing escapes as an exception;
on exit 2 the store holds no new event but a refusal's own audit event, and no file of the
checkout changed. `run`, `mcp`, `demo` and `bench` would start long work on valid input, so
their draws always carry an option that does not exist (their parsing is what is tested there).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lanes_es.exit_codes import EXIT_INTERNAL, EXIT_REFUSED
from tests.store_rows import StoreRows, store_exists
from lanes_es.cli.main import COMMAND_MODULES, build_parser, main
from lanes_es.cli.demo import make_repository

pytestmark = pytest.mark.coordinator_worktree

SLUG = "demo"
LONG_RUNNING = ("run", "mcp", "demo", "bench")
AUDIT_EVENTS = ("OffersRefused", "TickRejected", "ProjectionDriftRepaired")  # a refusal's own record


def options_of(command: str) -> list[str]:
    """The option strings (and subcommand names) of one command, read from its parser."""
    parser = build_parser(command)
    chosen = next(action for action in parser._actions if action.choices).choices[command]  # noqa: SLF001
    found: set[str] = set()
    for action in chosen._actions:  # noqa: SLF001 - argparse keeps no public list
        found.update(option for option in action.option_strings if option not in ("-h", "--help"))
        for name, sub in (action.choices or {}).items() if isinstance(action.choices, dict) else ():
            found.add(name)
            found.update(option for a in sub._actions for option in a.option_strings  # noqa: SLF001
                         if option not in ("-h", "--help"))
    return sorted(found)


def values(batch_id: str, lane_missing: str) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from([SLUG, "other", batch_id, "batch-demo-0", "../../etc/passwd", "", " ", "-", "--",
                         "0", "-5", "1", "2", "9007199254740991", "9007199254740992", "99999999999999999999",
                         "1e3", "nan", "{", "[]", "{}", '{"task_id": "greet"}', f"greet={lane_missing}",
                         "greet=relative", "=", "/nonexistent/out.jsonl", "/dev/null", "out.jsonl", "page.html",
                         "memory:", "foo://x", "héllo", "\udcff"]),
        st.text(max_size=12),
    )


def store_rows(store: str) -> list[tuple]:
    if not store_exists(store):
        return []
    return StoreRows(store).query("SELECT originator_id, originator_version, topic FROM {events} "
                                  "ORDER BY originator_id, originator_version")


def checkout_files(repo: Path) -> str:
    """The checkout's files (the work tree and .imm), not git's own bookkeeping or the store's."""
    digest = hashlib.sha256()
    for item in sorted(repo.rglob("*")):
        relative = item.relative_to(repo)
        if relative.parts[0] == ".git" or not item.is_file():
            continue
        digest.update(str(relative).encode() + b"\0" + item.read_bytes())
    return digest.hexdigest()


def test_random_argument_lists_never_crash_and_a_refusal_writes_nothing(tmp_path_factory, store_url):
    base = tmp_path_factory.mktemp("properties")
    repo = base / "repo"
    make_repository(repo)
    assert main(["--root", str(repo), "authorize", SLUG, "--yes", "--max-parallel", "2"]) == 0
    assert main(["--root", str(repo), "tick", SLUG]) == 0
    store = store_url
    batch_id = next(row[0] for row in store_rows(store) if row[0].startswith("batch-"))
    commands = ["plan", "authorize", "tick", "status", "rebuild", "retire", *COMMAND_MODULES]
    work = base / "cwd"
    work.mkdir()

    options = {command: options_of(command) for command in commands}
    anything = values(batch_id, str(base / "no-lane"))

    @settings(max_examples=300, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        command = data.draw(st.sampled_from(commands))
        first = data.draw(st.lists(st.sampled_from([SLUG, batch_id]), max_size=1))
        words = st.one_of(st.sampled_from(options[command]), anything) if options[command] else anything
        args = first + data.draw(st.lists(words, max_size=6))
        argv = ["--root", str(repo), command, *args]
        if command in LONG_RUNNING:
            argv.append("--no-such-option-for-the-property-test")
        before_rows, before_files = store_rows(store), checkout_files(repo)
        out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.StringIO()  # `export` writes bytes
        previous = os.getcwd()
        os.chdir(work)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(argv)
                except SystemExit as exit_:  # argparse: usage errors and --help
                    code = exit_.code if isinstance(exit_.code, int) else 2
        finally:
            os.chdir(previous)
        assert code != EXIT_INTERNAL, (argv, err.getvalue())
        assert "Traceback" not in err.getvalue()
        if code == EXIT_REFUSED:
            added = [row for row in store_rows(store) if row not in before_rows]
            assert all(row[2].rsplit(":", 1)[-1] in AUDIT_EVENTS for row in added), (argv, added)
            assert checkout_files(repo) == before_files, argv

    check()
    # the property held on a batch that still runs: nothing above broke the batch for the next tick
    assert subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True,
                          text=True).returncode == 0
    assert main(["--root", str(repo), "tick", SLUG]) in (0, 2)
