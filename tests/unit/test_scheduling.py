"""The scheduler: scope overlap, startable children and the confirmation's waves (tests/SCENARIOS.md)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanes_es.domain.scheduling import (
    DONE_STATES, IN_FLIGHT_STATES, project_parallel_groups, project_scope_overlap, scope_prefix, scopes_overlap,
    startable_children,
)

ALL_STATES = sorted({"pending", "lane_admitted", "enrolled", "settled", "lane_committed", "integrated", "released",
                     "needs_human", "skipped_blocked", "committed"})


def child(task_id: str, scope: list[str], state: str = "pending", blocked_by: list[str] | None = None) -> dict:
    return {"task_id": task_id, "state": state, "blocked_by": blocked_by or [], "scope_hint": scope}


# ---------------------------------------------------------------- scope overlap


@pytest.mark.parametrize("left, right", [
    (["runtime/a.ts"], ["runtime/b.ts"]),
    (["docs/a"], ["docs/ab"]),
    (["docs/plans/*.json"], ["docs/specs/x.md"]),
    (["runtime/a.ts", "docs/x.md"], ["tests/a.test.ts", "scripts/b.ts"]),
    (["./runtime/a.ts"], ["runtime/b.ts"]),
    (["src/foo*"], ["docs/x.md"]),
])
def test_sch01_provably_disjoint_scopes_do_not_overlap(left, right):
    assert scopes_overlap(left, right) is False
    assert scopes_overlap(right, left) is False


@pytest.mark.parametrize("left, right", [
    (["runtime/a.ts"], ["runtime/a.ts"]),
    (["runtime"], ["runtime/a.ts"]),
    (["runtime/a.ts"], ["runtime/"]),
    (["runtime/**"], ["runtime/deep/file.ts"]),
    (["runtime/deep/*.ts"], ["runtime/**"]),
    (["./runtime/a.ts"], ["runtime/a.ts"]),
    (["Runtime/A.ts"], ["runtime/a.ts"]),
    (["src/foo*"], ["src/foobar/x.ts"]),
    (["src/foo*"], ["src/other/x.ts"]),
])
def test_sch02_identical_nested_wildcard_and_case_variant_scopes_overlap(left, right):
    assert scopes_overlap(left, right) is True
    assert scopes_overlap(right, left) is True


@pytest.mark.parametrize("pattern", ["**/*.ts", "*.md", "{a,b}/x", "?/x", "[ab]/x", "!x/y"])
def test_sch03_a_pattern_with_an_empty_literal_prefix_overlaps_everything(pattern):
    assert scope_prefix(pattern) == []
    assert scopes_overlap([pattern], ["docs/a.md"]) is True


@pytest.mark.parametrize("left, right", [
    ([], ["docs/a.md"]),
    (["docs/a.md"], []),
    (["/etc/passwd"], ["docs/a.md"]),
    (["../outside/x"], ["tests/a.ts"]),
    (["docs\\a.md"], ["tests/a.ts"]),
    ([""], ["docs/a.md"]),
    (["docs/./a.md"], ["tests/a.ts"]),
    ([42], ["tests/a.ts"]),
])
def test_sch04_scopes_that_cannot_be_proven_disjoint_overlap(left, right):
    assert scopes_overlap(left, right) is True


def test_scope_prefix_cuts_back_to_the_last_slash_before_a_wildcard():
    assert scope_prefix("src/foo*/bar") == ["src"]
    assert scope_prefix("  ./././Docs/Plans/*.json ") == ["docs", "plans"]
    assert scope_prefix("runtime/") == ["runtime"]
    assert scope_prefix("a//b") == ["a", "b"]


# ---------------------------------------------------------------- startable children


def test_sch05_ready_disjoint_children_start_together_up_to_the_limit():
    children = [child("a", ["runtime/a.ts"]), child("b", ["docs/b.md"]), child("c", ["tests/c.ts"])]
    assert startable_children(children, 3) == ["a", "b", "c"]
    assert startable_children(children, 2) == ["a", "b"]
    assert startable_children(children, math.inf) == ["a", "b", "c"]


@pytest.mark.parametrize("first, second", [
    ("runtime/a.ts", "runtime/a.ts"),
    ("runtime", "runtime/b.ts"),
    ("runtime/**", "runtime/x/y.ts"),
    ("**/*.ts", "docs/b.md"),
])
def test_sch06_overlapping_pending_children_serialize(first, second):
    assert startable_children([child("a", [first]), child("b", [second])], 4) == ["a"]


@pytest.mark.parametrize("state", ["pending", "enrolled", "settled", "lane_admitted", "lane_committed",
                                   "needs_human", "skipped_blocked"])
def test_sch08_a_blocker_that_is_not_done_holds_its_dependent(state):
    children = [child("a", ["runtime/a.ts"], state), child("b", ["docs/b.md"], blocked_by=["a"])]
    assert "b" not in startable_children(children, 4)


@pytest.mark.parametrize("state", ["committed", "integrated", "released"])
def test_sch08_only_a_done_blocker_unblocks_its_dependent(state):
    children = [child("a", ["runtime/a.ts"], state), child("b", ["docs/b.md"], blocked_by=["a"])]
    assert startable_children(children, 4) == ["b"]


@pytest.mark.parametrize("state", sorted(IN_FLIGHT_STATES))
def test_sch09_in_flight_children_hold_their_scope_and_a_slot(state):
    assert startable_children([child("a", ["runtime/a.ts"], state), child("b", ["runtime/a.ts"])], 4) == []
    assert startable_children([child("a", ["runtime/a.ts"], state), child("b", ["docs/b.md"])], 4) == ["b"]
    assert startable_children([child("a", ["runtime/a.ts"], state), child("b", ["docs/b.md"])], 1) == []


def test_sch09_two_in_flight_children_leave_the_remaining_slots():
    children = [child("a", ["runtime/a.ts"], "enrolled"), child("b", ["runtime/b.ts"], "lane_admitted"),
                child("c", ["docs/c.md"]), child("d", ["tests/d.ts"])]
    assert startable_children(children, 3) == ["c"]
    assert startable_children(children, 4) == ["c", "d"]
    assert startable_children(children, 2) == []


def test_sch10_parked_or_skipped_siblings_occupy_no_slot():
    children = [child("a", ["x"], "needs_human"), child("b", ["x"], "skipped_blocked"), child("c", ["x"])]
    assert startable_children(children, 1) == ["c"]


def serial_oracle(children: list[dict]) -> list[str]:
    """The serial runner's choice: nothing while a child runs, else the first ready pending child."""
    if any(c["state"] in IN_FLIGHT_STATES for c in children):
        return []
    done = {c["task_id"] for c in children if c["state"] in DONE_STATES}
    for c in children:
        if c["state"] == "pending" and all(b in done for b in c["blocked_by"]):
            return [c["task_id"]]
    return []


