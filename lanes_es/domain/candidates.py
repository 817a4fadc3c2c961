"""Which integration candidates to build and verify next, given the verdicts so far. Pure.

A candidate is named by the Lanes it carries on top of the round's batch head, in plan
order: ("a",) is head + a, ("a", "b") is head + a + b. Serial integration verifies one
candidate at a time, each on the last one that passed. A merge queue verifies the chain
ahead at once, assuming every Lane before passes (Zuul's speculative gate); when one
fails, the candidates after it were built on a state that will never exist: they are
discarded and rebuilt on the nearest passing one (reparented). Because a candidate is
named by what it carries, a verdict is reused only for exactly the tree serial would have
verified, so the outcome (which Lanes integrate, which park, and on which candidate) is
serial's.

`batched` verifies only the top candidate (every Lane at once) and bisects on a failure,
with a cap on verifications before it falls back to serial.

A batched round lands every Lane of a passing top candidate without verifying the shorter
candidates under it: a check that passes with more Lanes' work on top is taken to pass with
less. `covering` applies that same assumption check by check (learning within the round): a
task's check that passed on a longer candidate of the round, one that carries the candidate as
its prefix, is not run again on it. So a bisection after a failure runs only the checks that
failed (or were not run) above, not every check of each half again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Candidate = tuple[str, ...]
CheckKey = tuple[str, str]  # a task's check: its task id and the digest of its acceptance

CHECK_FAILED = "batch_integration_check_failed"

SERIAL, SPECULATIVE, BATCHED, ADAPTIVE = "serial", "speculative", "batched", "adaptive"
INTEGRATION_MODES = (SERIAL, SPECULATIVE, BATCHED, ADAPTIVE)
DEFAULT_INTEGRATION = ADAPTIVE  # bench realrepo: fastest on passing work, no slower with a failure


@dataclass(frozen=True)
class Schedule:
    """`decided`: Lanes whose fate is settled, in plan order, True to integrate (on the candidate
    `(*accepted before it, lane)`), False to park; `to_verify`: the candidates to build and verify
    now, each one's parent first; `discarded`: verified candidates no Lane will ever land on;
    `chain`: each Lane's candidate as things stand (a candidate not in it is stranded: a Lane it
    stands on failed)."""

    decided: list[tuple[str, bool, Candidate]] = field(default_factory=list)
    to_verify: list[Candidate] = field(default_factory=list)
    discarded: list[Candidate] = field(default_factory=list)
    chain: list[Candidate] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.to_verify


def schedule_speculative(lanes: list[str], verdicts: dict[Candidate, bool], width: int | None = None) -> Schedule:
    """The chain of candidates ahead, each assuming the ones before it pass; at most `width` to verify at once."""
    limit = len(lanes) if width is None else max(width, 1)
    accepted: list[str] = []   # what the batch head will carry, as far as verdicts prove it
    assumed: list[str] = []    # what the next candidate is built on: accepted, then the hoped-for
    decided: list[tuple[str, bool, Candidate]] = []
    to_verify: list[Candidate] = []
    chain: list[Candidate] = []
    speculating = False
    for lane in lanes:
        candidate = (*assumed, lane)
        chain.append(candidate)
        verdict = verdicts.get(candidate)
        if verdict is None:
            if len(to_verify) < limit:
                to_verify.append(candidate)
            speculating = True
            assumed.append(lane)
            continue
        if not speculating:
            decided.append((lane, verdict, candidate))
            if verdict:
                accepted.append(lane)
        if verdict:
            assumed.append(lane)
    # A failed candidate still names its Lane's fate until a Lane under it fails too (its verdicts may come
    # in any order): only a candidate no Lane maps to any more is discarded.
    on_chain = set(chain)
    discarded = [candidate for candidate in verdicts if candidate not in on_chain]
    return Schedule(decided=decided, to_verify=to_verify, discarded=discarded, chain=chain)


def covering(candidate: Candidate, passed_on: dict[Candidate, set[CheckKey]]) -> dict[CheckKey, Candidate]:
    """Each check (task id, acceptance digest) that passed on a longer candidate of the round carrying
    `candidate` as its prefix (the same head, the same Lanes in the same order, and more on top), with the
    shortest such candidate.

    `passed_on`: the checks that ran and passed (not covered, not only on a flake rerun) on each candidate
    verified so far. A candidate that is not an extension of this one (another Lane left out, or the
    Lanes in another order) covers nothing: its tree is not this tree plus more work."""
    found: dict[CheckKey, Candidate] = {}
    for longer in sorted(passed_on, key=len):
        if len(longer) > len(candidate) and longer[:len(candidate)] == candidate:
            for key in passed_on[longer]:
                found.setdefault(key, longer)
    return found


def bisection_cap(count: int) -> int:
    """2⌈log₂B⌉ + 1 candidate verifications before a batched round falls back to serial."""
    return 2 * math.ceil(math.log2(count)) + 1 if count > 1 else 1


@dataclass(frozen=True)
class BatchedStep:
    """The next move of a batched round: verify `verify`; or the round is over with `decided`
    (as in `Schedule`); or `fall_back` to serial for the Lanes not yet decided."""

    verify: Candidate | None = None
    decided: list[tuple[str, bool, Candidate]] = field(default_factory=list)
    fall_back: bool = False


def schedule_batched(lanes: list[str], verdicts: dict[Candidate, bool], verifications: int | None = None) -> BatchedStep:
    """Verify the top candidate; on failure bisect for the first Lane whose addition fails.

    The accepted prefix grows by the longest candidate known to pass. A failing candidate
    `(*accepted, l1..lm)` with m = 1 parks l1 (exactly the candidate serial verifies). Otherwise
    the half `(*accepted, l1..l⌈m/2⌉)` is verified next. After a park the rest is verified
    again as one candidate. Past the cap the undecided Lanes go to serial.
    """
    count = len(verdicts) if verifications is None else verifications
    accepted: list[str] = []
    decided: list[tuple[str, bool, Candidate]] = []
    remaining = list(lanes)
    while remaining:
        top = (*accepted, *remaining)
        if top not in verdicts:
            return _capped(BatchedStep(verify=top, decided=decided), count, lanes)
        if verdicts[top]:
            for index, lane in enumerate(remaining):
                decided.append((lane, True, (*accepted, *remaining[:index + 1])))
            return BatchedStep(decided=decided)
        # The top fails: find the longest passing prefix of `remaining` by halving.
        passing, failing = 0, len(remaining)  # prefix lengths known to pass / to fail
        for length in range(1, len(remaining)):
            verdict = verdicts.get((*accepted, *remaining[:length]))
            if verdict is True:
                passing = max(passing, length)
            elif verdict is False:
                failing = min(failing, length)
        if failing - passing > 1:
            middle = (passing + failing + 1) // 2
            return _capped(BatchedStep(verify=(*accepted, *remaining[:middle]), decided=decided), count, lanes)
        for index in range(passing):
            decided.append((remaining[index], True, (*accepted, *remaining[:index + 1])))
        accepted.extend(remaining[:passing])
        parked = remaining[passing]
        decided.append((parked, False, (*accepted, parked)))
        remaining = remaining[passing + 1:]
    return BatchedStep(decided=decided)


def _capped(step: BatchedStep, verifications: int, lanes: list[str]) -> BatchedStep:
    if verifications >= bisection_cap(len(lanes)):
        return BatchedStep(decided=step.decided, fall_back=True)
    return step


def check_failure_reason(failed: list[str], candidate: str) -> str:
    """Upstream's park reason for a candidate whose checks failed (its failed finding ids, in check order)."""
    return f"{CHECK_FAILED}: {', '.join(failed)} failed on candidate {candidate}"
