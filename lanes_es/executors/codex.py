"""Codex (`codex exec`) as an Executor: non-interactive, JSONL events, the workspace-write sandbox.

The command (docs/how-to/agent-codex.md says why each flag):

    codex exec --json --sandbox workspace-write -C LANE
               -c sandbox_workspace_write.exclude_slash_tmp=true
               -c sandbox_workspace_write.exclude_tmpdir_env_var=true PROMPT

`codex exec` never asks for approvals. workspace-write lets its commands write in the working root
(`-C`, the Lane) and, by default, in /tmp and $TMPDIR: the two `-c` overrides take those away, so
the Lane is the only writable root (the adapter points TMPDIR inside the Lane, at an ignored
directory). Network access stays off (the default). `-c` flags outrank `$CODEX_HOME/config.toml`.
Codex reports tokens on `turn.completed`, never a cost: a cost budget cannot bound it.
"""

from __future__ import annotations

from typing import Any

from lanes_es.domain.events import AttemptLimits
from lanes_es.executors.usage import UsageReader, count

SANDBOX_OVERRIDES = ("sandbox_workspace_write.exclude_slash_tmp=true",
                     "sandbox_workspace_write.exclude_tmpdir_env_var=true")


class Codex:
    name = "codex"
    program = "codex"
    reports_cost = False
    takes_cost_limit = False

    def argv(self, program: str, lane: str, prompt: str, limits: AttemptLimits) -> list[str]:
        overrides = [part for override in SANDBOX_OVERRIDES for part in ("-c", override)]
        return [program, "exec", "--json", "--sandbox", "workspace-write", "-C", lane, *overrides, prompt]

    def environment(self, lane: str) -> dict[str, str]:
        return {}

    def reader(self) -> UsageReader:
        return CodexEvents()


class CodexEvents(UsageReader):
    """`thread.started` (the session), `turn.completed` (a turn's usage; cached input is part of the input),
    `turn.failed` and `error` (the agent's own error), and a `command_execution` item `declined`."""

    def take(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "thread.started":
            self.note_session(item.get("thread_id"))
        elif kind == "turn.completed":
            usage = item["usage"]
            self.add_tokens(count(usage.get("input_tokens", 0)), count(usage.get("output_tokens", 0)))
        elif kind == "turn.failed":
            self.note_error(item["error"].get("message"))
        elif kind == "error":
            self.note_error(item.get("message"))
        elif kind == "item.completed":
            entry = item["item"]
            if entry.get("type") == "command_execution" and entry.get("status") == "declined":
                self.note_denied(f"command: {entry.get('command')}")
