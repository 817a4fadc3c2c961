"""OpenCode (`opencode run`) as an Executor: one message, raw JSON events, its permission rules.

The command (docs/how-to/agent-opencode.md says why each flag):

    opencode run --format json --dir LANE --agent build PROMPT

with OPENCODE_CONFIG_CONTENT = {"permission": {"external_directory": "deny"},
                                "agent": {"build": {"permission": {"external_directory": "deny"}}}}

OpenCode has no OS sandbox. Its file tools ask before they touch a path outside the directory it
runs in (`external_directory`), and `opencode run` without `--auto` rejects every such request;
the inline config denies it outright, at the highest precedence a user config has (above the
project's opencode.json, repository content), on the `build` agent that `--agent` selects too.
Its bash tool is not confined: run it in a container where that matters.
"""

from __future__ import annotations

import json
from typing import Any

from lanes_es.domain.events import AttemptLimits
from lanes_es.executors.usage import UsageReader, amount, count

AGENT = "build"
DENY_OUTSIDE = {"external_directory": "deny"}
CONFIG = json.dumps({"permission": DENY_OUTSIDE, "agent": {AGENT: {"permission": DENY_OUTSIDE}}},
                    separators=(",", ":"), sort_keys=True)


class OpenCode:
    name = "opencode"
    program = "opencode"
    reports_cost = True
    takes_cost_limit = False

    def argv(self, program: str, lane: str, prompt: str, limits: AttemptLimits) -> list[str]:
        return [program, "run", "--format", "json", "--dir", lane, "--agent", AGENT, prompt]

    def environment(self, lane: str) -> dict[str, str]:
        return {"OPENCODE_CONFIG_CONTENT": CONFIG}

    def reader(self) -> UsageReader:
        return OpenCodeEvents()


class OpenCodeEvents(UsageReader):
    """Every line names its `sessionID`; `step_finish` parts carry a step's cost and tokens (input, output,
    reasoning, cache read and write); `error` is the agent's own error; `done` lists the permission
    requests it rejected."""

    def take(self, item: dict[str, Any]) -> None:
        self.note_session(item.get("sessionID"))
        kind = item.get("type")
        if kind == "step_finish":
            part = item["part"]
            tokens = part["tokens"]
            cache = tokens.get("cache") or {}
            self.add_tokens(count(tokens.get("input", 0)) + count(cache.get("read", 0)) + count(cache.get("write", 0)),
                            count(tokens.get("output", 0)) + count(tokens.get("reasoning", 0)))
            self.add_cost(amount(part.get("cost", 0)))
        elif kind == "error":
            error = item.get("error")
            data = error.get("data") if isinstance(error, dict) else None
            said = data.get("message") if isinstance(data, dict) else None
            self.note_error(said or (error.get("name") if isinstance(error, dict) else error))
        elif kind == "done":
            rejected = item.get("rejected")
            if isinstance(rejected, list):
                self.denied = []
                for name in rejected:
                    self.note_denied(name)
