"""The adaptive integration mode: per round, batched or speculative, from how often Lanes failed lately. Pure.

A batched round verifies one candidate that carries every Lane: the cheapest when it passes, and a
bisection (several verifications one after another) when it does not. A speculative round verifies
the stacked candidates side by side: more check runs, but a failure costs no extra round trip.
Which is faster depends on how likely the batch is to pass, as Mergify sizes its batches and Zuul
sizes its speculation window from what happened before.

The evidence is the log's: of the last `HISTORY` Lanes of this Initiative (this batch first, then its
earlier batches, newest first) that reached integration, how many failed there (parked on a check
that failed on their candidate, or on a conflict). The failure rate is estimated with a prior of a
quarter of a failure in five Lanes (`PRIOR_FAILURES`, `PRIOR_LANES`: 1 in 20), so that no history reads
as "failures are rare" and a failure or two in a short history does not read as certainty.

- When a batch of all the round's Lanes more likely passes than not ((1 - p)^B >= 1/2): batched.
- Otherwise: speculative, its window (candidates verified at once) the number of Lanes expected to
  pass before the next failure, 1/p, at least 2 and at most the round's Lanes (Zuul's window shrinks
  on failures the same way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

from .candidates import BATCHED, SPECULATIVE
HISTORY = 24
PRIOR_FAILURES, PRIOR_LANES = 0.25, 5
FAILED_AT_INTEGRATION = ("batch_integration_check_failed", "batch_integration_conflict")


@dataclass(frozen=True)
class RoundChoice:
    mode: str
    window: int
    considered: int
    failed: int
    reason: str


def integration_outcomes(record: dict[str, Any]) -> list[bool]:
    """Each child of a batch that reached integration, newest decision first: True integrated, False failed there.

    Children parked before integration (QA, scope, a lineage break) say nothing about candidates."""
    outcomes: list[bool] = []
    for child in reversed(record.get("children", [])):
        if child.get("state") in ("integrated", "released"):
            outcomes.append(True)
        elif child.get("state") == "needs_human" and str(child.get("reason") or "").startswith(FAILED_AT_INTEGRATION):
            outcomes.append(False)
    return outcomes


def choose_round(lanes: int, history: Iterable[bool]) -> RoundChoice:
    """The mode of a round of `lanes` Lanes given the recent outcomes (newest first)."""
    considered = list(history)[:HISTORY]
    failed = considered.count(False)
    rate = (failed + PRIOR_FAILURES) / (len(considered) + PRIOR_LANES)
    passes = (1 - rate) ** lanes
    said = (f"{failed} of the last {len(considered)} Lanes failed at integration: estimated failure rate "
            f"{rate:.3f}, so a batch of {lanes} passes with probability {passes:.2f}")
    if passes >= 0.5:
        return RoundChoice(BATCHED, 1, len(considered), failed, said + " (at least 1/2: one batched candidate)")
    window = max(2, min(lanes, math.floor(1 / rate)))
    return RoundChoice(SPECULATIVE, window, len(considered), failed,
                       said + f" (under 1/2: speculative, {window} candidates at once)")
