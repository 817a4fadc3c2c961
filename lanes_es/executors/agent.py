"""What a named Executor adapter is: how to start its agent headless in a Lane, and how to read it.

One adapter per agent (claude_code.py, codex.py, opencode.py), each built from the agent's own
documented headless interface (docs/how-to/agent-*.md say where each fact comes from):

- `argv`: the agent's command for one attempt, the prompt its last argument or in its place, with
  the agent's own sandbox or permission rules set so that the Lane is the only place it writes;
- `environment`: what the adapter adds to the user's environment (the agent's config, never a key);
- `reader`: a fresh reader of its output stream (usage.py);
- `reports_cost` / `takes_cost_limit`: whether the agent reports what it cost, and whether it stops
  itself at a dollar limit (a cost budget needs the first; the second is passed on).
"""

from __future__ import annotations

from typing import Protocol

from lanes_es.domain.events import AttemptLimits
from lanes_es.executors.usage import UsageReader


class Agent(Protocol):
    name: str
    program: str
    reports_cost: bool
    takes_cost_limit: bool

    def argv(self, program: str, lane: str, prompt: str, limits: AttemptLimits) -> list[str]: ...

    def environment(self, lane: str) -> dict[str, str]: ...

    def reader(self) -> UsageReader: ...


def cost_text(cost: float) -> str:
    """A dollar amount as a plain decimal the agents' number parsers take (never an exponent)."""
    return f"{cost:.4f}".rstrip("0").rstrip(".") or "0"
