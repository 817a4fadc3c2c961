"""`plan`: the batch plan as the coordinator reads it now (docs/upstream.md#the-plan-and-child-statuses); writes
nothing."""

from __future__ import annotations

import re
from typing import Any

from lanes_es.errors import ServiceError
from lanes_es.ports import PortError
from lanes_es.usecases.deps import Deps
from lanes_es.usecases.load import check_slug


def plan(deps: Deps, slug: str, root: str | None = None) -> dict[str, Any]:
    """The plan of Initiative `slug` as the files under `root` (default: the command's checkout) give it."""
    check_slug(slug)
    root = root or deps.root
    ports = deps.adapters.tick_ports(root, slug)
    from lanes_es.adapters.plan_observer import read_plan_inputs  # with the intent parser: not for `status`

    try:
        inputs = read_plan_inputs(root, slug, read_initiative=deps.adapters.read_initiative,
                                  batch_git=ports.batch_git, kernel=ports.kernel)
    except PortError as error:
        raise ServiceError("plan_projection_failed", _uncommitted(deps, slug, root) or str(error)) from None
    # Upstream's plan keeps only a reason code; the precise cause and its fix go beside it.
    intent_errors = {task: intent_error_text(read, task, slug) for task, read in inputs.reads.items()
                     if isinstance(read, str) and task not in inputs.settled}
    _refuse_commands_that_cannot_run(slug, inputs)
    try:
        derived = inputs.project()
    except ValueError as error:
        causes = "".join(f"; {task}: {text}" for task, text in intent_errors.items())
        if inputs.settled:  # said as `run` says it: every task is done, and how to add more
            causes += (f"; already done (their audit pairs are in this checkout): {', '.join(inputs.settled)}; "
                       f"add tasks with `lanes-es initiative add-task {slug} TASK ...` to run a new batch")
        raise ServiceError("empty_enrollable_set" if "no enrollable" in str(error) else "plan_projection_failed",
                           f"{error}{causes}") from None
    derived["intent_errors"] = intent_errors
    return derived


def _uncommitted(deps: Deps, slug: str, root: str) -> str | None:
    """In a coordinator worktree (made at the user's HEAD), an Initiative the user wrote and did not commit is
    missing: said as what it is, not as an Initiative that does not exist."""
    from lanes_es.adapters.initiative_reader import carrier_path, has_local_initiative

    checkout = deps.checkout
    if checkout is None or checkout == root:
        return None
    try:
        if has_local_initiative(root, slug) or not has_local_initiative(checkout, slug):
            return None
    except PortError:
        return None
    return (f"Local Initiative {carrier_path(slug)} is in your checkout but not committed: a batch runs what is "
            f"committed (its coordinator worktree is made at your HEAD); commit it and its intents (`git add "
            f"{carrier_path(slug)} docs/plans && git commit`), then run the command again")


def plan_digest_now(deps: Deps, slug: str, own_tasks: tuple[str, ...] | None,
                    root: str | None = None) -> tuple[str | None, str]:
    """(the plan digest as the files give it now, why it cannot be derived). `own_tasks`: a running batch's
    children, which never count as settled; None for a new plan, as `lanes-es plan` derives it."""
    root = root or deps.root
    if own_tasks is None:
        try:
            return plan(deps, slug, root)["plan_digest"], ""
        except ServiceError as error:
            return None, str(error)
    from lanes_es.adapters.plan_observer import observe_plan

    ports = deps.adapters.tick_ports(root, slug)
    try:
        return observe_plan(root, slug, read_initiative=deps.adapters.read_initiative,
                            batch_git=ports.batch_git, kernel=ports.kernel, own_tasks=own_tasks)["plan_digest"], ""
    except (PortError, ValueError) as error:
        return None, str(error)


def _refuse_commands_that_cannot_run(slug: str, inputs: Any) -> None:
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


def intent_error_text(error: str, task_id: str, slug: str) -> str:
    """The intent reader's message with the command that fixes the commonest causes."""
    if re.search(r"TaskIntent \S+ is not tracked", error):
        path = f"docs/plans/{task_id}.intent.json"  # the reader names the archive it tried last
        return f"missing: TaskIntent {path} is not tracked; commit it: `git add {path} && git commit`"
    if "names task" in error:
        return f"{error}; set its task_id to {task_id}, or name the file after its task"
    return f"{error}; fix the file, then `lanes-es plan {slug}` shows the result"
