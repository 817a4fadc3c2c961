"""The batch capability: what a literal-user confirmation grants, and which child slots it has spent.

Upstream keeps an in-memory registry of capabilities issued by the Host's gate. Here a
capability is built each tick from the Initiative's current authorization, and its
consumed slots are rehydrated from the batch record (rehydrateConsumption), so nothing
about authority lives outside the log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import events as ev


class AuthorizationError(ValueError):
    """The capability does not cover what was asked; the message is upstream's."""


@dataclass(frozen=True)
class Binding:
    """What a tick claims the capability covers."""

    batch_id: str
    plan_digest: str
    base_head: str
    initiative_slug: str
    budget: ev.Budget


@dataclass
class BatchCapability:
    """One confirmation, issued at `issued_at` (its confirmation_time), and the slots it has consumed."""

    authorization: ev.BatchAuthorized
    initiative_slug: str
    consumed: set[str] = field(default_factory=set)

    @property
    def issued_at(self) -> str:
        return self.authorization.confirmation_time

    @property
    def children(self) -> list[ev.PlanChild]:
        return list(self.authorization.children)

    def validate(self, binding: Binding) -> str:
        """The capability's issue time when it covers `binding`; AuthorizationError otherwise."""
        granted = self.authorization
        if binding.batch_id != granted.batch_id:
            raise AuthorizationError(f"batch authorization covers batch {granted.batch_id}, not {binding.batch_id}")
        if binding.initiative_slug != self.initiative_slug:
            raise AuthorizationError("batch authorization covers another Initiative")
        if binding.plan_digest != granted.plan_digest:
            raise AuthorizationError("batch plan digest does not match the confirmed child plan")
        if binding.base_head != granted.base_head:
            raise AuthorizationError("batch authorization base_head does not match")
        if binding.budget != granted.budget:
            raise AuthorizationError("batch authorization budget does not match")
        return granted.confirmation_time

    def is_child_consumed(self, task_id: str) -> bool:
        return task_id in self.consumed

    def consume_child(self, task_id: str) -> None:
        """Spend the child's slot; upstream's enrollment refusals otherwise."""
        if task_id not in {child.task_id for child in self.authorization.children}:
            raise AuthorizationError(f"batch_child_not_in_plan: {task_id}")
        if task_id in self.consumed:
            raise AuthorizationError(f"batch_child_slot_consumed: {task_id}")
        if len(self.consumed) >= self.authorization.budget.max_children:
            raise AuthorizationError(f"max_children budget exhausted ({self.authorization.budget.max_children})")
        self.consumed.add(task_id)


@dataclass(frozen=True)
class BatchEnrollment:
    """What the coordinator hands the kernel to enroll one child in a Lane."""

    capability: BatchCapability
    batch_id: str
    expected_head: str
