"""Replay: the timeline, the record as of a version, and each step's checks."""

from __future__ import annotations

import io

import msgspec
import pytest

from tests.unit.audit_logs import completed_log, long_log, parked_log, sha
from lanes_es.audit.chain import DIGEST_MISMATCH
from lanes_es.audit.replay import (
    ILLEGAL_TRANSITION, INVALID_RECORD, ReplayRangeError, TerminalProgress, replay,
)
from lanes_es.domain import events as ev
from lanes_es.domain.events import chain_digest
from lanes_es.domain.record import fold_record


def resealed(events: list) -> list:
    """Recompute every digest, as a forger who knows the chain rule would."""
    previous = ""
    out = []
    for event in events:
        event = msgspec.structs.replace(event, digest=chain_digest(previous, event))
        previous = event.digest
        out.append(event)
    return out


def test_a_completed_log_replays_clean_to_its_record():
    events = completed_log()
    result = replay(events)
    assert result.ok, result.failures
    assert result.record == fold_record(events)
    assert result.record["batch_state"] == "completed"
    assert result.version == len(events) and result.head == events[-1].digest
    assert [step.version for step in result.steps] == list(range(1, len(events) + 1))


def test_steps_name_the_card_transitions():
    result = replay(completed_log())
    named = [(step.task_id, step.transition) for step in result.steps if step.transition]
    assert named[:5] == [("task-a", "lane_admitted"), ("task-a", "enrolled"), ("task-a", "settled"),
                         ("task-a", "lane_committed"), ("task-a", "integrated")]
    assert ("task-a", "released") in named


def test_the_record_as_of_a_version():
    events = completed_log()
    result = replay(events, at_version=4)
    assert result.version == 4 and len(result.steps) == 4
    child = result.record["children"][0]
    assert child["state"] == "enrolled" and child["lane"]["run_id"] == "run-task-a"
    assert result.record["updated_at"] == events[3].at


def test_a_version_outside_the_log_is_refused():
    with pytest.raises(ReplayRangeError, match="versions 1 to 14"):
        replay(completed_log(), at_version=99)
    with pytest.raises(ReplayRangeError):
        replay(completed_log(), at_version=0)


def test_a_parked_log_replays_with_its_skipped_dependent():
    result = replay(parked_log())
    assert result.ok, result.failures
    states = {child["task_id"]: child["state"] for child in result.record["children"]}
    assert states == {"task-a": "integrated", "task-b": "needs_human", "task-c": "skipped_blocked"}


def test_an_illegal_transition_names_its_version_even_with_a_valid_chain():
    events = completed_log()
    # Integrate task-b straight after its admission: skip Enrolled, Settled, LaneCommitted.
    b_admitted = next(i for i, e in enumerate(events) if isinstance(e, ev.LaneAdmitted) and e.task_id == "task-b")
    forged = events[:b_admitted + 1] + [
        ev.Integrated(originator_id=events[0].originator_id, originator_version=b_admitted + 2,
                      timestamp=events[b_admitted].timestamp, at=events[b_admitted].at, task_id="task-b",
                      commit=sha("forged")),
    ]
    result = replay(resealed(forged))
    assert [(failure.version, failure.rule) for failure in result.failures] == [(b_admitted + 2, ILLEGAL_TRANSITION)]
    assert "task-b is lane_admitted; expected lane_committed" in result.failures[0].message
    assert result.checks_stopped_at == b_admitted + 2


def test_a_record_the_validator_refuses_names_its_version():
    events = completed_log()
    # The batch settles as completed while task-b is still only admitted.
    cut = next(i for i, e in enumerate(events) if isinstance(e, ev.Enrolled) and e.task_id == "task-b")
    settle = msgspec.structs.replace(events[-1], originator_version=cut + 1)
    result = replay(resealed(events[:cut] + [settle]))
    assert [(failure.version, failure.rule) for failure in result.failures] == [(cut + 1, INVALID_RECORD)]
    assert "is completed but a child is not integrated" in result.failures[0].message


def test_a_broken_digest_is_a_replay_failure_too():
    events = completed_log()
    events[6] = msgspec.structs.replace(events[6], commit=sha("other"))
    result = replay(events)
    assert [(failure.version, failure.rule) for failure in result.failures] == [(7, DIGEST_MISMATCH)]


