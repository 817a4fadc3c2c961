"""`land`: a completed batch's branch onto the user's branch, by fast-forward only (docs/how-to/land-on-main.md).

Refused, with nothing changed, for a batch that did not complete (or whose final verification failed), a
branch that is not a fast-forward, or uncommitted work the fast-forward would overwrite. Once landed, the
batch's files (its state and report) are written into the user's checkout, where `verify` finds them, and
its coordinator worktree is removed when it holds nothing uncommitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from lanes_es.domain.next_steps import failed_final_verification
from lanes_es.domain.record import expected_batch_head
from lanes_es.errors import ServiceError
from lanes_es.usecases.coordinator import remove_coordinator
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.load import current_authorization


@dataclass(frozen=True)
class Landed:
    batch_id: str
    branch: str
    onto: str
    before: str
    after: str
    coordinator: str  # what became of the coordinator worktree, in words ("" in place)

    def text(self) -> str:
        moved = (f"{self.onto} already holds {self.branch} ({self.after[:12]})" if self.before == self.after
                 else f"landed {self.branch} on {self.onto}: fast-forward {self.before[:12]}..{self.after[:12]}")
        return "; ".join(part for part in (f"batch {self.batch_id}: {moved}", self.coordinator) if part)


def land(deps: Deps, slug: str, onto: str | None = None) -> Landed:
    authorization = current_authorization(deps, slug)
    batch = deps.store.batch(authorization.batch_id) if authorization is not None else None
    if authorization is None or batch is None:
        raise ServiceError("batch_not_found", f"Initiative {slug} has no batch to land; `lanes-es run {slug} ...` "
                                              f"runs one")
    state = batch.batch_state
    if state != "completed":
        raise ServiceError("batch_not_completed", f"batch {batch.id} is {state}, and only a completed batch lands; "
                                                  f"nothing was landed: `lanes-es status {slug}` says what it needs")
    failed = failed_final_verification(batch.report or {})
    if failed:
        raise ServiceError("final_verification_failed",
                           f"batch {batch.id} completed but its final verification failed ({', '.join(failed)}); "
                           f"nothing was landed: fix it on {authorization.branch}, then land it yourself")
    coordinators = deps.adapters.coordinators()
    target = onto or coordinators.current_branch(deps.user_checkout)
    if target is None:
        raise ServiceError("no_branch_to_land_on", f"{deps.user_checkout} is on a detached HEAD; nothing was "
                                                   f"landed: name the branch with `lanes-es land {slug} --onto "
                                                   f"BRANCH`")
    if target == authorization.branch:
        raise ServiceError("no_branch_to_land_on", f"{deps.user_checkout} is on the batch branch {target} itself "
                                                   f"(a batch run in place); nothing was landed: name your branch "
                                                   f"with `lanes-es land {slug} --onto main`")
    landing = coordinators.land(deps.user_checkout, authorization.branch, expected_batch_head(batch.record),
                                target, slug)
    left = ""
    if authorization.coordinator is not None:
        from lanes_es.usecases.rebuild import rebuild

        # the batch's files follow it into the checkout it landed in, where `verify` reads them
        rebuild(deps.store, deps.user_checkout, [batch.id], check=False)
        left = remove_coordinator(deps, authorization)
    return Landed(batch_id=batch.id, branch=authorization.branch, onto=target, before=landing.before,
                  after=landing.after, coordinator=left)
