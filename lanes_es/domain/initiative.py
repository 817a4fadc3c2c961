"""`Initiative`: one aggregate per slug, holding its literal-user authorizations.

A batch runs only under an authorization recorded here. The newest authorization
names the active batch; a fresh one for a parked batch is what resumes it, and one
for a new batch id starts another. Capability slots are not stored: they are
rehydrated each tick from the batch record (upstream's rehydrateConsumption).
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from .aggregate import ChainedAggregate, TransitionRefused


def initiative_id(slug: str) -> str:
    return f"initiative:{slug}"


class Initiative(ChainedAggregate):
    def __init__(self) -> None:
        self.slug = ""
        self.authorizations: list[ev.BatchAuthorized] = []
        self.retired: list[str] = []

    @classmethod
    def register(cls, *, at: str, slug: str) -> "Initiative":
        return cls._start(ev.InitiativeRegistered, initiative_id(slug), at=at, slug=slug)

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

    def batch_ids(self) -> list[str]:
        seen: list[str] = []
        for authorization in self.authorizations:
            if authorization.batch_id not in seen:
                seen.append(authorization.batch_id)
        return seen

    def authorize(self, *, at: str, batch_id: str, plan_digest: str, base_head: str, branch: str,
                  budget: ev.Budget, max_parallel: int, children: list[ev.PlanChild], confirmation_ref: str,
                  final_verification: list[str] | None, delegate_revisions: bool, resumes: bool,
                  repository: str | None = None, integration: str | None = None,
                  verify_workers: int | None = None, flake_reruns: int | None = None) -> None:
        if not children:
            raise TransitionRefused("batch plan has no enrollable children; nothing to confirm")
        previous = self.authorizations[-1].confirmation_time if self.authorizations else ""
        if at <= previous:
            raise TransitionRefused("a fresh confirmation must be newer than the one before it")
        self.trigger_event(
            ev.BatchAuthorized, at=at, batch_id=batch_id, plan_digest=plan_digest, base_head=base_head,
            branch=branch, budget=budget, max_parallel=max_parallel, children=children, confirmation_time=at,
            confirmation_ref=confirmation_ref, final_verification=final_verification,
            delegate_revisions=delegate_revisions, resumes=resumes, repository=repository, integration=integration,
            verify_workers=verify_workers, flake_reruns=flake_reruns or None,
        )

    def retire(self, *, at: str, batch_id: str) -> None:
        if batch_id in self.retired:
            raise TransitionRefused(f"batch {batch_id} is already retired")
        self.trigger_event(ev.BatchRetired, at=at, batch_id=batch_id)
