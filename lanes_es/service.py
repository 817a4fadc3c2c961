"""The service layer: what the command line, the MCP server and the autopilot call.

Each use case loads the aggregates, holds the batch lock, runs the domain or the tick
through ports, saves the new events and materializes the projections. The ports come
from an `Adapters` factory chosen at the composition root (lanes_es/bootstrap.py).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from lanes_es.adapters.store import BatchLockHeld, EventStore, StoreConflict, default_store_url, describe_holder
from lanes_es.domain import events as ev
from lanes_es.domain.aggregate import TransitionRefused
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.candidates import DEFAULT_INTEGRATION, INTEGRATION_MODES, SERIAL
from lanes_es.domain.ids import batch_branch_name, is_valid_id
from lanes_es.domain.initiative import Initiative
from lanes_es.domain.record import IN_FLIGHT, is_terminal
from lanes_es.domain.repository import RepositoryIdentity
from lanes_es.errors import Refusal
from lanes_es.exit_codes import EXIT_INTERNAL, EXIT_NEEDS_PERSON, EXIT_OK, EXIT_REFUSED
from lanes_es.domain.report import RETIRE_NEXT_ACTION, RETIRE_REASON, lane_report
from lanes_es.ports import KernelError, PortError
from lanes_es.tick_input import InstructionInput, LaneOfferInput, RevisionInput, TickInput, TickPorts

if TYPE_CHECKING:
    from lanes_es.tick import TickOutcome

# The tick (lanes_es.tick) is imported by the use cases that run it, so that `status` starts fast.
from lanes_es.projections.batch import documents_of, drift, materialize

# upstream's runner turns these store conditions into a rejection instead of an error
_STORE_CONDITION = re.compile(r"retired file-store|kernel store|CAS mismatch|store is busy|locked", re.IGNORECASE)
STORE_CONDITION_NEXT = "settle the reported kernel store condition and retry in the current Host"

EXIT_REJECTED, EXIT_STOPPED = EXIT_REFUSED, EXIT_NEEDS_PERSON  # the names the service's callers use

# How long a tick waits for another tick of its batch to end before it reports busy.
DEFAULT_LOCK_WAIT = 5.0
# How often a tick whose append lost a race (the store refused its expected version) rereads
# the log and decides again before it reports the store condition.
LOST_RACE_RETRIES = 3


class Adapters(Protocol):
    def tick_ports(self, root: str, slug: str) -> TickPorts:
        """Fresh ports for one tick (caches inside them live for one tick only)."""

    def head(self, root: str) -> str:
        """The coordinator's HEAD commit."""

    def ensure_state_ignored(self, root: str) -> bool:
        """Add `.imm/state/` to `.git/info/exclude` when git does not ignore it; True when added."""

    def read_initiative(self, root: str, slug: str) -> dict[str, Any]:
        """The Initiative's observation (the Local carrier)."""

    def anchor_log(self, root: str, batch_id: str, version: int, read_rows: Callable[[int], Any]) -> Any:
        """Bring the batch's signed checkpoint in git up to `version` (lanes_es/audit/anchor.py)."""

    def repository_identity(self, root: str) -> RepositoryIdentity:
        """The repository id and checkout `root` is in now; a Refusal or OSError when it cannot be read."""


