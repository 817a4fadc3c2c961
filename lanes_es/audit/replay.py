"""Replay a batch's log step by step, checking each step as an auditor would.

For every event, in order:
- the transition is legal from the state before it (the child and batch state
  machines of docs/upstream.md#child-and-batch-transitions, checked here independently of the aggregate's
  guards, so a log written by any code is held to the same rules);
- the record folded after it passes the v2 validator (on what the event changed, see
  `validator.validate_change`);
- its digest links to the event before it.

A failed check names the version and the rule. Once a transition or record check
fails, the folded record is no longer trustworthy, so those checks stop there (the
result says where); the chain is checked to the end regardless.
"""

from __future__ import annotations

import hashlib
import sys
import time
from typing import Any, Callable, Sequence, TextIO

import msgspec

from lanes_es.domain import events as ev
from lanes_es.domain.record import IN_FLIGHT, apply_event, dependents_to_skip, is_terminal, prepared_record
from lanes_es.domain.validator import InvalidRecord, validate_change
from lanes_es.projections.timeline import TimelineRow, timeline_row

from .chain import ChainBreak, verify_chain

ILLEGAL_TRANSITION = "illegal_transition"
INVALID_RECORD = "invalid_record"
UNFOLDABLE = "unfoldable"

Progress = Callable[[int, int], None]


