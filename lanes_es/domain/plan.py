"""The batch plan: which Initiative Tasks a confirmation covers, in which order, bound by which digest.

An Initiative observation (Local carrier or GitHub) is normalized, ordered by its
dependencies, and each Task's status is decided from the coordinator's facts: already
settled, already owned, excluded for a human (a critical or unreadable intent), blocked
behind one of those, or enrollable. The enrollable children and their intent
identities are what the user confirms; `plan_digest` binds them (docs/upstream.md#the-plan-digest, #the-plan-and-child-statuses).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping, Sequence

from .events import PlanChild
from .ids import is_valid_id
from .jstext import escape_lone_surrogates, safe_integer
from .scheduling import ACYCLIC_MESSAGE, project_parallel_groups

LOCAL_CONTRACT = "immune_brain/local_initiative_observation/v1"
GITHUB_CONTRACT = "immune_brain/github_initiative_observation/v1"
DEFAULT_QA_FAILURE_LIMIT = 2
EXCLUSION_REASONS = ("critical", "invalid_intent", "dependency_unavailable", "spec_binding_missing",
                     "spec_binding_ambiguous", "spec_binding_incomplete")
UNAVAILABLE_STATUSES = frozenset({"already_owned", "needs_human", "blocked"})
EMPTY_PLAN_MESSAGE = "batch plan has no enrollable children; nothing to confirm"
MAX_BLOCKER_ENTRIES = 1_000_000  # every child's transitive blockers, added up (docs/reference/limits.md)


class InvalidPlan(ValueError):
    """The observation or the child plan cannot be confirmed; the message is upstream's."""


# ---------------------------------------------------------------- observation


def normalize_observation(observation: Any, slug: str) -> dict[str, Any]:
    """The observation with checked Tasks sorted by task_id and sorted, known, unique blocked_by."""
    local = isinstance(observation, dict) and observation.get("contract") == LOCAL_CONTRACT
    if not isinstance(observation, dict) or (not local and observation.get("contract") != GITHUB_CONTRACT):
        raise InvalidPlan("tracker returned an invalid Initiative observation contract")
    if observation.get("initiative_id") != slug:
        raise InvalidPlan("tracker returned an observation for another Initiative")
    if not local and not _positive(observation.get("issue_number")):
        raise InvalidPlan("tracker returned an invalid Initiative Issue number")
    if not isinstance(observation.get("tasks"), list):
        raise InvalidPlan("tracker returned an invalid Initiative Task list")
    tasks = _normalize_tasks(observation["tasks"], local)
    carrier = {key: observation[key] for key in ("path", "issue_number") if key in observation}
    return {"contract": observation["contract"], "initiative_id": slug, **carrier, "tasks": tasks}


def _positive(value: Any) -> bool:
    number = safe_integer(value)
    return number is not None and number > 0


def _normalize_tasks(raw_tasks: list[Any], local: bool) -> list[dict[str, Any]]:
    tasks: list[dict[str, Any]] = []
    task_ids: set[str] = set()
    slice_ids: set[str] = set()
    for index, raw in enumerate(raw_tasks):
        task = _normalize_task(index, raw, local)
        if task["task_id"] in task_ids:
            raise InvalidPlan(f"tracker returned duplicate Task {task['task_id']}")
        if task["slice_id"] in slice_ids:
            raise InvalidPlan(f"tracker returned duplicate Slice {task['slice_id']}")
        task_ids.add(task["task_id"])
        slice_ids.add(task["slice_id"])
        tasks.append(task)
    for task in tasks:
        unknown = [blocker for blocker in task["blocked_by"] if blocker not in task_ids]
        if unknown:
            raise InvalidPlan(f"tracker Task {task['task_id']} depends on unknown Task {unknown[0]}")
    return sorted(tasks, key=lambda task: task["task_id"])


def _normalize_task(index: int, raw: Any, local: bool) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise InvalidPlan(f"tracker Task {index} is invalid")
    if not is_valid_id(raw.get("task_id")):
        raise InvalidPlan(f"tracker Task {index} has an invalid task_id")
    if not is_valid_id(raw.get("slice_id")):
        raise InvalidPlan(f"tracker Task {index} has an invalid slice_id")
    task_id = raw["task_id"]
    if not local and not _positive(raw.get("issue_number")):
        raise InvalidPlan(f"tracker Task {task_id} has an invalid Issue number")
    blocked_by = raw.get("blocked_by")
    if (not isinstance(blocked_by, list) or not all(is_valid_id(blocker) for blocker in blocked_by)
            or task_id in blocked_by):
        raise InvalidPlan(f"tracker Task {task_id} has invalid blocked_by dependencies")
    task = {"task_id": task_id, "slice_id": raw["slice_id"], "blocked_by": sorted(set(blocked_by))}
    if not local:
        task["issue_number"] = raw["issue_number"]
    return task


