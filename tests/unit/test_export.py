"""Export: JSON Lines that round-trip to the same events, refusals of malformed files, rebuild."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.audit_logs import completed_log, parked_log
from lanes_es.adapters.store import EventStore
from lanes_es.audit.chain import verify_chain
from lanes_es.audit.export import ExportError, export_lines, read_export, rebuild_from_export, write_export
from lanes_es.projections.batch import fold_documents
from lanes_es.projections.files import report_path, state_path


def test_each_line_is_one_sorted_object_with_topic_and_identity():
    events = parked_log()
    lines = list(export_lines(events))
    assert len(lines) == len(events) and all(line.endswith(b"\n") for line in lines)
    first = json.loads(lines[0])
    assert first["topic"] == "lanes_es.domain.events:BatchPrepared"
    assert first["originator_id"] == "batch-demo-1" and first["originator_version"] == 1
    assert first["digest"] == events[0].digest
    assert list(first) == sorted(first)
    assert b" " not in lines[1]  # compact


def test_an_export_reads_back_to_the_same_events(tmp_path: Path):
    events = parked_log()
    path = tmp_path / "batch.jsonl"
    assert write_export(events, path) == len(events)
    assert read_export(path) == events
    assert verify_chain(read_export(path)) == []


def test_an_export_from_the_store_matches_the_store(tmp_path: Path, store_url: str):
    store = EventStore(store_url)
    store.app.repository.event_store.put(completed_log())
    events = store.events("batch-demo-1")
    store.close()
    path = tmp_path / "batch.jsonl"
    write_export(events, path)
    assert read_export(path) == events


def _refused(tmp_path: Path, data: bytes, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(data)
    with pytest.raises(ExportError, match=match):
        read_export(path)


def test_malformed_exports_are_refused_with_the_line(tmp_path: Path):
    good = b"".join(export_lines(completed_log()))
    lines = good.split(b"\n")
    _refused(tmp_path, b"", "holds no events")
    _refused(tmp_path, good[:-1], "does not end with a newline")
    _refused(tmp_path, lines[0] + b"\n\n" + lines[1] + b"\n", "line 2: an empty line")
    _refused(tmp_path, lines[0] + b"\n{nope\n", "line 2: not JSON")
    _refused(tmp_path, b"[1, 2]\n", "line 1: not a JSON object")
    _refused(tmp_path, lines[0].replace(b'"topic":', b'"tropic":') + b"\n", "line 1: no topic")
    _refused(tmp_path, lines[0].replace(b"lanes_es.domain.events:BatchPrepared", b"os:system") + b"\n",
             "line 1: 'os:system' is not a lanes-es event")
    _refused(tmp_path, lines[0].replace(b"events:BatchPrepared", b"events:Nothing") + b"\n",
             "line 1: unknown event topic")
    _refused(tmp_path, lines[0].replace(b"lanes_es.domain.events:BatchPrepared", b"lanes_es.domain.events:Payload")
             + b"\n", "is not a lanes-es event")
    _refused(tmp_path, lines[0].replace(b'"max_parallel":2', b'"max_parallel":"2"') + b"\n",
             r"line 1: not a valid BatchPrepared \(Expected `int`, got `str` - at `\$.max_parallel`\)")
    _refused(tmp_path, lines[0].replace(b'"originator_version":1', b'"originator_version":"1"') + b"\n",
             "originator_version an integer")


def test_an_export_holds_one_batch(tmp_path: Path):
    other = [line.replace(b"batch-demo-1", b"batch-demo-2") for line in export_lines(completed_log())]
    data = b"".join(list(export_lines(completed_log()))[:2]) + other[2]
    _refused(tmp_path, data, "line 3: an event of batch-demo-2 inside the export of batch-demo-1")


def test_rebuild_from_an_export_writes_the_projections(tmp_path: Path):
    events = parked_log()
    path = tmp_path / "batch.jsonl"
    write_export(events, path)
    root = tmp_path / "repo"
    written = rebuild_from_export(path, root)
    documents = fold_documents(events)
    assert sorted(written) == sorted([state_path(root, "batch-demo-1"), report_path(root, "batch-demo-1")])
    assert state_path(root, "batch-demo-1").read_bytes() == documents.record_bytes()
    assert report_path(root, "batch-demo-1").read_bytes() == documents.report_bytes()
    assert rebuild_from_export(path, root) == []  # already current: nothing rewritten


def test_rebuild_refuses_a_tampered_export_and_writes_nothing(tmp_path: Path):
    lines = list(export_lines(parked_log()))
    assert b"run-task-a" in lines[3]  # version 4: Enrolled
    lines[3] = lines[3].replace(b"run-task-a", b"run-task-z")
    path = tmp_path / "batch.jsonl"
    path.write_bytes(b"".join(lines))
    root = tmp_path / "repo"
    with pytest.raises(ExportError, match="version 4: digest_mismatch"):
        rebuild_from_export(path, root)
    assert not (root / ".imm").exists()
