"""Whether an offered Lane may take a child (upstream's decideLaneAdmission).

The facts are read once by the adapter (docs/upstream.md#lane-inspection-and-admission); the decision is pure, so a
refused offer reads nothing more and writes nothing. Each refusal has one stable
reason, checked in a fixed order: the first broken condition names the refusal.
"""

from __future__ import annotations

from typing import Sequence

from ..ports import LaneFacts

FOREIGN_REPOSITORY = "batch_lane_foreign_repository"
IS_COORDINATOR = "batch_lane_is_coordinator"
BRANCH_MISMATCH = "batch_lane_branch_mismatch"
BASE_MISMATCH = "batch_lane_base_mismatch"
DIRTY = "batch_lane_dirty"
OCCUPIED = "batch_lane_occupied"
# Decided by the tick before the facts are read: absent, not pending, or not startable now.
UNKNOWN_CHILD = "batch_lane_unknown_child"

# In the order decide_lane_admission checks them, then the one decided before it.
ADMISSION_REASONS = (FOREIGN_REPOSITORY, IS_COORDINATOR, BRANCH_MISMATCH, BASE_MISMATCH, DIRTY, OCCUPIED,
                     UNKNOWN_CHILD)


def decide_lane_admission(facts: LaneFacts, coordinator_real_path: str, expected_branch: str, batch_head: str,
                          bound_paths: Sequence[str]) -> str | None:
    """None when the Lane is admitted, else the reason of the first failed check."""
    if not (facts.exists and facts.real_path and facts.same_repository and facts.is_worktree_root):
        return FOREIGN_REPOSITORY
    if facts.real_path == coordinator_real_path:
        return IS_COORDINATOR
    if facts.branch != expected_branch:
        return BRANCH_MISMATCH
    if facts.head != batch_head:
        return BASE_MISMATCH
    if not facts.clean:
        return DIRTY
    # An unreadable Lane store reports the claim "unreadable": that counts as occupied.
    if facts.active_claim_task_id is not None or facts.real_path in bound_paths:
        return OCCUPIED
    return None
