"""Property tests of the v2 validator and the aggregate's guards (issue 3).

- Any sequence of commands on a LaneBatch either is refused by a guard or leaves a record
  the validator accepts: an illegal transition never reaches the log.
- Any value put anywhere in a valid record is either accepted or refused with InvalidRecord,
  never another exception (a hand-edited state file cannot crash a reader).
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lanes_es.domain import events as ev
from lanes_es.domain.aggregate import TransitionRefused
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.validator import InvalidRecord, validate_record

AT = "2026-01-01T00:00:00.000Z"
TASKS = ["a", "b", "c"]
BATCH = "batch-prop-1"


def new_batch() -> LaneBatch:
    batch = LaneBatch.prepare(
        at=AT, batch_id=BATCH, initiative_slug="prop", plan_digest="sha256:0", base_head="b" * 40, branch="imm/prop",
        confirmation_time=AT, budget=ev.Budget(max_children=2, qa_failure_limit=2), max_parallel=2,
        children=[ev.PlanChild(task_id="a", slice_id="S1", blocked_by=[]),
                  ev.PlanChild(task_id="b", slice_id="S2", blocked_by=["a"]),
                  ev.PlanChild(task_id="c", slice_id="S3", blocked_by=[])])
    batch.start(AT)
    return batch


def lane(task: str) -> ev.LaneBinding:
    return ev.LaneBinding(path=f"/lanes/{task}", branch=f"imm-lane/prop/{task}", base_head="b" * 40)


COMMANDS = {
    "admit": lambda b, t, n: b.admit_lane(AT, t, lane(t)),
    "enroll": lambda b, t, n: b.enroll(AT, t, f"run-{t}"),
    "settle": lambda b, t, n: b.settle(AT, t),
    "commit": lambda b, t, n: b.commit_lane(AT, t, f"{t}{n}".ljust(40, "0")),
    "integrate": lambda b, t, n: b.integrate(AT, t, f"i{t}{n}".ljust(40, "0")),
    "release": lambda b, t, n: b.release(AT, t),
    "park": lambda b, t, n: b.park(AT, t, "boom"),
    "qa": lambda b, t, n: b.count_qa_failure(AT, t, n % 3, "QA failure limit reached" if n % 2 else None),
    "correct": lambda b, t, n: b.record_intervention(AT, t, "correction", "redesign"),
    "instruct": lambda b, t, n: b.record_intervention(AT, t, "instruction", "hint"),
    "close": lambda b, t, n: b.close_tracker(AT, t),
    "complete": lambda b, t, n: b.settle_batch(AT, "completed", "done", ""),
    "fail": lambda b, t, n: b.settle_batch(AT, "failed", "broken", ""),
    "stop": lambda b, t, n: b.settle_batch(AT, "budget_stopped", "budget", ""),
    "park_batch": lambda b, t, n: b.settle_batch(AT, "needs_human", "parked", ""),
    "supersede": lambda b, t, n: b.supersede(AT, "retired", ""),
}

steps = st.lists(st.tuples(st.sampled_from(sorted(COMMANDS)), st.sampled_from(TASKS), st.integers(0, 9)),
                 max_size=40)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_guards_keep_every_record_valid(sequence):
    batch = new_batch()
    for name, task, number in sequence:
        before = copy.deepcopy(batch.record)
        version = batch.version
        try:
            COMMANDS[name](batch, task, number)
        except TransitionRefused:
            assert batch.record == before and batch.version == version  # a refusal changes nothing
            continue
        except InvalidRecord:
            raise AssertionError(f"{name} {task} passed its guard but broke the record")
        validate_record(batch.record, BATCH)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)


def paths(record: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix] if prefix else []
    if isinstance(record, dict):
        for key, value in record.items():
            found += paths(value, prefix + (key,))
    elif isinstance(record, list):
        for index, value in enumerate(record):
            found += paths(value, prefix + (index,))
    return found


VALID = new_batch()
VALID.admit_lane(AT, "a", lane("a"))
VALID_PATHS = paths(VALID.record)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(VALID_PATHS), json_values)
def test_any_edit_is_accepted_or_refused_cleanly(path, value):
    record = copy.deepcopy(VALID.record)
    target = record
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        validate_record(record, BATCH)
    except InvalidRecord as error:
        assert str(error).startswith(f"batch run state {BATCH} ")