def test_sch11_max_parallel_1_reproduces_the_serial_choice_for_every_state_combination():
    shape = [("a", ["runtime/shared.ts"], []), ("b", ["runtime/shared.ts"], ["a"]),
             ("c", ["runtime/shared.ts"], ["a"]), ("d", ["runtime/shared.ts"], ["b", "c"]), ("e", ["docs/e.md"], [])]
    states = ["pending", "committed", "needs_human", "skipped_blocked"]
    combinations = list(itertools.product(states, repeat=len(shape)))
    assert len(combinations) == 1024
    for combination in combinations:
        children = [child(task, scope, state, blocked) for (task, scope, blocked), state in zip(shape, combination)]
        assert startable_children(children, 1) == serial_oracle(children), combination


def test_sch12_a_serial_run_starts_nothing_while_a_child_is_enrolled():
    assert startable_children([child("a", ["runtime/a.ts"], "enrolled"), child("b", ["docs/b.md"])], 1) == []


@pytest.mark.parametrize("limit", [0, -1, 1.5, math.nan, 2**53 + 1, float(2**53 + 2), "2", None, True, -math.inf])
def test_sch13_an_invalid_limit_is_rejected(limit):
    with pytest.raises(ValueError, match="max_parallel"):
        startable_children([child("a", ["x"])], limit)


def test_sch13_integral_numbers_are_valid_limits():
    assert startable_children([child("a", ["x"])], 2.0) == ["a"]
    assert startable_children([child("a", ["x"])], 2**53 - 1) == ["a"]


def test_sch16_an_unreadable_scope_serializes_behind_every_in_flight_child():
    children = [child("a", ["docs/a.md"], "enrolled"), child("b", ["**"]), child("c", ["tests/c.ts"])]
    assert startable_children(children, 4) == ["c"]
    assert startable_children([child("b", ["**"]), child("c", ["tests/c.ts"])], 4) == ["b"]


