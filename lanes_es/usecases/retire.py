"""`retire`: upstream's retire_stale_batch: the active record becomes `superseded`, refused while a child is
in flight. The target is read before the literal-user gate opens (every refusal comes there), and the
write is a compare-and-swap on the digest of the record's exact bytes (docs/upstream.md#retiring-a-batch):
a record that moved while the user was asked is not retired.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.record import IN_FLIGHT, is_terminal
from lanes_es.domain.report import RETIRE_NEXT_ACTION, RETIRE_REASON, lane_report
from lanes_es.domain.repository import RepositoryIdentity
from lanes_es.errors import ServiceError
from lanes_es.projections.batch import documents_of
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.load import current_authorization, initiative
from lanes_es.usecases.lock import DEFAULT_LOCK_WAIT, locked
from lanes_es.usecases.save import anchor, require_writable_state, save_and_materialize


@dataclass(frozen=True)
class RetireTarget:
    """The active batch as read before the retire gate: its id and the digest of its record's exact bytes."""

    slug: str
    batch_id: str
    record_digest: str


def retire_target(deps: Deps, slug: str) -> RetireTarget:
    """What `retire` would retire, read before the literal-user gate opens; every refusal comes here."""
    current = current_authorization(deps, slug)
    if current is None:
        raise ServiceError("stale_batch_absent", f"Initiative {slug} has no active batch to retire; "
                                                 f"`lanes-es authorize {slug}` starts a new one")
    batch = deps.store.batch(current.batch_id)
    _refuse_retiring_elsewhere(deps, slug, current)
    _require_retirable(batch)
    require_writable_state(deps.root, f"retire {slug}")
    return RetireTarget(slug=slug, batch_id=current.batch_id, record_digest=record_digest(batch))


def retire(deps: Deps, slug: str, expected: RetireTarget | None = None) -> dict[str, Any]:
    """The retired batch's report. With `expected` (the target read before the gate), a compare-and-swap."""
    target = expected or retire_target(deps, slug)
    with locked(deps.store, target.batch_id, DEFAULT_LOCK_WAIT):
        found = initiative(deps, slug)
        current = found.current if found else None
        batch = deps.store.batch(target.batch_id)
        if current is None or current.batch_id != target.batch_id or record_digest(batch) != target.record_digest:
            raise ServiceError("plan_changed", f"batch run state {target.batch_id} changed while the user was "
                                               f"deciding; nothing was retired. Run `lanes-es retire {slug}` "
                                               f"again to decide on the record as it now stands")
        _require_retirable(batch)
        now = deps.now()
        if batch is not None:
            batch.supersede(now, RETIRE_REASON, RETIRE_NEXT_ACTION)
            save_and_materialize(deps, deps.root, batch)
            anchor(deps, deps.root, batch)
        found.retire(at=now, batch_id=current.batch_id)  # type: ignore[union-attr]
        deps.store.save(found)
        if batch is None:
            return {"batch_id": current.batch_id, "batch_state": "superseded", "reason": RETIRE_REASON}
        return batch.report or lane_report(batch.record, RETIRE_REASON, RETIRE_NEXT_ACTION)


def retire_and_remove_coordinator(deps: Deps, slug: str, expected: RetireTarget) -> tuple[dict[str, Any], str]:
    """`retire`, run in the batch's coordinator (`deps` are the user's checkout's), then that coordinator worktree
    removed when it holds nothing uncommitted (a superseded batch is terminal): the report, and what became of
    the worktree, in words ("" for a batch run in place)."""
    from lanes_es.usecases.coordinator import coordinator_of, remove_coordinator

    authorization = current_authorization(deps, slug)
    report = retire(coordinator_of(deps, slug), slug, expected)
    return report, remove_coordinator(deps, authorization)


def _refuse_retiring_elsewhere(deps: Deps, slug: str, authorization: ev.BatchAuthorized) -> None:
    """Retiring writes the superseded record and its checkpoint into this checkout: from a checkout the
    batch was not confirmed in (a shared store read from a copy), it is refused as a tick is."""
    from lanes_es.domain.drift import decide_repository

    drift = decide_repository(RepositoryIdentity.of_authorization(authorization), deps.repository_opened(),
                              deps.store_is_shared())
    if drift is not None:
        recorded = authorization.repository
        raise ServiceError(drift.code, f"{drift.detail}; nothing was retired. Run `lanes-es retire {slug}` in "
                                       f"{recorded}, where the batch's record and Lanes are")


def _require_retirable(batch: LaneBatch | None) -> None:
    if batch is not None and is_terminal(batch.batch_state):
        raise ServiceError("stale_batch_absent", f"batch {batch.id} is already {batch.batch_state}")
    if batch is not None and batch.children_in(*IN_FLIGHT):
        raise ServiceError("stale_batch_in_flight",
                           f"batch run state {batch.id} is {batch.batch_state} but a child is still mid-flight; "
                           f"let its Lanes settle (tick) or park them before retiring")


def record_digest(batch: LaneBatch | None) -> str:
    """sha256 of the v2 record's canonical bytes as the log has them (of nothing for a batch authorized but
    never ticked): what retire's compare-and-swap compares, and what the MCP gate carries across its rounds."""
    import hashlib

    return hashlib.sha256(documents_of(batch).record_bytes() if batch is not None else b"").hexdigest()
