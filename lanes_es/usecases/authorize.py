"""`authorize`: record the literal user's yes to a `Confirmation` on the Initiative.

The confirmation was decided on the Initiative as it stood before the user answered; it is
decided again on the Initiative as it stands now (`_still_confirms`), so two confirmations given
at once never mint two batches. The append carries the Initiative's version: an append that lost
a race to another writer rereads and decides again.
"""

from __future__ import annotations

import uuid

from lanes_es.adapters.store import StoreConflict
from lanes_es.domain import events as ev
from lanes_es.domain.aggregate import TransitionRefused
from lanes_es.domain.ids import batch_branch_name
from lanes_es.domain.initiative import Initiative
from lanes_es.domain.record import is_terminal
from lanes_es.domain.repository import RepositoryIdentity
from lanes_es.errors import Refusal, ServiceError
from lanes_es.usecases.confirmation import Confirmation
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.lock import DEFAULT_LOCK_WAIT, locked
from lanes_es.usecases.plan import plan_digest_now
from lanes_es.usecases.save import require_writable_state

# How often an append that lost a race (the store refused its expected version) rereads and decides again.
LOST_RACE_RETRIES = 3


def authorize(deps: Deps, confirmation: Confirmation) -> ev.BatchAuthorized:
    """The authorization recorded for `confirmation` (or the very same one another confirmation recorded first)."""
    require_writable_state(deps.root, f"authorize {confirmation.slug}")
    with locked(deps.store, deps.store.initiative_lock_name(confirmation.slug), DEFAULT_LOCK_WAIT):
        _require_unmoved_since_gate(deps, confirmation)
        for attempt in range(LOST_RACE_RETRIES + 1):
            initiative = deps.store.initiative(confirmation.slug)
            standing = _still_confirms(deps, initiative, confirmation)
            if standing is not None:
                return standing
            now = deps.now()
            initiative = initiative or deps.store.new_initiative(now, confirmation.slug)
            try:
                initiative.authorize(
                    at=now, batch_id=confirmation.batch_id, plan_digest=confirmation.plan_digest,
                    base_head=confirmation.base_head, branch=batch_branch_name(confirmation.slug),
                    budget=confirmation.budget, max_parallel=confirmation.max_parallel,
                    children=confirmation.children, confirmation_ref=f"lanes-es-confirm-{uuid.uuid4().hex[:16]}",
                    final_verification=confirmation.final_verification,
                    delegate_revisions=confirmation.delegate_revisions, resumes=confirmation.resumes,
                    repository=deps.user_checkout, repository_id=deps.store.recorded_repository_id(),
                    coordinator=deps.root if deps.checkout is not None else None,
                    integration=confirmation.integration,
                    verify_workers=confirmation.verify_workers, flake_reruns=confirmation.flake_reruns,
                    executor_budget=confirmation.executor_budget, runner=confirmation.runner)
            except TransitionRefused as error:
                raise ServiceError("confirmation_failed", str(error)) from None
            try:
                deps.store.save(initiative)
            except StoreConflict:
                if attempt == LOST_RACE_RETRIES:
                    raise ServiceError("confirmation_superseded",
                                       f"Initiative {confirmation.slug} kept changing while this confirmation was "
                                       f"recorded; nothing was written: run `lanes-es authorize "
                                       f"{confirmation.slug}` again") from None
                continue
            deps.adapters.ensure_state_ignored(deps.root)
            return initiative.authorizations[-1]
    raise AssertionError("unreachable")


def _require_unmoved_since_gate(deps: Deps, confirmation: Confirmation) -> None:
    """upstream's checks after its native gate (docs/upstream.md#reason-codes,
    #authorization-reuse-and-the-tool-surface): the user answered on facts
    read before the prompt; the plan, the repository and HEAD are read again, and a yes is recorded only
    when none moved. Refused with upstream's key; nothing is written (no authorize refusal writes an event:
    the Initiative's log holds only what a user confirmed)."""
    slug = confirmation.slug
    again = f"nothing was recorded: run `lanes-es authorize {slug}` again to confirm it as it now stands"
    digest, unreadable = plan_digest_now(deps, slug, confirmation.own_tasks)
    if digest is None:
        raise ServiceError("plan_became_unreadable", f"the batch plan of Initiative {slug} became unreadable "
                                                     f"after the confirmation ({unreadable}); {again}")
    if digest != confirmation.plan_digest:
        raise ServiceError("plan_changed", f"the batch plan of Initiative {slug} changed after the confirmation "
                                           f"(it is now {digest}, the user confirmed {confirmation.plan_digest}); "
                                           f"{again}")
    if confirmation.repository is None or confirmation.seen_head is None:
        return  # built by hand (tests, tools): nothing was seen to compare the repository against
    try:
        repository, head = deps.repository_now(), deps.adapters.head(deps.root)
    except (Refusal, OSError) as error:
        raise ServiceError("repository_became_unreadable",
                           f"the git repository {confirmation.repository.checkout} became unreadable after the "
                           f"confirmation ({error}); {again}") from None
    if repository != confirmation.repository and not _id_made_since(confirmation.repository, repository):
        raise ServiceError("batch_repository_changed",
                           f"the confirmation was given for {confirmation.repository.describe()}, and this "
                           f"checkout is now {repository.describe()}; {again}")
    if head != confirmation.seen_head:
        raise ServiceError("head_moved", f"HEAD of {deps.root} moved after the confirmation (from "
                                         f"{confirmation.seen_head} to {head}); {again}")


def _id_made_since(confirmed: RepositoryIdentity, now: RepositoryIdentity) -> bool:
    """The clone had no id when the user was asked and another command made one since: the same clone."""
    return confirmed.repository_id is None and confirmed.checkout == now.checkout


def _still_confirms(deps: Deps, initiative: Initiative | None, confirmation: Confirmation) -> ev.BatchAuthorized | None:
    """None when `confirmation` still applies to the Initiative as it now stands (record it). When another
    confirmation started a batch meanwhile, that batch's authorization if it has the very facts this one
    confirmed (the same yes, given twice: nothing more is written), else the refusal `confirmation_superseded`."""
    current = initiative.current if initiative else None
    recorded = deps.store.batch(current.batch_id) if current else None
    open_batch = current if current is not None and not (recorded and is_terminal(recorded.batch_state)) else None
    known = initiative.batch_ids() if initiative else []
    if open_batch is not None and open_batch.batch_id == confirmation.batch_id:
        return None
    if open_batch is None and confirmation.batch_id not in known:
        return None
    if open_batch is not None and confirmation.batch_id not in known and (
            open_batch.plan_digest, open_batch.base_head, open_batch.max_parallel, open_batch.budget,
            open_batch.executor_budget) == (confirmation.plan_digest, confirmation.base_head,
                                            confirmation.max_parallel, confirmation.budget,
                                            confirmation.executor_budget):
        return open_batch
    now_open = f"batch {open_batch.batch_id} is now its open batch" if open_batch else "it has no open batch now"
    raise ServiceError("confirmation_superseded",
                       f"Initiative {confirmation.slug} changed while this confirmation was given ({now_open}; "
                       f"this one was for batch {confirmation.batch_id}); nothing was written: run `lanes-es "
                       f"authorize {confirmation.slug}` again to confirm it as it now stands")
