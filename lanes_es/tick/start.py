"""The steps of a tick (docs/upstream.md#the-steps-of-a-tick), first: the persisted-state checks, then a new batch prepared or a recorded one resumed."""

from __future__ import annotations

from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.authority import AuthorizationError
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.ids import batch_branch_name
from lanes_es.domain.plan import compute_batch_plan_digest
from lanes_es.domain.record import is_terminal
from lanes_es.domain.report import LANE_NEEDS_HUMAN_NEXT_ACTION
from lanes_es.tick import complete, tracker
from lanes_es.tick.guards import refuse_if_plan_moved_before_start, stop_if_world_moved
from lanes_es.tick.context import PlanMismatch, TickContext, TickOutcome

PARALLEL_MISMATCH = "batch_parallel_mismatch"


def check_parallel_and_plan(ctx: TickContext) -> TickOutcome | None:
    """Steps 1-3: a recorded max_parallel is never changed; the limit; an empty plan is refused."""
    tick, recorded = ctx.tick, ctx.batch
    if recorded is not None and tick.max_parallel is not None and tick.max_parallel != recorded.record["max_parallel"]:
        return ctx.refuse(PARALLEL_MISMATCH, f"the recorded batch runs with max_parallel {recorded.record['max_parallel']}")
    ctx.limit = recorded.record["max_parallel"] if recorded is not None else (tick.max_parallel or 1)
    if not tick.children:
        return ctx.refuse("batch_plan_empty", "batch plan is empty")
    return None


def validate_new_authorization(ctx: TickContext) -> str | None:
    """upstream's validateNewAuthorization: the capability covers this input, issued at its confirmation."""
    try:
        issued_at = ctx.capability.validate(ctx.binding())
        if issued_at != ctx.tick.confirmation_time:
            return "the parked batch requires a fresh literal-user confirmation"
        for child in ctx.tick.children:
            if child.intent_path is None or child.intent_revision is None or child.intent_content_hash is None:
                return f"batch child {child.task_id} has no complete intent identity"
        if compute_batch_plan_digest(ctx.tick.children) != ctx.tick.authorization.plan_digest:
            return "batch run input does not match the authorized plan or base_head"
        return None
    except (AuthorizationError, ValueError) as error:
        return str(error)


def start_new(ctx: TickContext) -> TickOutcome | None:
    """Step 5: a new batch, prepared (not yet saved) once authorization, runtime and preflight hold."""
    tick = ctx.tick
    invalid = validate_new_authorization(ctx)
    if invalid:
        return ctx.refuse("batch_authorization_invalid", invalid)
    if ctx.ports.runtime_contracts is not None:
        refusal = ctx.ports.runtime_contracts.refusal(tick.root, tick.executor_runtime)
        if refusal:
            code, _, detail = refusal.partition(": ")
            return ctx.refuse(code, detail)
    moved = refuse_if_plan_moved_before_start(ctx)
    if moved is not None:
        return moved
    # The branch may already sit at base_head: made by a preflight whose batch was never saved (a crash),
    # or left by the Initiative's settled batch. Checked out there, it is reused rather than refused.
    preflight = ctx.ports.batch_git.preflight(tick.root, tick.initiative_slug, tick.authorization.base_head,
                                              reuse_head=tick.authorization.base_head)
    if not preflight.ok:
        return ctx.refuse(preflight.reason, preflight.message or "Correct the preflight condition and re-confirm.")
    ctx.batch = LaneBatch.prepare(
        at=ctx.now, batch_id=tick.batch_id, initiative_slug=tick.initiative_slug,
        plan_digest=tick.authorization.plan_digest, base_head=tick.authorization.base_head,
        branch=batch_branch_name(tick.initiative_slug), confirmation_time=tick.confirmation_time,
        budget=tick.authorization.budget, max_parallel=ctx.limit, children=tick.children,
        final_verification=tick.authorization.final_verification or None,
        revision_delegation=tick.confirmation_time if tick.revision_delegation else None,
        integration=tick.authorization.integration, verify_workers=tick.authorization.verify_workers,
        flake_reruns=tick.authorization.flake_reruns,
    )
    return None


