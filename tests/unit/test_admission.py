"""Lane admission from the facts of an offered path (scenarios LANE-ADM-01/02)."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from lanes_es.domain.admission import ADMISSION_REASONS, decide_lane_admission
from lanes_es.ports import LaneFacts

CLEAN = LaneFacts(exists=True, real_path="/lane", same_repository=True, is_worktree_root=True,
                  branch="imm-lane/s/t", head="h", clean=True, active_claim_task_id=None)


def decide(facts: LaneFacts = CLEAN, bound_paths: tuple[str, ...] = ()) -> str | None:
    return decide_lane_admission(facts, "/coordinator", "imm-lane/s/t", "h", list(bound_paths))


def test_adm01_a_clean_unoccupied_lane_on_the_expected_branch_at_the_batch_head_is_admitted():
    assert decide() is None


@pytest.mark.parametrize("change, reason", [
    ({"exists": False, "real_path": None}, "batch_lane_foreign_repository"),
    ({"real_path": None}, "batch_lane_foreign_repository"),
    ({"same_repository": False}, "batch_lane_foreign_repository"),
    ({"is_worktree_root": False}, "batch_lane_foreign_repository"),
    ({"real_path": "/coordinator"}, "batch_lane_is_coordinator"),
    ({"branch": "other"}, "batch_lane_branch_mismatch"),
    ({"branch": None}, "batch_lane_branch_mismatch"),
    ({"head": "moved"}, "batch_lane_base_mismatch"),
    ({"clean": False}, "batch_lane_dirty"),
    ({"active_claim_task_id": "task-z"}, "batch_lane_occupied"),
    ({"active_claim_task_id": "unreadable"}, "batch_lane_occupied"),
])
def test_adm02_each_refusal_has_one_stable_reason(change, reason):
    assert decide(msgspec.structs.replace(CLEAN, **change)) == reason


def test_adm02_a_path_another_child_already_holds_is_occupied():
    assert decide(bound_paths=("/lane",)) == "batch_lane_occupied"
    assert decide(bound_paths=("/other-lane",)) is None


# Each failure and the reason it yields, in the order the checks run.
FAILURES = [
    ({"same_repository": False}, "batch_lane_foreign_repository"),
    ({"real_path": "/coordinator"}, "batch_lane_is_coordinator"),
    ({"branch": "other"}, "batch_lane_branch_mismatch"),
    ({"head": "moved"}, "batch_lane_base_mismatch"),
    ({"clean": False}, "batch_lane_dirty"),
    ({"active_claim_task_id": "task-z"}, "batch_lane_occupied"),
]


@pytest.mark.parametrize("combination", [combo for size in range(2, 7)
                                         for combo in itertools.combinations(range(len(FAILURES)), size)])
def test_adm02_several_failures_name_the_first_in_check_order(combination):
    facts = CLEAN
    for index in combination:
        facts = msgspec.structs.replace(facts, **FAILURES[index][0])
    assert decide(facts) == FAILURES[min(combination)][1]


def test_admission_reasons_list_the_decision_order_then_the_unknown_child():
    assert ADMISSION_REASONS == (
        "batch_lane_foreign_repository", "batch_lane_is_coordinator", "batch_lane_branch_mismatch",
        "batch_lane_base_mismatch", "batch_lane_dirty", "batch_lane_occupied", "batch_lane_unknown_child")
