"""docs/upstream.md#the-steps-of-a-tick: the batch completes, parks or stops, or the tick reports what comes next."""

from __future__ import annotations

from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.ids import LANE_EXECUTOR_HOSTS, lane_branch_name
from lanes_es.domain.record import IN_FLIGHT, consumed_slots, expected_batch_head
from lanes_es.domain.report import (
    NEXT_FINAL_VERIFICATION_FAILED, NEXT_REVIEW, RELEASE_SUFFIX, lane_report, review_reason, running_next_action,
)
from lanes_es.tick import reconcile
from lanes_es.tick.context import TickContext, TickFinished
from lanes_es.tick.guards import refuse_unknown_leaks
from lanes_es.tick.qa import MAX_COORDINATOR_CORRECTIONS


def settle_or_report(ctx: TickContext) -> dict[str, Any]:
    record = ctx.record
    if all(child["state"] in ("integrated", "released") for child in record["children"]):
        return complete(ctx)
    handoffs: list[ev.Handoff] = lane_handoffs(ctx)
    handoffs.extend(release_handoffs(ctx))
    in_flight = ctx.live.children_in(*IN_FLIGHT)
    startable = ctx.startable()
    over_budget = consumed_slots(record) >= record["budget"]["max_children"]
    if not in_flight and (not startable or over_budget):
        parked = bool(ctx.live.children_in("needs_human", "skipped_blocked"))
        state = "needs_human" if parked or not over_budget else "budget_stopped"
        reason = ctx.parked_message or (
            "a parked child needs a human decision" if parked
            else f"max_children budget exhausted ({record['budget']['max_children']})" if over_budget
            else "no child can start")
        return ctx.finalize(state, reason)
    if not over_budget:
        head = expected_batch_head(record)
        handoffs.extend(ev.ProvisionHandoff(task_id=task_id, lane_branch=lane_branch_name(record["initiative_slug"], task_id),
                                            base_head=head, executor_hosts=list(LANE_EXECUTOR_HOSTS))
                        for task_id in startable)
    if ctx.review_open:
        return ctx.report(review_reason(ctx.review_open), NEXT_REVIEW, handoffs)
    return ctx.report(None, running_next_action(handoffs), handoffs)


def complete(ctx: TickContext) -> dict[str, Any]:
    refused = refuse_unknown_leaks(ctx)  # the working-tree preflight once more, before `completed`
    if refused is not None:
        raise TickFinished(refused.report)
    reconcile.restore_leaks(ctx)  # a Lane's write that leaked during this tick
    final = None
    commands = ctx.record.get("final_verification")
    if commands:
        head, results = ctx.ports.verifier.run_final_verification(ctx.tick.root, list(commands))
        final = ev.FinalVerificationReport(passed=all(result.passed for result in results), head=head,
                                           results=list(results))
    handoffs = release_handoffs(ctx)
    if final is not None and not final.passed:
        failed = ", ".join(result.command for result in final.results if not result.passed)
        return ctx.finalize("completed", f"all enrollable children integrated; final verification did not pass: {failed}",
                            NEXT_FINAL_VERIFICATION_FAILED, handoffs, final)
    return ctx.finalize("completed", "all enrollable children integrated", "", handoffs, final)


def lane_handoffs(ctx: TickContext) -> list[ev.Handoff]:
    handoffs: list[ev.Handoff] = []
    for child in ctx.live.children_in("enrolled"):
        lane = child["lane"]
        if child.get("correction_due"):
            used = child.get("corrections", 0)
            handoffs.append(ev.CoordinatorHandoff(task_id=child["task_id"], reason=child["correction_due"],
                                                  corrections_used=used,
                                                  corrections_left=MAX_COORDINATOR_CORRECTIONS - used,
                                                  lane_path=lane["path"]))
            continue
        fresh = ctx.ports.kernel.project_task(lane["path"], child["task_id"])
        if fresh.error is not None:
            continue
        handoffs.append(ev.ExecutorHandoff(task_id=child["task_id"], run_id=fresh.run_id,
                                           record_revision=fresh.record_revision,
                                           next_obligation=fresh.next_obligation,
                                           lane_branch=lane["branch"], lane_path=lane["path"]))
    return handoffs


def release_handoffs(ctx: TickContext) -> list[ev.Handoff]:
    """Integrated Lanes that are safe to remove: present, clean, unclaimed, audit pair on the batch branch."""
    integrated = ctx.live.children_in("integrated")
    if not integrated:
        return []
    lineage = ctx.lineage or ctx.ports.lanes.classify_lineage(
        ctx.tick.root, ctx.record["branch"], expected_batch_head(ctx.record), list(ctx.record["commits"]),
        ctx.record["batch_id"])
    if lineage.kind == "broken":
        return []
    handoffs: list[ev.Handoff] = []
    for child in integrated:
        lane = child["lane"]
        facts = ctx.ports.lanes.inspect_lane(ctx.tick.root, lane["path"])
        if (not facts.exists or not facts.same_repository or not facts.is_worktree_root or not facts.clean
                or facts.branch != lane["branch"]
                or ctx.ports.kernel.active_claim_task_id(facts.real_path or lane["path"]) is not None):
            continue
        if not ctx.ports.lanes.audit_reachable(ctx.tick.root, lineage.head, child["task_id"]):
            continue
        handoffs.append(ev.ReleaseHandoff(task_id=child["task_id"], lane_branch=lane["branch"]))
    return handoffs


def lane_rejection_report(ctx: TickContext, reason: str, next_action: str) -> dict[str, Any]:
    """A store-condition rejection of a recorded batch: only safe release handoffs, no authority granted."""
    ctx.lineage = None
    handoffs = release_handoffs(ctx)
    suffix = RELEASE_SUFFIX if handoffs else ""
    return lane_report(ctx.record, reason, f"{next_action}{suffix}", ev.ReportExtras(handoffs=handoffs),
                       batch_state="rejected")
