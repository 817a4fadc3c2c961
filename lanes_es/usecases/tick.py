"""`tick`: one tick of an Initiative's batch under the batch lock (lanes_es/tick is the tick itself).

The log is loaded under the lock, drift in the projections repaired, the tick run through fresh
ports, each decision saved and materialized as it is made, and the checkpoint brought up after.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lanes_es.adapters.store import StoreConflict
from lanes_es.domain.aggregate import TransitionRefused
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.record import is_terminal
from lanes_es.domain.runner import is_ray
from lanes_es.errors import ServiceError
from lanes_es.exit_codes import EXIT_NEEDS_PERSON, EXIT_OK, EXIT_REFUSED
from lanes_es.ports import KernelError
from lanes_es.tick_input import InstructionInput, LaneOfferInput, RevisionInput, TickInput, TickPorts
from lanes_es.usecases.authorize import LOST_RACE_RETRIES
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.load import current_authorization
from lanes_es.usecases.lock import DEFAULT_LOCK_WAIT, locked
from lanes_es.usecases.save import anchor, repair_drift, require_writable_state, save_and_materialize
from lanes_es.usecases.stats import Timings, git_snapshot, require_stats_file, timed, write_stats

if TYPE_CHECKING:
    from lanes_es.tick import TickOutcome

# upstream's runner turns these store conditions into a rejection instead of an error
_STORE_CONDITION = re.compile(r"retired file-store|kernel store|CAS mismatch|store is busy|locked", re.IGNORECASE)
STORE_CONDITION_NEXT = "settle the reported kernel store condition and retry in the current Host"


@dataclass
class TickResult:
    report: dict[str, Any]
    batch_id: str
    written: bool
    drift: list[str] = field(default_factory=list)
    anchor_problem: str | None = None  # why the checkpoint was not brought up to the log, when it was not

    @property
    def exit_code(self) -> int:
        state = self.report["batch_state"]
        if state == "rejected":
            return EXIT_REFUSED
        if state in ("needs_human", "budget_stopped", "failed", "superseded"):
            return EXIT_NEEDS_PERSON
        return EXIT_OK


def tick(deps: Deps, slug: str, *, max_parallel: int | None = None, offers: list[LaneOfferInput] | None = None,
         instruction: InstructionInput | None = None, revision: RevisionInput | None = None,
         executor_runtime: str | None = None, wait: float = DEFAULT_LOCK_WAIT) -> TickResult:
    """One tick under the batch lock; raises BatchBusy when another tick holds it past `wait` seconds."""
    authorization = current_authorization(deps, slug)
    if authorization is None:
        raise ServiceError("batch_authorization_invalid",
                           f"Initiative {slug} has no current authorization; run `lanes-es authorize {slug}` first")
    deps = _at_coordinator(deps, authorization)
    root = deps.root
    require_writable_state(root, f"tick {slug}")
    require_stats_file(deps.stats_path)
    started = time.perf_counter()
    timings = Timings(git_before=git_snapshot())

    def tick_input(limit: int | None) -> TickInput:
        return TickInput(root=root, initiative_slug=slug, authorization=authorization, now=deps.now(),
                         max_parallel=limit, lane_offers=tuple(offers or ()), lane_instruction=instruction,
                         lane_revision=revision, revision_delegation=authorization.delegate_revisions,
                         executor_runtime=executor_runtime)

    with locked(deps.store, authorization.batch_id, wait):
        batch = deps.store.batch(authorization.batch_id)
        elsewhere = _refuse_in_another_repository(deps, tick_input(None), batch)
        if elsewhere is not None:
            return elsewhere
        repaired = repair_drift(deps, root, batch)
        if batch is None and max_parallel is not None and max_parallel != authorization.max_parallel:
            from lanes_es.tick import refusal_report

            report = refusal_report(tick_input(max_parallel), None, "batch_parallel_mismatch",
                                    f"the authorization covers max_parallel {authorization.max_parallel}")
            return TickResult(report, authorization.batch_id, written=False)
        outcome = _run(deps, tick_input(max_parallel if batch is not None else authorization.max_parallel), batch,
                       timings)
        problem = anchor(deps, root, outcome.batch, timings)
        write_stats(deps.stats_path, started, timings)
        return TickResult(outcome.report, authorization.batch_id, outcome.written, repaired, problem)


def _at_coordinator(deps: Deps, authorization: Any) -> Deps:
    """Every step runs in the batch's coordinator (its log says where); a running batch's coordinator removed
    by hand is made again, a terminal batch's is refused (`coordinator_removed`: its log keeps it all)."""
    from pathlib import Path

    from lanes_es.usecases.coordinator import at_coordinator

    restore = False
    if authorization.coordinator is not None and not (Path(authorization.coordinator) / ".git").exists():
        batch = deps.store.batch(authorization.batch_id)  # read only when the coordinator is gone
        restore = batch is None or not is_terminal(batch.batch_state)
    return at_coordinator(deps, authorization, restore=restore)


