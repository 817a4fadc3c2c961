"""`replay` streams the log from the store a page of rows at a time, on SQLite and PostgreSQL, and
still writes the very bytes of the whole result (every step checked, every row and chain break found):
compared here with the result of `replay` over the whole log loaded at once. The rebuild's own
paged read (`stream_events`, a narrow SELECT of its own on each backend) gives the very events
the store loads."""

from __future__ import annotations

import io
import sqlite3

import msgspec
import pytest

from lanes_es.adapters import log_reader
from lanes_es.adapters.store import EventStore, is_postgres_url
from lanes_es.audit.chain import verify_stored
from lanes_es.audit.replay import replay
from lanes_es.projections.batch import fold_documents
from lanes_es.projections.timeline import AnchorMarks
from tests.conftest import postgres_statement
from lanes_es.cli.audit import replay_command
from tools.bench_logs import write_batch

BATCH = "batch-stream-1"


def whole_document(store: EventStore, at_version: int | None, anchors: AnchorMarks) -> str:
    """The form before streaming: the whole log loaded, replayed, and the result written as one document."""
    events, breaks = verify_stored(store.stored_events(BATCH))
    document = msgspec.to_builtins(replay(events, at_version, chain_breaks=breaks))
    document["anchors"] = msgspec.to_builtins(anchors)
    return msgspec.json.format(msgspec.json.encode(document), indent=2).decode() + "\n"


def streamed(store: EventStore, at_version: int | None, anchors: AnchorMarks, as_json: bool = True) -> tuple[int, str]:
    out = io.StringIO()
    code = replay_command(store, BATCH, at_version, as_json=as_json, out=out, err=io.StringIO(), anchors=anchors)
    return code, out.getvalue()


def run_sql(store: EventStore, store_url: str, statement: str) -> None:
    """`statement` on the store's events table, by hand, as a damaged store is."""
    table = store.app.recorder.events_table_name
    if is_postgres_url(store_url):
        schema = store_url.rsplit("schema=", 1)[1]
        postgres_statement(statement.replace("stored_events", table if "." in table else f"{schema}.{table}"))
        return
    statement = statement.replace("stored_events", table)
    with sqlite3.connect(store_url) as connection:
        connection.execute(statement)


@pytest.fixture
def store(store_url, monkeypatch):
    monkeypatch.setattr(log_reader, "PAGE", 700)  # several pages, and a page boundary inside each range
    written = EventStore(store_url)
    write_batch(written, BATCH, "stream", 2_500, children=6)
    yield written
    written.close()


def test_the_streamed_replay_writes_the_bytes_of_the_whole_result(store):
    anchors = AnchorMarks(checkpoints=[(700, "ab" * 32)], attested={12: "attestations/12-task.dsse.json"})
    for at_version in (None, 1, 700, 701, 2_499):
        code, text = streamed(store, at_version, anchors)
        assert code == 0
        assert text == whole_document(store, at_version, anchors), at_version
    assert msgspec.json.decode(streamed(store, None, anchors)[1])["steps"][-1]["version"] == 2_500


def test_a_damaged_log_streams_to_the_same_findings(store, store_url):
    run_sql(store, store_url, f"DELETE FROM stored_events WHERE originator_id = '{BATCH}' AND originator_version = 900")
    edited = ("convert_to(replace(convert_from(state, 'UTF8'), 'stream', 'streaX'), 'UTF8')"
              if is_postgres_url(store_url) else "CAST(replace(CAST(state AS TEXT), 'stream', 'streaX') AS BLOB)")
    run_sql(store, store_url, f"UPDATE stored_events SET state = {edited} "
                              f"WHERE originator_id = '{BATCH}' AND originator_version = 1400")
    anchors = AnchorMarks()
    for at_version in (None, 1_000):
        code, text = streamed(store, at_version, anchors)
        assert code == 1
        assert text == whole_document(store, at_version, anchors)
        rules = {(failure["version"], failure["rule"]) for failure in msgspec.json.decode(text)["failures"]}
        assert (900, "version_gap") in rules
        assert any(version == 1400 for version, _ in rules) == (at_version is None)  # the edited row


def test_the_text_replay_streams_too_and_ends_with_the_verdict(store):
    code, text = streamed(store, 1_000, AnchorMarks(), as_json=False)
    assert code == 0
    events = store.events(BATCH)[:1_000]
    lines = text.splitlines()
    steps = [line for line in lines if line[:6].strip().isdigit()]
    assert [int(line[:6]) for line in steps] == list(range(1, 1_001))
    assert [line for line in lines if line.startswith("-- tick")] == \
        [f"-- tick {at}" for at in dict.fromkeys(event.at for event in events)]
    record_at = lines.index("record as of version 1000:")
    assert lines[record_at - 1] == (f"replayed 1000 events of {BATCH} to version 1000: batch running, chain head "
                                    f"{events[-1].digest}; every check holds")


def test_the_rebuild_reads_every_event_across_its_pages(store):
    events = store.events(BATCH)
    assert len(events) == 2_500  # four pages of 700, the last one short
    assert list(log_reader.stream_events(store, BATCH)) == events  # pages of 700 (the fixture's PAGE)
    assert list(log_reader.stream_events(store, BATCH, page=2_500)) == events  # a last page that is full
    assert list(log_reader.stream_events(store, "batch-absent-1")) == []
    streamed_documents, whole = fold_documents(log_reader.stream_events(store, BATCH)), fold_documents(events)
    assert streamed_documents is not None and whole is not None
    assert (streamed_documents.record_bytes(), streamed_documents.report_bytes()) == \
        (whole.record_bytes(), whole.report_bytes())
