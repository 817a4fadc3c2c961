"""The prompt an agent gets for one attempt: the task's intent and what the task needs next.

Pure: a function of the `Assignment`. What the task needs next is one of

- `first_delivery`: nothing was delivered yet;
- `rework`: the last delivery failed the coordinator's QA; the findings (each failed check and the
  tail of its output) are quoted;
- `correction`: the coordinator sent a correction (or an instruction) since the last attempt; its
  text is quoted, with the findings that led to it;
- `retry`: an earlier attempt ended without delivering (it failed, or was killed); the Lane keeps
  what it left.

The agent's exit status is never trusted: lanes-es submits the work when the agent ends, and the
coordinator's QA and scope check decide. The prompt says so, and says what the agent must not do.
Text from the Lane (findings, corrections) is quoted as data, each piece cut to a bound, so the
whole prompt stays a single command-line argument.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass, field
from typing import Any

FIRST_DELIVERY, REWORK, CORRECTION, RETRY = "first_delivery", "rework", "correction", "retry"
MAX_QUOTED = 4000  # characters of one quoted piece (a finding, a correction)
MAX_QUOTED_PIECES = 20
MAX_PROMPT = 100_000  # Linux takes one argument of up to 128 KiB


@dataclass(frozen=True)
class Assignment:
    """One attempt's task, as the autopilot read it from the Lane and the batch's log."""

    task_id: str
    lane: str
    branch: str
    intent: dict[str, Any]
    attempt: int
    findings: list[tuple[str, str]] = field(default_factory=list)  # (check id, why it failed, output tail)
    interventions: list[tuple[str, str]] = field(default_factory=list)  # (kind, text) since the last attempt
    lanes_es: str = "lanes-es"  # how the agent runs lanes-es in the Lane

    @property
    def obligation(self) -> str:
        if self.interventions:
            return CORRECTION
        if self.findings:
            return REWORK
        return FIRST_DELIVERY if self.attempt == 1 else RETRY


def build_prompt(assignment: Assignment) -> str:
    intent = assignment.intent
    parts = [
        f"You are the Executor of task {assignment.task_id} of a lanes-es batch, working headless in its Lane: "
        f"the git worktree {assignment.lane} on branch {assignment.branch}. Work only inside this directory.",
        section("Goal", str(intent.get("goal", "")).strip()),
        section("Scope: change only these paths (a change anywhere else is refused when the Lane is committed)",
                "\n".join(f"- {entry}" for entry in intent.get("scope_hint", []))),
        section("Acceptance: the coordinator runs these checks on your work; each must pass",
                "\n".join(acceptance_line(item) for item in intent.get("acceptance", []))),
        section("Risk", risk_text(str(intent.get("risk", "routine")))),
        section(f"This attempt ({assignment.attempt}): {assignment.obligation.replace('_', ' ')}",
                obligation_text(assignment)),
        section("Rules", "\n".join([
            "- Do not commit, amend, rebase, switch branches or make worktrees: the coordinator commits the Lane.",
            f"- Do not run `{assignment.lanes_es} task submit`: lanes-es submits your work when you end.",
            f"- You may run `{assignment.lanes_es} task check` in the Lane: it runs the checks above on your "
            f"work and changes nothing.",
            "- When the work is done, end the session. Ending is not success: the checks decide.",
        ])),
    ]
    return cut("\n\n".join(part for part in parts if part), MAX_PROMPT)


def obligation_text(assignment: Assignment) -> str:
    lines: list[str] = []
    obligation = assignment.obligation
    if obligation == FIRST_DELIVERY:
        lines.append("Nothing was delivered yet: deliver the goal within the scope.")
    if obligation == RETRY:
        lines.append(f"Attempt {assignment.attempt - 1} ended without delivering (it failed or was stopped). "
                     f"The Lane keeps what it left: look at it (git status, git diff), then finish the goal.")
    if assignment.interventions:
        lines.append("The coordinator sent you this, to follow before anything else:")
        lines += [quoted(f"{kind}: {text}") for kind, text in assignment.interventions[-MAX_QUOTED_PIECES:]]
    if assignment.findings:
        lines.append("Your last delivery failed the coordinator's QA. Each failed check, with why and the tail "
                     "of its output:")
        lines += [quoted(f"{check}: {reason}") for check, reason in assignment.findings[:MAX_QUOTED_PIECES]]
        lines.append("Fix the work in the Lane so that every check passes; do not change the checks.")
    return "\n".join(lines)


def acceptance_line(item: Any) -> str:
    if not isinstance(item, dict):
        return f"- {cut(str(item), 500)}"
    assertion = f": {item['assertion']}" if item.get("assertion") else ""
    return f"- {item.get('id')}{assertion}\n  run: {command_text(item.get('verification'))}"


def command_text(verification: Any) -> str:
    """The check's command as a shell would show it, and where it runs."""
    from lanes_es.domain.descriptor import InvalidDescriptor, parse_verification_descriptor

    try:
        command = parse_verification_descriptor(verification).command
    except InvalidDescriptor:
        return cut(str(verification), 500)
    where = "" if command.cwd == "." else f" (in {command.cwd})"
    return cut(shlex.join([command.executable, *command.argv]), 2000) + where


def risk_text(risk: str) -> str:
    if risk == "routine":
        return "routine: the task completes when the checks pass."
    return f"{risk}: after the checks pass, a person reviews the work before it completes."


def section(title: str, body: str) -> str:
    return f"{title}:\n{body}" if body else ""


def quoted(text: str) -> str:
    """A piece of Lane text, marked as quoted data, cut to its bound."""
    return "\n".join("> " + line for line in cut(text, MAX_QUOTED).splitlines() or [""])


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def prompt_digest(prompt: str) -> str:
    return "sha256:" + hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()
