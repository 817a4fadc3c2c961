"""The audit chain: recomputed digests and stored rows, on real logs and a real SQLite store."""

from __future__ import annotations


import msgspec
import pytest

from tests.store_rows import StoreRows
from tests.unit.audit_logs import completed_log
from lanes_es.adapters.store import EventStore
from lanes_es.audit.chain import (
    DIGEST_MISMATCH, EMPTY_LOG, FIRST_VERSION_RULE, FOREIGN_EVENT, ROW_MISMATCH, UNDECODABLE, VERSION_GAP,
    VERSION_ORDER, chain_head, verify_chain, verify_stored,
)

BATCH = "batch-demo-1"


def test_a_log_made_by_the_aggregate_holds():
    events = completed_log()
    assert verify_chain(events) == []
    assert chain_head(events) == events[-1].digest


def test_a_changed_payload_names_its_version():
    events = completed_log()
    events[3] = msgspec.structs.replace(events[3], run_id="run-forged")
    breaks = verify_chain(events)
    assert [(found.version, found.rule) for found in breaks] == [(4, DIGEST_MISMATCH)]
    assert "Enrolled" in breaks[0].message


def test_a_resealed_forgery_breaks_the_next_link():
    """Recomputing the edited event's digest moves the break to the event after it."""
    from lanes_es.domain.events import chain_digest

    events = completed_log()
    forged = msgspec.structs.replace(events[3], run_id="run-forged")
    events[3] = msgspec.structs.replace(forged, digest=chain_digest(events[2].digest, forged))
    assert [(found.version, found.rule) for found in verify_chain(events)] == [(5, DIGEST_MISMATCH)]


def test_a_missing_event_is_a_gap_at_its_version():
    events = completed_log()
    del events[5]
    assert [(found.version, found.rule) for found in verify_chain(events)] == [(6, VERSION_GAP)]


def test_reordered_events_name_the_first_out_of_place_version():
    events = completed_log()
    events[4], events[5] = events[5], events[4]
    breaks = verify_chain(events)
    assert (breaks[0].version, breaks[0].rule) == (5, VERSION_GAP)
    assert any(found.rule == VERSION_ORDER and found.version == 5 for found in breaks)


def test_a_log_that_does_not_start_at_one():
    events = completed_log()[2:]
    assert [(found.version, found.rule) for found in verify_chain(events)] == [(1, FIRST_VERSION_RULE)]


def test_an_event_of_another_batch():
    events = completed_log()
    events[2] = msgspec.structs.replace(events[2], originator_id="batch-other")
    rules = {(found.version, found.rule) for found in verify_chain(events)}
    assert (3, FOREIGN_EVENT) in rules and (3, DIGEST_MISMATCH) in rules


def test_an_empty_log_is_a_break():
    assert [found.rule for found in verify_chain([])] == [EMPTY_LOG]


# ---------------------------------------------------------------- the store (SQLite and PostgreSQL)


@pytest.fixture
def stored(store_url: str) -> str:
    path = store_url
    store = EventStore(path)
    store.app.repository.event_store.put(completed_log())
    store.close()
    return path


def _verify(path: str) -> tuple[list, list]:
    store = EventStore(path)
    try:
        return verify_stored(store.stored_events(BATCH))
    finally:
        store.close()


def _sql(path: str, statement: str, *args: object) -> None:
    assert StoreRows(path).execute(statement, *args) == 1


def _state(path: str, version: int) -> bytes:
    return StoreRows(path).query("SELECT state FROM {events} WHERE originator_id=? AND originator_version=?",
                                 BATCH, version)[0][0]


def test_an_untouched_store_verifies(stored: str):
    events, breaks = _verify(stored)
    assert breaks == []
    assert len(events) == len(completed_log())
    assert chain_head(events) == completed_log()[-1].digest


def test_editing_one_stored_payload_names_that_version(stored: str):
    state = _state(stored, 7)
    assert b'"commit":"' in state
    edited = state.replace(b'"commit":"', b'"commit":"f', 1)
    _sql(stored, "UPDATE {events} SET state=? WHERE originator_id=? AND originator_version=7", edited, BATCH)
    _, breaks = _verify(stored)
    assert [(found.version, found.rule) for found in breaks] == [(7, DIGEST_MISMATCH)]


def test_deleting_a_middle_event_names_that_version(stored: str):
    _sql(stored, "DELETE FROM {events} WHERE originator_id=? AND originator_version=6", BATCH)
    _, breaks = _verify(stored)
    assert [(found.version, found.rule) for found in breaks] == [(6, VERSION_GAP)]


def test_swapping_two_rows_is_seen_in_the_rows(stored: str):
    fifth, sixth = _state(stored, 5), _state(stored, 6)
    _sql(stored, "UPDATE {events} SET state=? WHERE originator_id=? AND originator_version=5", sixth, BATCH)
    _sql(stored, "UPDATE {events} SET state=? WHERE originator_id=? AND originator_version=6", fifth, BATCH)
    _, breaks = _verify(stored)
    assert (breaks[0].version, breaks[0].rule) == (5, ROW_MISMATCH)


def test_a_row_that_no_longer_decodes_is_named_not_raised(stored: str):
    _sql(stored, "UPDATE {events} SET state=? WHERE originator_id=? AND originator_version=3", b"{broken", BATCH)
    events, breaks = _verify(stored)
    assert [(found.version, found.rule) for found in breaks] == [(3, UNDECODABLE)]
    assert len(events) == len(completed_log()) - 1
