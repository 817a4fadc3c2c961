"""`Initiative`: one aggregate per slug and repository, holding its literal-user authorizations.

A batch runs only under an authorization recorded here. The newest authorization
names the active batch; a fresh one for a parked batch is what resumes it, and one
for a new batch id starts another. Capability slots are not stored: they are
rehydrated each tick from the batch record (upstream's rehydrateConsumption).

Several repositories may share one store (PostgreSQL), each with an Initiative of the same
slug, so the aggregate is keyed by the repository too (`initiative:<repository id>:<slug>`).
A repository's id is made once per clone (lanes_es/adapters/store_open.py): clones of one
project on two machines are two coordinators, each with its own batch branch and Lanes, so
they never share an Initiative, while the worktrees of one clone do. Stores written before
repository ids keyed it `initiative:<slug>`; such an Initiative still loads (`owner`).
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from .aggregate import ChainedAggregate, TransitionRefused


def initiative_id(slug: str, repository_id: str | None = None) -> str:
    """The aggregate id; without a repository id, the key of stores from before repository ids."""
    return f"initiative:{repository_id}:{slug}" if repository_id else f"initiative:{slug}"


def slug_of(aggregate_id: str) -> str:
    """The slug an Initiative's id names, in either form (neither a slug nor a repository id has a ':')."""
    return aggregate_id.rsplit(":", 1)[1]


class Initiative(ChainedAggregate):
    def __init__(self) -> None:
        self.slug = ""
        self.authorizations: list[ev.BatchAuthorized] = []
        self.retired: list[str] = []

    @classmethod
    def register(cls, *, at: str, slug: str, repository_id: str | None = None) -> "Initiative":
        return cls._start(ev.InitiativeRegistered, initiative_id(slug, repository_id), at=at, slug=slug)

    def apply_fact(self, event: Any) -> None:
        if isinstance(event, ev.InitiativeRegistered):
            self.slug = event.slug
        elif isinstance(event, ev.BatchAuthorized):
            self.authorizations.append(event)
        elif isinstance(event, ev.BatchRetired):
            self.retired.append(event.batch_id)
        super().apply_fact(event)

    @property
    def current(self) -> ev.BatchAuthorized | None:
        """The newest authorization, unless its batch was retired."""
        if not self.authorizations or self.authorizations[-1].batch_id in self.retired:
            return None
        return self.authorizations[-1]

    @property
    def owner(self) -> str | None:
        """The repository id of the newest authorization that names one: who an Initiative keyed by slug
        alone (a store from before repository ids) belongs to; None while no authorization names one."""
        for authorization in reversed(self.authorizations):
            if authorization.repository_id:
                return authorization.repository_id
        return None

    def batch_ids(self) -> list[str]:
        seen: list[str] = []
        for authorization in self.authorizations:
            if authorization.batch_id not in seen:
                seen.append(authorization.batch_id)
        return seen

    def authorize(self, *, at: str, batch_id: str, plan_digest: str, base_head: str, branch: str,
                  budget: ev.Budget, max_parallel: int, children: list[ev.PlanChild], confirmation_ref: str,
                  final_verification: list[str] | None, delegate_revisions: bool, resumes: bool,
                  repository: str | None = None, repository_id: str | None = None, integration: str | None = None,
                  verify_workers: int | None = None, flake_reruns: int | None = None,
                  executor_budget: ev.ExecutorBudgets | None = None, runner: str | None = None,
                  coordinator: str | None = None) -> None:
        if not children:
            raise TransitionRefused("batch plan has no enrollable children; nothing to confirm")
        previous = self.authorizations[-1].confirmation_time if self.authorizations else ""
        if at <= previous:
            raise TransitionRefused("a fresh confirmation must be newer than the one before it")
        self.trigger_event(
            ev.BatchAuthorized, at=at, batch_id=batch_id, plan_digest=plan_digest, base_head=base_head,
            branch=branch, budget=budget, max_parallel=max_parallel, children=children, confirmation_time=at,
            confirmation_ref=confirmation_ref, final_verification=final_verification,
            delegate_revisions=delegate_revisions, resumes=resumes, repository=repository, repository_id=repository_id,
            integration=integration,
            verify_workers=verify_workers, flake_reruns=flake_reruns or None, executor_budget=executor_budget,
            runner=runner, coordinator=coordinator,
        )

    def retire(self, *, at: str, batch_id: str) -> None:
        if batch_id in self.retired:
            raise TransitionRefused(f"batch {batch_id} is already retired")
        self.trigger_event(ev.BatchRetired, at=at, batch_id=batch_id)
