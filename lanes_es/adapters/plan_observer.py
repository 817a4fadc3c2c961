"""The batch plan as the coordinator checkout has it now: the Initiative, its intents, the settled tasks.

One function serves `lanes-es plan` and `authorize` (the plan a confirmation binds) and every
tick's drift check (the plan the confirmation must still cover, lanes_es/domain/drift.py).
For a running batch its own children are never counted as already settled: their audit pairs
arrive on the batch branch as they integrate, and that is the batch's progress, not a new plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from lanes_es.adapters.initiative_reader import carrier_path
from lanes_es.domain.ids import is_valid_id
from lanes_es.domain.plan import project_batch_plan
from lanes_es.ports import PortError


@dataclass(frozen=True)
class PlanInputs:
    """What the plan is projected from: the Initiative, each task's intent (or why it is unreadable), the settled."""

    observation: dict[str, Any]
    reads: dict[str, Any]
    settled: list[str]

    def project(self) -> dict[str, Any]:
        return project_batch_plan(self.observation, self.reads, settled_tasks=self.settled)


def read_plan_inputs(root: str, slug: str, *, read_initiative: Callable[[str, str], dict[str, Any]], batch_git: Any,
                     kernel: Any, own_tasks: Iterable[str] = ()) -> PlanInputs:
    """PortError when the Initiative is unreadable; an intent that cannot be read is kept as its reason."""
    observation = read_initiative(root, slug)
    own = set(own_tasks)
    reads: dict[str, Any] = {}
    settled: list[str] = []
    for task in observation["tasks"]:
        task_id = task["task_id"]
        if not is_valid_id(task_id):  # the carrier names it; no file is looked up by such a name
            reads[task_id] = f"invalid: task id {task_id!r} is not a valid task id (letters, digits, '.', '_', '-')"
            continue
        if task_id not in own and kernel.read_tombstone(root, task_id) is not None:
            settled.append(task_id)
        try:
            reads[task_id] = batch_git.read_intent(root, task_id, None)
        except PortError as error:
            reads[task_id] = str(error)
    return PlanInputs(observation, reads, settled)


def observe_plan(root: str, slug: str, *, read_initiative: Callable[[str, str], dict[str, Any]], batch_git: Any,
                 kernel: Any, own_tasks: Iterable[str] = ()) -> dict[str, Any]:
    """upstream's projectBatchPlan at the coordinator; PortError when the Initiative is unreadable,
    ValueError (InvalidPlan) when no child is enrollable or the plan is malformed."""
    return read_plan_inputs(root, slug, read_initiative=read_initiative, batch_git=batch_git, kernel=kernel,
                            own_tasks=own_tasks).project()


class CoordinatorPlan:
    """The tick's PlanObserver port: the plan digest the coordinator's files give now."""

    def __init__(self, read_initiative: Callable[[str, str], dict[str, Any]], batch_git: Any, kernel: Any) -> None:
        self._read_initiative = read_initiative
        self._batch_git = batch_git
        self._kernel = kernel

    def current_digest(self, root: str, slug: str, own_tasks: Iterable[str]) -> str:
        """The digest of the enrollable plan; PortError saying why when it cannot be derived."""
        try:
            plan = observe_plan(root, slug, read_initiative=self._read_initiative, batch_git=self._batch_git,
                                kernel=self._kernel, own_tasks=own_tasks)
        except ValueError as error:
            raise PortError(str(error)) from None
        return plan["plan_digest"]

    def unreadable_file(self, root: str, slug: str, intent_paths: Iterable[str]) -> str | None:
        """Opened, not trusted to git: git lists an unreadable file as changed only when its stat
        cache says so, which a chmod may or may not trip."""
        for relative in [carrier_path(slug), *intent_paths]:
            try:
                with open(Path(root) / relative, "rb"):
                    pass
            except PermissionError:
                return relative
            except OSError:
                continue  # absent or not a file: the plan's own read says what is wrong
        return None
