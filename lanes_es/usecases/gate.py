"""The one confirmation gate: the facts are prepared, a surface puts them to the literal user, and only a
yes is recorded (decided again on the Initiative as it then stands, lanes_es/usecases/authorize.py).

Each surface adapts it by how it asks: the command line on its terminal (or `--yes`), the autopilot
through the question its caller gave it (or `--yes`), the MCP server through form elicitation. A
surface that cannot ask refuses with `confirmation_port_unavailable`; a declined or cancelled gate
writes nothing.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from lanes_es.domain import events as ev
from lanes_es.errors import ServiceError
from lanes_es.usecases.authorize import authorize
from lanes_es.usecases.confirmation import BatchOptions, Confirmation, prepare_confirmation
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.load import current_authorization

QUESTION = "Confirm this batch as the literal user? [y/N] "
NO_TERMINAL = "no terminal to ask on; review the facts above and run again with --yes"
REVISION_DELEGATION_TEXT = (
    "Delegate in-Lane Intent revisions? If yes, when a Lane's Executor needs a breaking revision "
    "of its TaskIntent, the coordinator may approve it for you, within bounds the runtime enforces: the same "
    "goal, owner and risk, and a scope_hint that is never widened. Anything beyond that still comes back to "
    "you (docs/upstream.md#delegated-intent-revisions). Default: no.")


@dataclass(frozen=True)
class Answer:
    """The user's answer to a gate: accept (with what the form holds), decline or cancel."""

    action: str
    content: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def yes(cls) -> "Answer":
        return cls("accept", {"confirm": True})

    @classmethod
    def of_reply(cls, reply: str) -> "Answer":
        """A typed reply: y or yes (any case) accepts, anything else declines."""
        return cls.yes() if reply.strip().lower() in ("y", "yes") else cls("decline")

    @property
    def confirmed(self) -> bool:
        return self.action == "accept" and self.content.get("confirm") is True

    @property
    def delegates(self) -> bool | None:
        """The answer to the delegation question when the form asked it (MCP), else None."""
        if "delegate_in_lane_revisions" not in self.content:
            return None
        return self.content["delegate_in_lane_revisions"] is True


Ask = Callable[[Confirmation], Answer]


def pass_gate(deps: Deps, slug: str, options: BatchOptions, ask: Ask) -> tuple[Confirmation, ev.BatchAuthorized]:
    """Prepare the facts, let the surface ask (`ask` shows them and returns the answer, or refuses when it
    cannot ask), and record a yes."""
    confirmation = prepare_confirmation(deps, slug, options)
    return confirmation, close_gate(deps, confirmation, ask(confirmation))


def close_gate(deps: Deps, confirmation: Confirmation, answer: Answer) -> ev.BatchAuthorized:
    """Record the answer to `confirmation`: only a yes; a delegation answered on the form replaces the asked one."""
    require_confirmed(answer)
    if answer.delegates is not None:
        confirmation = replace(confirmation, delegate_revisions=answer.delegates)
    return authorize(deps, confirmation)


def require_confirmed(answer: Answer, unchanged: str = "nothing was recorded") -> None:
    if answer.action == "cancel":
        raise ServiceError("confirmation_cancelled", unchanged)
    if not answer.confirmed:
        raise ServiceError("confirmation_declined", unchanged)


def ask_on_terminal(question: str, yes: bool, ask: Callable[[str], str] | None,
                    unavailable: str = NO_TERMINAL) -> Answer:
    """`--yes` answers for the user; else `ask` (a terminal's `input`) puts the question; with neither, refused."""
    if yes:
        return Answer.yes()
    if ask is None:
        raise ServiceError("confirmation_port_unavailable", unavailable)
    return Answer.of_reply(ask(question))


def authorization_needed(deps: Deps, slug: str) -> bool:
    """True when no authorization lets a tick run the Initiative's batch now.

    Valid: an authorization whose batch has not started yet, or is running, or is parked and
    was confirmed again after it parked. A terminal batch needs a new confirmation (a new
    batch), and so does a parked one that was not confirmed since.
    """
    current = current_authorization(deps, slug)
    if current is None:
        return True
    batch = deps.store.batch(current.batch_id)
    if batch is None or batch.batch_state in ("prepared", "running"):
        return False
    if batch.batch_state == "needs_human":
        return current.confirmation_time <= batch.record["confirmation_time"]
    return True


def facts_digest(facts: dict[str, Any]) -> str:
    """What a person confirmed, minus the freshly minted batch id: equal digests, equal facts."""
    seen = {key: value for key, value in facts.items() if key != "batch_id"}
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()


def confirmation_text(facts: dict[str, Any], *, with_delegation: bool = True) -> str:
    """The confirmation facts as a person reads them (upstream's gate message, lane form)."""
    verb = "Resume the parked" if facts["resumes_parked_batch"] else "Start the unattended"
    lines = [f"{verb} lane batch {facts['batch_id']} of Initiative {facts['initiative_slug']}?",
             *([f"Checkout: {facts['repository']}"] if facts.get("repository") else []),
             f"Branch: {facts['branch']} from base {facts['base_head']}",
             f"Plan digest: {facts['plan_digest']}",
             f"Children ({len(facts['children'])}):"]
    for child in facts["children"]:
        after = f" after {', '.join(child['blocked_by'])}" if child["blocked_by"] else ""
        lines.append(f"  - {child['task_id']} ({child['slice_id']}){after}")
    if facts["excluded"]:
        lines.append(f"Excluded children ({len(facts['excluded'])}):")
        lines += [f"  - {c['task_id']} ({c.get('slice_id')}): {c.get('reason') or c.get('status')}"
                  for c in facts["excluded"]]
    budget, lane = facts["budget"], facts["lane_mode"]
    lines.append(f"Budget: max_children={budget['max_children']}, qa_failure_limit={budget['qa_failure_limit']}")
    if facts.get("executor_budget"):
        import msgspec

        from lanes_es.domain.executor_budget import budgets_text

        lines.append(f"Executor budget: {budgets_text(msgspec.convert(facts['executor_budget'], ev.ExecutorBudgets))}")
    lines.append(f"Lane mode: max_parallel={lane['max_parallel']}")
    if lane["parallel_groups"]:
        lines.append(f"Parallel groups ({len(lane['parallel_groups'])}):")
        lines += [f"  - {', '.join(group)}" for group in lane["parallel_groups"]]
    if lane["serialized"]:
        lines.append(f"Serialized by overlapping scope ({len(lane['serialized'])}):")
        lines += [f"  - {c['task_id']} after {', '.join(c['overlaps_with'])}" for c in lane["serialized"]]
    if lane.get("final_verification"):
        lines.append("Final verification: " + "; ".join(lane["final_verification"]))
    if with_delegation:
        lines += ["", REVISION_DELEGATION_TEXT]
    return "\n".join(lines)