def _refuse_in_another_repository(deps: Deps, tick: TickInput, batch: LaneBatch | None) -> TickResult | None:
    """A batch confirmed in another checkout (issue 14): refused before anything here is read or
    written; its audit event goes to the store only (lanes_es/tick/guards.py)."""
    from lanes_es.tick.guards import repository_refusal

    report = repository_refusal(tick, batch, deps.repository_opened(), shared_store=deps.store_is_shared())
    if report is None:
        return None
    if batch is not None:
        deps.store.save(batch)
    return TickResult(report, tick.batch_id, written=False)


def _run(deps: Deps, tick: TickInput, batch: LaneBatch | None, timings: Timings) -> TickOutcome:
    """Run the tick; when an append loses a race (the store refuses its expected version, which
    only a writer bypassing the lock can cause), reread the log and decide again, never writing
    over what the other writer appended."""
    from lanes_es.tick import PlanMismatch, run_lane_batch

    def persist(live: LaneBatch) -> None:
        began = time.perf_counter()
        timings.events += save_and_materialize(deps, tick.root, live)
        timings.store += time.perf_counter() - began

    for attempt in range(LOST_RACE_RETRIES + 1):
        ports = deps.adapters.tick_ports(tick.root, tick.initiative_slug)
        if is_ray(tick.authorization.runner):
            ports = deps.adapters.on_cluster(ports, tick.authorization.runner, tick.batch_id)
        ports.history = ports.history or _store_history(deps.store)
        try:
            return run_lane_batch(tick, batch, timed(ports, timings), persist)
        except PlanMismatch as error:
            raise ServiceError("plan_changed", f"{error}; re-authorize the Initiative") from None
        except TransitionRefused as error:
            if batch is not None:
                raise
            # An authorization recorded by an older version that its batch cannot start with: the way out.
            slug = tick.initiative_slug
            raise ServiceError("batch_authorization_invalid",
                               f"{error}; this authorization cannot start a batch: run `lanes-es retire {slug} "
                               f"--yes` then `lanes-es authorize {slug}`") from None
        except StoreConflict as error:
            if attempt == LOST_RACE_RETRIES:
                return _store_condition_report(deps, tick, ports, str(error))
            batch = deps.store.batch(tick.batch_id)
        except KernelError as error:
            if not _STORE_CONDITION.search(str(error)):
                raise
            return _store_condition_report(deps, tick, ports, str(error))
    raise AssertionError("unreachable")


def _store_condition_report(deps: Deps, tick: TickInput, ports: TickPorts, reason: str) -> TickOutcome:
    """What the log holds is what stands: report it rejected, with only safe release handoffs."""
    from lanes_es.tick import TickContext, TickOutcome, lane_rejection_report, refusal_report

    persisted = deps.store.batch(tick.batch_id)
    if persisted is None:
        return TickOutcome(refusal_report(tick, None, "batch_store_condition", reason), None, written=False)
    context = TickContext(tick=tick, ports=ports, persist_port=lambda _: None, batch=persisted)
    return TickOutcome(lane_rejection_report(context, reason, STORE_CONDITION_NEXT), persisted, written=False)


def _store_history(store: Any) -> Any:
    from lanes_es.adapters.integration_history import StoreHistory  # read only by a round in the adaptive mode

    return StoreHistory(store)