def test_a_second_prepare_is_illegal():
    events = completed_log()
    again = msgspec.structs.replace(events[0], originator_version=len(events) + 1)
    result = replay(resealed(events + [again]))
    assert [(failure.version, failure.rule) for failure in result.failures] == [(len(events) + 1, ILLEGAL_TRANSITION)]
    assert "prepared once" in result.failures[0].message


def test_an_initiative_event_inside_a_batch_log_is_illegal():
    events = completed_log()
    stray = ev.BatchRetired(originator_id=events[0].originator_id, originator_version=len(events) + 1,
                            timestamp=events[-1].timestamp, at=events[-1].at, batch_id="batch-demo-1")
    result = replay(resealed(events + [stray]))
    assert [(failure.version, failure.rule) for failure in result.failures] == [(len(events) + 1, ILLEGAL_TRANSITION)]


def test_a_park_that_skips_the_wrong_dependents_is_illegal():
    events = parked_log()
    index = next(i for i, e in enumerate(events) if isinstance(e, ev.Parked))
    events[index] = msgspec.structs.replace(events[index], skipped=[])
    result = replay(resealed(events))
    assert result.failures[0].version == index + 1 and "pending dependents" in result.failures[0].message


def test_a_ten_thousand_event_log_replays_with_progress():
    events = long_log(10_000)
    assert len(events) == 10_000
    calls: list[tuple[int, int]] = []
    result = replay(events, progress=lambda done, total: calls.append((done, total)))
    assert result.ok, result.failures[:3]
    assert result.record["batch_state"] == "completed"
    assert calls[-1] == (10_000, 10_000) and len(calls) == 10_000


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_progress_is_throttled_and_always_shows_the_end():
    stream = FakeTerminal()
    ticks = iter([0.0, 0.01, 0.02, 0.15, 0.16, 0.17])
    progress = TerminalProgress(stream=stream, clock=lambda: next(ticks))
    for done in range(1, 7):
        progress(done, 6)
    progress.finish()
    drawn = stream.getvalue().split("\r")[1:]
    assert drawn == ["replaying 1/6 events", "replaying 4/6 events", "replaying 6/6 events\n"]


def test_progress_stays_silent_off_a_terminal():
    stream = io.StringIO()
    progress = TerminalProgress(stream=stream)
    progress(1, 1)
    progress.finish()
    assert stream.getvalue() == ""



def test_a_child_made_invalid_by_one_event_is_caught_by_the_step_check():
    """Replay checks what each event changed (validate_change), not the whole record: an event whose
    only fault is the child it touches is still refused, with the whole check's message."""
    events = completed_log()
    at = next(i for i, e in enumerate(events) if isinstance(e, ev.Enrolled) and e.task_id == "task-b")
    forged = events[:at] + [msgspec.structs.replace(events[at], run_id="")] + events[at + 1:]
    result = replay(resealed(forged))
    assert [(failure.version, failure.rule) for failure in result.failures] == [(at + 1, INVALID_RECORD)]
    assert "child task-b has an invalid lane" in result.failures[0].message


@pytest.mark.parametrize("make", [completed_log, parked_log, lambda: long_log(300, tasks=4)])
def test_the_change_check_agrees_with_the_whole_check_on_every_step(make):
    from lanes_es.domain.record import apply_event, prepared_record
    from lanes_es.domain.validator import InvalidRecord, validate_change, validate_record

    record = None
    for event in make():
        record = prepared_record(event) if isinstance(event, ev.BatchPrepared) else (apply_event(record, event) or record)
        validate_record(record, record["batch_id"])
        validate_change(record, record["batch_id"], event)
        named = {getattr(event, "task_id", None), *getattr(event, "skipped", ())}
        if not named & {child["task_id"] for child in record["children"]}:
            continue
        # A fault in a child this event changed: the change check finds it, with the whole check's words.
        broken = {**record, "children": [{**child, "qa_failures": -1} if child["task_id"] in named else child
                                         for child in record["children"]]}
        messages = []
        for check in (validate_record, lambda r, b: validate_change(r, b, event)):
            with pytest.raises(InvalidRecord) as raised:
                check(broken, record["batch_id"])
            messages.append(str(raised.value))
        assert messages[0] == messages[1]