def dependency_order(tasks: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Kahn's layers, each sorted by task_id: every Task comes after all of its blockers. Blockers are
    counted down, so a long chain costs its length, not its square."""
    by_id = {task["task_id"]: task for task in tasks}
    waiting: dict[str, int] = {}
    dependents: dict[str, list[str]] = {}
    for task_id, task in by_id.items():
        blockers = set(task["blocked_by"])
        waiting[task_id] = len(blockers)
        for blocker in blockers:
            dependents.setdefault(blocker, []).append(task_id)
    layer = sorted(task_id for task_id, count in waiting.items() if count == 0)
    order: list[Mapping[str, Any]] = []
    while len(order) < len(by_id):
        if not layer:
            raise InvalidPlan(ACYCLIC_MESSAGE)
        order.extend(by_id[task_id] for task_id in layer)
        ready = []
        for task_id in layer:
            for dependent in dependents.get(task_id, ()):
                waiting[dependent] -= 1
                if waiting[dependent] == 0:
                    ready.append(dependent)
        layer = sorted(ready)
    return order


def transitive_blocked_by(tasks: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Every Task's blockers, direct or not, sorted. The plan records them all, so a long chain grows as the
    square of its length (a chain of 4,000 Tasks: 8 million entries, a 291 MB plan): past MAX_BLOCKER_ENTRIES
    the plan is refused before it is built, in bounded time and memory."""
    closures: dict[str, set[str]] = {}
    total = 0
    for task in dependency_order(tasks):
        closure = set(task["blocked_by"])
        for blocker in task["blocked_by"]:
            closure |= closures[blocker]
        total += len(closure)
        if total > MAX_BLOCKER_ENTRIES:
            raise InvalidPlan(f"batch plan would record more than {MAX_BLOCKER_ENTRIES:,} transitive blockers (each "
                              f"child lists every Task before it in its chains; {task['task_id']} alone has "
                              f"{len(closure):,}); shorten the Initiative's Blocked by chains or split it")
        closures[task["task_id"]] = closure
    return {task_id: sorted(closure) for task_id, closure in closures.items()}


# ---------------------------------------------------------------- digest


def _child_field(child: Any, name: str) -> Any:
    return child.get(name) if isinstance(child, dict) else getattr(child, name, None)


def compute_batch_plan_digest(children: Sequence[Any]) -> str:
    """batch_authority's digest of the confirmed child plan, after the registry's checks."""
    validate_plan_children(children)
    entries = [{"blocked_by": list(_child_field(child, "blocked_by")), **{
        name: _child_field(child, name) for name in ("intent_content_hash", "intent_path", "intent_revision", "task_id")
    }} for child in children]
    text = json.dumps(entries, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(escape_lone_surrogates(text).encode("utf-8")).hexdigest()


def validate_plan_children(children: Sequence[Any]) -> None:
    """The registry's validateChildren: complete identities, known blockers, no duplicate, no cycle."""
    graph: dict[str, list[str]] = {}
    for child in children:
        task_id = _child_field(child, "task_id")
        _check_identity(task_id, child)
        if task_id in graph:
            raise InvalidPlan(f"batch plan has a duplicate child {task_id}")
        graph[task_id] = list(_child_field(child, "blocked_by"))
    for task_id, blockers in graph.items():
        unknown = [blocker for blocker in blockers if blocker not in graph]
        if unknown:
            raise InvalidPlan(f"batch plan child {task_id} depends on {unknown[0]}, which is not in the plan")
    _refuse_cycles(graph)


def _check_identity(task_id: Any, child: Any) -> None:
    if not isinstance(task_id, str):
        raise InvalidPlan("batch plan child has no task_id")
    texts = [_child_field(child, name) for name in ("intent_path", "intent_content_hash")]
    revision = _child_field(child, "intent_revision")
    blocked_by = _child_field(child, "blocked_by")
    # A float revision would print as 1.0 where upstream prints 1: only a true int keeps the digest.
    whole = isinstance(revision, int) and not isinstance(revision, bool) and safe_integer(revision) is not None
    if (not all(isinstance(text, str) for text in texts) or not whole or revision <= 0
            or not isinstance(blocked_by, (list, tuple)) or not all(isinstance(b, str) for b in blocked_by)):
        raise InvalidPlan(f"batch plan child {task_id} has an invalid intent identity")


def _refuse_cycles(graph: dict[str, list[str]]) -> None:
    """Depth-first, in plan order, without recursion: a blocker met again on the path is a cycle."""
    done: set[str] = set()
    for root in graph:
        path, stack = {root}, [(root, iter(graph[root]))]
        while stack:
            node, blockers = stack[-1]
            blocker = next((b for b in blockers if b not in done), None)
            if blocker is None:
                done.add(node)
                path.discard(node)
                stack.pop()
            elif blocker in path:
                raise InvalidPlan(f"batch plan dependency cycle at {blocker}")
            else:
                path.add(blocker)
                stack.append((blocker, iter(graph[blocker])))


# ---------------------------------------------------------------- projection


def project_batch_plan(observation: Any, intent_reads: Mapping[str, Any], settled_tasks: Iterable[str] = (),
                       owned_tasks: Iterable[str] = (), *, slug: str | None = None,
                       max_children: int | None = None, qa_failure_limit: int | None = None) -> dict[str, Any]:
    """The plan a confirmation shows and binds. `intent_reads[task]` is an IntentRead-like value or an error text."""
    normalized = normalize_observation(observation, slug if slug is not None else _initiative_of(observation))
    order = dependency_order(normalized["tasks"])
    closures = transitive_blocked_by(normalized["tasks"])
    settled, owned = set(settled_tasks), set(owned_tasks)
    children, scopes = [], {}
    for task in order:
        child, scope = _plan_child(task, closures[task["task_id"]], intent_reads.get(task["task_id"]), settled, owned)
        children.append(child)
        scopes[child["task_id"]] = scope
    _block_behind_unavailable(order, children)
    enrollable = _enrollable(children)
    if not enrollable:
        raise InvalidPlan(EMPTY_PLAN_MESSAGE)
    return _plan(normalized, children, enrollable, scopes, _budget(len(enrollable), max_children, qa_failure_limit))


def _initiative_of(observation: Any) -> Any:
    return observation.get("initiative_id") if isinstance(observation, dict) else None


def _plan_child(task: Mapping[str, Any], blocked_by: list[str], read: Any, settled: set[str],
                owned: set[str]) -> tuple[dict[str, Any], list[str] | None]:
    """A child's plan entry and, when enrollable, its scope."""
    task_id = task["task_id"]
    child = {"task_id": task_id, "slice_id": task["slice_id"], "blocked_by": blocked_by, "status": "enrollable",
             "reason": None, "intent_path": None, "intent_revision": None, "intent_content_hash": None}
    if task_id in settled and task_id in owned:
        raise InvalidPlan(f"Task {task_id} has conflicting settled and active state")
    if task_id in settled or task_id in owned:
        child["status"] = "already_settled" if task_id in settled else "already_owned"
        return child, None
    if read is None or isinstance(read, str):
        return {**child, "status": "needs_human", "reason": _read_failure_reason(read)}, None
    intent = _child_field(read, "intent")
    child.update(intent_path=_child_field(read, "path"), intent_revision=intent["revision"],
                 intent_content_hash=_child_field(read, "content_hash"))
    if intent["risk"] == "critical":
        return {**child, "status": "needs_human", "reason": "critical"}, None
    return child, list(intent["scope_hint"])


def _read_failure_reason(error: str | None) -> str:
    """A Spec binding failure keeps its own reason; any other unreadable intent is invalid_intent."""
    if error and error.startswith("spec_binding_"):
        return error
    return "invalid_intent"


def _block_behind_unavailable(order: list[Mapping[str, Any]], children: list[dict[str, Any]]) -> None:
    """An enrollable child whose direct blocker cannot run here is blocked too (in dependency order)."""
    status = {child["task_id"]: child for child in children}
    for task in order:
        child = status[task["task_id"]]
        if child["status"] == "enrollable" and any(
                status[blocker]["status"] in UNAVAILABLE_STATUSES for blocker in task["blocked_by"]):
            child.update(status="blocked", reason="dependency_unavailable")


def _enrollable(children: list[dict[str, Any]]) -> list[PlanChild]:
    ids = {child["task_id"] for child in children if child["status"] == "enrollable"}
    return [PlanChild(task_id=child["task_id"], slice_id=child["slice_id"],
                      blocked_by=[blocker for blocker in child["blocked_by"] if blocker in ids],
                      intent_path=child["intent_path"], intent_revision=child["intent_revision"],
                      intent_content_hash=child["intent_content_hash"])
            for child in children if child["task_id"] in ids]


def _budget(count: int, max_children: int | None, qa_failure_limit: int | None) -> dict[str, int]:
    maximum = count if max_children is None else _positive_budget(max_children, "budget.max_children")
    if maximum > count:
        raise InvalidPlan(f"budget.max_children must not exceed the {count} enrollable children")
    limit = (DEFAULT_QA_FAILURE_LIMIT if qa_failure_limit is None
             else _positive_budget(qa_failure_limit, "budget.qa_failure_limit"))
    return {"max_children": maximum, "qa_failure_limit": limit}


def _positive_budget(value: Any, name: str) -> int:
    number = safe_integer(value)
    if number is None or number <= 0:
        raise InvalidPlan(f"{name} must be a positive safe integer")
    return number


def _plan(normalized: dict[str, Any], children: list[dict[str, Any]], enrollable: list[PlanChild],
          scopes: dict[str, list[str] | None], budget: dict[str, int]) -> dict[str, Any]:
    groups = project_parallel_groups([{"task_id": child.task_id, "blocked_by": child.blocked_by,
                                       "scope_hint": scopes[child.task_id]} for child in enrollable])
    return {
        "initiative_slug": normalized["initiative_id"],
        "tracker_observation": normalized,
        "children": children,
        "enrollable": enrollable,
        "exclusions": [{"task_id": c["task_id"], "status": c["status"], "reason": c["reason"]}
                       for c in children if c["status"] != "enrollable"],
        "plan_digest": compute_batch_plan_digest(enrollable),
        "budget": budget,
        **groups,
    }
