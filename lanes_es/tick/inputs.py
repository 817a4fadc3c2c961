"""The steps of a tick (docs/upstream.md#the-steps-of-a-tick), its inputs: the per-tick lane instruction (docs/upstream.md#lane-instructions-and-corrections) and delegated revision (docs/upstream.md#delegated-intent-revisions)."""

from __future__ import annotations

from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.intent import canonical_intent_hash, delegated_revision_refusal
from lanes_es.ports import PortError
from lanes_es.tick.context import TickContext

REVISION_FALLBACK = ("the Executor requests approve_breaking_intent_revision through its own native gate "
                     "for the user to answer")


def decide_lane_instruction(record: dict[str, Any], request: Any) -> str | None:
    """Whether the coordinator may send this text now; None means allowed (docs/upstream.md#lane-instructions-and-corrections)."""
    task_id = request.task_id
    child = next((c for c in record["children"] if c["task_id"] == task_id), None)
    if child is None or not child["lane"]:
        return f"{task_id} has no Lane in this batch"
    if child["state"] != "enrolled":
        return f"{task_id} is {child['state']}, not running in its Lane"
    if request.kind == "correction" and not child.get("correction_due"):
        return f"{task_id} has not exhausted its rework budget; send an ordinary instruction instead"
    if request.kind == "instruction" and child.get("correction_due"):
        return f"{task_id} waits for a design-level correction; send it with kind correction"
    if request.session_state == "blocked":
        return f"{task_id}'s session is blocked on a dialog only the user may answer; send nothing and tell the user"
    if request.session_state != "idle":
        return f"{task_id}'s session is {request.session_state}; text goes only to an idle session"
    return None


def decide_instruction(ctx: TickContext) -> None:
    """Step 14."""
    request = ctx.tick.lane_instruction
    if request is None:
        return
    refusal = decide_lane_instruction(ctx.record, request)
    if refusal:
        ctx.instruction = ev.InstructionOutcome(task_id=request.task_id, kind=request.kind, accepted=False,
                                                reason=f"batch_lane_instruction_refused: {refusal}")
        return
    ctx.live.record_intervention(ctx.now, request.task_id, request.kind, request.text)
    ctx.persist()  # recorded before the Parent sends it
    ctx.instruction = ev.InstructionOutcome(task_id=request.task_id, kind=request.kind, accepted=True, reason=None)


def decide_revision(ctx: TickContext) -> None:
    """Step 15."""
    request = ctx.tick.lane_revision
    if request is None:
        return
    refusal = apply_revision_or_refuse(ctx, request)
    if refusal is not None:
        ctx.revision = ev.RevisionOutcome(task_id=request.task_id, accepted=False,
                                          reason=f"batch_delegation_refused: {refusal}", fallback=REVISION_FALLBACK)
        return
    ctx.revision = ev.RevisionOutcome(task_id=request.task_id, accepted=True, reason=None)


def apply_revision_or_refuse(ctx: TickContext, request: Any) -> str | None:
    """docs/upstream.md#delegated-intent-revisions: apply an in-bounds breaking revision under the grant; otherwise the refusal text."""
    grant = ctx.record.get("revision_delegation")
    child = next((c for c in ctx.record["children"] if c["task_id"] == request.task_id), None)
    if not grant:
        return "this batch's confirmation did not delegate Intent revisions"
    if child is None or not child["lane"] or child["state"] != "enrolled":
        return f"{request.task_id} is not running in its Lane"
    if ctx.ports.revisions is None:
        return "this coordinator cannot apply Intent revisions in a Lane"
    try:
        authorized = ctx.ports.batch_git.read_intent(ctx.tick.root, request.task_id,
                                                     ctx.intent_path_of(request.task_id)).intent
        current = ctx.ports.revisions.current_intent(child["lane"]["path"], request.task_id)
        if current is None:
            return f"the Lane has no TaskRecord for {request.task_id}"
        if not revision_awaits_record(ctx, request.task_id, current, request.next_intent):
            out_of_bounds = delegated_revision_refusal(authorized, current, request.next_intent)
            if out_of_bounds:
                return out_of_bounds
        confirmation_ref = f"delegated-batch:{ctx.record['batch_id']}@{grant['confirmation_time']}"
        from_revision, to_revision, content_hash = ctx.ports.revisions.apply_delegated_revision(
            child["lane"]["path"], request.task_id, request.next_intent, confirmation_ref, ctx.now)
    except (PortError, ValueError) as error:
        return str(error)
    ctx.live.apply_delegated_revision(ctx.now, request.task_id, from_revision, to_revision,
                                      content_hash, confirmation_ref)
    ctx.persist()
    return None


def revision_awaits_record(ctx: TickContext, task_id: str, current: dict[str, Any], next_intent: dict[str, Any]) -> bool:
    """The Lane already holds this revision, but the batch has no record of applying it (a crash
    fell between the two): applying it again adopts the Lane's approval instead of refusing it."""
    content_hash = canonical_intent_hash(next_intent)
    if canonical_intent_hash(current) != content_hash:
        return False
    return not any(r["task_id"] == task_id and r["intent_content_hash"] == content_hash
                   for r in ctx.record.get("delegated_revisions", []))
