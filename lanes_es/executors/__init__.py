"""The named Executor adapters: coding agents run headless in a Lane (`lanes-es run --executor NAME`).

- agent.py: what an adapter is; claude_code.py, codex.py, opencode.py: one per agent;
- usage.py: reading an agent's output stream into one attempt's usage;
- prompt.py: the prompt, from the task's intent and what the task needs next;
- environment.py: the agent's environment (the user's, none of the coordinator's);
- attempt.py: the process that runs one attempt, enforces its limits and submits the work.

Nothing here appends to a batch's log: the autopilot records each attempt (lanes_es/steward/).
"""

from __future__ import annotations

from lanes_es.executors.agent import Agent

ADAPTER_NAMES = ("claude-code", "codex", "opencode")


def agent_named(name: str) -> Agent | None:
    """The adapter called `name`, None for any other name (a command)."""
    if name == "claude-code":
        from lanes_es.executors.claude_code import ClaudeCode

        return ClaudeCode()
    if name == "codex":
        from lanes_es.executors.codex import Codex

        return Codex()
    if name == "opencode":
        from lanes_es.executors.opencode import OpenCode

        return OpenCode()
    return None
