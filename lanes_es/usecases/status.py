"""`status`: where an Initiative's batch stands, read-only: its record, or, authorized but not ticked yet,
the facts of its authorization (the first tick starts it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.record import is_terminal
from lanes_es.errors import ServiceError
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.load import active_batch, batch, current_authorization


@dataclass(frozen=True)
class Status:
    """A batch (`batch`), or the facts of an authorization whose batch has not started (`not_started`);
    `executor_budget`: the Executor budgets of the batch's latest authorization."""

    batch: LaneBatch | None = None
    not_started: dict[str, Any] | None = None
    executor_budget: ev.ExecutorBudgets | None = None


def status(deps: Deps, slug: str | None, batch_id: str | None = None) -> Status:
    if batch_id:
        found = batch(deps, batch_id)
        return Status(batch=found, executor_budget=budgets_of(deps, found))
    if not slug:
        raise ServiceError("invalid_input", "name an Initiative SLUG or --batch ID")
    found = active_batch(deps, slug)
    if found is not None:
        return Status(batch=found, executor_budget=budgets_of(deps, found))
    current = current_authorization(deps, slug)
    if current is None:
        raise ServiceError("batch_not_found", f"Initiative {slug} has no batch yet; "
                                              f"run `lanes-es authorize {slug}` then `lanes-es tick {slug}`")
    return Status(not_started={"initiative_slug": slug, "batch_id": current.batch_id, "batch_state": "authorized",
                               "base_head": current.base_head, "max_parallel": current.max_parallel,
                               "children": [child.task_id for child in current.children],
                               "next_action": f"run `lanes-es tick {slug}` to start the batch"})


def budgets_of(deps: Deps, found: LaneBatch) -> ev.ExecutorBudgets | None:
    """The Executor budgets the batch's latest authorization set (None: none)."""
    initiative = deps.store.initiative(found.record["initiative_slug"])
    own = [grant for grant in (initiative.authorizations if initiative else []) if grant.batch_id == found.id]
    return own[-1].executor_budget if own else None


def recorded_max_parallel(deps: Deps, slug: str) -> int | None:
    """The active lane batch's max_parallel, None when no batch is recorded or it is terminal."""
    found = active_batch(deps, slug)
    if found is None or is_terminal(found.batch_state):
        return None
    return int(found.record["max_parallel"])
