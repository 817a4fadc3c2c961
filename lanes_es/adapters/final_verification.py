"""Final verification: the recorded project commands, run on the batch branch once every child
is integrated (docs/upstream.md#final-verification).

Each command is split on single spaces into an executable and its argv and spawned with no
shell, in the coordinator root, with the process environment and no stdio. A command that
outlives its timeout is killed (its whole process group) and reported with signal
"timeout"; one that cannot start is reported with signal "spawn_failed". Output is never
recorded. These are the project's commands, not git, so they run through `subprocess`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from lanes_es.adapters.git import git
from lanes_es.ports import CommandResult
from lanes_es.adapters.processes import forget_group, kill_group, start_check

DEFAULT_TIMEOUT_MS = 1_800_000  # upstream's DEFAULT_TIMEOUT_MS: 30 minutes per command


def run_final_verification(root: str, commands: list[str],
                           timeout_ms: int = DEFAULT_TIMEOUT_MS) -> tuple[str, list[CommandResult]]:
    """(HEAD of `root`, one result per command, in order). Every command runs, whatever the others gave."""
    head = git(root, "rev-parse", "HEAD").text
    return head, [run_command(root, command, timeout_ms) for command in commands]


def run_command(root: str, command: str, timeout_ms: int) -> CommandResult:
    argv = [part for part in command.split(" ") if part]
    started = time.monotonic()
    try:
        if not argv:
            raise FileNotFoundError("empty command")
        process = start_check(argv, cwd=root, env=dict(os.environ), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, ValueError):
        return _result(command, None, "spawn_failed", started)
    try:
        code = process.wait(timeout=timeout_ms / 1000)
    except subprocess.TimeoutExpired:
        kill_group(process)
        return _result(command, None, "timeout", started)
    forget_group(process)
    if code < 0:  # ended by a signal it did not catch
        return _result(command, None, _signal_name(-code), started)
    return _result(command, code, None, started)


def _result(command: str, exit_code: int | None, signal_name: str | None, started: float) -> CommandResult:
    return CommandResult(command=command, exit_code=exit_code, signal=signal_name, passed=exit_code == 0,
                         duration_ms=int((time.monotonic() - started) * 1000))




def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


class ProcessVerifier:
    """The Verifier port: final verification with real processes."""

    def __init__(self, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> None:
        self.timeout_ms = timeout_ms

    def run_final_verification(self, root: str, commands: list[str]) -> tuple[str, list[CommandResult]]:
        return run_final_verification(root, commands, self.timeout_ms)
