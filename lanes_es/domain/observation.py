"""What the tick does with an admitted or enrolled Lane, from its kernel projection (docs/upstream.md#the-steps-of-a-tick).

Pure: the projection and whether the batch's capability holds the child's slot are facts
read before; the decision names the one move the tick makes for the child. Deciding every
Lane before moving any lets the tick run the QA of several Lanes at once and still record
what it learnt in record order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

LANE_CONTRACT_MISMATCH = "batch_lane_contract_mismatch"
_CONTRACT_ERROR = re.compile(r"contract must equal|unknown field|schema version .* incompatible|unknown contract",
                             re.IGNORECASE)

PARK, ADOPT_CLAIM, ENROLL, SETTLE, WAIT, ADVANCE = "park", "adopt_claim", "enroll", "settle", "wait", "advance"


@dataclass(frozen=True)
class Observation:
    """One move: park (with `reason`), adopt_claim, enroll, settle, wait (the Executor's or the coordinator's
    move), or advance (the kernel runs the Lane's QA and Review)."""

    move: str
    reason: str = ""


def lane_unreadable_reason(error: str) -> str:
    """A Lane whose state this runtime refuses to read is a contract mismatch, not a lost Lane."""
    return f"{LANE_CONTRACT_MISMATCH}: {error}" if _CONTRACT_ERROR.search(error) else "batch_lane_lost"


def decide_observation(child: dict[str, Any], fresh: Any, slot_consumed: bool) -> Observation:
    """`fresh` is the Lane's `TaskProjection` (ports), read by the tick."""
    task_id, lane = child["task_id"], child["lane"]
    if fresh.error is not None:
        return Observation(PARK, lane_unreadable_reason(fresh.error))
    if lane.get("run_id") and fresh.run_id != lane["run_id"]:
        return Observation(PARK, "batch_lane_run_mismatch")
    holds_claim = fresh.claim_task_id == task_id
    if child["state"] == "lane_admitted":
        # A crash between admission and enrollment: adopt the claim the kernel already made.
        return Observation(ADOPT_CLAIM) if holds_claim and fresh.run_id else Observation(ENROLL)
    if fresh.lifecycle == "done" and fresh.completion_ready:
        return Observation(SETTLE)
    if not holds_claim:
        return Observation(PARK, "batch_lane_lost")
    if not slot_consumed:
        return Observation(PARK, "claim held by another batch")
    if child.get("correction_due"):
        return Observation(WAIT)  # waits for the coordinator's correction
    if fresh.next_obligation == "run_qa" or fresh.artifact_state != "frozen":
        return Observation(WAIT)  # the Executor's move
    return Observation(ADVANCE)
