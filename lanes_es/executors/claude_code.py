"""Claude Code (`claude -p`) as an Executor: print mode, stream-json output, its Bash sandbox on.

The command (docs/how-to/agent-claude-code.md says why each flag):

    claude -p PROMPT --output-format stream-json --verbose --permission-mode acceptEdits
           --allowedTools Read,Glob,Grep,Edit,Write --settings SANDBOX [--max-budget-usd X]

The prompt follows `-p` directly: `--allowedTools` takes a variadic list and would swallow a
positional argument after it. `--verbose` is required with stream-json in print mode.
The sandbox settings come from `--settings`, which outranks the project's `.claude/` settings
(repository content: it could turn the sandbox off). With the sandbox on, Bash writes only in the
working directory (the Lane) and the session's temp dir; `failIfUnavailable` makes a machine
without the sandbox (bubblewrap and socat on Linux) an error instead of an unsandboxed run, and
`allowUnsandboxedCommands: false` removes the per-command escape. No `--add-dir`: the Lane is the
only working directory.
"""

from __future__ import annotations

import json
from typing import Any

from lanes_es.domain.events import AttemptLimits
from lanes_es.executors.agent import cost_text
from lanes_es.executors.usage import UsageReader, amount, count

ALLOWED_TOOLS = "Read,Glob,Grep,Edit,Write"
SANDBOX_SETTINGS = json.dumps({"sandbox": {"enabled": True, "failIfUnavailable": True,
                                           "allowUnsandboxedCommands": False, "autoAllowBashIfSandboxed": True}},
                              separators=(",", ":"), sort_keys=True)


class ClaudeCode:
    name = "claude-code"
    program = "claude"
    reports_cost = True
    takes_cost_limit = True

    def argv(self, program: str, lane: str, prompt: str, limits: AttemptLimits) -> list[str]:
        argv = [program, "-p", prompt, "--output-format", "stream-json", "--verbose",
                "--permission-mode", "acceptEdits", "--allowedTools", ALLOWED_TOOLS, "--settings", SANDBOX_SETTINGS]
        if limits.cost_usd is not None:
            argv += ["--max-budget-usd", cost_text(limits.cost_usd)]
        return argv

    def environment(self, lane: str) -> dict[str, str]:
        return {}

    def reader(self) -> UsageReader:
        return ClaudeStream()


class ClaudeStream(UsageReader):
    """`system` init (the session), `assistant` messages (usage per API message, as the run goes) and the
    final `result` (total cost, usage, permission denials, is_error) of stream-json."""

    def __init__(self) -> None:
        super().__init__()
        self.by_message: dict[str, tuple[int, int]] = {}  # one API message may come as several lines

    def take(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "system":
            self.note_session(item.get("session_id"))
        elif kind == "assistant":
            message = item["message"]
            if isinstance(message.get("usage"), dict) and isinstance(message.get("id"), str):
                self.by_message[message["id"]] = tokens_of(message["usage"])
                self.tokens_in = sum(used[0] for used in self.by_message.values())
                self.tokens_out = sum(used[1] for used in self.by_message.values())
        elif kind == "result":
            self.take_result(item)

    def take_result(self, item: dict[str, Any]) -> None:
        self.note_session(item.get("session_id"))
        if isinstance(item.get("usage"), dict):
            self.tokens_in, self.tokens_out = tokens_of(item["usage"])  # the whole session's, authoritative
        if item.get("total_cost_usd") is not None:
            self.cost_usd = amount(item["total_cost_usd"])
        denials = item.get("permission_denials")
        if isinstance(denials, list):
            self.denied = []
            for denial in denials:
                self.note_denied(denial.get("tool_name") if isinstance(denial, dict) else denial)
        if item.get("is_error") or item.get("subtype") != "success":  # error_max_turns, error_max_budget_usd, ...
            errors = item.get("errors")
            said = "; ".join(map(str, errors)) if isinstance(errors, list) and errors else item.get("result")
            self.note_error(f"{item.get('subtype')}: {said}" if said else item.get("subtype"))
        self.agent_error = bool(item.get("is_error"))  # the agent's own flag, as it reported it


def tokens_of(usage: dict[str, Any]) -> tuple[int, int]:
    """(input tokens, cached reads and writes included; output tokens)."""
    tokens_in = sum(count(usage.get(key, 0) or 0)
                    for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
    return tokens_in, count(usage.get("output_tokens", 0) or 0)