class ServiceError(Refusal):
    """A use case refused: `code` is stable, the message says what to do next."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.detail = message


class BatchBusy(ServiceError, StoreConflict):
    """Another tick holds the batch lock: an outcome, not an error. Nothing was read for writing and
    nothing was written; the caller ticks again shortly (or waits longer with `wait`).

    A ServiceError (the command line refuses with exit 2) and a StoreConflict (callers that retry
    on store contention keep doing so).
    """

    def __init__(self, batch_id: str, holder: dict[str, Any] | None, waited: float) -> None:
        self.batch_id = batch_id
        self.holder = holder
        self.waited = waited
        ServiceError.__init__(self, "batch_busy",
                              f"batch {batch_id} is busy: its lock is held by {describe_holder(holder)}; nothing was "
                              f"written (waited {waited:g} s); tick again shortly, or wait longer with --wait SECONDS")

    def report(self) -> dict[str, Any]:
        """The `--json` and MCP form of a busy refusal."""
        return {"outcome": "busy", "batch_id": self.batch_id, "holder": self.holder, "waited_seconds": self.waited,
                "reason": "batch_busy", "message": self.detail,
                "next_action": "tick again shortly; `lanes-es tick SLUG --wait SECONDS` waits for the lock"}


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
            return EXIT_REJECTED
        if state in ("needs_human", "budget_stopped", "failed", "superseded"):
            return EXIT_STOPPED
        return EXIT_OK


@dataclass
class Confirmation:
    """The facts a literal user confirms, shown before the answer is recorded."""

    slug: str
    batch_id: str
    resumes: bool
    plan: dict[str, Any]
    children: list[ev.PlanChild]
    plan_digest: str
    base_head: str
    budget: ev.Budget
    max_parallel: int
    final_verification: list[str] | None
    delegate_revisions: bool
    integration: str = DEFAULT_INTEGRATION  # lanes-es's own choice; kept out of upstream's facts
    verify_workers: int | None = None
    flake_reruns: int = 0
    # What the gate saw before the user answered, read again after it (`LanesService.authorize`):
    # the checkout and its repository id, the coordinator's HEAD, and the tasks kept as the batch's own
    # when the plan is derived (None: a new plan, as `lanes-es plan` derives it).
    repository: RepositoryIdentity | None = None
    seen_head: str | None = None
    own_tasks: tuple[str, ...] | None = None

    def facts(self) -> dict[str, Any]:
        return {
            "initiative_slug": self.slug,
            **({"repository": self.repository.checkout} if self.repository is not None else {}),
            "batch_id": self.batch_id,
            "resumes_parked_batch": self.resumes,
            "branch": batch_branch_name(self.slug),
            "base_head": self.base_head,
            "plan_digest": self.plan_digest,
            "children": [{"task_id": c.task_id, "slice_id": c.slice_id, "blocked_by": list(c.blocked_by)}
                         for c in self.children],
            "excluded": [c for c in self.plan.get("children", []) if c.get("status") != "enrollable"],
            "budget": self.budget.plain(),
            "lane_mode": {
                "max_parallel": self.max_parallel,
                "parallel_groups": self.plan.get("parallel_groups", []),
                "serialized": self.plan.get("scope_conflicts", []),
                **({"final_verification": self.final_verification} if self.final_verification else {}),
                "offer_revision_delegation": True,
                "delegate_revisions": self.delegate_revisions,
            },
        }


@dataclass
class LanesService:
    root: str
    store: EventStore
    adapters: Adapters
    now: Callable[[], str]
    stats_path: str | None = None

    # ------------------------------------------------------------ reading

    def initiative(self, slug: str) -> Initiative | None:
        _check_slug(slug)
        return self.store.initiative(slug)

    def active_batch(self, slug: str) -> LaneBatch | None:
        initiative = self.initiative(slug)
        if initiative is None or initiative.current is None:
            return None
        return self.store.batch(initiative.current.batch_id)

    def batch(self, batch_id: str) -> LaneBatch:
        if not is_valid_id(batch_id):
            raise ServiceError("invalid_batch_id", f"{batch_id!r} is not a batch id")
        batch = self.store.batch(batch_id)
        if batch is None:
            raise ServiceError("batch_not_found", f"no batch {batch_id} in the store {self.store.shown_url}; "
                                                  f"`lanes-es status` lists the Initiative's batches")
        return batch

    def plan(self, slug: str) -> dict[str, Any]:
        """The batch plan as the coordinator reads it now (docs/upstream.md#the-plan-and-child-statuses)."""
        _check_slug(slug)
        ports = self.adapters.tick_ports(self.root, slug)
        from lanes_es.adapters.plan_observer import read_plan_inputs  # with the intent parser: not for `status`

        try:
            inputs = read_plan_inputs(self.root, slug, read_initiative=self.adapters.read_initiative,
                                      batch_git=ports.batch_git, kernel=ports.kernel)
        except PortError as error:
            raise ServiceError("plan_projection_failed", str(error)) from None
        # Upstream's plan keeps only a reason code; the precise cause and its fix go beside it.
        intent_errors = {task: intent_error_text(read, task, slug) for task, read in inputs.reads.items()
                         if isinstance(read, str) and task not in inputs.settled}
        self._refuse_commands_that_cannot_run(slug, inputs)
        try:
            plan = inputs.project()
        except ValueError as error:
            causes = "".join(f"; {task}: {text}" for task, text in intent_errors.items())
            if inputs.settled:  # said as `run` says it: every task is done, and how to add more
                causes += (f"; already done (their audit pairs are in this checkout): {', '.join(inputs.settled)}; "
                           f"add tasks with `lanes-es initiative add-task {slug} TASK ...` to run a new batch")
            raise ServiceError("empty_enrollable_set" if "no enrollable" in str(error) else "plan_projection_failed",
                               f"{error}{causes}") from None
        plan["intent_errors"] = intent_errors
        return plan

    # ------------------------------------------------------------ authorize

    def confirmation(self, slug: str, *, max_parallel: int | None = None, max_children: int | None = None,
                     qa_failure_limit: int | None = None, final_verification: list[str] | None = None,
                     delegate_revisions: bool = False, integration: str | None = None,
                     verify_workers: int | None = None, flake_reruns: int | None = None) -> Confirmation:
        """What `authorize` will ask the user to confirm; nothing is written.

        `integration` (serial, speculative or batched; default speculative) and `verify_workers`
        (candidate checks run at once; default the batch's max_parallel) apply to a new batch; a
        recorded batch keeps the mode it was prepared with."""
        # Whatever authorize accepts, the tick must be able to record: the same bounds as the v2 validator.
        from lanes_es.domain.inputs import parse_positive_count

        max_parallel = parse_positive_count(max_parallel, "max_parallel")
        max_children = parse_positive_count(max_children, "max_children")
        qa_failure_limit = parse_positive_count(qa_failure_limit, "qa_failure_limit")
        self.require_writable_state(f"authorize {slug}")
        if integration is not None and integration not in INTEGRATION_MODES:
            raise ServiceError("invalid_integration_mode", f"integration mode {integration!r} is unknown; choose "
                                                           f"{', '.join(INTEGRATION_MODES)}")
        if verify_workers is not None and verify_workers < 1:
            raise ServiceError("invalid_verify_workers", "verify_workers must be at least 1")
        if flake_reruns is not None and not 0 <= flake_reruns <= 5:
            raise ServiceError("invalid_flake_reruns", "flake_reruns must be 0 to 5")
        repository = self._repository_now()
        initiative = self.initiative(slug)
        current = initiative.current if initiative else None
        recorded = self.store.batch(current.batch_id) if current else None
        if current is not None and recorded is not None and not is_terminal(recorded.batch_state):
            self._require_plan_unchanged(slug, recorded)
            return replace(self._reconfirmation(slug, current, recorded, max_parallel, delegate_revisions),
                           repository=repository, seen_head=self.adapters.head(self.root),
                           own_tasks=tuple(child["task_id"] for child in recorded.record["children"]))
        plan = self.plan(slug)
        self._refuse_unreadable_intents(slug, plan)
        self._refuse_what_the_preflight_would(slug, self.adapters.head(self.root))
        batch_id = f"batch-{slug}-{uuid.uuid4()}"
        if current is not None and recorded is None:
            # Authorized but never ticked: confirm it again as it stands, or, when the plan moved
            # since, confirm the new plan under the same (never started) batch id.
            if plan["plan_digest"] == current.plan_digest:
                return replace(self._reconfirmation(slug, current, None, max_parallel, delegate_revisions,
                                                    integration, verify_workers, flake_reruns),
                               repository=repository, seen_head=self.adapters.head(self.root))
            batch_id = current.batch_id
        enrollable: list[ev.PlanChild] = plan["enrollable"]
        budget = ev.Budget(max_children=max_children or len(enrollable),
                           qa_failure_limit=qa_failure_limit or plan["budget"]["qa_failure_limit"])
        if budget.max_children > len(enrollable) or budget.max_children < 1:
            raise ServiceError("invalid_budget", f"max_children must be 1 to {len(enrollable)} (the enrollable children)")
        head = self.adapters.head(self.root)
        return Confirmation(slug=slug, batch_id=batch_id, resumes=False, plan=plan,
                            children=enrollable, plan_digest=plan["plan_digest"], base_head=head,
                            budget=budget, max_parallel=max_parallel or 1, final_verification=final_verification or None,
                            delegate_revisions=delegate_revisions, integration=integration or DEFAULT_INTEGRATION,
                            verify_workers=verify_workers, flake_reruns=flake_reruns or 0,
                            repository=repository, seen_head=head)

    def _refuse_what_the_preflight_would(self, slug: str, head: str) -> None:
        """The first tick of a new batch runs the batch-branch preflight (docs/upstream.md#the-batch-branch-preflight);
        what it would refuse (a dirty tree, an earlier batch's imm/<slug>) is refused before the user is asked."""
        checked = self.adapters.tick_ports(self.root, slug).batch_git.preflight(self.root, slug, head, reuse_head=head,
                                                                                  create=False)
        if not checked.ok:
            from lanes_es.domain.next_steps import command_line_next

            fix = command_line_next({"batch_state": "rejected", "initiative_slug": slug,
                                     "reason": f"{checked.reason}: {checked.message}"})
            fix = fix.replace(f"then `lanes-es tick {slug}`", "then confirm again")
            raise ServiceError(checked.reason, f"{checked.message}; nothing was confirmed: {fix}")

    def _repository_now(self) -> RepositoryIdentity:
        """The checkout this service runs in and its repository id, read from the files now when the adapters
        can (the gate compares them after the user's answer), else as the service was opened."""
        read = getattr(self.adapters, "repository_identity", None)
        return self._repository_opened() if read is None else read(self.root)

    def _refuse_commands_that_cannot_run(self, slug: str, inputs: Any) -> None:
        """An intent valid by upstream's rules (its `verification` only has to be a string) whose descriptor
        breaks descriptor v2 (a control character in an argument, ...) would fail every QA of its Lane: refused
        before anything is confirmed rather than planned."""
        from lanes_es.domain.descriptor import acceptance_problem

        for task, read in inputs.reads.items():
            if isinstance(read, str) or task in inputs.settled:
                continue
            problem = acceptance_problem(read.intent)
            if problem is not None:
                raise ServiceError("invalid_verification_descriptor",
                                   f"task {task}: {read.path} {problem}; this check could never run, so nothing was "
                                   f"confirmed: correct the descriptor in {read.path}, commit it, then run "
                                   f"`lanes-es plan {slug}` again")

    def _refuse_unreadable_intents(self, slug: str, plan: dict[str, Any]) -> None:
        """An intent this user cannot read is no plan decision (a fix of its mode would change the plan under the
        batch): refused before anything is confirmed, where a malformed or untracked one is only excluded."""
        for task in plan.get("intent_errors", {}):
            path = Path(self.root) / "docs" / "plans" / f"{task}.intent.json"
            if path.exists() and not os.access(path, os.R_OK):
                raise ServiceError("intent_unreadable",
                                   f"{path} cannot be read by this user (permission denied), so task {task} cannot "
                                   f"be planned; nothing was confirmed: fix its owner or mode (chmod u+r {path}), "
                                   f"then run `lanes-es authorize {slug}` again")

    def _require_plan_unchanged(self, slug: str, recorded: LaneBatch) -> None:
        """A recorded batch runs the plan it was confirmed on; a changed plan is a new batch (upstream:
        "a changed plan is not repaired by confirmation alone")."""
        own = tuple(child["task_id"] for child in recorded.record["children"])
        digest, unreadable = self._plan_digest_now(slug, own)
        if digest is None:
            digest = f"underivable ({unreadable})"
        if digest != recorded.record["plan_digest"]:
            raise ServiceError("batch_plan_digest_changed",
                               f"the Initiative or its intents changed after batch {recorded.id} was confirmed (the plan "
                               f"is now {digest}, the batch runs {recorded.record['plan_digest']}); a batch never runs "
                               f"another plan. Put the plan back as it was, or retire the batch with `lanes-es retire "
                               f"{slug}` (its Lanes and commits are kept) and authorize the new plan as a new batch")

    def _reconfirmation(self, slug: str, current: ev.BatchAuthorized, recorded: LaneBatch | None,
                        max_parallel: int | None, delegate_revisions: bool, integration: str | None = None,
                        verify_workers: int | None = None, flake_reruns: int | None = None) -> Confirmation:
        """A fresh confirmation of the active batch: same plan and base, a newer confirmation time."""
        recorded_parallel = recorded.record["max_parallel"] if recorded else current.max_parallel
        if max_parallel is not None and max_parallel != recorded_parallel:
            raise ServiceError("batch_parallel_mismatch", f"the recorded batch runs with max_parallel {recorded_parallel}")
        children, digest = list(current.children), current.plan_digest
        if recorded is not None and recorded.record.get("reseals"):
            identities = recorded.record["intent_identities"]
            children = [ev.PlanChild(task_id=c.task_id, slice_id=c.slice_id, blocked_by=list(c.blocked_by),
                                     **identities[c.task_id]) for c in children]
            digest = recorded.record["plan_digest"]
        return Confirmation(slug=slug, batch_id=current.batch_id,
                            resumes=recorded is not None and recorded.batch_state == "needs_human",
                            plan={"parallel_groups": [], "scope_conflicts": []}, children=children,
                            plan_digest=digest, base_head=current.base_head, budget=current.budget,
                            max_parallel=recorded_parallel, final_verification=current.final_verification,
                            delegate_revisions=delegate_revisions,
                            integration=(recorded.integration if recorded is not None
                                         else integration or current.integration or SERIAL),
                            verify_workers=(recorded.verify_workers if recorded is not None
                                            else verify_workers or current.verify_workers),
                            flake_reruns=(recorded.flake_reruns if recorded is not None
                                          else flake_reruns or current.flake_reruns or 0))

    def require_writable_state(self, command: str) -> None:
        """A command that writes a batch's state files refuses before it records anything when it could not."""
        from lanes_es.projections.files import unwritable_state_dir

        blocked = unwritable_state_dir(self.root)
        if blocked is not None:
            cause = "cannot be written by this user" if blocked.is_dir() else "is a file, not a directory"
            raise ServiceError("state_not_writable",
                               f"{blocked} {cause}, so the batch's state files (.imm/state/batches/) cannot be "
                               f"written; nothing was recorded: fix its owner or mode (chmod u+w {blocked}), or run "
                               f"as its owner, then run `lanes-es {command}` again")

    def authorize(self, confirmation: Confirmation) -> ev.BatchAuthorized:
        """Record the literal user's yes to `confirmation` on the Initiative.

        The confirmation was decided on the Initiative as it stood before the user answered; it is
        decided again on the Initiative as it stands now (`_still_confirms`), so two confirmations given
        at once never mint two batches. The append carries the Initiative's version: an append that lost
        a race to another writer rereads and decides again.
        """
        self.require_writable_state(f"authorize {confirmation.slug}")
        with self._locked(self.store.initiative_lock_name(confirmation.slug), DEFAULT_LOCK_WAIT):
            self._require_unmoved_since_gate(confirmation)
            for attempt in range(LOST_RACE_RETRIES + 1):
                initiative = self.store.initiative(confirmation.slug)
                standing = self._still_confirms(initiative, confirmation)
                if standing is not None:
                    return standing
                now = self.now()
                initiative = initiative or self.store.new_initiative(now, confirmation.slug)
                try:
                    initiative.authorize(
                        at=now, batch_id=confirmation.batch_id, plan_digest=confirmation.plan_digest,
                        base_head=confirmation.base_head, branch=batch_branch_name(confirmation.slug),
                        budget=confirmation.budget, max_parallel=confirmation.max_parallel,
                        children=confirmation.children, confirmation_ref=f"lanes-es-confirm-{uuid.uuid4().hex[:16]}",
                        final_verification=confirmation.final_verification,
                        delegate_revisions=confirmation.delegate_revisions, resumes=confirmation.resumes,
                        repository=self.root, repository_id=self.store.repository_id,
                        integration=confirmation.integration,
                        verify_workers=confirmation.verify_workers, flake_reruns=confirmation.flake_reruns)
                except TransitionRefused as error:
                    raise ServiceError("confirmation_failed", str(error)) from None
                try:
                    self.store.save(initiative)
                except StoreConflict:
                    if attempt == LOST_RACE_RETRIES:
                        raise ServiceError("confirmation_superseded",
                                           f"Initiative {confirmation.slug} kept changing while this confirmation was "
                                           f"recorded; nothing was written: run `lanes-es authorize "
                                           f"{confirmation.slug}` again") from None
                    continue
                self.adapters.ensure_state_ignored(self.root)
                return initiative.authorizations[-1]
        raise AssertionError("unreachable")

    def _require_unmoved_since_gate(self, confirmation: Confirmation) -> None:
        """upstream's checks after its native gate (docs/upstream.md#reason-codes, #authorization-reuse-and-the-tool-surface): the user answered on facts
        read before the prompt; the plan, the repository and HEAD are read again, and a yes is recorded only
        when none moved. Refused with upstream's key; nothing is written (no authorize refusal writes an event:
        the Initiative's log holds only what a user confirmed)."""
        slug = confirmation.slug
        again = f"nothing was recorded: run `lanes-es authorize {slug}` again to confirm it as it now stands"
        digest, unreadable = self._plan_digest_now(slug, confirmation.own_tasks)
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
            repository, head = self._repository_now(), self.adapters.head(self.root)
        except (Refusal, OSError) as error:
            raise ServiceError("repository_became_unreadable",
                               f"the git repository {confirmation.repository.checkout} became unreadable after the "
                               f"confirmation ({error}); {again}") from None
        if repository != confirmation.repository:
            raise ServiceError("batch_repository_changed",
                               f"the confirmation was given for {confirmation.repository.describe()}, and this "
                               f"checkout is now {repository.describe()}; {again}")
        if head != confirmation.seen_head:
            raise ServiceError("head_moved", f"HEAD of {self.root} moved after the confirmation (from "
                                             f"{confirmation.seen_head} to {head}); {again}")

    def _plan_digest_now(self, slug: str, own_tasks: tuple[str, ...] | None) -> tuple[str | None, str]:
        """(the plan digest as the files give it now, why it cannot be derived)."""
        if own_tasks is None:  # a new plan, as `lanes-es plan` derives it
            try:
                return self.plan(slug)["plan_digest"], ""
            except ServiceError as error:
                return None, str(error)
        from lanes_es.adapters.plan_observer import observe_plan  # a running batch's: its own tasks never count as settled

        ports = self.adapters.tick_ports(self.root, slug)
        try:
            return observe_plan(self.root, slug, read_initiative=self.adapters.read_initiative,
                                batch_git=ports.batch_git, kernel=ports.kernel, own_tasks=own_tasks)["plan_digest"], ""
        except (PortError, ValueError) as error:
            return None, str(error)

    def _still_confirms(self, initiative: Initiative | None, confirmation: Confirmation) -> ev.BatchAuthorized | None:
        """None when `confirmation` still applies to the Initiative as it now stands (record it). When another
        confirmation started a batch meanwhile, that batch's authorization if it has the very facts this one
        confirmed (the same yes, given twice: nothing more is written), else the refusal `confirmation_superseded`."""
        current = initiative.current if initiative else None
        recorded = self.store.batch(current.batch_id) if current else None
        open_batch = current if current is not None and not (recorded and is_terminal(recorded.batch_state)) else None
        known = initiative.batch_ids() if initiative else []
        if open_batch is not None and open_batch.batch_id == confirmation.batch_id:
            return None
        if open_batch is None and confirmation.batch_id not in known:
            return None
        if open_batch is not None and confirmation.batch_id not in known and (
                open_batch.plan_digest, open_batch.base_head, open_batch.max_parallel, open_batch.budget) == (
                confirmation.plan_digest, confirmation.base_head, confirmation.max_parallel, confirmation.budget):
            return open_batch
        now_open = f"batch {open_batch.batch_id} is now its open batch" if open_batch else "it has no open batch now"
        raise ServiceError("confirmation_superseded",
                           f"Initiative {confirmation.slug} changed while this confirmation was given ({now_open}; "
                           f"this one was for batch {confirmation.batch_id}); nothing was written: run `lanes-es "
                           f"authorize {confirmation.slug}` again to confirm it as it now stands")

    # ------------------------------------------------------------ tick

    def tick(self, slug: str, *, max_parallel: int | None = None, offers: list[LaneOfferInput] | None = None,
             instruction: InstructionInput | None = None, revision: RevisionInput | None = None,
             executor_runtime: str | None = None, wait: float = DEFAULT_LOCK_WAIT) -> TickResult:
        """One tick under the batch lock; raises BatchBusy when another tick holds it past `wait` seconds."""
        initiative = self.initiative(slug)
        authorization = initiative.current if initiative else None
        if authorization is None:
            raise ServiceError("batch_authorization_invalid",
                               f"Initiative {slug} has no current authorization; run `lanes-es authorize {slug}` first")
        self.require_writable_state(f"tick {slug}")
        self._require_stats_file()
        started = time.perf_counter()
        timings = _Timings(git_before=_git_snapshot())
        with self._locked(authorization.batch_id, wait):
            batch = self.store.batch(authorization.batch_id)
            elsewhere = self._refuse_in_another_repository(slug, authorization, batch)
            if elsewhere is not None:
                return elsewhere
            repaired = self._repair_drift(batch)
            if batch is None and max_parallel is not None and max_parallel != authorization.max_parallel:
                from lanes_es.tick import refusal_report

                tick = self._tick_input(slug, authorization, max_parallel, offers, instruction, revision, executor_runtime)
                report = refusal_report(tick, None, "batch_parallel_mismatch",
                                        f"the authorization covers max_parallel {authorization.max_parallel}")
                return TickResult(report, authorization.batch_id, written=False)
            limit = max_parallel if batch is not None else authorization.max_parallel
            tick = self._tick_input(slug, authorization, limit, offers, instruction, revision, executor_runtime)
            outcome = self._run(tick, batch, timings)
            problem = self._anchor(outcome.batch, timings)
            self._write_stats(started, timings)
            return TickResult(outcome.report, authorization.batch_id, outcome.written, repaired, problem)

    def _refuse_in_another_repository(self, slug: str, authorization: ev.BatchAuthorized,
                                      batch: LaneBatch | None) -> TickResult | None:
        """A batch confirmed in another checkout (issue 14): refused before anything here is read or
        written; its audit event goes to the store only (lanes_es/tick/guards.py)."""
        from lanes_es.tick.guards import repository_refusal

        tick = self._tick_input(slug, authorization, None, None, None, None, None)
        report = repository_refusal(tick, batch, self._repository_opened(), shared_store=self._store_is_shared())
        if report is None:
            return None
        if batch is not None:
            self.store.save(batch)
        return TickResult(report, authorization.batch_id, written=False)

    def _repository_opened(self) -> RepositoryIdentity:
        """The checkout this service runs in and the repository id the store was opened with."""
        return RepositoryIdentity(repository_id=getattr(self.store, "repository_id", None), checkout=self.root)

    def _store_is_shared(self) -> bool:
        """Whether the log is not this checkout's own embedded store (only a shared one can be read from
        another checkout)."""
        common_dir = getattr(self.adapters, "common_dir", None)
        return not (common_dir is not None and getattr(self.store, "url", None) == default_store_url(common_dir))

    def _tick_input(self, slug: str, authorization: ev.BatchAuthorized, max_parallel: int | None,
                    offers: list[LaneOfferInput] | None, instruction: InstructionInput | None,
                    revision: RevisionInput | None, executor_runtime: str | None) -> TickInput:
        return TickInput(root=self.root, initiative_slug=slug, authorization=authorization, now=self.now(),
                         max_parallel=max_parallel, lane_offers=tuple(offers or ()), lane_instruction=instruction,
                         lane_revision=revision, revision_delegation=authorization.delegate_revisions,
                         executor_runtime=executor_runtime)

    @contextmanager
    def _locked(self, name: str, wait: float) -> Iterator[None]:
        """The batch lock, its refusal turned into the busy outcome."""
        lock = ExitStack()
        try:
            lock.enter_context(self.store.batch_lock(name, wait=wait))
        except BatchLockHeld as held:
            raise BatchBusy(name, held.holder, wait) from None
        with lock:
            yield

    def _run(self, tick: TickInput, batch: LaneBatch | None, timings: "_Timings") -> TickOutcome:
        """Run the tick; when an append loses a race (the store refuses its expected version, which
        only a writer bypassing the lock can cause), reread the log and decide again, never writing
        over what the other writer appended."""
        from lanes_es.tick import PlanMismatch, run_lane_batch

        def persist(live: LaneBatch) -> None:
            began = time.perf_counter()
            timings.events += self.store.save(live)
            materialize(self.root, documents_of(live))
            timings.store += time.perf_counter() - began

        for attempt in range(LOST_RACE_RETRIES + 1):
            ports = self.adapters.tick_ports(self.root, tick.initiative_slug)
            try:
                return run_lane_batch(tick, batch, _timed(ports, timings), persist)
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
                    return self._store_condition_report(tick, ports, str(error))
                batch = self.store.batch(tick.batch_id)
            except KernelError as error:
                if not _STORE_CONDITION.search(str(error)):
                    raise
                return self._store_condition_report(tick, ports, str(error))
        raise AssertionError("unreachable")

    def _anchor(self, batch: LaneBatch | None, timings: "_Timings | None" = None) -> str | None:
        """After the log is saved: the signed checkpoint and attestations in git, outside the store.

        Never raises for a condition a user can fix: the events stand, and the next tick
        (or `verify`, which says the checkpoint is behind) picks it up.
        """
        anchor = getattr(self.adapters, "anchor_log", None)
        if anchor is None or batch is None or batch.version <= 0:
            return None
        # The audit modules (DSSE, Merkle, signed notes) are imported only by a tick that anchors: `status` never does.
        from lanes_es.audit.anchor import AnchorRefused
        from lanes_es.audit.signing import KeyError_

        began = time.perf_counter()
        try:
            anchor(self.root, batch.id, batch.version, lambda after: self.store.stored_events(batch.id, after))
        except (AnchorRefused, KeyError_, PortError) as error:
            return str(error)
        finally:
            if timings is not None:
                timings.anchor += time.perf_counter() - began
        return None

    def _store_condition_report(self, tick: TickInput, ports: TickPorts, reason: str) -> TickOutcome:
        """What the log holds is what stands: report it rejected, with only safe release handoffs."""
        from lanes_es.tick import TickContext, TickOutcome, lane_rejection_report, refusal_report

        persisted = self.store.batch(tick.batch_id)
        if persisted is None:
            return TickOutcome(refusal_report(tick, None, "batch_store_condition", reason), None, written=False)
        context = TickContext(tick=tick, ports=ports, persist_port=lambda _: None, batch=persisted)
        return TickOutcome(lane_rejection_report(context, reason, STORE_CONDITION_NEXT), persisted, written=False)

    def _repair_drift(self, batch: LaneBatch | None) -> list[str]:
        """A projection that differs from the log is rewritten from the log, and the drift reported."""
        if batch is None:
            return []
        documents = documents_of(batch)
        found = drift(self.root, documents)
        if not found:
            return []
        materialize(self.root, documents)
        for item in found:
            batch.note_drift(self.now(), str(item.path))
        self.store.save(batch)
        return [item.describe() for item in found]

    def _require_stats_file(self) -> None:
        """LANES_ES_STATS is checked before the tick: a tick that ran is never reported as refused for it."""
        if not self.stats_path:
            return
        foreign = _foreign_stats_file(self.stats_path)
        if foreign:
            raise ServiceError("invalid_stats_file", f"LANES_ES_STATS={self.stats_path} is {foreign}, not a tick "
                                                     f"statistics file; nothing was ticked: name a new file or one "
                                                     f"lanes-es wrote, or unset LANES_ES_STATS")
        try:
            with open(self.stats_path, "a", encoding="utf-8"):
                pass
        except OSError as error:
            raise ServiceError("invalid_stats_file", f"LANES_ES_STATS={self.stats_path} cannot be appended to "
                                                     f"({error.strerror}); nothing was ticked: name a writable file, "
                                                     f"or unset LANES_ES_STATS") from None

    def _write_stats(self, started: float, timings: "_Timings") -> None:
        if not self.stats_path:
            return
        spawns, seconds, busy = (now - before for now, before in zip(_git_snapshot(), timings.git_before))
        # This tick's figures only (the process may tick many times: `lanes-es run`, the MCP server).
        # git_seconds adds up spawns that ran at once from several threads; git_busy_seconds is wall time.
        line = {"git_spawns": spawns, "git_seconds": round(seconds, 4), "git_busy_seconds": round(busy, 4),
                "store_seconds": round(timings.store, 4), "kernel_seconds": round(timings.kernel, 4),
                "anchor_seconds": round(timings.anchor, 4),
                "total_seconds": round(time.perf_counter() - started, 4), "events_appended": timings.events}
        try:
            with open(self.stats_path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(line) + "\n")
        except OSError as error:  # the tick itself is done and recorded: say so, do not fail it
            print(f"lanes-es: tick statistics not written to {self.stats_path}: {error.strerror}", file=sys.stderr)

    # ------------------------------------------------------------ retire, rebuild

    def retire_target(self, slug: str) -> "RetireTarget":
        """What `retire` would retire, read before the literal-user gate opens; every refusal comes here.

        The digest of the record's exact bytes is kept: `retire` writes only when they are unchanged
        after the gate (upstream's compare-and-swap, docs/upstream.md#retiring-a-batch).
        """
        initiative = self.initiative(slug)
        current = initiative.current if initiative else None
        if current is None:
            raise ServiceError("stale_batch_absent", f"Initiative {slug} has no active batch to retire; "
                                                     f"`lanes-es authorize {slug}` starts a new one")
        batch = self.store.batch(current.batch_id)
        self._refuse_retiring_elsewhere(slug, current)
        self._require_retirable(batch)
        self.require_writable_state(f"retire {slug}")
        return RetireTarget(slug=slug, batch_id=current.batch_id, record_digest=record_digest(batch))

    def _refuse_retiring_elsewhere(self, slug: str, authorization: ev.BatchAuthorized) -> None:
        """Retiring writes the superseded record and its checkpoint into this checkout: from a checkout the
        batch was not confirmed in (a shared store read from a copy), it is refused as a tick is."""
        from lanes_es.domain.drift import decide_repository

        drift = decide_repository(RepositoryIdentity.of_authorization(authorization), self._repository_opened(),
                                  self._store_is_shared())
        if drift is not None:
            recorded = authorization.repository
            raise ServiceError(drift.code, f"{drift.detail}; nothing was retired. Run `lanes-es retire {slug}` in "
                                           f"{recorded}, where the batch's record and Lanes are")

    @staticmethod
    def _require_retirable(batch: LaneBatch | None) -> None:
        if batch is not None and is_terminal(batch.batch_state):
            raise ServiceError("stale_batch_absent", f"batch {batch.id} is already {batch.batch_state}")
        if batch is not None and batch.children_in(*IN_FLIGHT):
            raise ServiceError("stale_batch_in_flight",
                               f"batch run state {batch.id} is {batch.batch_state} but a child is still mid-flight; "
                               f"let its Lanes settle (tick) or park them before retiring")

    def retire(self, slug: str, expected: "RetireTarget | None" = None) -> dict[str, Any]:
        """upstream's retire_stale_batch: the active record becomes `superseded`, refused while a child is in flight.

        With `expected` (the target read before the gate), the write is a compare-and-swap on
        the digest of the record's exact bytes: a record that moved while the user was asked is not retired.
        """
        target = expected or self.retire_target(slug)
        with self._locked(target.batch_id, DEFAULT_LOCK_WAIT):
            initiative = self.initiative(slug)
            current = initiative.current if initiative else None
            batch = self.store.batch(target.batch_id)
            if current is None or current.batch_id != target.batch_id or record_digest(batch) != target.record_digest:
                raise ServiceError("plan_changed", f"batch run state {target.batch_id} changed while the user was "
                                                   f"deciding; nothing was retired. Run `lanes-es retire {slug}` "
                                                   f"again to decide on the record as it now stands")
            self._require_retirable(batch)
            now = self.now()
            if batch is not None:
                batch.supersede(now, RETIRE_REASON, RETIRE_NEXT_ACTION)
                self.store.save(batch)
                materialize(self.root, documents_of(batch))
                self._anchor(batch)
            initiative.retire(at=now, batch_id=current.batch_id)  # type: ignore[union-attr]
            self.store.save(initiative)
            if batch is None:
                return {"batch_id": current.batch_id, "batch_state": "superseded", "reason": RETIRE_REASON}
            return batch.report or lane_report(batch.record, RETIRE_REASON, RETIRE_NEXT_ACTION)

    def rebuild(self, batch_ids: list[str], *, check: bool) -> dict[str, list[str]]:
        """Recompute every projection from the log; with `check`, write nothing and return the drift.

        The log is folded as it is read, a page of rows at a time, so memory stays flat however long it is.
        """
        from lanes_es.adapters.log_reader import stream_events
        from lanes_es.projections.batch import fold_documents

        found: dict[str, list[str]] = {}
        for batch_id in batch_ids:
            if not is_valid_id(batch_id):
                raise ServiceError("invalid_batch_id", f"{batch_id!r} is not a batch id")
            documents = fold_documents(stream_events(self.store, batch_id))
            if documents is None:
                raise ServiceError("batch_not_found", f"no batch {batch_id} in the store {self.store.shown_url}; "
                                                      f"`lanes-es status` lists the Initiative's batches")
            if check:
                found[batch_id] = [item.describe() for item in drift(self.root, documents)]
            else:
                found[batch_id] = [str(path) for path in materialize(self.root, documents)]
        return found


@dataclass(frozen=True)
class RetireTarget:
    """The active batch as read before the retire gate: its id and the digest of its record's exact bytes."""

    slug: str
    batch_id: str
    record_digest: str


def record_digest(batch: LaneBatch | None) -> str:
    """sha256 of the v2 record's canonical bytes as the log has them (of nothing for a batch authorized but
    never ticked): what retire's compare-and-swap compares, and what the MCP gate carries across its rounds."""
    import hashlib

    return hashlib.sha256(documents_of(batch).record_bytes() if batch is not None else b"").hexdigest()


def _foreign_stats_file(path: str) -> str | None:
    """What makes an existing file at `path` no statistics file (None when it is one, or absent).

    lanes-es only appends JSON lines; appending to anything else (a program, a document) would
    damage a file of the user's, which root could do to any file on the machine."""
    try:
        info = os.stat(path)
    except OSError:
        return None  # absent (made on first use) or unreadable: the append check says which
    if stat.S_ISCHR(info.st_mode):
        return None  # a device such as /dev/null or a terminal takes lines and keeps nothing
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_mode & 0o111:
        return "an executable file"
    if info.st_size == 0:
        return None
    try:
        with open(path, "rb") as handle:
            handle.seek(max(info.st_size - 4096, 0))
            tail = handle.read()
    except OSError:
        return None
    if b"\0" in tail or not tail.endswith(b"}\n"):
        return "a file whose last line is no JSON line lanes-es wrote"
    return None


@dataclass
class _Timings:
    store: float = 0.0
    kernel: float = 0.0
    anchor: float = 0.0
    events: int = 0
    git_before: tuple[int, float, float] = (0, 0.0, 0.0)  # the git counters when the tick began


def _git_snapshot() -> tuple[int, float, float]:
    from lanes_es.adapters.git import STATS  # the runner's module: only a tick imports it

    return STATS.snapshot()


class _TimedKernel:
    """Wraps the kernel port to add up the seconds spent in it, for LANES_ES_STATS."""

    def __init__(self, kernel: Any, timings: _Timings) -> None:
        self._kernel = kernel
        self._timings = timings

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._kernel, name)
        if not callable(target):
            return target

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return target(*args, **kwargs)
            finally:
                self._timings.kernel += time.perf_counter() - began
        return timed


