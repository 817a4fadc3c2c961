"""A schema change with an upcaster keeps a recorded log replaying (docs/adr/0001-event-schema-changes.md).

The change simulated here: `Enrolled.run_id` was once called `run`. Each fixture is turned into
the log that v1 code would have written (its Enrolled rows in the old shape, every link sealed
over the rows as written), and the current `Enrolled` gets `class_version = 2` with the
upcaster that renames the field. The old log must then read, verify and rebuild to the very
bytes the real run wrote; without the upcaster it must be refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from eventsourcing.persistence import StoredEvent

from lanes_es.adapters.log_reader import stream_events
from lanes_es.adapters.store import EventStore
from lanes_es.audit.chain import sealed_bytes, verify_stored
from lanes_es.audit.export import ExportError, read_export_log
from lanes_es.domain import events as ev
from lanes_es.projections.batch import fold_documents
from tests.gitfixtures import run_git
from lanes_es.cli.main import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "logs"
NAMES = ("demo", "parked", "resumed", "intervened")
_SORTED = msgspec.json.Encoder(order="sorted")


def upcast_enrolled_v1_v2(state: dict[str, Any]) -> None:
    state["run_id"] = state.pop("run")


@pytest.fixture
def enrolled_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ev.Enrolled, "class_version", 2, raising=False)
    monkeypatch.setattr(ev.Enrolled, "upcast_v1_v2", staticmethod(upcast_enrolled_v1_v2), raising=False)


def v1_rows(log: Path) -> list[StoredEvent]:
    """The fixture's log as v1 code would have stored it, sealed again link by link."""
    rows: list[StoredEvent] = []
    previous = ""
    for line in log.read_bytes().splitlines():
        fields = msgspec.json.decode(line)
        topic = fields.pop("topic")
        if topic == "lanes_es.domain.events:Enrolled":
            fields["run"] = fields.pop("run_id")
        fields["digest"] = ""
        unsealed = StoredEvent(originator_id=fields["originator_id"], originator_version=fields["originator_version"],
                               topic=topic, state=_SORTED.encode(fields))
        fields["digest"] = previous = hashlib.sha256(previous.encode() + sealed_bytes(unsealed)).hexdigest()
        rows.append(StoredEvent(originator_id=unsealed.originator_id, originator_version=unsealed.originator_version,
                                topic=topic, state=_SORTED.encode(fields)))
    return rows


def v1_export(log: Path, tmp_path: Path) -> Path:
    path = tmp_path / f"v1-{log.name}"
    lines = []
    for row in v1_rows(log):
        fields = msgspec.json.decode(row.state)
        fields["topic"] = row.topic
        lines.append(_SORTED.encode(fields) + b"\n")
    path.write_bytes(b"".join(lines))
    return path


def recorded(name: str) -> tuple[Path, bytes, bytes]:
    return (FIXTURES / f"{name}.jsonl", (FIXTURES / f"{name}.state.json").read_bytes(),
            (FIXTURES / f"{name}.report.json").read_bytes())


@pytest.mark.parametrize("name", NAMES)
def test_an_old_log_replays_to_the_recorded_bytes_through_the_upcaster(name: str, enrolled_v2: None,
                                                                       tmp_path: Path):
    log, state, report = recorded(name)
    old = v1_export(log, tmp_path)
    assert b'"run":"run-' in old.read_bytes() and b'"run_id"' not in old.read_bytes()
    events, breaks = read_export_log(old)
    assert breaks == []
    documents = fold_documents(events)
    assert documents is not None
    assert (documents.record_bytes(), documents.report_bytes()) == (state, report)


def test_the_cli_verifies_and_rebuilds_an_old_export(enrolled_v2: None, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]):
    log, state, report = recorded("resumed")
    old = v1_export(log, tmp_path)
    assert main(["verify", "--export", str(old)]) == 0
    assert "verified: every check holds" in capsys.readouterr().out
    repo = tmp_path / "repo"
    repo.mkdir()
    run_git(repo, "init", "-q", "-b", "main")
    assert main(["--root", str(repo), "rebuild", "--from-export", str(old)]) == 0
    batch_id = json.loads(state)["batch_id"]
    assert (repo / ".imm/state/batches" / f"{batch_id}.json").read_bytes() == state
    assert (repo / ".imm/state/batches" / f"{batch_id}.report.json").read_bytes() == report


def test_old_rows_in_a_store_verify_and_load_through_the_upcaster(enrolled_v2: None, store_url: str):
    log, state, _ = recorded("parked")
    rows = v1_rows(log)
    store = EventStore(store_url)
    try:
        store.app.recorder.insert_events(rows)
        batch_id = rows[0].originator_id
        events, breaks = verify_stored(store.stored_events(batch_id))
        assert breaks == []
        assert store.batch(batch_id).record == json.loads(state)  # the aggregate loads through the mapper too
        documents = fold_documents(events)
        assert documents is not None and documents.record_bytes() == state
        rebuilt = fold_documents(stream_events(store, batch_id))  # the rebuild's own read of the rows
        assert rebuilt is not None and rebuilt.record_bytes() == state
    finally:
        store.close()


def test_without_the_upcaster_the_old_log_is_refused(tmp_path: Path):
    old = v1_export(recorded("resumed")[0], tmp_path)
    with pytest.raises(ExportError, match="not a valid Enrolled"):
        read_export_log(old)