class ReplayFailure(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    rule: str
    message: str

    def describe(self) -> str:
        return f"version {self.version}: {self.rule}: {self.message}"


class ReplayResult(msgspec.Struct, kw_only=True):
    batch_id: str
    version: int  # the newest version replayed
    head: str  # its digest
    steps: list[TimelineRow]
    record: dict[str, Any] | None  # the record as of `version`
    failures: list[ReplayFailure]
    checks_stopped_at: int | None = None  # the version after which state checks were suspended

    @property
    def ok(self) -> bool:
        return not self.failures


class ReplayRangeError(ValueError):
    """`--at` names a version the log does not have."""


def replay(events: Sequence[Any], at_version: int | None = None, progress: Progress | None = None,
           chain_breaks: Sequence[ChainBreak] | None = None, keep_steps: bool = True) -> ReplayResult:
    """Walk `events` (one batch's log, oldest first) up to `at_version`, checking every step.

    `chain_breaks` are the breaks already found on the stored form of a log read from a
    store or an export (`chain.verify_stored`); without them the chain is checked on the
    events themselves, which holds only for events that were never upcast. Without
    `keep_steps` the result has no timeline rows (`verify` checks the steps, it shows none).
    """
    chosen = _up_to(events, at_version)
    walk = Replay(keep_steps=keep_steps)
    total = len(chosen)
    for index, event in enumerate(chosen, start=1):
        walk.step(event)
        if progress is not None:
            progress(index, total)
    return walk.result(_chain_breaks(chosen, at_version, chain_breaks))


class Replay:
    """The replay one event at a time, so a log read a page at a time is replayed as it streams.

    Each step's timeline row goes to `on_step` (a streamed `replay --json` writes it out), else into
    the result's steps, or nowhere without `keep_steps`.
    """

    def __init__(self, on_step: Callable[[TimelineRow], None] | None = None, keep_steps: bool = True) -> None:
        self.steps: list[TimelineRow] = []
        self._emit = on_step if on_step is not None else (self.steps.append if keep_steps else None)
        self.record: dict[str, Any] | None = None
        self.failures: list[ReplayFailure] = []
        self.stopped_at: int | None = None
        self.first: Any = None
        self.last: Any = None
        self.count = 0  # steps replayed

    def step(self, event: Any) -> None:
        self.count += 1
        if self.first is None:
            self.first = event
        self.last = event
        if self._emit is not None:
            self._emit(timeline_row(event))
        if self.stopped_at is None:
            self.record, failure = _step(self.record, event)
            if failure is not None:
                self.failures.append(failure)
                self.stopped_at = event.originator_version

    def result(self, chain_breaks: Sequence[ChainBreak]) -> ReplayResult:
        """The replay's result; the chain's breaks come first among failures of one version."""
        failures = [*map(_from_break, chain_breaks), *self.failures]
        failures.sort(key=lambda failure: failure.version)
        return ReplayResult(
            batch_id=self.first.originator_id if self.first is not None else "",
            version=self.last.originator_version if self.last is not None else 0,
            head=self.last.digest if self.last is not None else "",
            steps=self.steps, record=self.record, failures=failures, checks_stopped_at=self.stopped_at,
        )


def check_range(at_version: int | None, newest: int) -> None:
    """`ReplayRangeError` when `--at` names a version the log (newest version `newest`) does not have."""
    if at_version is not None and (at_version < 1 or at_version > newest):
        raise ReplayRangeError(f"version {at_version} is not in this log (versions 1 to {newest})")


def _up_to(events: Sequence[Any], at_version: int | None) -> list[Any]:
    if at_version is None:
        return list(events)
    check_range(at_version, events[-1].originator_version if events else 0)
    return [event for event in events if event.originator_version <= at_version]


def chain_breaks_up_to(known: Sequence[ChainBreak], at_version: int | None) -> list[ChainBreak]:
    return [found for found in known if at_version is None or found.version <= at_version]


def _chain_breaks(chosen: list[Any], at_version: int | None,
                  known: Sequence[ChainBreak] | None) -> list[ChainBreak]:
    if known is None:
        return verify_chain(chosen) if chosen else []
    return chain_breaks_up_to(known, at_version)


def _from_break(found: ChainBreak) -> ReplayFailure:
    return ReplayFailure(version=found.version, rule=found.rule, message=found.message)


def _step(record: dict[str, Any] | None, event: Any) -> tuple[dict[str, Any] | None, ReplayFailure | None]:
    """Check the transition, fold it, validate the result."""
    version = event.originator_version

    def fail(rule: str, text: str) -> tuple[dict[str, Any] | None, ReplayFailure]:
        return record, ReplayFailure(version=version, rule=rule, message=f"{event.name}: {text}")

    illegal = refusal(record, event)
    if illegal is not None:
        return fail(ILLEGAL_TRANSITION, illegal)
    try:
        if isinstance(event, ev.BatchPrepared):
            record = prepared_record(event)
        else:
            assert record is not None  # refusal() already required a prepared batch
            apply_event(record, event)
    except (KeyError, TypeError, ValueError) as error:
        return fail(UNFOLDABLE, f"does not fold into the record ({error})")
    try:
        # The record was valid before this event (the checks stop at the first failure), so what the
        # event changed is what is checked: the same rules and messages as the whole check.
        validate_change(record, record["batch_id"], event)
    except InvalidRecord as error:
        return fail(INVALID_RECORD, str(error))
    return record, None


# ---------------------------------------------------------------- the state machines


# The child states each event may start from (docs/upstream.md#child-and-batch-transitions).
CHILD_FROM: dict[type, frozenset[str]] = {
    ev.LaneAdmitted: frozenset({"pending"}),
    ev.Enrolled: frozenset({"lane_admitted"}),
    ev.Settled: frozenset({"enrolled"}),
    ev.LaneCommitted: frozenset({"settled"}),
    ev.Integrated: frozenset({"lane_committed"}),
    ev.Released: frozenset({"integrated"}),
    ev.Parked: IN_FLIGHT,
    ev.QaFailureCounted: frozenset({"enrolled"}),
    ev.ReviewOpened: frozenset({"enrolled"}),
    ev.InterventionRecorded: frozenset({"enrolled"}),
    ev.DelegatedRevisionApplied: frozenset({"enrolled"}),
    ev.Resealed: frozenset({"integrated"}),
    ev.TrackerClosed: frozenset({"integrated", "released"}),
}
RESUMABLE_STATES = frozenset({"enrolled", "settled", "lane_committed"})
SETTLED_BATCH_STATES = frozenset({"completed", "needs_human", "budget_stopped", "failed"})


def refusal(record: dict[str, Any] | None, event: Any) -> str | None:
    """Why `event` cannot follow the state `record` is in, or None when it can.

    By exact type (no event class derives from another; a negative isinstance on these classes costs
    ten times a type lookup, and this runs for every event of a replay).
    """
    kind = type(event)
    if kind is ev.BatchPrepared:
        return None if record is None else "a batch is prepared once, as its first event"
    if record is None:
        return "the log does not start with BatchPrepared"
    if kind not in _BATCH_EVENTS:
        return "is not an event of a batch"
    if kind in _AUDIT_ONLY:
        return None  # an audit note changes nothing and may follow any state
    state = record["batch_state"]
    if kind is ev.BatchStarted:
        return None if state == "prepared" else f"the batch is {state}, not prepared"
    if kind is ev.ParkResumed:
        return _resume_refusal(record, event)
    if kind is not ev.TrackerClosed and is_terminal(state):
        # A tracker close that failed before completion is retried afterwards (upstream).
        return f"the batch is {state}; a terminal record does not move"
    child_rule = CHILD_FROM.get(kind)
    if child_rule is not None:
        return _child_refusal(record, event, child_rule)
    if kind is ev.BatchSettled and event.batch_state not in SETTLED_BATCH_STATES:
        return f"a batch does not settle as {event.batch_state}"
    if kind is ev.BatchSuperseded:
        in_flight = [child["task_id"] for child in record["children"] if child["state"] in IN_FLIGHT]
        if in_flight:
            return f"the batch cannot be retired while {', '.join(in_flight)} is in flight"
    return None


def _child_refusal(record: dict[str, Any], event: Any, allowed: frozenset[str]) -> str | None:
    child = next((child for child in record["children"] if child["task_id"] == event.task_id), None)
    if child is None:
        return f"the batch has no child {event.task_id}"
    if child["state"] not in allowed:
        return f"child {event.task_id} is {child['state']}; expected {' or '.join(sorted(allowed))}"
    if isinstance(event, ev.Integrated) and event.commit in record["commits"]:
        return f"commit {event.commit} is already integrated"
    if isinstance(event, ev.Parked):
        expected = dependents_to_skip(record, event.task_id)
        if sorted(event.skipped) != sorted(expected):
            return (f"skips {event.skipped}, but the pending dependents of {event.task_id} "
                    f"are {expected}")
    if isinstance(event, ev.InterventionRecorded):
        return _intervention_refusal(child, event)
    if isinstance(event, ev.Resealed):
        if event.task_id not in record.get("intent_identities", {}):
            return f"{event.task_id} has no recorded intent identity"
        if event.from_digest != record["plan_digest"]:
            return f"reseals from {event.from_digest}, but the plan digest is {record['plan_digest']}"
    if isinstance(event, ev.TrackerClosed) and child.get("tracker_closed"):
        return f"the Issue of {event.task_id} is already closed"
    return None


def _intervention_refusal(child: dict[str, Any], event: ev.InterventionRecorded) -> str | None:
    if event.kind not in ("instruction", "correction"):
        return f"unknown intervention kind {event.kind}"
    if event.kind == "correction" and not child.get("correction_due"):
        return f"{event.task_id} has no correction due"
    digest = "sha256:" + hashlib.sha256(event.text.encode()).hexdigest()
    if event.text_digest != digest:
        return "text_digest is not the sha256 of the recorded text"
    return None


def _resume_refusal(record: dict[str, Any], event: ev.ParkResumed) -> str | None:
    if record["batch_state"] != "needs_human":
        return f"the batch is {record['batch_state']}, not parked"
    if event.confirmation_time <= record["confirmation_time"]:
        return "a resume needs a confirmation newer than the recorded one"
    states = {child["task_id"]: child["state"] for child in record["children"]}
    for resumed in event.children:
        if states.get(resumed.task_id) != "needs_human":
            return f"child {resumed.task_id} is not parked"
        if resumed.state not in RESUMABLE_STATES:
            return f"child {resumed.task_id} cannot resume as {resumed.state}"
    return None


_BATCH_EVENTS = frozenset({
    ev.BatchStarted, ev.LaneAdmitted, ev.Enrolled, ev.Settled, ev.LaneCommitted, ev.Integrated, ev.Released,
    ev.Parked, ev.Resealed, ev.QaFailureCounted, ev.ReviewOpened, ev.InterventionRecorded,
    ev.DelegatedRevisionApplied, ev.DelegationGrantChanged, ev.TrackerClosed, ev.HeadAdopted, ev.LeaksRestored,
    ev.ParkResumed, ev.BatchSettled, ev.BatchSuperseded, ev.OffersRefused, ev.TickRejected,
    ev.ProjectionDriftRepaired, ev.CandidateBuilt, ev.CandidateVerified, ev.CandidateDiscarded,
    ev.IntegrationFellBack, ev.ExecutorRunStarted, ev.ExecutorRunFinished, ev.ExecutorRunKilled,
}) | frozenset(ev.AUDIT_ONLY)
_AUDIT_ONLY = frozenset(ev.AUDIT_ONLY)


# ---------------------------------------------------------------- progress on a terminal


class TerminalProgress:
    """A counter on stderr, redrawn at most every `interval` seconds, only when stderr is a terminal."""

    def __init__(self, stream: TextIO | None = None, label: str = "replaying", interval: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self.interval = interval
        self.clock = clock
        self.enabled = _is_terminal(self.stream)
        self.drawn = False
        self._last = float("-inf")

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if done != total and now - self._last < self.interval:
            return
        self._last = now
        self.stream.write(f"\r{self.label} {done}/{total} events")
        self.stream.flush()
        self.drawn = True

    def finish(self) -> None:
        """End the counter's line so the next output starts on its own."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
