"""docs/upstream.md#the-steps-of-a-tick: each offered Lane admitted (then enrolled) or refused, in offer order."""

from __future__ import annotations

from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.admission import decide_lane_admission
from lanes_es.domain.ids import lane_branch_name
from lanes_es.domain.record import consumed_slots, expected_batch_head
from lanes_es.tick import enroll
from lanes_es.tick.context import TickContext


def admit_offers(ctx: TickContext) -> None:
    if not ctx.tick.lane_offers:
        return
    coordinator = ctx.ports.lanes.resolve_root(ctx.tick.root)
    for offer in ctx.tick.lane_offers:
        child = next((c for c in ctx.record["children"] if c["task_id"] == offer.task_id), None)
        if child is None or child["state"] != "pending" or offer.task_id not in ctx.startable():
            ctx.refusals.append(ev.LaneRefusal(task_id=offer.task_id, path=offer.path,
                                               reason="batch_lane_unknown_child"))
            continue
        head = expected_batch_head(ctx.record)
        facts = ctx.ports.lanes.inspect_lane(ctx.tick.root, offer.path)
        if facts.exists and facts.same_repository and facts.real_path:
            facts = _with_claim(facts, ctx.ports.kernel.active_claim_task_id(facts.real_path))
        bound = [c["lane"]["path"] for c in ctx.record["children"] if c["lane"] and c["state"] != "released"]
        branch = lane_branch_name(ctx.record["initiative_slug"], offer.task_id)
        reason = decide_lane_admission(facts, coordinator, branch, head, bound)
        if reason:
            ctx.refusals.append(ev.LaneRefusal(task_id=offer.task_id, path=offer.path, reason=reason))
            continue
        if consumed_slots(ctx.record) >= ctx.record["budget"]["max_children"]:
            break  # the child budget stops new admissions only; in-flight Lanes finish
        ctx.live.admit_lane(ctx.now, offer.task_id, ev.LaneBinding(path=facts.real_path, branch=branch, base_head=head))
        ctx.persist()
        enroll.enroll_in_lane(ctx, offer.task_id)
    if ctx.refusals:
        ctx.live.refuse_offers(ctx.now, ctx.refusals)
        ctx.persist()


def _with_claim(facts: Any, claim: str | None) -> Any:
    import msgspec

    return msgspec.structs.replace(facts, active_claim_task_id=claim)
