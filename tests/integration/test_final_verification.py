"""The final verification runner on a real repository and real processes (docs/upstream.md#final-verification, LANE-CMP-05)."""

from __future__ import annotations

import os
import sys

import msgspec

from lanes_es.adapters.final_verification import ProcessVerifier, run_final_verification
from lanes_es.ports import Verifier
from tests.gitfixtures import head, make_repo


def test_records_command_exit_status_and_timing_and_the_head(tmp_path):
    """Ports LANE-CMP-05."""
    root = make_repo(tmp_path / "repo")
    current, results = run_final_verification(root, ["git status"])
    assert current == head(root)
    assert len(results) == 1
    assert msgspec.structs.asdict(results[0]) | {"duration_ms": 0} == {
        "command": "git status", "exit_code": 0, "signal": None, "passed": True, "duration_ms": 0}
    assert results[0].duration_ms >= 0


def test_a_failing_command_is_not_passed_and_the_next_still_runs(tmp_path):
    """Ports LANE-CMP-05."""
    root = make_repo(tmp_path / "repo")
    _, results = run_final_verification(root, ["git no-such-subcommand", "git status"])
    assert [result.passed for result in results] == [False, True]
    assert results[0].exit_code not in (0, None) and results[0].signal is None


def test_commands_run_without_a_shell_in_the_root_with_the_process_environment(tmp_path, monkeypatch):
    root = make_repo(tmp_path / "repo")
    monkeypatch.setenv("LANES_ES_FV_PROBE", "present")
    script = ("import os,sys; sys.exit(0 if os.path.exists('base.txt') "
              "and os.environ.get('LANES_ES_FV_PROBE') == 'present' else 1)")
    probe = os.path.join(tmp_path, "probe.py")
    with open(probe, "w") as stream:
        stream.write(script)
    _, results = run_final_verification(root, [f"{sys.executable} {probe}", "echo $HOME && false"])
    assert results[0].passed
    # no shell: `echo` gets the words literally and exits 0; `&&` and `false` are just arguments
    assert results[1].passed and results[1].exit_code == 0


def test_a_command_past_its_timeout_is_killed_and_reported(tmp_path):
    """Ports LANE-CMP-05."""
    root = make_repo(tmp_path / "repo")
    _, results = run_final_verification(root, ["sleep 5"], timeout_ms=200)
    assert results[0].passed is False and results[0].signal == "timeout" and results[0].exit_code is None
    assert results[0].duration_ms < 5000


def test_a_command_that_cannot_start_is_a_spawn_failure(tmp_path):
    root = make_repo(tmp_path / "repo")
    _, results = run_final_verification(root, ["no-such-program-for-lanes-es --flag", ""])
    for result in results:
        assert (result.passed, result.exit_code, result.signal) == (False, None, "spawn_failed")


def test_a_command_ended_by_a_signal_reports_it(tmp_path):
    root = make_repo(tmp_path / "repo")
    script = os.path.join(tmp_path, "suicide.py")
    with open(script, "w") as stream:
        stream.write("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    _, results = run_final_verification(root, [f"{sys.executable} {script}"])
    assert (results[0].passed, results[0].exit_code, results[0].signal) == (False, None, "SIGTERM")


def test_process_verifier_is_the_verifier_port(tmp_path):
    root = make_repo(tmp_path / "repo")
    verifier: Verifier = ProcessVerifier(timeout_ms=10_000)
    current, results = verifier.run_final_verification(root, ["git status", "sleep 0.1"])
    assert current == head(root) and all(result.passed for result in results)
