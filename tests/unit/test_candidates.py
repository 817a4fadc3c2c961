"""The candidate scheduler (pure): speculative and batched rounds decide exactly what serial decides."""

from __future__ import annotations

import random

import pytest

from lanes_es.domain.candidates import (
    Candidate, bisection_cap, schedule_batched, schedule_speculative,
)


def serial(lanes: list[str], passes) -> list[tuple[str, bool, Candidate]]:
    """Upstream's serial integration: each Lane on the head that carries every Lane that passed before it."""
    accepted: list[str] = []
    decided = []
    for lane in lanes:
        candidate = (*accepted, lane)
        verdict = passes(candidate)
        decided.append((lane, verdict, candidate))
        if verdict:
            accepted.append(lane)
    return decided


def run_speculative(lanes, passes, width=None):
    verdicts: dict[Candidate, bool] = {}
    waves, discarded = [], set()
    while True:
        schedule = schedule_speculative(lanes, verdicts, width)
        discarded |= set(schedule.discarded)
        if schedule.done:
            return schedule.decided, waves, discarded
        waves.append(list(schedule.to_verify))
        for candidate in schedule.to_verify:
            verdicts[candidate] = passes(candidate)


def run_batched(lanes, passes):
    verdicts: dict[Candidate, bool] = {}
    verified = 0
    while True:
        step = schedule_batched(lanes, verdicts, verified)
        if step.fall_back:
            done = {lane for lane, _, _ in step.decided}
            accepted = [lane for lane, passed, _ in step.decided if passed]
            rest = serial([lane for lane in lanes if lane not in done], lambda c: passes((*accepted, *c)))
            # the serial tail runs on the head the batched part left
            tail, carried = [], list(accepted)
            for lane, _, _ in rest:
                candidate = (*carried, lane)
                verdict = passes(candidate)
                tail.append((lane, verdict, candidate))
                if verdict:
                    carried.append(lane)
            return step.decided + tail, verified, True
        if step.verify is None:
            return step.decided, verified, False
        # A batched verification runs every check of the candidate: it fails when any Lane in it fails.
        verdicts[step.verify] = all(passes(step.verify[:length]) for length in range(1, len(step.verify) + 1))
        verified += 1


def failing(*bad: str):
    return lambda candidate: not any(lane in bad for lane in candidate)


LANES = [f"l{index}" for index in range(8)]


def test_all_passing_is_one_wave_of_every_cumulative_candidate():
    decided, waves, discarded = run_speculative(LANES, failing())
    assert waves == [[tuple(LANES[:length]) for length in range(1, 9)]]
    assert decided == serial(LANES, failing()) and not discarded


def test_a_failing_lane_discards_the_candidates_after_it_and_reparents_them():
    decided, waves, discarded = run_speculative(LANES, failing("l3"))
    assert decided == serial(LANES, failing("l3"))
    assert waves[1] == [("l0", "l1", "l2", *LANES[4:length]) for length in range(5, 9)]
    assert discarded == {tuple(LANES[:length]) for length in range(5, 9)}


def test_width_bounds_the_candidates_verified_at_once():
    _, waves, _ = run_speculative(LANES, failing(), width=3)
    assert [len(wave) for wave in waves] == [3, 3, 2]


def test_batched_all_passing_verifies_only_the_top_candidate():
    decided, verified, fell_back = run_batched(LANES, failing())
    assert (verified, fell_back) == (1, False)
    assert decided == serial(LANES, failing())


def test_batched_bisects_to_the_failing_lane_within_the_cap():
    decided, verified, fell_back = run_batched(LANES, failing("l5"))
    assert decided == serial(LANES, failing("l5"))
    assert not fell_back and verified <= bisection_cap(8)


def test_the_cap_is_two_log2_b_plus_one():
    assert [bisection_cap(count) for count in (1, 2, 3, 4, 8, 9)] == [1, 3, 5, 5, 7, 9]


def random_passes(rng: random.Random, lanes: list[str]):
    """Failing Lanes, and conflicting pairs (the later one fails on any candidate holding the earlier)."""
    bad = {lane for lane in lanes if rng.random() < 0.25}
    pairs = {(a, b) for a in lanes for b in lanes if a < b and rng.random() < 0.1}

    def passes(candidate: Candidate) -> bool:
        last = candidate[-1]
        return last not in bad and not any((earlier, last) in pairs for earlier in candidate[:-1])
    return passes


@pytest.mark.parametrize("seed", range(200))
def test_speculative_and_batched_decide_what_serial_decides(seed: int):
    """A candidate fails when its last Lane does: the verdict serial reads. Differential over random batches."""
    rng = random.Random(seed)
    lanes = LANES[:rng.randint(1, 8)]
    passes = random_passes(rng, lanes)
    expected = serial(lanes, passes)
    assert run_speculative(lanes, passes, width=rng.choice([None, 1, 2, 3]))[0] == expected
    decided, verified, fell_back = run_batched(lanes, passes)
    assert decided == expected
    assert verified <= bisection_cap(len(lanes))


def run_speculative_out_of_order(lanes, passes, rng: random.Random, width=None):
    """As a round now runs: verdicts come one at a time, in any order; a candidate no Lane maps to any more is
    cancelled (its verdict never used); decisions are taken once their candidates' verdicts are in."""
    verdicts: dict[Candidate, bool] = {}
    flying: set[Candidate] = set()
    cancelled: set[Candidate] = set()
    while True:
        schedule = schedule_speculative(lanes, verdicts, width)
        for candidate in [c for c in flying if c not in schedule.chain]:
            flying.discard(candidate)
            cancelled.add(candidate)
        flying |= set(schedule.to_verify)
        if not flying:
            return schedule.decided, cancelled
        finished = rng.choice(sorted(flying))
        flying.discard(finished)
        verdicts[finished] = passes(finished)


@pytest.mark.parametrize("seed", range(200))
def test_verdicts_in_any_order_with_cancellation_decide_what_serial_decides(seed: int):
    rng = random.Random(seed)
    lanes = LANES[:rng.randint(1, 8)]
    passes = random_passes(rng, lanes)
    decided, cancelled = run_speculative_out_of_order(lanes, passes, rng, width=rng.choice([None, 2, 3]))
    assert decided == serial(lanes, passes)
    assert not cancelled & {candidate for _, _, candidate in decided}  # nothing decided on a cancelled one


def test_a_failed_candidate_still_names_its_lanes_fate_while_one_under_it_is_undecided():
    """l2's candidate failed before l1's got a verdict: it stays on the chain (l2 parks on it if l1 passes),
    and the candidate stacked on it is rebuilt without l2."""
    verdicts = {("l0", "l1", "l2"): False}
    schedule = schedule_speculative(["l0", "l1", "l2", "l3"], verdicts)
    assert ("l0", "l1", "l2") in schedule.chain and ("l0", "l1", "l2") not in schedule.discarded
    assert ("l0", "l1", "l3") in schedule.to_verify and ("l0", "l1", "l2", "l3") not in schedule.chain
