"""The facts a literal user confirms: `BatchOptions` asked for, a `Confirmation` shown; nothing is written.

A new batch is confirmed on the plan and HEAD as they are now; an open batch (authorized, running
or parked) is confirmed again as it was recorded, and a plan that moved under it is refused.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.candidates import DEFAULT_INTEGRATION, INTEGRATION_MODES, SERIAL
from lanes_es.domain.ids import batch_branch_name
from lanes_es.domain.record import is_terminal
from lanes_es.domain.repository import RepositoryIdentity
from lanes_es.domain.runner import LOCAL, InvalidRunner, parse_runner
from lanes_es.errors import ServiceError
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.load import current_authorization
from lanes_es.usecases.plan import plan, plan_digest_now
from lanes_es.usecases.save import require_writable_state


@dataclass(frozen=True)
class BatchOptions:
    """What a user may choose when confirming a batch (`authorize`, `run`, the MCP tool); None: the default.

    `integration` (serial, speculative or batched; default speculative), `verify_workers` (candidate
    checks run at once; default the batch's max_parallel) and `flake_reruns` apply to a new batch; a
    recorded batch keeps what it was prepared with. `executor_budget` holds the Executor budgets given,
    (scope, measure) -> limit (lanes_es/domain/executor_budget.py): a new confirmation of an open batch
    keeps the budgets it had and changes those given. `runner` (`local` or `ray://HOST:PORT`, as the user
    wrote it; None: the authorization's before, else local) is recorded with each confirmation.
    """

    max_parallel: int | None = None
    max_children: int | None = None
    qa_failure_limit: int | None = None
    final_verification: list[str] | None = None
    delegate_revisions: bool = False
    integration: str | None = None
    verify_workers: int | None = None
    flake_reruns: int | None = None
    executor_budget: dict[tuple[str, str], float | None] | None = None
    runner: str | None = None


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
    runner: str = LOCAL  # where checks, QA and Executor attempts run (lanes_es/domain/runner.py)
    # What the gate saw before the user answered, read again after it (lanes_es/usecases/authorize.py):
    # the checkout and its repository id, the coordinator's HEAD, and the tasks kept as the batch's own
    # when the plan is derived (None: a new plan, as `lanes-es plan` derives it).
    repository: RepositoryIdentity | None = None
    seen_head: str | None = None
    own_tasks: tuple[str, ...] | None = None
    executor_budget: ev.ExecutorBudgets | None = None  # lanes-es's own; kept out of upstream's facts

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
            # lanes-es's own, only when set: what the Executor attempts may take
            **({"executor_budget": self.executor_budget.plain()} if self.executor_budget is not None else {}),
            "lane_mode": {
                "max_parallel": self.max_parallel,
                "parallel_groups": self.plan.get("parallel_groups", []),
                "serialized": self.plan.get("scope_conflicts", []),
                **({"final_verification": self.final_verification} if self.final_verification else {}),
                "offer_revision_delegation": True,
                "delegate_revisions": self.delegate_revisions,
            },
        }


def prepare_confirmation(deps: Deps, slug: str, options: BatchOptions = BatchOptions()) -> Confirmation:
    """What `authorize` will ask the user to confirm; nothing is written."""
    # Whatever authorize accepts, the tick must be able to record: the same bounds as the v2 validator.
    from lanes_es.domain.inputs import parse_positive_count

    max_parallel = parse_positive_count(options.max_parallel, "max_parallel")
    max_children = parse_positive_count(options.max_children, "max_children")
    qa_failure_limit = parse_positive_count(options.qa_failure_limit, "qa_failure_limit")
    require_writable_state(deps.root, f"authorize {slug}")
    _check_integration_options(options)
    runner = _runner(options)
    repository = deps.repository_now()
    current = current_authorization(deps, slug)
    recorded = deps.store.batch(current.batch_id) if current else None
    if current is not None and recorded is not None and not is_terminal(recorded.batch_state):
        _require_plan_unchanged(deps, slug, recorded)
        return replace(_reconfirmation(slug, current, recorded, max_parallel, options),
                       repository=repository, seen_head=deps.adapters.head(deps.root),
                       runner=runner or current.runner or LOCAL,
                       own_tasks=tuple(child["task_id"] for child in recorded.record["children"]))
    derived = plan(deps, slug)
    _refuse_unreadable_intents(deps.root, slug, derived)
    _refuse_what_the_preflight_would(deps, slug, deps.adapters.head(deps.root))
    batch_id = f"batch-{slug}-{uuid.uuid4()}"
    if current is not None and recorded is None:
        # Authorized but never ticked: confirm it again as it stands, or, when the plan moved
        # since, confirm the new plan under the same (never started) batch id.
        if derived["plan_digest"] == current.plan_digest:
            return replace(_reconfirmation(slug, current, None, max_parallel, options),
                           repository=repository, seen_head=deps.adapters.head(deps.root),
                           runner=runner or current.runner or LOCAL)
        batch_id = current.batch_id
    enrollable: list[ev.PlanChild] = derived["enrollable"]
    budget = ev.Budget(max_children=max_children or len(enrollable),
                       qa_failure_limit=qa_failure_limit or derived["budget"]["qa_failure_limit"])
    if budget.max_children > len(enrollable) or budget.max_children < 1:
        raise ServiceError("invalid_budget", f"max_children must be 1 to {len(enrollable)} (the enrollable children)")
    head = deps.adapters.head(deps.root)
    return Confirmation(slug=slug, batch_id=batch_id, resumes=False, plan=derived,
                        children=enrollable, plan_digest=derived["plan_digest"], base_head=head,
                        budget=budget, max_parallel=max_parallel or 1,
                        final_verification=options.final_verification or None,
                        delegate_revisions=options.delegate_revisions,
                        integration=options.integration or DEFAULT_INTEGRATION,
                        verify_workers=options.verify_workers, flake_reruns=options.flake_reruns or 0,
                        repository=repository, seen_head=head, runner=runner or LOCAL,
                        executor_budget=budgets_confirmed(None, options))


def _refuse_what_the_preflight_would(deps: Deps, slug: str, head: str) -> None:
    """The first tick of a new batch runs the batch-branch preflight (docs/upstream.md#the-batch-branch-preflight);
    what it would refuse (a dirty tree, an earlier batch's imm/<slug>) is refused before the user is asked."""
    checked = deps.adapters.tick_ports(deps.root, slug).batch_git.preflight(deps.root, slug, head, reuse_head=head,
                                                                            create=False)
    if not checked.ok:
        from lanes_es.domain.next_steps import command_line_next

        fix = command_line_next({"batch_state": "rejected", "initiative_slug": slug,
                                 "reason": f"{checked.reason}: {checked.message}"})
        fix = fix.replace(f"then `lanes-es tick {slug}`", "then confirm again")
        raise ServiceError(checked.reason, f"{checked.message}; nothing was confirmed: {fix}")


def _runner(options: BatchOptions) -> str | None:
    """The runner the user named, in its canonical text (None: none named); a clear refusal otherwise."""
    if options.runner is None:
        return None
    try:
        return parse_runner(options.runner)
    except InvalidRunner as error:
        raise ServiceError("invalid_runner", f"{error}; nothing was confirmed") from None


def _check_integration_options(options: BatchOptions) -> None:
    if options.integration is not None and options.integration not in INTEGRATION_MODES:
        raise ServiceError("invalid_integration_mode", f"integration mode {options.integration!r} is unknown; choose "
                                                       f"{', '.join(INTEGRATION_MODES)}")
    if options.verify_workers is not None and options.verify_workers < 1:
        raise ServiceError("invalid_verify_workers", "verify_workers must be at least 1")
    if options.flake_reruns is not None and not 0 <= options.flake_reruns <= 5:
        raise ServiceError("invalid_flake_reruns", "flake_reruns must be 0 to 5")


def _refuse_unreadable_intents(root: str, slug: str, derived: dict[str, Any]) -> None:
    """An intent this user cannot read is no plan decision (a fix of its mode would change the plan under the
    batch): refused before anything is confirmed, where a malformed or untracked one is only excluded."""
    for task in derived.get("intent_errors", {}):
        path = Path(root) / "docs" / "plans" / f"{task}.intent.json"
        if path.exists() and not os.access(path, os.R_OK):
            raise ServiceError("intent_unreadable",
                               f"{path} cannot be read by this user (permission denied), so task {task} cannot "
                               f"be planned; nothing was confirmed: fix its owner or mode (chmod u+r {path}), "
                               f"then run `lanes-es authorize {slug}` again")


def _require_plan_unchanged(deps: Deps, slug: str, recorded: LaneBatch) -> None:
    """A recorded batch runs the plan it was confirmed on; a changed plan is a new batch (upstream:
    "a changed plan is not repaired by confirmation alone")."""
    own = tuple(child["task_id"] for child in recorded.record["children"])
    digest, unreadable = plan_digest_now(deps, slug, own)
    if digest is None:
        digest = f"underivable ({unreadable})"
    if digest != recorded.record["plan_digest"]:
        raise ServiceError("batch_plan_digest_changed",
                           f"the Initiative or its intents changed after batch {recorded.id} was confirmed (the plan "
                           f"is now {digest}, the batch runs {recorded.record['plan_digest']}); a batch never runs "
                           f"another plan. Put the plan back as it was, or retire the batch with `lanes-es retire "
                           f"{slug}` (its Lanes and commits are kept) and authorize the new plan as a new batch")


def _reconfirmation(slug: str, current: ev.BatchAuthorized, recorded: LaneBatch | None,
                    max_parallel: int | None, options: BatchOptions) -> Confirmation:
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
                        delegate_revisions=options.delegate_revisions,
                        integration=(recorded.integration if recorded is not None
                                     else options.integration or current.integration or SERIAL),
                        verify_workers=(recorded.verify_workers if recorded is not None
                                        else options.verify_workers or current.verify_workers),
                        flake_reruns=(recorded.flake_reruns if recorded is not None
                                      else options.flake_reruns or current.flake_reruns or 0),
                        executor_budget=budgets_confirmed(current.executor_budget, options))


def budgets_confirmed(recorded: ev.ExecutorBudgets | None, options: BatchOptions) -> ev.ExecutorBudgets | None:
    """The Executor budgets a confirmation records: those recorded before, with the ones given changed."""
    from lanes_es.domain.executor_budget import is_set, with_values

    budgets = with_values(recorded, options.executor_budget or {})
    return budgets if is_set(budgets) else None
