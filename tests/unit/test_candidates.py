"""The candidate scheduler (pure): speculative and batched rounds decide exactly what serial decides."""

from __future__ import annotations

import random

import pytest

from lanes_es.domain.candidates import (
    Candidate, bisection_cap, covering, schedule_batched, schedule_speculative,
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


# ---------------------------------------------------------------- coverage: a batched round learns check by check


def breaking_checks(rng: random.Random, lanes: list[str]):
    """Each Lane's own check; a check breaks when some Lane's work is on the candidate with it (before or after
    it in plan order), as a later Lane's change breaks an earlier Lane's test. Adding work only ever breaks."""
    breaks = {(a, b) for a in lanes for b in lanes if a != b and rng.random() < 0.12}

    def failed(candidate: Candidate) -> list[str]:
        return [lane for lane in candidate if any((lane, other) in breaks for other in candidate)]
    return failed


def serial_checks(lanes: list[str], failed) -> list[tuple[str, bool, Candidate, list[str]]]:
    """Serial, every check of each candidate run: each decision with the failed checks its park names."""
    accepted: list[str] = []
    decided = []
    for lane in lanes:
        candidate = (*accepted, lane)
        found = failed(candidate)
        decided.append((lane, not found, candidate, found))
        if not found:
            accepted.append(lane)
    return decided


def batched_with_coverage(lanes: list[str], failed):
    """A batched round as `tick/rounds.py` runs it: on each candidate, only the checks no longer candidate of the
    round passed (`covering`); the others stand as passed. Returns the decisions with the failed checks of each
    decided candidate, and the checks run."""
    verdicts: dict[Candidate, bool] = {}
    passed_on: dict[Candidate, set[tuple[str, str]]] = {}
    failed_on: dict[Candidate, list[str]] = {}
    runs = 0
    while True:
        step = schedule_batched(lanes, verdicts, len(verdicts))
        if step.fall_back or step.verify is None:
            decided = [(lane, passed, candidate, failed_on.get(candidate, [])) for lane, passed, candidate in step.decided]
            if step.fall_back:  # the rest serially, on the head the batched part left, every check run
                accepted = [lane for lane, passed, _, _ in decided if passed]
                for lane in [lane for lane in lanes if lane not in {d[0] for d in decided}]:
                    candidate = (*accepted, lane)
                    found = failed(candidate)
                    runs += len(candidate)
                    decided.append((lane, not found, candidate, found))
                    if not found:
                        accepted.append(lane)
            return decided, runs
        candidate = step.verify
        covered = covering(candidate, passed_on)
        ran = [lane for lane in candidate if (lane, "acceptance") not in covered]
        runs += len(ran)
        found = [lane for lane in failed(candidate) if lane in ran]
        verdicts[candidate] = not found
        failed_on[candidate] = found
        passed_on[candidate] = {(lane, "acceptance") for lane in ran if lane not in found}


@pytest.mark.parametrize("seed", range(300))
def test_a_batched_round_with_coverage_decides_and_parks_for_the_reasons_serial_does(seed: int):
    """Differential: the same Lanes integrate on the same candidates, and a parked Lane's candidate names the
    same failed checks as serial's, where every check of every candidate ran."""
    rng = random.Random(seed)
    lanes = LANES[:rng.randint(1, 8)]
    failed = breaking_checks(rng, lanes)
    decided, runs = batched_with_coverage(lanes, failed)
    assert decided == serial_checks(lanes, failed)


def test_coverage_is_only_from_longer_candidates_carrying_this_one():
    passed_on = {("a", "b", "c"): {("a", "x"), ("b", "x")}, ("a", "c"): {("c", "x")}, ("b",): {("b", "x")},
                 ("a", "b"): {("a", "x")}}
    assert covering(("a", "b"), passed_on) == {("a", "x"): ("a", "b", "c"), ("b", "x"): ("a", "b", "c")}
    assert covering(("a",), passed_on) == {("a", "x"): ("a", "b"), ("b", "x"): ("a", "b", "c"),
                                            ("c", "x"): ("a", "c")}
    assert covering(("a", "b", "c"), passed_on) == {}  # not by itself, nor by a shorter one
    assert covering(("b", "a"), passed_on) == {}  # the same Lanes in another order: another tree


def test_a_later_lane_breaking_an_earlier_lanes_check_costs_its_failed_check_per_bisection_step():
    """The real-repository benchmark's conflict: of 7 Lanes, the fifth breaks the second's check. The top runs
    7 checks; the bisection (4, 6 and 5 Lanes) runs only that check; the rest (6 Lanes, not a prefix of any
    candidate verified) runs all 6: 16 runs where every check of every candidate is 7 + 4 + 6 + 5 + 6 = 28."""
    lanes = LANES[:7]

    def failed(candidate: Candidate) -> list[str]:
        return ["l1"] if "l1" in candidate and "l4" in candidate else []
    decided, runs = batched_with_coverage(lanes, failed)
    assert decided == serial_checks(lanes, failed)
    assert [lane for lane, passed, _, _ in decided if not passed] == ["l4"]
    assert runs == 16
