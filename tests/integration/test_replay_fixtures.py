"""Replay compatibility: logs recorded from real runs replay with the current code to the very bytes
those runs wrote, as Temporal's replayer holds workflow histories to the current workflow code.

The fixtures (tests/fixtures/logs/<name>.jsonl, .state.json, .report.json) are made by
tools/record_fixtures.py and are history: when a test here fails, the code changed what an
old log means. Fix the code, or for a schema change add a `class_version` and an upcaster
(docs/adr/0001-event-schema-changes.md); do not re-record to make it pass.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from eventsourcing.persistence import StoredEvent

from lanes_es.audit.export import parse_export_log, read_export_log, stored_line
from lanes_es.audit.replay import replay
from lanes_es.projections.batch import fold_documents
from lanes_es.projections.files import canonical_bytes
from tests.gitfixtures import run_git
from lanes_es.cli.main import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
NAMES = ("demo", "parked", "resumed", "intervened")  # what tools/record_fixtures.py records
# Every log kept here replays, including older recordings kept beside a newer one.
KEPT = tuple(sorted(path.name.removesuffix(".jsonl") for path in FIXTURES.glob("*.jsonl")))


def recorded(name: str) -> tuple[Path, bytes, bytes | None]:
    state = FIXTURES / f"{name}.state.json"
    report = FIXTURES / f"{name}.report.json"
    return FIXTURES / f"{name}.jsonl", state.read_bytes(), report.read_bytes() if report.exists() else None


def test_every_recorded_scenario_is_here():
    assert set(NAMES) <= set(KEPT)
    for name in KEPT:
        assert (FIXTURES / f"{name}.state.json").is_file(), f"{name}.jsonl has no recorded state file"


@pytest.mark.parametrize("name", KEPT)
def test_the_log_folds_to_the_projections_it_produced(name: str):
    log, state, report = recorded(name)
    events, breaks = read_export_log(log)
    assert breaks == []
    documents = fold_documents(events)
    assert documents is not None
    assert documents.record_bytes() == state
    assert documents.report_bytes() == report


@pytest.mark.parametrize("name", KEPT)
def test_every_step_replays_clean_to_the_same_record(name: str):
    log, state, _ = recorded(name)
    events, breaks = read_export_log(log)
    result = replay(events, chain_breaks=breaks)
    assert result.failures == [] and result.checks_stopped_at is None
    assert result.version == len(events) and result.head == events[-1].digest
    assert canonical_bytes(result.record) == state


@pytest.mark.parametrize("name", KEPT)
def test_each_line_is_a_stored_row_and_its_topic(name: str):
    """The export format itself: a line, as a store row, exports to the same bytes."""
    data = recorded(name)[0].read_bytes()
    events, _ = parse_export_log(data)
    lines = data.splitlines(keepends=True)
    assert len(lines) == len(events)
    for line, event in zip(lines, events):
        fields = msgspec.json.decode(line)
        topic = fields.pop("topic")
        row = StoredEvent(originator_id=event.originator_id, originator_version=event.originator_version,
                          topic=topic, state=msgspec.json.encode(fields, order="sorted"))
        assert stored_line(row) == line


@pytest.mark.parametrize("name", KEPT)
def test_verify_export_accepts_it(name: str, capsys: pytest.CaptureFixture[str]):
    log = recorded(name)[0]
    assert main(["verify", "--export", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("verified: every check holds")
    assert f"chain head {json.loads(log.read_bytes().splitlines()[-1])['digest']}" in out


@pytest.mark.parametrize("name", KEPT)
@pytest.mark.usefixtures("store_url")  # rebuild writes the log into the store, on each backend
def test_rebuild_from_export_writes_the_recorded_bytes(name: str, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]):
    log, state, report = recorded(name)
    repo = tmp_path / "repo"
    repo.mkdir()
    run_git(repo, "init", "-q", "-b", "main")
    assert main(["--root", str(repo), "rebuild", "--from-export", str(log)]) == 0
    capsys.readouterr()
    batch_id = json.loads(state)["batch_id"]
    batches = repo / ".imm" / "state" / "batches"
    assert (batches / f"{batch_id}.json").read_bytes() == state
    assert (batches / f"{batch_id}.report.json").read_bytes() == report
    assert sorted(path.name for path in batches.iterdir()) == sorted([f"{batch_id}.json", f"{batch_id}.report.json"])


# ---------------------------------------------------------------- what each fixture holds


def kinds(name: str) -> Counter[str]:
    return Counter(json.loads(line)["topic"].rpartition(":")[2] for line in recorded(name)[0].read_bytes().splitlines())


def children(name: str) -> dict[str, dict[str, Any]]:
    return {child["task_id"]: child for child in json.loads(recorded(name)[1])["children"]}


def test_the_fixtures_cover_what_they_were_recorded_for():
    """A re-recording that lost its point (no park, no resume, ...) fails here, not silently."""
    demo = kinds("demo")
    assert json.loads(recorded("demo")[1])["batch_state"] == "completed"
    assert demo["Integrated"] == len(children("demo")) == 6

    parked = kinds("parked")
    assert json.loads(recorded("parked")[1])["batch_state"] == "needs_human"
    assert parked["Parked"] == 2 and parked["HeadAdopted"] == 1
    reasons = {task: child["reason"] or "" for task, child in children("parked").items()}
    assert reasons["breaker"].startswith("batch_integration_check_failed: ")
    assert reasons["conflict"].startswith("batch_integration_conflict: ")
    assert children("parked")["dependent"]["state"] == "skipped_blocked"

    resumed = kinds("resumed")
    assert json.loads(recorded("resumed")[1])["batch_state"] == "completed"
    assert resumed["Parked"] == 1 and resumed["ParkResumed"] == 1 and resumed["InterventionRecorded"] == 2

    intervened = kinds("intervened")
    state = json.loads(recorded("intervened")[1])
    assert state["batch_state"] == "superseded"
    assert intervened["BatchSuperseded"] == 1 and intervened["OffersRefused"] == 1
    interventions = [json.loads(line) for line in recorded("intervened")[0].read_bytes().splitlines()
                     if b"InterventionRecorded" in line]
    assert [item["kind"] for item in interventions] == ["instruction"]
    corrections = [json.loads(line)["kind"] for line in recorded("resumed")[0].read_bytes().splitlines()
                   if b"InterventionRecorded" in line]
    assert corrections == ["correction", "correction"]
