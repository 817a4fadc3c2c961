"""What an agent says of itself on its output stream, as one attempt's usage.

Each agent prints one JSON object per line in its own documented format; its adapter's reader
takes the lines one at a time (`feed`) and keeps the session id, tokens, cost, denied tool
calls and the agent's own error flag. Lines that are not JSON objects, or not of a known
shape, are passed over: an agent's output is hostile input and moves nothing but these counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lanes_es.domain.events import ExecutorUsage

MAX_ERROR_TEXT = 500
MAX_DENIED_KEPT = 50


@dataclass
class UsageReader:
    """The counts so far; an adapter's reader updates them from the lines it knows (`take`)."""

    session_id: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    denied: list[str] | None = None
    agent_error: bool | None = None
    error: str | None = None
    seen: int = field(default=0, repr=False)

    def feed(self, line: bytes | str) -> bool:
        """Take one output line; True when the usage changed."""
        try:
            item = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):  # an agent's line is any bytes it printed
            return False
        if not isinstance(item, dict):
            return False
        before = self.usage()
        try:
            self.take(item)
        except (KeyError, TypeError, ValueError, AttributeError):
            return False  # a line of a known type whose shape is not the documented one: passed over
        return self.usage() != before

    def take(self, item: dict[str, Any]) -> None:
        raise NotImplementedError

    def usage(self) -> ExecutorUsage:
        return ExecutorUsage(session_id=self.session_id, tokens_in=self.tokens_in, tokens_out=self.tokens_out,
                             cost_usd=None if self.cost_usd is None else round(self.cost_usd, 6),
                             denied_tools=None if self.denied is None else list(self.denied),
                             agent_error=self.agent_error, error=self.error)

    # ------------------------------------------------------------ helpers for the adapters

    def note_session(self, value: Any) -> None:
        if isinstance(value, str) and value and self.session_id is None:
            self.session_id = value[:200]

    def add_tokens(self, tokens_in: int, tokens_out: int) -> None:
        self.tokens_in = (self.tokens_in or 0) + tokens_in
        self.tokens_out = (self.tokens_out or 0) + tokens_out

    def add_cost(self, cost: float) -> None:
        self.cost_usd = (self.cost_usd or 0.0) + cost

    def note_denied(self, name: Any) -> None:
        self.denied = self.denied if self.denied is not None else []
        if len(self.denied) < MAX_DENIED_KEPT:
            self.denied.append(str(name)[:120])

    def note_error(self, text: Any) -> None:
        self.agent_error = True
        if text:
            shown = " ".join(str(text).split())
            self.error = shown if len(shown) <= MAX_ERROR_TEXT else shown[:MAX_ERROR_TEXT - 3] + "..."


def count(value: Any) -> int:
    """A token count from a line: a non-negative integer, else a ValueError (the line is passed over)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a token count: {value!r}")
    return value


def amount(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        raise ValueError(f"not a cost: {value!r}")
    return float(value)
