"""The exit codes every `lanes-es` command keeps, so a script can tell a finding from a refusal from a crash.

The table is printed by `lanes-es --help` and copied in the README; a test keeps the two equal.
"""

from __future__ import annotations

EXIT_OK = 0          # done; a tick whose batch is running or completed
EXIT_FINDING = 1     # a check found something: verify, replay, rebuild --check drift
EXIT_REFUSED = 2     # refused or bad input; nothing was written but its audit event
EXIT_NEEDS_PERSON = 3  # the batch needs a person: needs_human, budget_stopped, failed
EXIT_INTERNAL = 70   # an internal error (EX_SOFTWARE): a bug, never something a user caused
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT); the log keeps every step already taken
EXIT_PIPE_CLOSED = 141  # the reader of the output went away (128 + SIGPIPE), as git does

EXIT_CODE_TABLE = (
    (EXIT_OK, "done (a tick: the batch is running or completed)"),
    (EXIT_FINDING, "a finding: verify, replay or rebuild --check found damage or drift"),
    (EXIT_REFUSED, "refused or bad input; nothing was written but a started batch's audit event (a busy batch too); "
                   "the message names the next command"),
    (EXIT_NEEDS_PERSON, "the batch needs a person: needs_human, budget_stopped or failed"),
    (EXIT_INTERNAL, "an internal error: a bug in lanes-es, never something you caused"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C), with the checks it started; run the same command again to go on"),
    (EXIT_PIPE_CLOSED, "the output's reader closed the pipe (as `git log | head`)"),
)


def exit_code_text(indent: str = "  ") -> str:
    """The table as lines for `--help` and the README."""
    return "\n".join(f"{indent}{code:<4} {meaning}" for code, meaning in EXIT_CODE_TABLE)
