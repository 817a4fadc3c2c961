"""The batch plan: observation normalization, dependency order, plan digest and projection (docs/upstream.md#the-plan-digest, #the-plan-and-child-statuses)."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanes_es.domain.events import PlanChild
from lanes_es.domain.initiative_file import parse_local_initiative
from lanes_es.domain.intent import canonical_intent_hash, parse_task_intent
from lanes_es.domain.plan import (
    InvalidPlan, compute_batch_plan_digest, dependency_order, normalize_observation, project_batch_plan,
    transitive_blocked_by,
)
from lanes_es.ports import IntentRead

SLUG = "local-batch"


def observation(*tasks: tuple[str, str, list[str]], contract: str = "immune_brain/local_initiative_observation/v1",
                **extra) -> dict:
    return {"contract": contract, "initiative_id": SLUG, "path": f"docs/initiatives/{SLUG}.md",
            "tasks": [{"task_id": t, "slice_id": s, "blocked_by": b} for t, s, b in tasks], **extra}


def intent_read(task_id: str, scope: list[str], risk: str = "routine", revision: int = 1) -> IntentRead:
    intent = parse_task_intent({
        "contract": "assurance_kernel/task_intent/v1", "task_id": task_id, "goal": f"Deliver {task_id}",
        "acceptance": [{"id": "A1", "assertion": "done", "verification": "{}"}], "scope_hint": scope, "risk": risk,
        "revision": revision, "owner": "user"})
    return IntentRead(intent=intent, content_hash=canonical_intent_hash(intent),
                      path=f"docs/plans/{task_id}.intent.json")


# ---------------------------------------------------------------- normalization


def test_tasks_are_sorted_and_blocked_by_is_sorted_and_unique():
    normalized = normalize_observation(observation(("b", "S2", ["c", "a", "a"]), ("a", "S1", []), ("c", "S3", [])), SLUG)
    assert normalized == {
        "contract": "immune_brain/local_initiative_observation/v1", "initiative_id": SLUG,
        "path": f"docs/initiatives/{SLUG}.md",
        "tasks": [{"task_id": "a", "slice_id": "S1", "blocked_by": []},
                  {"task_id": "b", "slice_id": "S2", "blocked_by": ["a", "c"]},
                  {"task_id": "c", "slice_id": "S3", "blocked_by": []}],
    }


@pytest.mark.parametrize("value, message", [
    (None, "tracker returned an invalid Initiative observation contract"),
    ({"contract": "x"}, "tracker returned an invalid Initiative observation contract"),
    ({**observation(), "initiative_id": "other"}, "tracker returned an observation for another Initiative"),
    ({**observation(), "tasks": {}}, "tracker returned an invalid Initiative Task list"),
    ({**observation(), "tasks": ["x"]}, "tracker Task 0 is invalid"),
    (observation(("../a", "S1", [])), "tracker Task 0 has an invalid task_id"),
    (observation(("a", "S 1", [])), "tracker Task 0 has an invalid slice_id"),
    (observation(("a", "S1", "b")), "tracker Task a has invalid blocked_by dependencies"),
    (observation(("a", "S1", [3])), "tracker Task a has invalid blocked_by dependencies"),
    (observation(("a", "S1", ["a"])), "tracker Task a has invalid blocked_by dependencies"),
    (observation(("a", "S1", []), ("a", "S2", [])), "tracker returned duplicate Task a"),
    (observation(("a", "S1", []), ("b", "S1", [])), "tracker returned duplicate Slice S1"),
    (observation(("a", "S1", ["elsewhere"])), "tracker Task a depends on unknown Task elsewhere"),
])
def test_observation_refusals(value, message):
    with pytest.raises(InvalidPlan) as raised:
        normalize_observation(value, SLUG)
    assert str(raised.value) == message


def test_a_github_observation_needs_issue_numbers():
    github = "immune_brain/github_initiative_observation/v1"
    with pytest.raises(InvalidPlan, match="^tracker returned an invalid Initiative Issue number$"):
        normalize_observation(observation(("a", "S1", []), contract=github), SLUG)
    value = observation(("a", "S1", []), contract=github, issue_number=7)
    with pytest.raises(InvalidPlan, match="^tracker Task a has an invalid Issue number$"):
        normalize_observation(value, SLUG)
    value["tasks"][0]["issue_number"] = 8
    assert normalize_observation(value, SLUG)["tasks"] == [
        {"task_id": "a", "slice_id": "S1", "blocked_by": [], "issue_number": 8}]


def test_dependency_order_is_kahn_layers_sorted_by_task_id():
    tasks = normalize_observation(observation(
        ("d", "S4", ["b", "c"]), ("c", "S3", ["a"]), ("b", "S2", ["a"]), ("a", "S1", []), ("e", "S5", [])), SLUG)["tasks"]
    assert [task["task_id"] for task in dependency_order(tasks)] == ["a", "e", "b", "c", "d"]
    assert transitive_blocked_by(tasks) == {"a": [], "b": ["a"], "c": ["a"], "d": ["a", "b", "c"], "e": []}


def layered_order(tasks):
    """The dependency order as first written: each layer found by scanning every remaining Task (quadratic)."""
    remaining = {task["task_id"]: task for task in tasks}
    placed, order = set(), []
    while remaining:
        layer = sorted(task_id for task_id, task in remaining.items() if all(b in placed for b in task["blocked_by"]))
        if not layer:
            raise InvalidPlan("acyclic")
        order.extend(remaining.pop(task_id) for task_id in layer)
        placed.update(layer)
    return order


@given(st.integers(min_value=0, max_value=10).flatmap(lambda count: st.lists(
    st.tuples(st.sampled_from([f"t{i}" for i in range(max(count, 1))]),
              st.lists(st.sampled_from([f"t{i}" for i in range(max(count, 1))] + ["unknown"]), max_size=3)),
    max_size=count)))
def test_dependency_order_equals_the_layered_scan(drawn):
    tasks = [{"task_id": task_id, "blocked_by": blocked} for task_id, blocked in drawn]
    try:
        expected = [task["task_id"] for task in layered_order(tasks)]
    except InvalidPlan:
        with pytest.raises(InvalidPlan, match="acyclic"):
            dependency_order(tasks)
        return
    assert [task["task_id"] for task in dependency_order(tasks)] == expected


def test_a_chain_whose_blockers_would_pass_a_million_entries_is_refused_before_it_is_built():
    tasks = [{"task_id": "t00000", "blocked_by": []}] + [
        {"task_id": f"t{i:05d}", "blocked_by": [f"t{i - 1:05d}"]} for i in range(1, 1500)]
    assert len(transitive_blocked_by(tasks[:1414])["t01413"]) == 1413  # 998,991 entries: planned
    with pytest.raises(InvalidPlan, match="more than 1,000,000 transitive blockers"):
        transitive_blocked_by(tasks)


def test_a_cycle_is_refused():
    tasks = [{"task_id": "a", "blocked_by": ["b"]}, {"task_id": "b", "blocked_by": ["a"]}]
    with pytest.raises(InvalidPlan, match="^Initiative Task dependencies must form an acyclic graph$"):
        dependency_order(tasks)
    with pytest.raises(InvalidPlan, match="acyclic"):
        normalize_and_plan(observation(("a", "S1", ["b"]), ("b", "S2", ["a"])))


def normalize_and_plan(value: dict, reads: dict | None = None, **kwargs) -> dict:
    reads = reads if reads is not None else {task["task_id"]: intent_read(task["task_id"], [f"{task['task_id']}/**"])
                                             for task in value["tasks"]}
    return project_batch_plan(value, reads, **kwargs)


# ---------------------------------------------------------------- digest


def plan_child(task_id: str, blocked_by: list[str], revision: int = 1, content_hash: str = "0" * 64) -> PlanChild:
    return PlanChild(task_id=task_id, slice_id=f"S-{task_id}", blocked_by=blocked_by,
                     intent_path=f"docs/plans/{task_id}.intent.json", intent_revision=revision,
                     intent_content_hash=content_hash)


def test_the_digest_is_compact_sorted_json_of_the_identities_in_plan_order():
    children = [plan_child("task-a", []), plan_child("task-b", ["task-a"], 2, "sha256:ff")]
    text = ('[{"blocked_by":[],"intent_content_hash":"' + "0" * 64 + '","intent_path":"docs/plans/task-a.intent.json",'
            '"intent_revision":1,"task_id":"task-a"},{"blocked_by":["task-a"],"intent_content_hash":"sha256:ff",'
            '"intent_path":"docs/plans/task-b.intent.json","intent_revision":2,"task_id":"task-b"}]')
    assert compute_batch_plan_digest(children) == "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_the_digest_keeps_blocked_by_order_and_ignores_slice_ids():
    first = [plan_child("a", []), plan_child("b", []), plan_child("c", ["a", "b"])]
    second = [plan_child("a", []), plan_child("b", []), plan_child("c", ["b", "a"])]
    assert compute_batch_plan_digest(first) != compute_batch_plan_digest(second)
    renamed = [PlanChild(**{**child.plain(), "slice_id": "other"}) for child in first]
    assert compute_batch_plan_digest(renamed) == compute_batch_plan_digest(first)
    assert compute_batch_plan_digest([child.plain() for child in first]) == compute_batch_plan_digest(first)


@pytest.mark.parametrize("children, message", [
    ([plan_child("a", ["b"]), plan_child("b", ["a"])], "batch plan dependency cycle at a"),
    ([plan_child("a", []), plan_child("b", ["c"]), plan_child("c", ["b"])], "batch plan dependency cycle at b"),
    ([plan_child("a", ["a"])], "batch plan dependency cycle at a"),
    ([plan_child("a", []), plan_child("a", [])], "batch plan has a duplicate child a"),
    ([plan_child("a", ["z"])], "batch plan child a depends on z, which is not in the plan"),
    ([plan_child("a", [], revision=0)], "batch plan child a has an invalid intent identity"),
    ([{**plan_child("a", []).plain(), "intent_revision": 1.0}], "batch plan child a has an invalid intent identity"),
    ([{**plan_child("a", []).plain(), "intent_revision": True}], "batch plan child a has an invalid intent identity"),
    ([{**plan_child("a", []).plain(), "intent_path": None}], "batch plan child a has an invalid intent identity"),
    ([{**plan_child("a", []).plain(), "intent_content_hash": None}], "batch plan child a has an invalid intent identity"),
    ([{"blocked_by": []}], "batch plan child has no task_id"),
])
def test_the_digest_refuses_a_child_plan_the_registry_would_refuse(children, message):
    with pytest.raises(InvalidPlan) as raised:
        compute_batch_plan_digest(children)
    assert str(raised.value) == message


def test_a_deep_chain_is_checked_without_recursion():
    children = [plan_child("t0", [])] + [plan_child(f"t{i}", [f"t{i - 1}"]) for i in range(1, 5000)]
    assert compute_batch_plan_digest(children).startswith("sha256:")


# ---------------------------------------------------------------- projection


CARRIER = """# Local batch
## S1: Alpha exists
Tasks:
- local-alpha
## S2: Beta exists
Tasks:
- `local-beta`
## S3: Gamma follows alpha
Blocked by: local-alpha
Tasks:
- local-gamma
"""


def local_plan() -> dict:
    value = parse_local_initiative(CARRIER, SLUG, f"docs/initiatives/{SLUG}.md")
    reads = {"local-alpha": intent_read("local-alpha", ["alpha/**"]), "local-beta": intent_read("local-beta", ["beta/**"]),
             "local-gamma": intent_read("local-gamma", ["gamma/**"])}
    return project_batch_plan(value, reads)


def test_grp04_loc06_a_local_plan_carries_its_children_and_parallel_groups():
    plan = local_plan()
    assert [[c["task_id"], c["slice_id"], c["status"], c["blocked_by"]] for c in plan["children"]] == [
        ["local-alpha", "S1", "enrollable", []], ["local-beta", "S2", "enrollable", []],
        ["local-gamma", "S3", "enrollable", ["local-alpha"]]]
    assert plan["parallel_groups"] == [["local-alpha", "local-beta"], ["local-gamma"]]
    assert plan["scope_conflicts"] == []
    assert plan["tracker_observation"]["contract"] == "immune_brain/local_initiative_observation/v1"
    assert plan["budget"] == {"max_children": 3, "qa_failure_limit": 2}
    assert plan["exclusions"] == []
    assert plan["plan_digest"] == compute_batch_plan_digest(plan["enrollable"])


def test_the_enrollable_children_carry_their_intent_identities():
    plan = local_plan()
    gamma = plan["enrollable"][2]
    assert gamma == PlanChild(task_id="local-gamma", slice_id="S3", blocked_by=["local-alpha"],
                              intent_path="docs/plans/local-gamma.intent.json", intent_revision=1,
                              intent_content_hash=intent_read("local-gamma", ["gamma/**"]).content_hash)
    assert plan["children"][2]["intent_content_hash"] == gamma.intent_content_hash


def test_loc07_local_and_github_carriers_give_the_same_plan():
    local = local_plan()
    github = parse_local_initiative(CARRIER, SLUG, "unused")
    github = {"contract": "immune_brain/github_initiative_observation/v1", "initiative_id": SLUG, "issue_number": 10,
              "tasks": [{**task, "issue_number": 11 + index} for index, task in enumerate(github["tasks"])]}
    reads = {task["task_id"]: intent_read(task["task_id"], [task["task_id"].split("-")[1] + "/**"])
             for task in github["tasks"]}
    plan = project_batch_plan(github, reads)
    assert plan["plan_digest"] == local["plan_digest"]
    assert plan["children"] == local["children"]


def test_statuses_exclusions_and_blocked_dependents():
    value = observation(("a", "S1", []), ("b", "S2", ["a"]), ("c", "S3", []), ("d", "S4", ["c"]), ("e", "S5", []),
                        ("f", "S6", ["e"]), ("g", "S7", []), ("h", "S8", ["g"]), ("i", "S9", ["h"]), ("j", "S10", []),
                        ("k", "S11", ["j"]))
    reads = {task: intent_read(task, [f"{task}.txt"]) for task in "abcdefghijk"}
    reads["c"] = intent_read("c", ["c.txt"], risk="critical")
    reads["e"] = "TaskIntent docs/plans/e.intent.json is not tracked"
    reads["j"] = "spec_binding_incomplete: docs/specs/archive/x.spec.md"
    plan = project_batch_plan(value, reads, settled_tasks=["a"], owned_tasks=["g"])
    status = {c["task_id"]: (c["status"], c["reason"]) for c in plan["children"]}
    assert status == {
        "a": ("already_settled", None), "b": ("enrollable", None), "c": ("needs_human", "critical"),
        "d": ("blocked", "dependency_unavailable"), "e": ("needs_human", "invalid_intent"),
        "f": ("blocked", "dependency_unavailable"), "g": ("already_owned", None),
        "h": ("blocked", "dependency_unavailable"), "i": ("blocked", "dependency_unavailable"),
        "j": ("needs_human", "spec_binding_incomplete: docs/specs/archive/x.spec.md"),
        "k": ("blocked", "dependency_unavailable"),
    }
    assert [child.task_id for child in plan["enrollable"]] == ["b"]
    assert plan["enrollable"][0].blocked_by == []  # a is settled, not part of the batch
    # Exclusions follow the plan's dependency order: Kahn layers, each sorted by task_id.
    assert [e["task_id"] for e in plan["exclusions"]] == ["a", "c", "e", "g", "j", "d", "f", "h", "k", "i"]
    assert plan["exclusions"][1] == {"task_id": "c", "status": "needs_human", "reason": "critical"}
    assert plan["budget"]["max_children"] == 1


def test_a_missing_intent_read_is_an_invalid_intent():
    plan = project_batch_plan(observation(("a", "S1", []), ("b", "S2", [])), {"a": intent_read("a", ["a.txt"])})
    assert [(c["task_id"], c["status"], c["reason"]) for c in plan["children"]] == [
        ("a", "enrollable", None), ("b", "needs_human", "invalid_intent")]


def test_only_a_direct_blocker_that_cannot_run_blocks_a_dependent():
    # c waits on b (settled) which waited on a (needs a human): b's work is done, so c may still run.
    value = observation(("a", "S1", []), ("b", "S2", ["a"]), ("c", "S3", ["b"]))
    reads = {"a": "unreadable", "c": intent_read("c", ["c.txt"])}
    plan = project_batch_plan(value, reads, settled_tasks=["b"])
    assert [(c["task_id"], c["status"]) for c in plan["children"]] == [
        ("a", "needs_human"), ("b", "already_settled"), ("c", "enrollable")]
    assert plan["children"][2]["blocked_by"] == ["a", "b"]
    assert plan["enrollable"][0].blocked_by == []


def test_enrollable_blocked_by_is_the_closure_restricted_to_enrollable_children():
    value = observation(("a", "S1", []), ("b", "S2", ["a"]), ("c", "S3", ["b"]), ("x", "S4", []), ("d", "S5", ["c", "x"]))
    plan = normalize_and_plan(value, settled_tasks=["x"])
    assert {c.task_id: c.blocked_by for c in plan["enrollable"]} == {
        "a": [], "b": ["a"], "c": ["a", "b"], "d": ["a", "b", "c"]}


def test_a_task_both_settled_and_owned_is_a_conflict():
    with pytest.raises(InvalidPlan, match="^Task a has conflicting settled and active state$"):
        normalize_and_plan(observation(("a", "S1", [])), settled_tasks=["a"], owned_tasks=["a"])


def test_a_plan_with_nothing_enrollable_is_refused():
    with pytest.raises(InvalidPlan) as raised:
        normalize_and_plan(observation(("a", "S1", [])), settled_tasks=["a"])
    assert str(raised.value) == "batch plan has no enrollable children; nothing to confirm"


def test_overlapping_enrollable_children_are_reported_as_scope_conflicts():
    value = observation(("a", "S1", []), ("b", "S2", []))
    plan = project_batch_plan(value, {"a": intent_read("a", ["src"]), "b": intent_read("b", ["src/b.ts"])})
    assert plan["parallel_groups"] == [["a"], ["b"]]
    assert plan["scope_conflicts"] == [{"task_id": "b", "overlaps_with": ["a"]}]


def test_the_budget_may_be_narrowed_but_not_widened():
    value = observation(("a", "S1", []), ("b", "S2", []))
    assert normalize_and_plan(value, max_children=1, qa_failure_limit=5)["budget"] == {
        "max_children": 1, "qa_failure_limit": 5}
    with pytest.raises(InvalidPlan, match="max_children"):
        normalize_and_plan(value, max_children=3)
    with pytest.raises(InvalidPlan, match="qa_failure_limit"):
        normalize_and_plan(value, qa_failure_limit=0)


def test_the_slug_may_be_checked_against_the_observation():
    with pytest.raises(InvalidPlan, match="another Initiative"):
        normalize_and_plan(observation(("a", "S1", [])), slug="other")


@st.composite
def dags(draw):
    count = draw(st.integers(min_value=1, max_value=8))
    tasks = []
    for index in range(count):
        earlier = [f"t{i}" for i in range(index)]
        blocked = draw(st.lists(st.sampled_from(earlier), unique=True, max_size=3)) if earlier else []
        tasks.append((f"t{index}", f"S{index}", blocked))
    order = draw(st.permutations(tasks))
    return observation(*order)


@given(dags())
def test_any_dag_plans_every_child_after_its_blockers_with_a_stable_digest(value):
    plan = normalize_and_plan(value)
    position = {child.task_id: index for index, child in enumerate(plan["enrollable"])}
    for child in plan["enrollable"]:
        assert all(position[blocker] < position[child.task_id] for blocker in child.blocked_by)
        assert child.blocked_by == sorted(child.blocked_by)
    reordered = {**value, "tasks": list(reversed(value["tasks"]))}
    assert normalize_and_plan(reordered)["plan_digest"] == plan["plan_digest"]
    assert json.loads(json.dumps(plan["children"])) == plan["children"]


@pytest.mark.parametrize("reason", ["spec_binding_missing", "spec_binding_ambiguous"])
def test_a_spec_binding_exclusion_is_kept_as_the_childs_reason(reason):
    """docs/upstream.md#reason-codes: each spec_binding_* reason parks the child as needs_human
    with that reason, and its dependent is blocked behind it."""
    reads = {"a": f"{reason}: docs/specs/a.spec.md", "b": intent_read("b", ["b.txt"])}
    plan = project_batch_plan(observation(("a", "S1", []), ("b", "S2", ["a"]), ("c", "S3", [])),
                              {**reads, "c": intent_read("c", ["c.txt"])})
    status = {c["task_id"]: (c["status"], c["reason"]) for c in plan["children"]}
    assert status == {"a": ("needs_human", f"{reason}: docs/specs/a.spec.md"),
                      "b": ("blocked", "dependency_unavailable"), "c": ("enrollable", None)}
