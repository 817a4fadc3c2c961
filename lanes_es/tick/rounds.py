"""An integration round of several lane commits at once: `speculative` or `batched` (docs/upstream.md#the-steps-of-a-tick).

The domain (`lanes_es.domain.candidates`) says which candidates to build and verify given the
verdicts so far; this step builds them (each on its parent candidate), verifies them
concurrently (every check on its own fresh tree, at most verify_workers at once, the candidate
closest to landing first: `tick/verification.py`), records each candidate, verdict, cancellation
and discard as an event, and lands the Lanes it decided in plan order, one fast-forward each,
exactly as serial would have landed them: a Lane lands on the very candidate serial would have
built, and a Lane that fails parks with serial's reason.

A speculative round reacts as its checks end: the first failed check of a candidate fails it, and
the candidates stacked on it are cancelled at once (their running checks killed) and rebuilt on
the nearest passing candidate (Zuul's way), while the failed candidate's own checks run to their
end (its park reason names every failed finding, as serial's does).

A check that ran and passed on a candidate covers the same check on every shorter candidate of the round
under it (a prefix: the same Lanes, fewer on top): it is not run there again (`covering`). A batched
round's bisection after a failed top so runs only the checks that failed above, not every check of each
half again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from lanes_es.domain.adaptive import choose_round, integration_outcomes
from lanes_es.domain.candidates import (
    ADAPTIVE, BATCHED, SERIAL, SPECULATIVE, Candidate, CheckKey, bisection_cap, covering, schedule_batched,
    schedule_speculative,
)
from lanes_es.domain.record import expected_batch_head
from lanes_es.ports import (
    CandidateBuild, CandidateChecks, CandidateVerdict, IntegrationChild, IntegrationError, PortError,
)
from lanes_es.tick import integrate, verification
from lanes_es.tick.context import TickContext
from lanes_es.tick.verification import CheckPool, Flight

CHECK_FAILED = "batch_integration_check_failed"
DISCARD_REASON = "a Lane it was built on did not pass; rebuilt on the nearest passing candidate"


@dataclass
class Round:
    """What a round knows so far: its head, the built candidates, the verdicts, and what it recorded."""

    ctx: TickContext
    mode: str
    children: dict[str, dict[str, Any]]
    head: str
    builds: dict[Candidate, CandidateBuild | None] = field(default_factory=dict)
    failures: dict[Candidate, PortError] = field(default_factory=dict)
    verdicts: dict[Candidate, bool] = field(default_factory=dict)
    parents: dict[str, str] = field(default_factory=dict)  # lane -> parent of its newest candidate
    landed: int = 0
    verifications: int = 0
    discarded: set[Candidate] = field(default_factory=set)
    flights: dict[Candidate, Flight] = field(default_factory=dict)  # candidates whose checks are under way
    cancelled: list[tuple[Candidate, Flight, list[str]]] = field(default_factory=list)  # stopping, not yet recorded
    changed: threading.Event = field(default_factory=threading.Event)  # a check ended somewhere
    passed_on: dict[Candidate, set[CheckKey]] = field(default_factory=dict)  # checks that ran and passed, by candidate

    @property
    def lanes(self) -> list[str]:
        return list(self.children)

    def workers(self) -> int:
        return verification.verify_workers(self.ctx)


def integrate_round(ctx: TickContext, children: list[dict[str, Any]]) -> None:
    state = Round(ctx=ctx, mode=ctx.live.integration, children={c["task_id"]: c for c in children},
                  head=expected_batch_head(ctx.record))
    if ctx.ports.remote is not None:  # a dispatch to a Ray node wakes the round, which records it at once
        ctx.ports.remote.wake = state.changed.set
    # Serial under a flake policy: one candidate at a time, as serial, with its verdicts recorded.
    width = 1 if state.mode == SERIAL else None
    if state.mode == ADAPTIVE:
        state.mode, width = choose_mode(ctx, state.lanes)
    with CheckPool(state.workers()) as pool:
        try:
            if state.mode == BATCHED:
                run_batched(state, pool)
            else:
                run_speculative(state, pool, width)
        finally:
            stop_all(state)


def choose_mode(ctx: TickContext, lanes: list[str]) -> tuple[str, int | None]:
    """The adaptive mode's choice for this round, from this batch's outcomes so far and the Initiative's earlier
    batches (newest first), recorded with what it was chosen from."""
    outcomes = integration_outcomes(ctx.record)
    batches = [ctx.record["batch_id"]] if outcomes else []
    if ctx.ports.history is not None:
        earlier, read = ctx.ports.history.earlier_outcomes(ctx.tick.initiative_slug, ctx.record["batch_id"])
        outcomes, batches = outcomes + earlier, batches + read
    choice = choose_round(len(lanes), outcomes)
    ctx.live.note_mode_chosen(ctx.now, choice.mode, choice.window, list(lanes), choice.considered, choice.failed,
                              batches, choice.reason)
    ctx.persist()
    return choice.mode, (choice.window if choice.mode == SPECULATIVE else None)


# ---------------------------------------------------------------- speculative


def run_speculative(state: Round, pool: CheckPool, width: int | None = None) -> None:
    while True:
        schedule = schedule_speculative(state.lanes, state.verdicts, width)
        cancel_stranded(state, schedule.chain)
        note_discards(state, schedule.discarded)
        land_decided(state, ready_prefix(state, schedule.decided))
        launch(state, pool, [candidate for candidate in schedule.to_verify if candidate not in state.flights])
        if not state.flights and not state.cancelled:
            if schedule.done and state.landed == len(schedule.decided):
                return
            continue  # a candidate that did not build has its verdict: schedule again
        wait_for_checks(state)


def ready_prefix(state: Round, decided: list[tuple[str, bool, Candidate]]) -> list[tuple[str, bool, Candidate]]:
    """The decisions whose candidates' checks have all ended: a failed candidate parks its Lane only once its
    every check ran (the park reason names each failed finding)."""
    for index, (_, _, candidate) in enumerate(decided):
        if candidate in state.flights:
            return decided[:index]
    return decided


def cancel_stranded(state: Round, chain: list[Candidate]) -> None:
    """Candidates under way that no Lane maps to any more (a candidate they stand on failed): stop their
    checks now; they are recorded as cancelled once their running checks are gone."""
    failed = [candidate for candidate, passed in state.verdicts.items() if not passed]
    for candidate in [candidate for candidate in state.flights if candidate not in chain]:
        flight = state.flights.pop(candidate)
        flight.cancel.set()
        because = max((f for f in failed if candidate[:len(f)] == f and f != candidate), key=len, default=())
        state.cancelled.append((candidate, flight, list(because)))


def wait_for_checks(state: Round) -> None:
    """Until a check ends; then record what ended: finished candidates' verdicts, cancelled ones, and the
    failure of a candidate whose checks still run (its verdict is False from its first failed check on)."""
    state.changed.wait()
    state.changed.clear()
    noted = state.ctx.record_remote()  # the attempts a Ray cluster ran since, before the verdicts they gave
    finished = [candidate for candidate, flight in state.flights.items() if flight.done]
    for candidate in finished:
        record_verdict(state, candidate, state.flights.pop(candidate).verdict())
    for candidate, flight in state.flights.items():
        if flight.failed and candidate not in state.verdicts:
            state.verdicts[candidate] = False
    record_cancelled(state)
    if finished or state.cancelled or noted:
        state.ctx.persist()


def record_cancelled(state: Round) -> None:
    """The cancelled candidates whose checks have all stopped, with what ran and what was cut short."""
    stopped = [entry for entry in state.cancelled if entry[1].done]
    state.cancelled = [entry for entry in state.cancelled if not entry[1].done]
    for candidate, flight, because in stopped:
        build = state.builds.get(candidate)
        checks = [integrate.check_verdict(check) for check in flight.checks()]
        cut = {check.task_id for check in checks}
        checks += [integrate.check_verdict(verification.cancelled_check(flight.planned, check))
                   for check in flight.planned.checks if check.task_id not in cut]
        state.ctx.live.note_candidate_cancelled(state.ctx.now, state.mode, list(candidate),
                                                build.commit if build else None, because, checks)


def stop_all(state: Round) -> None:
    """When a round ends early (an error, a lineage break that fails the batch): no check of it outlives it.
    Nothing is recorded: the round did not decide anything about these candidates."""
    flights = [*state.flights.values(), *(flight for _, flight, _ in state.cancelled)]
    for flight in flights:
        flight.cancel.set()
    for flight in flights:
        while not flight.done:
            state.changed.wait(0.05)


# ---------------------------------------------------------------- batched


def run_batched(state: Round, pool: CheckPool) -> None:
    cap = bisection_cap(len(state.lanes))
    while True:
        step = schedule_batched(state.lanes, state.verdicts, state.verifications)
        land_decided(state, step.decided)
        if step.fall_back:
            rest = [lane for lane in state.lanes if state.ctx.live.child(lane)["state"] == "lane_committed"]
            state.ctx.live.note_fall_back(state.ctx.now, rest, state.verifications, cap)
            state.ctx.persist()
            integrate.integrate_serially(state.ctx, [state.ctx.live.child(lane) for lane in rest])
            return
        if step.verify is None:
            return
        top = step.verify
        build_chain(state, [top[:length] for length in range(1, len(top) + 1) if top[:length] not in state.builds])
        if state.builds.get(top) is None:
            fail_unbuilt(state, top)
            continue
        # The Lanes under the top whose own candidates get no verdict of their own: covered by this one.
        unverified = [lane for length, lane in enumerate(top[:-1], 1) if top[:length] not in state.verdicts]
        bisection = any(verdict is False for verdict in state.verdicts.values())
        verify_now(state, pool, top, bisection=bisection, unverified=unverified)


def fail_unbuilt(state: Round, top: Candidate) -> None:
    """A Lane of the chain did not apply: every longer prefix fails with it (it carries that Lane)."""
    failure: PortError | None = None
    for length in range(1, len(top) + 1):
        prefix = top[:length]
        if prefix in state.failures and failure is None:
            failure = state.failures[prefix]
        elif failure is not None and prefix not in state.verdicts:
            state.verdicts[prefix], state.failures[prefix] = False, failure


def verify_now(state: Round, pool: CheckPool, candidate: Candidate, bisection: bool = False,
               unverified: list[str] | None = None) -> None:
    """Verify one built candidate, every check at once (bounded by the round's workers), and record its verdict."""
    launch(state, pool, [candidate], build=False)
    flight = state.flights.get(candidate)
    while flight is not None and not flight.done:
        state.changed.wait()
        state.changed.clear()
    if flight is not None:
        record_verdict(state, candidate, state.flights.pop(candidate).verdict(), bisection, unverified)
    state.ctx.persist()


# ---------------------------------------------------------------- building, verifying, landing


def launch(state: Round, pool: CheckPool, candidates: list[Candidate], build: bool = True) -> None:
    """Build the candidates (a chain costs a few git spawns), then queue their checks; the candidates' events
    are stored while their checks run."""
    if not candidates:
        return
    built = build_candidates(state, candidates) if build else candidates
    for candidate in built:
        start(state, pool, candidate)
    state.ctx.persist()


def start(state: Round, pool: CheckPool, candidate: Candidate) -> None:
    ctx = state.ctx
    state.verifications += 1
    try:
        planned = ctx.ports.candidates.candidate_checks(_request(state, candidate, _parent_of(state, candidate)),
                                                        state.builds[candidate],  # type: ignore[arg-type]
                                                        ctx.live.flake_reruns)
    except PortError as error:
        record_verdict(state, candidate, error)
        return
    flight = verification.start_flight(ctx, pool, planned, list(candidate), len(candidate), state.changed,
                                       covered_checks(state, candidate, planned))
    if flight.done:
        record_verdict(state, candidate, flight.verdict())  # every check reused: nothing to wait for
        return
    state.flights[candidate] = flight


def covered_checks(state: Round, candidate: Candidate, planned: CandidateChecks) -> dict[str, str]:
    """The candidate's checks that passed on a longer candidate of this round carrying it (task id -> that
    candidate's commit): not run again, as a batched round lands the Lanes under a passing top unverified."""
    found = covering(candidate, state.passed_on)
    keys = {check.task_id: (check.task_id, check.acceptance) for check in planned.checks}
    return {task_id: _commit_of(state, found[key]) or "" for task_id, key in keys.items() if key in found}


def build_chain(state: Round, candidates: list[Candidate]) -> list[Candidate]:
    """Build each candidate on its parent (the round's head or the candidate before it); the ones built."""
    built = build_candidates(state, candidates)
    state.ctx.persist()
    return built


def build_candidates(state: Round, candidates: list[Candidate]) -> list[Candidate]:
    """Build and record the candidates, each run of candidates stacked on one another as one chain
    (one port call: its git reads are shared); a Lane that does not apply fails its candidate at once,
    and the candidates stacked on it are not built (the next schedule rebuilds them elsewhere)."""
    built: list[Candidate] = []
    for chain in _chains(candidates):
        built += build_stacked(state, chain)
    return built


def _chains(candidates: list[Candidate]) -> list[list[Candidate]]:
    """Consecutive candidates each built on the one before it."""
    chains: list[list[Candidate]] = []
    for candidate in candidates:
        if chains and candidate[:-1] == chains[-1][-1]:
            chains[-1].append(candidate)
        else:
            chains.append([candidate])
    return chains


def build_stacked(state: Round, chain: list[Candidate]) -> list[Candidate]:
    ctx = state.ctx
    parent = state.head if len(chain[0]) == 1 else _commit_of(state, chain[0][:-1])
    if parent is None:
        return []  # its parent did not apply: the next schedule rebuilds it elsewhere
    lanes = [(state.children[c[-1]]["lane"]["base_head"], state.children[c[-1]]["lane"]["lane_commit"]) for c in chain]
    built: list[Candidate] = []
    for candidate, result in zip(chain, ctx.ports.candidates.build_chain(ctx.tick.root, parent, lanes)):
        on = parent if candidate == chain[0] else _commit_of(state, candidate[:-1]) or parent
        lane = candidate[-1]
        reparented_from = state.parents.get(lane) if state.parents.get(lane) not in (None, on) else None
        state.parents[lane] = on
        if isinstance(result, PortError):
            state.builds[candidate], state.failures[candidate], state.verdicts[candidate] = None, result, False
            ctx.live.note_candidate_built(ctx.now, state.mode, list(candidate), on, None, reparented_from)
            ctx.live.note_candidate_verified(ctx.now, state.mode, list(candidate), None, False, str(result), [])
            break
        state.builds[candidate] = result
        ctx.live.note_candidate_built(ctx.now, state.mode, list(candidate), on, result.commit, reparented_from)
        built.append(candidate)
    return built


def _request(state: Round, candidate: Candidate, parent: str) -> Any:
    """The integration of the candidate's last Lane on `parent`, the Lanes ahead of it as landed siblings."""
    ctx = state.ctx
    ahead = [IntegrationChild(task_id=task_id, intent_path=ctx.intent_path_of(task_id),
                              commit=_commit_of(state, candidate[:index + 1]))
             for index, task_id in enumerate(candidate[:-1])]
    return integrate.integration_request(ctx, state.children[candidate[-1]], parent, ahead)


def record_verdict(state: Round, candidate: Candidate, result: CandidateVerdict | PortError, bisection: bool = False,
                   unverified: list[str] | None = None) -> None:
    ctx = state.ctx
    commit = state.builds[candidate].commit  # type: ignore[union-attr]
    if isinstance(result, PortError):
        state.failures[candidate], state.verdicts[candidate] = result, False
        ctx.live.note_candidate_verified(ctx.now, state.mode, list(candidate), commit, False, str(result), [],
                                         bisection)
        return
    checks = [integrate.check_verdict(check) for check in result.checks]
    state.verdicts[candidate] = result.passed
    state.passed_on[candidate] = {(check.task_id, check.acceptance) for check in result.checks
                                  if check.acceptance and not check.findings and not check.cancelled
                                  and not check.flaky and check.covered_by is None}
    if not result.passed:
        state.failures[candidate] = IntegrationError(CHECK_FAILED, result.reason or "", candidate=commit,
                                                     checks=result.checks)
    ctx.live.note_candidate_verified(ctx.now, state.mode, list(candidate), commit, result.passed, result.reason,
                                     checks, bisection, unverified or [])


def land_decided(state: Round, decided: list[tuple[str, bool, Candidate]]) -> None:
    """Land (or park) the Lanes decided since the last call, in plan order, with serial's reasons.

    Each passing candidate is built on the one before it, so one fast-forward to the last lands them
    all; the log then records each Lane on its own candidate, as serial would. A crash in between is
    found again on the branch by the next tick (adopt_missed_integrations)."""
    ctx, fresh = state.ctx, decided[state.landed:]
    if not fresh:
        return
    state.landed = len(decided)
    passing = [candidate for _, passed, candidate in fresh if passed]
    if passing:
        try:
            ctx.ports.candidates.land_candidate(ctx.tick.root, ctx.record["branch"], expected_batch_head(ctx.record),
                                                _commit_of(state, passing[-1]) or "")
        except PortError:
            land_one_by_one(state, fresh)  # the same checks again, one Lane at a time, to park the right one
            return
    for lane, passed, candidate in fresh:
        if passed:
            integrate.record_integration(ctx, lane, _commit_of(state, candidate) or "")
        else:
            integrate.park_failed_integration(ctx, lane, _failure_of(state, candidate))


def land_one_by_one(state: Round, decided: list[tuple[str, bool, Candidate]]) -> None:
    ctx = state.ctx
    for lane, passed, candidate in decided:
        if not passed:
            integrate.park_failed_integration(ctx, lane, _failure_of(state, candidate))
            continue
        try:
            landed = ctx.ports.candidates.land_candidate(ctx.tick.root, ctx.record["branch"],
                                                         expected_batch_head(ctx.record),
                                                         _commit_of(state, candidate) or "")
        except PortError as error:
            integrate.park_failed_integration(ctx, lane, error)
            continue
        integrate.record_integration(ctx, lane, landed)


def note_discards(state: Round, candidates: list[Candidate]) -> None:
    fresh = [candidate for candidate in candidates if candidate not in state.discarded]
    for candidate in fresh:
        state.discarded.add(candidate)
        build = state.builds.get(candidate)
        state.ctx.live.note_candidate_discarded(state.ctx.now, state.mode, list(candidate),
                                                build.commit if build else None, DISCARD_REASON)
    if fresh:
        state.ctx.persist()


def _commit_of(state: Round, candidate: Candidate) -> str | None:
    build = state.builds.get(candidate)
    return build.commit if build is not None else None


def _parent_of(state: Round, candidate: Candidate) -> str:
    return state.head if len(candidate) == 1 else _commit_of(state, candidate[:-1]) or state.head


def _failure_of(state: Round, candidate: Candidate) -> PortError:
    return state.failures.get(candidate) or IntegrationError("batch_integration_conflict",
                                                             f"candidate {candidate} did not pass")


__all__ = ["integrate_round", "SPECULATIVE", "BATCHED"]
