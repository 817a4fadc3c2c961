"""An event schema change on a throwaway event class: a v1 row written by old code, read by v2
code through its upcaster, still verifies on its digest chain (docs/adr/0001-event-schema-changes.md).

`Noted` below is v2: its field `note` was renamed `text`. A v1 row is made as v1 code made it
(a class of the same name with the old field, sealed and encoded by the store's mapper) and
stored under the topic the class keeps, as a store holds it after the code moved on.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from eventsourcing.persistence import StoredEvent
from eventsourcing.utils import get_topic

from lanes_es.adapters.store import EventStore, NullTranscoder, StructMapper
from tests.store_rows import StoreRows
from lanes_es.audit.chain import DIGEST_MISMATCH, sealed_bytes, verify_chain, verify_stored
from lanes_es.domain import events as ev
from lanes_es.domain.events import canonical_bytes, chain_digest

LOG = "noted-log-1"
AT = "2030-01-01T00:00:00.000Z"


class Noted(ev.Event, frozen=True, kw_only=True):
    """v2: `note` became `text`."""

    task_id: str
    text: str
    class_version = 2

    @staticmethod
    def upcast_v1_v2(state: dict[str, Any]) -> None:
        state["text"] = state.pop("note")


def _v1_class() -> type:
    """The class as v1 code defined it: same name, the old field, no class_version."""

    class Noted(ev.Event, frozen=True, kw_only=True):
        task_id: str
        note: str

    return Noted


NotedV1 = _v1_class()


def sealed(event: Any, previous: str) -> Any:
    return msgspec.structs.replace(event, digest=chain_digest(previous, event))


def v1_row(version: int, note: str, previous: str) -> tuple[StoredEvent, str]:
    """A row as the v1 mapper stored it, under the topic of `Noted`; and its digest."""
    from lanes_es.domain.ids import parse_timestamp

    old = sealed(NotedV1(originator_id=LOG, originator_version=version, timestamp=parse_timestamp(AT), at=AT,
                            task_id="task-a", note=note), previous)
    row = StructMapper(NullTranscoder()).to_stored_event(old)
    return StoredEvent(originator_id=LOG, originator_version=version, topic=get_topic(Noted), state=row.state), \
        old.digest


def v2_event(version: int, text: str, previous: str) -> Any:
    from lanes_es.domain.ids import parse_timestamp

    return sealed(Noted(originator_id=LOG, originator_version=version, timestamp=parse_timestamp(AT), at=AT,
                        task_id="task-a", text=text), previous)


@pytest.fixture
def mixed_log(store_url: str) -> str:
    """Two v1 rows written by old code, then one v2 event written by the current code, in the store (each backend)."""
    first, digest = v1_row(1, "first words", "")
    second, digest = v1_row(2, "second words", digest)
    third = StructMapper(NullTranscoder()).to_stored_event(v2_event(3, "new words", digest))
    path = store_url
    store = EventStore(path)
    store.app.recorder.insert_events([first, second, third])
    store.close()
    return path


def read(path: str) -> tuple[list[StoredEvent], list[Any], list[Any]]:
    store = EventStore(path)
    try:
        rows = store.stored_events(LOG)
    finally:
        store.close()
    events, breaks = verify_stored(rows)
    return rows, events, breaks


def test_a_v1_row_reads_back_as_v2_through_the_upcaster(mixed_log: str):
    rows, events, breaks = read(mixed_log)
    assert [type(event) for event in events] == [Noted, Noted, Noted]
    assert [event.text for event in events] == ["first words", "second words", "new words"]
    assert b'"note":"first words"' in rows[0].state and b"class_version" not in rows[0].state
    assert b'"class_version":2' in rows[2].state  # so the v2 row is not upcast a second time


def test_the_chain_holds_on_the_stored_form_across_the_schema_change(mixed_log: str):
    _, events, breaks = read(mixed_log)
    assert breaks == []
    # Why the stored form: the decoded v1 events are v2-shaped now, so their links no longer recompute.
    assert [(found.version, found.rule) for found in verify_chain(events)] == [(1, DIGEST_MISMATCH),
                                                                               (2, DIGEST_MISMATCH)]


def test_the_sealed_bytes_of_a_current_event_are_its_canonical_bytes():
    event = v2_event(1, "words", "")
    row = StructMapper(NullTranscoder()).to_stored_event(event)
    assert sealed_bytes(row) == canonical_bytes(event)


def test_editing_an_old_row_still_names_its_version(mixed_log: str):
    rows = StoreRows(mixed_log)
    state = rows.query("SELECT state FROM {events} WHERE originator_version=1")[0][0]
    assert rows.execute("UPDATE {events} SET state=? WHERE originator_version=1",
                        state.replace(b"first words", b"other words")) == 1
    _, events, breaks = read(mixed_log)
    assert events[0].text == "other words"  # the upcaster reads the edit like any v1 row
    assert [(found.version, found.rule) for found in breaks] == [(1, DIGEST_MISMATCH)]


def test_a_key_added_to_a_stored_row_breaks_its_link(mixed_log: str):
    """Decoding ignores keys the class does not know; the chain over the stored form does not."""
    rows = StoreRows(mixed_log)
    state = rows.query("SELECT state FROM {events} WHERE originator_version=3")[0][0]
    assert rows.execute("UPDATE {events} SET state=? WHERE originator_version=3",
                        state.replace(b"{", b'{"approved_by":"someone",', 1)) == 1
    _, events, breaks = read(mixed_log)
    assert events[2].text == "new words"
    assert [(found.version, found.rule) for found in breaks] == [(3, DIGEST_MISMATCH)]


def test_class_version_is_sealed():
    """A row's schema version is part of what its digest covers, so relabelling a row breaks its link."""
    event = v2_event(1, "words", "")
    row = StructMapper(NullTranscoder()).to_stored_event(event)
    assert b'"class_version":2' in canonical_bytes(event) and b'"class_version":2' in sealed_bytes(row)
    relabelled = StoredEvent(originator_id=row.originator_id, originator_version=row.originator_version,
                             topic=row.topic, state=row.state.replace(b'"class_version":2,', b""))
    assert sealed_bytes(relabelled) != sealed_bytes(row)
