"""The read model's line of a batch follows the same child and batch states as the v2 record."""

from __future__ import annotations

from pathlib import Path

import pytest

from lanes_es.audit.export import read_export_log
from lanes_es.domain import events as ev
from lanes_es.domain.batch_summary import AUTHORIZED, summary_after, summary_key
from lanes_es.domain.record import apply_event, prepared_record
from tests.unit.audit_logs import BASE, at, completed_log, long_log, parked_log

FIXTURES = Path(__file__).parent.parent / "fixtures" / "logs"


def fixture_log(name: str) -> list:
    return read_export_log(FIXTURES / f"{name}.jsonl")[0]


LOGS = {"completed": completed_log, "parked_log": parked_log, "long": lambda: long_log(400, tasks=5),
        **{name: (lambda name=name: fixture_log(name)) for name in ("demo", "intervened", "parked", "resumed")}}


@pytest.mark.parametrize("name", sorted(LOGS))
def test_after_every_event_the_line_has_the_records_states(name):
    events = LOGS[name]()
    line = record = None
    for event in events:
        assert summary_key(event) == events[0].originator_id
        line = summary_after(line, event)
        if isinstance(event, ev.BatchPrepared):
            record = prepared_record(event)
        else:
            apply_event(record, event)
        assert line.children == {child["task_id"]: child["state"] for child in record["children"]}
        assert line.batch_state == record["batch_state"]
        assert (line.version, line.last_event_at) == (event.originator_version, event.at)


def authorization(batch_id: str, repository: str | None, tasks: list[str]) -> ev.BatchAuthorized:
    return ev.BatchAuthorized(
        originator_id="initiative:demo", originator_version=2, timestamp=completed_log()[0].timestamp, at=at(0),
        batch_id=batch_id, plan_digest="sha256:0", base_head=BASE, branch="imm/demo",
        budget=ev.Budget(max_children=2, qa_failure_limit=3), max_parallel=1,
        children=[ev.PlanChild(task_id=task, slice_id="S", blocked_by=[]) for task in tasks],
        confirmation_time=at(0), confirmation_ref="ref", repository=repository)


def test_the_authorization_names_the_repository_and_the_batch_keeps_it():
    events = completed_log()
    line = summary_after(None, authorization(events[0].originator_id, "/work/repo", ["task-a", "task-b"]))
    assert (line.batch_state, line.repository, line.children_by_status()) == (AUTHORIZED, "/work/repo", {"pending": 2})
    for event in events:
        line = summary_after(line, event)
    assert (line.batch_state, line.repository) == ("completed", "/work/repo")
    assert line.children_by_status() == {"integrated": 1, "released": 1}


@pytest.mark.parametrize("written_as", [1, 2, 3, 4])
def test_an_authorization_written_before_v4_upcasts_to_no_repository_id_and_no_budget(written_as):
    """v1 rows had neither field (no class_version), v2 rows a repository but no repository id, v3 rows no
    Executor budget, v4 rows no coordinator (in place, as before coordinator worktrees)."""
    from lanes_es.adapters.store import StructMapper, NullTranscoder

    mapper = StructMapper(transcoder=NullTranscoder())
    stored = mapper.to_stored_event(authorization("batch-demo-1", "/r", ["task-a"]))
    import json

    state = json.loads(stored.state)
    assert state.pop("class_version") == 5
    del state["coordinator"]
    if written_as < 4:
        del state["executor_budget"]
    if written_as < 3:
        del state["repository_id"]
    if written_as == 1:
        del state["repository"]
    else:
        state["class_version"] = written_as
    old = type(stored)(originator_id=stored.originator_id, originator_version=stored.originator_version,
                       topic=stored.topic, state=json.dumps(state).encode())
    decoded = mapper.to_domain_event(old)
    assert decoded.repository_id == (None if written_as < 3 else stored_id(stored))
    assert decoded.repository == (None if written_as == 1 else "/r")
    assert decoded.executor_budget is None
    assert decoded.coordinator is None


def stored_id(stored):
    import json

    return json.loads(stored.state)["repository_id"]