def test_children_may_be_objects_with_the_same_fields():
    @dataclass
    class View:
        task_id: str
        state: str
        blocked_by: list[str]
        scope_hint: list[str]

    children = [View("a", "pending", [], ["a.txt"]), View("b", "pending", [], ["b.txt"])]
    assert startable_children(children, 2) == ["a", "b"]


# ---------------------------------------------------------------- parallel groups


def test_grp01_waves_and_serialized_children():
    children = [child("a", ["runtime/a/**"]), child("b", ["docs/b.md"]), child("c", ["runtime/a/deep.ts"]),
                child("d", ["tests/d.ts"], blocked_by=["a", "b"])]
    assert project_parallel_groups(children) == {
        "parallel_groups": [["a", "b"], ["c", "d"]],
        "scope_conflicts": [{"task_id": "c", "overlaps_with": ["a"]}],
    }


def test_grp01_overlaps_with_is_sorted_and_lists_every_wave_member_hit():
    children = [child("z", ["src/z.ts"]), child("m", ["docs/m.md"]), child("w", ["src/z.ts", "docs"])]
    assert project_parallel_groups(children)["scope_conflicts"] == [{"task_id": "w", "overlaps_with": ["m", "z"]}]


def test_grp02_a_strictly_serial_plan_gives_one_child_per_wave():
    children = [child("s1", ["runtime/x.ts"]), child("s2", ["runtime/x.ts"], blocked_by=["s1"]),
                child("s3", ["runtime/x.ts"], blocked_by=["s2", "s1"])]
    assert project_parallel_groups(children) == {"parallel_groups": [["s1"], ["s2"], ["s3"]], "scope_conflicts": []}


def test_grp03_a_cyclic_graph_is_rejected():
    with pytest.raises(ValueError, match="acyclic"):
        project_parallel_groups([child("a", ["a"], blocked_by=["b"]), child("b", ["b"], blocked_by=["a"])])


def test_grp05_the_overlap_report_for_disjoint_scopes():
    report = project_scope_overlap([{"task_id": "a", "scope_hint": ["src/a.ts"]},
                                    {"task_id": "b", "scope_hint": ["src/b.ts"]}])
    assert report == {"contract": "assurance_kernel/intent_scope_overlap/v1", "overlaps": [],
                      "parallel_groups": [["a", "b"]]}


def test_grp06_the_overlap_report_names_the_shared_entry_pair_and_orders_the_children_serially():
    spec = "docs/specs/user-acceptance-scenarios.spec.md"
    report = project_scope_overlap([
        {"task_id": "s2", "scope_hint": [spec, "runtime/s2.ts"]},
        {"task_id": "s3", "scope_hint": ["tests/s3.ts", spec]},
    ])
    assert report["contract"] == "assurance_kernel/intent_scope_overlap/v1"
    assert len(report["overlaps"]) == 1
    assert report["overlaps"][0]["task_ids"] == ["s2", "s3"]
    assert report["overlaps"][0]["entries"] == [[spec, spec]]
    assert report["parallel_groups"] == [["s2"], ["s3"]]


# ---------------------------------------------------------------- properties


SEGMENTS = st.sampled_from(["a", "A", "b", "src", "docs", ".", "..", "*", "**", "?", "x*", "[a]", "{a,b}", " c", ""])
ENTRY = st.one_of(st.lists(SEGMENTS, min_size=1, max_size=4).map("/".join),
                  st.text(alphabet="ab/*?.\\ {}[]!", max_size=8))
SCOPE = st.lists(ENTRY, max_size=3)


@given(SCOPE, SCOPE)
def test_scopes_overlap_is_symmetric(left, right):
    assert scopes_overlap(left, right) == scopes_overlap(right, left)


@given(SCOPE)
def test_a_non_empty_scope_overlaps_itself(scope):
    if scope:
        assert scopes_overlap(scope, scope)


@st.composite
def schedules(draw):
    count = draw(st.integers(min_value=0, max_value=7))
    children = []
    for index in range(count):
        earlier = [f"t{i}" for i in range(index)]
        blocked = draw(st.lists(st.sampled_from(earlier), unique=True, max_size=2)) if earlier else []
        children.append(child(f"t{index}", draw(SCOPE), draw(st.sampled_from(ALL_STATES)), blocked))
    return children


LIMITS = st.one_of(st.integers(min_value=1, max_value=5), st.just(math.inf))


