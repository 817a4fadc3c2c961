"""What a tick checks before it moves any child of a recorded batch, and again before `completed`.

1. The working-tree preflight (docs/upstream.md#lane-leak-restore, upstream's Host preflight before every call):
   every dirty path of the coordinator must be a Lane's provable write (restored later in the
   tick, with a backup in the log), else the tick refuses (`working_tree_unstaged`) and
   touches no file.
2. The drift check (docs/upstream.md#authorization-reuse-and-the-tool-surface): the plan derived from the
   Initiative and intents as they are now and the branch must be what the confirmation
   covered. A running batch that drifted parks every child in flight and settles `needs_human`
   with the blocker's code; a parked one is not resumed; only a fresh confirmation of the batch
   as it stands goes on. The head is the lineage check's (lanes_es/tick/reconcile.py): a
   fast-forward is adopted, anything else fails the batch.

0. Before all of that, and before the service reads or writes anything in the checkout (the
   projections it repairs, the checkpoint ref it signs), the repository: a tick run in another
   checkout than the one the confirmation was given in is refused (`batch_repository_changed`),
   its audit event saved in the store and nothing else written, here or there
   (`repository_refusal`, called by the service).

Facts come through the tick's ports; the decisions are pure (lanes_es/domain/working_tree.py,
lanes_es/domain/drift.py). The steps call `stop_if_world_moved` and `refuse_unknown_leaks`.
"""

from __future__ import annotations

from typing import Any

from lanes_es.domain.drift import (
    Covered, Drift, Observed, decide_drift, decide_repository, drift_next_action, repository_next_action,
)
from lanes_es.domain.working_tree import Unprovable, WorkingTreeRefusal, decide_working_tree, unreadable_file_refusal
from lanes_es.domain.record import IN_FLIGHT
from lanes_es.domain.repository import RepositoryIdentity
from lanes_es.ports import CoordinatorView, PortError
from lanes_es.tick.context import TickOutcome, refusal_report
from lanes_es.tick_input import TickInput


def repository_refusal(tick: TickInput, batch: Any, here: RepositoryIdentity, shared_store: bool) -> dict[str, Any] | None:
    """The refusal report when `tick` runs in another repository than its confirmation's (`here`: the
    checkout and repository id it runs in), else None. `shared_store`: the log is not the checkout's own
    embedded store (only then can another read it).

    The refusal is recorded on `batch` (when it exists) as its audit event, for the caller to
    save in the store only: materializing the projections or signing a checkpoint would write
    into the wrong checkout.
    """
    drift = decide_repository(RepositoryIdentity.of_authorization(tick.authorization), here, shared_store)
    if drift is None:
        return None
    detail = f"{drift.detail}; {repository_next_action(tick.initiative_slug, tick.authorization.repository or '')}"
    report = refusal_report(tick, batch, drift.code, detail)
    if batch is not None:
        batch.reject_tick(tick.now, report["reason"])
    return report


def working_tree_refusal(ports: Any, root: str, slug: str, record: dict[str, Any],
                         view: CoordinatorView) -> WorkingTreeRefusal | None:
    """The preflight's refusal when a dirty path has an unknown origin or a file of the plan cannot be
    read; None when clean or all provable."""
    if ports.plans is not None:
        intents = [identity["intent_path"] for identity in (record.get("intent_identities") or {}).values()]
        unreadable = ports.plans.unreadable_file(root, slug, intents)
        if unreadable is not None:
            return unreadable_file_refusal(unreadable, slug)
    if not view.entries:
        return None
    if ports.leaks is None:  # nothing here can prove a Lane's origin: every change is of unknown origin
        return decide_working_tree(view.entries, Unprovable(view.entries[0][1], "no Lane origin can be proven"),
                                   slug)
    return decide_working_tree(view.entries, ports.leaks.plan(root, record, view.entries), slug)


def observed_plan(ports: Any, root: str, slug: str, own_tasks: list[str], covered: str) -> tuple[str | None, str | None]:
    """(digest now, why it cannot be derived); the covered digest when no plan observer is wired."""
    if ports.plans is None:
        return covered, None
    try:
        return ports.plans.current_digest(root, slug, own_tasks), None
    except PortError as failure:
        return None, str(failure)


def observe_drift(ports: Any, root: str, slug: str, record: dict[str, Any], view: CoordinatorView) -> Drift | None:
    """The first reuse blocker that holds now, from the coordinator's view and its files."""
    covered = Covered.of(record)
    digest, error = observed_plan(ports, root, slug, [child["task_id"] for child in record["children"]],
                                  covered.plan_digest)
    # The head is judged later, at the lineage check: an integration this batch made but did not
    # record (a crash) moves it too, and is adopted first (docs/upstream.md#the-steps-of-a-tick).
    return decide_drift(covered, Observed(plan_digest=digest, branch=view.branch, plan_error=error))


def stop_if_world_moved(runner: Any) -> Any:
    """The tick's outcome when the preflight refuses or the world drifted; None to go on.

    `runner` is the tick's context (lanes_es/tick/context.py): its ports, input, batch, `refuse`, `finalize`.
    """
    record = runner.record
    if record["batch_state"] == "needs_human" and runner.tick.confirmation_time <= record["confirmation_time"]:
        return None  # parked, and no confirmation since: nothing can move; the park's own report says so
    view = runner.view = runner.ports.lanes.coordinator_view(runner.tick.root)
    refusal = working_tree_refusal(runner.ports, runner.tick.root, runner.tick.initiative_slug, record, view)
    if refusal is not None:
        return runner.refuse(refusal.code, refusal.text)
    drift = observe_drift(runner.ports, runner.tick.root, runner.tick.initiative_slug, record, view)
    if drift is None:
        return None
    if runner.live.batch_state != "running":
        return runner.refuse(drift.code, f"{drift.detail}; {drift_next_action(runner.tick.initiative_slug)}")
    return stop_on_drift(runner, drift.reason, drift_next_action(runner.tick.initiative_slug))


def stop_on_drift(runner: Any, reason: str, next_action: str) -> Any:
    """What the confirmation covered moved: every child in flight parks (its Lane is kept), the batch
    settles needs_human, and nothing more is admitted, enrolled, committed or integrated."""
    for child in runner.live.children_in(*IN_FLIGHT):
        runner.live.park(runner.now, child["task_id"], reason)
    runner.parked_message = reason
    return TickOutcome(runner.finalize("needs_human", reason, next_action), runner.batch)


def refuse_if_plan_moved_before_start(runner: Any) -> Any:
    """A new batch starts only on the plan its authorization covers: one that moved between
    `authorize` and this first tick is refused (nothing is written); `authorize` again confirms it."""
    tick = runner.tick
    covered = Covered(plan_digest=tick.authorization.plan_digest, branch="")
    digest, error = observed_plan(runner.ports, tick.root, tick.initiative_slug, [], covered.plan_digest)
    drift = decide_drift(covered, Observed(plan_digest=digest, branch="", plan_error=error))
    if drift is None:
        return None
    return runner.refuse(drift.code, f"{drift.detail}; run `lanes-es authorize {tick.initiative_slug}` to confirm "
                                     f"the plan as it now stands")


def refuse_unknown_leaks(runner: Any) -> Any:
    """Before `completed`: the checkout is read once more; a path of unknown origin refuses the tick."""
    view = runner.view = runner.ports.lanes.coordinator_view(runner.tick.root)
    refusal = working_tree_refusal(runner.ports, runner.tick.root, runner.tick.initiative_slug, runner.record, view)
    if refusal is None:
        return None
    return runner.refuse(refusal.code, refusal.text)
