"""No program a repository's config or attributes name runs in lanes-es's git (lanes_es/adapters/git_programs.py).

For each key that can name a program, a repository is armed as an Executor can arm it, and the git command of
the lanes-es call site that would run it is run twice, each in a repository of its own: by plain git, which
runs the program (its marker file appears: the key is armed, so this test can fail), and by lanes-es's git
runner, after which no marker exists. `uploadpack.packObjectsHook` is the one key git itself already ignores
in a repository's config; the test checks that this still holds.

`test_hostile_executor.py` arms every key at once in a real batch run through the command line.
"""

from __future__ import annotations

import os
import pty
import subprocess

import pytest

from lanes_es.adapters.git import git_ok
from lanes_es.ports import GitFailure
from tests.integration.git_programs_cases import CASES, SERVER, plain_env


@pytest.fixture(scope="module", autouse=True)
def auth_server_closed():
    yield
    while SERVER:
        SERVER.pop().close()


def plain_git(armed, timeout: float = 60) -> None:
    """Run the armed command with git as a user would (no lanes-es overrides), on a terminal when asked."""
    args = ["git", "-C", str(armed.cwd), *(armed.plain_args or armed.args)]
    if not armed.tty:
        subprocess.run(args, input=armed.stdin, capture_output=True, env=plain_env(), timeout=timeout)
        return
    leader, follower = pty.openpty()
    try:
        subprocess.run(args, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=plain_env(),
                       timeout=timeout)
    finally:
        os.close(follower)
        os.close(leader)


@pytest.mark.parametrize("key", sorted(CASES))
def test_a_program_the_repository_names_runs_in_plain_git_and_never_in_lanes_es_git(key, tmp_path):
    plain_base, runner_base = tmp_path / "plain", tmp_path / "runner"
    plain_base.mkdir()
    runner_base.mkdir()
    plain_marker, runner_marker = plain_base / "ran", runner_base / "ran"

    armed = CASES[key](plain_base, plain_marker)
    plain_git(armed)
    assert plain_marker.exists() == armed.plain_runs, f"plain git {'did not run' if armed.plain_runs else 'ran'} {key}"

    armed = CASES[key](runner_base, runner_marker)
    try:
        git_ok(str(armed.cwd), *armed.args, stdin=armed.stdin)
    except GitFailure:
        pass  # refused (no transport is allowed), or git ended by SIGPIPE before reading all of stdin
    assert not runner_marker.exists(), f"lanes-es's git ran the program of {key}"
