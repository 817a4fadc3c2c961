"""The steps of a tick (docs/upstream.md#the-steps-of-a-tick), reconcile: the recorded batch brought up to what git and the kernel now say."""

from __future__ import annotations

from lanes_es.domain.authority import AuthorizationError
from lanes_es.domain.record import expected_batch_head
from lanes_es.ports import Lineage, PortError
from lanes_es.tick.context import TickContext, TickFinished


def replace_grant(ctx: TickContext, new_batch: bool) -> None:
    """Step 6: a fresh confirmation of a recorded batch replaces its delegation grant with that answer."""
    answer = ctx.tick.revision_delegation
    if new_batch or answer is None:
        return
    wanted = ctx.tick.confirmation_time if answer else None
    current = ctx.record.get("revision_delegation", {}).get("confirmation_time")
    if wanted == current:
        return
    ctx.live.change_grant(ctx.now, wanted)
    ctx.persist()  # durable at once: a withdrawn grant must never survive to a later tick


LEAK_RESTORE_FAILED = "leak_restore_failed"  # lanes-es's own: upstream throws the message


def restore_leaks(ctx: TickContext) -> None:
    """Step 7: Lane writes leaked into the coordinator checkout, restored only when every path is provably a Lane's."""
    view = ctx.view = ctx.view or ctx.ports.lanes.coordinator_view(ctx.tick.root)
    if ctx.ports.leaks is None or not view.entries:
        return
    try:
        restored = ctx.ports.leaks.restore(ctx.tick.root, ctx.record, view.entries, ctx.now)
    except PortError as failure:  # nothing was changed in the checkout; the refusal is the tick's audit event
        raise TickFinished(ctx.refuse(LEAK_RESTORE_FAILED, f"{failure}; run `lanes-es tick "
                                                           f"{ctx.tick.initiative_slug}` again once git can write "
                                                           f"the checkout").report) from None
    if restored is not None:
        backup, paths = restored
        ctx.live.restore_leaks(ctx.now, backup, paths)
        ctx.persist()
        ctx.view = None  # the checkout changed


def start_running(ctx: TickContext) -> None:
    """Step 8: a prepared batch becomes running, its first write."""
    if ctx.live.batch_state == "prepared":
        ctx.live.start(ctx.now)
        ctx.persist()


def adopt_missed_integrations(ctx: TickContext) -> None:
    """Step 9: an integration a previous tick completed but did not record is found on the branch and adopted."""
    for child in ctx.live.children_in("lane_committed"):
        lane = child["lane"]
        found = ctx.ports.lanes.find_integrated(
            ctx.tick.root, child["task_id"], ctx.record["batch_id"], expected_batch_head(ctx.record),
            lane["base_head"], lane["lane_commit"])
        if found:
            ctx.live.integrate(ctx.now, child["task_id"], found, adopted=True)
            ctx.persist()
            ctx.view = None


def record_releases(ctx: TickContext) -> None:
    """Step 10: an integrated Lane whose worktree is gone is released."""
    for child in ctx.live.children_in("integrated"):
        if not ctx.ports.lanes.inspect_lane(ctx.tick.root, child["lane"]["path"]).exists:
            ctx.live.release(ctx.now, child["task_id"])
            ctx.persist()


def check_lineage(ctx: TickContext) -> None:
    """Step 11: the batch branch is where the log says, or a fast-forward of it; anything else fails the batch.

    A fast-forward (a user's commit on the batch branch, no batch trailer) is adopted in this very tick,
    as upstream does: `adopted_heads` gets {from: the expected head, to: the branch's head}, the batch
    goes on under the same authorization, and later Lanes start from the adopted head."""
    record = ctx.record
    expected = expected_batch_head(record)
    lineage = ctx.ports.lanes.classify_lineage(
        ctx.tick.root, record["branch"], expected, list(record["commits"]), record["batch_id"], ctx.view)
    if lineage.kind == "broken":
        raise TickFinished(ctx.fail_lineage(lineage.message))
    if lineage.kind == "fast_forward":
        ctx.live.adopt_head(ctx.now, expected, lineage.head)
        ctx.persist()
    ctx.lineage = Lineage(kind="equal", head=lineage.head)


def rehydrate_consumption(ctx: TickContext) -> None:
    """Step 12: slots held by integrated and in-flight children are re-consumed on this capability."""
    try:
        ctx.capability.validate(ctx.binding(ctx.record))
        for child in ctx.record["children"]:
            if child["state"] in ("pending", "skipped_blocked", "lane_admitted"):
                continue
            if not ctx.capability.is_child_consumed(child["task_id"]):
                ctx.capability.consume_child(child["task_id"])
    except (AuthorizationError, ValueError) as error:
        raise TickFinished(ctx.fail_lineage(str(error))) from None


def persist_resumed_park(ctx: TickContext) -> None:
    """Step 13: a resumed park is written only now, after the lineage held."""
    if ctx.resumed_park:
        ctx.persist()