@settings(max_examples=300)
@given(schedules(), LIMITS)
def test_startable_never_exceeds_the_free_slots_and_picks_only_ready_disjoint_children(children, limit):
    picked = startable_children(children, limit)
    in_flight = [c for c in children if c["state"] in IN_FLIGHT_STATES]
    done = {c["task_id"] for c in children if c["state"] in DONE_STATES}
    by_id = {c["task_id"]: c for c in children}
    assert len(picked) <= max(0, limit - len(in_flight))
    assert len(set(picked)) == len(picked)
    for task_id in picked:
        assert by_id[task_id]["state"] == "pending"
        assert all(blocker in done for blocker in by_id[task_id]["blocked_by"])
        assert not any(scopes_overlap(by_id[task_id]["scope_hint"], other["scope_hint"]) for other in in_flight)
    for first, second in itertools.combinations(picked, 2):
        assert not scopes_overlap(by_id[first]["scope_hint"], by_id[second]["scope_hint"])
    assert [c["task_id"] for c in children if c["task_id"] in picked] == picked  # record order


@settings(max_examples=300)
@given(schedules())
def test_with_limit_1_the_scheduler_equals_the_serial_oracle(children):
    assert startable_children(children, 1) == serial_oracle(children)


@given(schedules())
def test_parallel_groups_place_every_child_once_after_its_blockers(children):
    groups = project_parallel_groups(children)["parallel_groups"]
    placed = [task for wave in groups for task in wave]
    assert sorted(placed) == sorted(c["task_id"] for c in children)
    wave_of = {task: index for index, wave in enumerate(groups) for task in wave}
    for c in children:
        assert all(wave_of[b] < wave_of[c["task_id"]] for b in c["blocked_by"])


def quadratic_parallel_groups(children: list[dict]) -> dict:
    """The waves as first written: every ready child against every wave member, wave by wave. The oracle the
    near-linear projection must equal (it took 30 s for 4,000 slices; `lanes-es bench plan` measures it now)."""
    remaining, placed, groups, conflicts = list(children), set(), [], {}
    while remaining:
        ready = [c for c in remaining if all(b in placed for b in c["blocked_by"])]
        if not ready:
            raise ValueError("acyclic")
        wave = []
        for c in ready:
            overlapped = [m for m in wave if scopes_overlap(c["scope_hint"], m["scope_hint"])]
            if overlapped:
                conflicts.setdefault(c["task_id"], set()).update(m["task_id"] for m in overlapped)
                continue
            wave.append(c)
        groups.append([c["task_id"] for c in wave])
        placed.update(c["task_id"] for c in wave)
        remaining = [c for c in remaining if not any(c is m for m in wave)]
    return {"parallel_groups": groups,
            "scope_conflicts": [{"task_id": c["task_id"], "overlaps_with": sorted(conflicts[c["task_id"]])}
                                for c in children if c["task_id"] in conflicts]}


@st.composite
def plans(draw):
    """Up to 12 children, any blockers among them (cycles and unknown blockers included), scopes drawn from a
    small alphabet so that nesting, equal entries, wildcards and empty scopes meet often."""
    count = draw(st.integers(min_value=0, max_value=12))
    names = [f"t{index}" for index in range(count)]
    blockers = st.lists(st.sampled_from(names + ["unknown"]), max_size=3) if names else st.just([])
    return [child(name, draw(SCOPE), blocked_by=draw(blockers)) for name in names]


@settings(max_examples=200)
@given(plans())
def test_parallel_groups_equal_the_quadratic_projection(children):
    try:
        expected = quadratic_parallel_groups(children)
    except ValueError:
        with pytest.raises(ValueError, match="acyclic"):
            project_parallel_groups(children)
        return
    assert project_parallel_groups(children) == expected


def test_parallel_groups_of_thousands_of_disjoint_and_nested_scopes_equal_the_quadratic_projection():
    """Larger than hypothesis draws: 600 children over a shared tree of paths, with chains of blockers."""
    children = [child(f"t{index}", [f"src/{index % 7}/{index % 13}/f{index % 50}.py", f"docs/{index % 11}/"],
                      blocked_by=[f"t{index - 40}"] if index >= 40 and index % 3 == 0 else [])
                for index in range(600)]
    children[5]["scope_hint"] = []  # overlaps everything
    children[17]["scope_hint"] = ["src/**"]
    assert project_parallel_groups(children) == quadratic_parallel_groups(children)
