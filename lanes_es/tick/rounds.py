"""An integration round of several lane commits at once: `speculative` or `batched` (docs/upstream.md#the-steps-of-a-tick).

The domain (`lanes_es.domain.candidates`) says which candidates to build and verify given the
verdicts so far; this step builds them (each on its parent candidate), verifies them
concurrently (every check on its own fresh tree, at most verify_workers at once), records
each candidate, verdict and discard as an event, and lands the Lanes it decided in plan order,
one fast-forward each, exactly as serial would have landed them: a Lane lands on the very
candidate serial would have built, and a Lane that fails parks with serial's reason.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from lanes_es.domain.candidates import (
    BATCHED, SERIAL, SPECULATIVE, Candidate, bisection_cap, schedule_batched, schedule_speculative,
)
from lanes_es.domain.record import expected_batch_head
from lanes_es.ports import CandidateBuild, CandidateVerdict, IntegrationChild, IntegrationError, PortError
from lanes_es.tick import integrate
from lanes_es.tick.context import TickContext

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

    @property
    def lanes(self) -> list[str]:
        return list(self.children)

    def workers(self) -> int:
        return max(self.ctx.live.verify_workers or self.ctx.limit, 1)


def integrate_round(ctx: TickContext, children: list[dict[str, Any]]) -> None:
    state = Round(ctx=ctx, mode=ctx.live.integration, children={c["task_id"]: c for c in children},
                  head=expected_batch_head(ctx.record))
    if state.mode == BATCHED:
        run_batched(state)
    else:
        # Serial under a flake policy: one candidate at a time, as serial, with its verdicts recorded.
        run_speculative(state, 1 if state.mode == SERIAL else None)


# ---------------------------------------------------------------- speculative


def run_speculative(state: Round, width: int | None = None) -> None:
    while True:
        schedule = schedule_speculative(state.lanes, state.verdicts, width)
        note_discards(state, schedule.discarded)
        land_decided(state, schedule.decided)
        if schedule.done:
            return
        build_and_verify(state, schedule.to_verify)


# ---------------------------------------------------------------- batched


def run_batched(state: Round) -> None:
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
        verify(state, [top], bisection=bisection, unverified=unverified)


def fail_unbuilt(state: Round, top: Candidate) -> None:
    """A Lane of the chain did not apply: every longer prefix fails with it (it carries that Lane)."""
    failure: PortError | None = None
    for length in range(1, len(top) + 1):
        prefix = top[:length]
        if prefix in state.failures and failure is None:
            failure = state.failures[prefix]
        elif failure is not None and prefix not in state.verdicts:
            state.verdicts[prefix], state.failures[prefix] = False, failure


# ---------------------------------------------------------------- building, verifying, landing


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
    for candidate, result in zip(chain, ctx.ports.lane_git.build_chain(ctx.tick.root, parent, lanes)):
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


def build_and_verify(state: Round, candidates: list[Candidate]) -> None:
    """Build the candidates (a chain costs a few git spawns), then verify them all at once."""
    ctx = state.ctx
    slots = threading.BoundedSemaphore(state.workers())
    built = build_candidates(state, candidates)
    with ThreadPoolExecutor(max_workers=max(len(built), 1), thread_name_prefix="lanes-es-candidate") as pool:
        started = [(candidate, pool.submit(_verify_one, state, candidate, slots)) for candidate in built]
        ctx.persist()  # the candidates' events are stored while their checks run
        state.verifications += len(started)
        results = [(candidate, future.result()) for candidate, future in started]
    for candidate, result in results:
        record_verdict(state, candidate, result)
    ctx.persist()


def _verify_one(state: Round, candidate: Candidate, slots: Any) -> CandidateVerdict | PortError:
    ctx = state.ctx
    try:
        return ctx.ports.lane_git.verify_candidate(_request(state, candidate, _parent_of(state, candidate)),
                                                   state.builds[candidate], slots, ctx.live.flake_reruns)
    except PortError as error:
        return error


def verify(state: Round, candidates: list[Candidate], bisection: bool = False,
           unverified: list[str] | None = None) -> None:
    """Verify built candidates at once, every check bounded by the round's workers; record in chain order."""
    if not candidates:
        return
    slots = threading.BoundedSemaphore(state.workers())
    state.verifications += len(candidates)
    with ThreadPoolExecutor(max_workers=len(candidates), thread_name_prefix="lanes-es-candidate") as pool:
        results = list(pool.map(lambda candidate: _verify_one(state, candidate, slots), candidates))
    for candidate, result in zip(candidates, results):
        record_verdict(state, candidate, result, bisection, unverified)
    state.ctx.persist()


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
    if not result.passed:
        state.failures[candidate] = IntegrationError(CHECK_FAILED, result.reason or "")
    ctx.live.note_candidate_verified(ctx.now, state.mode, list(candidate), commit, result.passed, result.reason,
                                     checks, bisection, unverified or [])


def land_decided(state: Round, decided: list[tuple[str, bool, Candidate]]) -> None:
    """Land (or park) the Lanes decided since the last call, in plan order, with serial's reasons.

    Each passing candidate is built on the one before it, so one fast-forward to the last lands them
    all; the log then records each Lane on its own candidate, as serial would. A crash in between is
    found again on the branch by the next tick (adopt_missed_integrations)."""
    ctx, fresh = state.ctx, decided[state.landed:]
    state.landed = len(decided)
    passing = [candidate for _, passed, candidate in fresh if passed]
    if passing:
        try:
            ctx.ports.lane_git.land_candidate(ctx.tick.root, ctx.record["branch"], expected_batch_head(ctx.record),
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
            landed = ctx.ports.lane_git.land_candidate(ctx.tick.root, ctx.record["branch"],
                                                       expected_batch_head(ctx.record), _commit_of(state, candidate) or "")
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