def resume_recorded(ctx: TickContext) -> TickOutcome | None:
    """Step 4: the plan still matches; a terminal batch replays its report; a parked one resumes."""
    assert_plan_matches(ctx)
    state = ctx.live.batch_state
    if is_terminal(state):
        return replay_terminal(ctx, state)
    stopped = stop_if_world_moved(ctx)  # the working-tree preflight, then what the confirmation covered
    if stopped is not None:
        return stopped
    if state == "needs_human":
        return resume_park(ctx)
    return None


def assert_plan_matches(ctx: TickContext) -> None:
    """upstream's assertPlanMatches; it throws (the tick fails loudly, nothing is written)."""
    record = ctx.record
    plan = ctx.capability.children
    digests = {compute_batch_plan_digest(plan)} | {r["to_digest"] for r in record.get("reseals", [])}
    if (record["plan_digest"] not in digests or len(record["children"]) != len(plan)
            or any(child["task_id"] != planned.task_id or child["blocked_by"] != list(planned.blocked_by)
                   for child, planned in zip(record["children"], plan))):
        raise PlanMismatch("plan_digest mismatch: persisted children do not match the authorized plan")


def replay_terminal(ctx: TickContext, state: str) -> TickOutcome:
    if state == "completed":
        tracker.close_integrated_issues(ctx)
    handoffs = complete.release_handoffs(ctx) if state == "completed" else []
    report = ctx.report(f"terminal state already reached: {state}", "", handoffs)
    return TickOutcome(report, ctx.batch)


def resume_park(ctx: TickContext) -> TickOutcome | None:
    record = ctx.record
    invalid = validate_new_authorization(ctx)
    if invalid or ctx.tick.confirmation_time <= record["confirmation_time"]:
        reason = invalid or "the parked batch requires a fresh literal-user confirmation"
        return TickOutcome(ctx.report(reason, LANE_NEEDS_HUMAN_NEXT_ACTION), ctx.batch, written=False)
    resumed: list[ev.ResumedChild] = []
    for child in record["children"]:
        if child["state"] != "needs_human":
            continue
        outcome = recover_parked(ctx, child)
        if isinstance(outcome, str) and outcome not in ("enrolled", "settled", "lane_committed"):
            return TickOutcome(ctx.report(outcome, LANE_NEEDS_HUMAN_NEXT_ACTION), ctx.batch, written=False)
        resumed.append(ev.ResumedChild(task_id=child["task_id"], state=outcome))
    # Applied now, persisted only after the lineage validation (step 13, upstream's order).
    ctx.live.resume_park(ctx.now, ctx.tick.confirmation_time, resumed)
    ctx.resumed_park = True
    return None


def recover_parked(ctx: TickContext, child: dict[str, Any]) -> str:
    """The state a parked child resumes in, from its Lane's facts, or upstream's refusal text."""
    lane = child["lane"]
    if not lane or not lane.get("run_id"):
        return "parked Lane has no recorded run identity; inspect it without re-enrolling"
    facts = ctx.ports.lanes.inspect_lane(ctx.tick.root, lane["path"])
    fresh = ctx.ports.kernel.project_task(lane["path"], child["task_id"])
    if (not facts.exists or not facts.same_repository or not facts.is_worktree_root
            or facts.branch != lane["branch"] or fresh.error is not None or fresh.run_id != lane["run_id"]
            or fresh.open_user_decision_count > 0 or fresh.replan_required_ids):
        return "parked Lane identity or decision is unresolved"
    if fresh.lifecycle == "done" and fresh.completion_ready:
        return "lane_committed" if lane["lane_commit"] else "settled"
    claim = ctx.ports.kernel.active_claim_task_id(lane["path"])
    if fresh.lifecycle == "active" and fresh.claim_task_id == child["task_id"] and claim in (None, child["task_id"]):
        return "enrolled"
    return "parked child has no recoverable owned run"