def _timed(ports: TickPorts, timings: _Timings) -> TickPorts:
    from dataclasses import replace

    return replace(ports, kernel=_TimedKernel(ports.kernel, timings))


def intent_error_text(error: str, task_id: str, slug: str) -> str:
    """The intent reader's message with the command that fixes the commonest causes."""
    if re.search(r"TaskIntent \S+ is not tracked", error):
        path = f"docs/plans/{task_id}.intent.json"  # the reader names the archive it tried last
        return f"missing: TaskIntent {path} is not tracked; commit it: `git add {path} && git commit`"
    if "names task" in error:
        return f"{error}; set its task_id to {task_id}, or name the file after its task"
    return f"{error}; fix the file, then `lanes-es plan {slug}` shows the result"


def _check_slug(slug: str) -> None:
    if not is_valid_id(slug):
        raise ServiceError("invalid_slug", f"initiative_slug {slug!r} is invalid: use letters, digits, '.', '_' or '-' "
                                           f"(at most 128, starting with a letter or digit)")


__all__ = ["LanesService", "ServiceError", "BatchBusy", "DEFAULT_LOCK_WAIT", "TickResult", "Confirmation", "RetireTarget", "LaneOfferInput", "InstructionInput",
           "RevisionInput", "EXIT_OK", "EXIT_INTERNAL", "EXIT_REJECTED", "EXIT_STOPPED"]
