"""The confirmation the autopilot and the MCP server put to the literal user, and whether one is needed."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

from lanes_es.domain.record import is_terminal
from lanes_es.service import Confirmation, LanesService, ServiceError

Out = Callable[[str], None]

REVISION_DELEGATION_TEXT = (
    "Delegate in-Lane Intent revisions? If yes, when a Lane's Executor needs a breaking revision "
    "of its TaskIntent, the coordinator may approve it for you, within bounds the runtime enforces: the same "
    "goal, owner and risk, and a scope_hint that is never widened. Anything beyond that still comes back to "
    "you (docs/upstream.md#delegated-intent-revisions). Default: no.")


def authorization_needed(service: LanesService, slug: str) -> bool:
    """True when no authorization lets a tick run the Initiative's batch now.

    Valid: an authorization whose batch has not started yet, or is running, or is parked and
    was confirmed again after it parked. A terminal batch needs a new confirmation (a new
    batch), and so does a parked one that was not confirmed since.
    """
    initiative = service.initiative(slug)
    current = initiative.current if initiative else None
    if current is None:
        return True
    batch = service.store.batch(current.batch_id)
    if batch is None or batch.batch_state in ("prepared", "running"):
        return False
    if batch.batch_state == "needs_human":
        return current.confirmation_time <= batch.record["confirmation_time"]
    return True


def recorded_max_parallel(service: LanesService, slug: str) -> int | None:
    """The active lane batch's max_parallel, None when no batch is recorded or it is terminal."""
    batch = service.active_batch(slug)
    if batch is None or is_terminal(batch.batch_state):
        return None
    return int(batch.record["max_parallel"])


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


def confirm_on_terminal(service: LanesService, slug: str, max_parallel: int, yes: bool, out: Out,
                        ask: Callable[[str], str] | None, *, final_verification: list[str] | None = None,
                        delegate_revisions: bool = False, integration: str | None = None,
                        verify_workers: int | None = None, flake_reruns: int | None = None) -> Confirmation | None:
    """Show the facts and record the answer; None when the current authorization is valid."""
    if not authorization_needed(service, slug):
        return None
    confirmation = service.confirmation(slug, max_parallel=max_parallel, final_verification=final_verification,
                                        delegate_revisions=delegate_revisions, integration=integration,
                                        verify_workers=verify_workers, flake_reruns=flake_reruns)
    out(confirmation_text(confirmation.facts(), with_delegation=delegate_revisions))
    if not yes:
        if ask is None:
            raise ServiceError("confirmation_port_unavailable",
                               "no terminal to ask on; review the facts above and run again with --yes")
        if ask("Confirm this batch as the literal user? [y/N] ").strip().lower() not in ("y", "yes"):
            raise ServiceError("confirmation_declined", "nothing was recorded")
    service.authorize(confirmation)
    out(f"confirmed {confirmation.batch_id} (max_parallel {confirmation.max_parallel})")
    return confirmation

