"""A batch's log read a page at a time, for rebuilds that must not hold a whole log in memory.

`stream_events` reads only what a fold needs of each row (its version, topic and state), with
one narrow SELECT a page on SQLite and PostgreSQL: eventsourcing's `select_events` builds a
StoredEvent of every row, which cost a rebuild more than decoding the row did. Each row is
decoded with one msgspec Decoder per event class (the mapper's path, without its per-row topic
lookup); a class past schema version 1 goes through the mapper, which runs its upcasters.
`stream_verified_events` checks each row as it decodes it (what every command that loads a batch
reads); `stream_rows` gives whole StoredEvents, for the checks that read every column (replay, verify).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterator, NamedTuple

import msgspec
from eventsourcing.persistence import InterfaceError, OperationalError, StoredEvent
from eventsourcing.utils import resolve_topic, retry

PAGE = 2000
# A read whose connection the server ended is tried again on a new one, as eventsourcing's own reads are
# (ten attempts, 0.2 s apart); when the server does not answer, the store stops it as an outage at once.
RETRIED = retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)

# A page of a log: its rows after a version, oldest first, as (version, topic, state).
SelectPage = Callable[[str, int, int], list[Any]]


def stream_events(store: Any, aggregate_id: str, page: int | None = None) -> Iterator[Any]:
    """Every event of one aggregate, oldest first, `page` rows (default PAGE) in memory at a time."""
    page = page or PAGE  # read when called, not when defined, so a test can make the pages small
    mapper = store.app.mapper
    decoders: dict[str, Any] = {}
    select = _page_select(store.app.recorder)
    after = 0  # versions start at 1 (newest_version's 0 is "no row")
    while True:
        rows = select(aggregate_id, after, page)
        for version, topic, state in rows:
            try:
                decode = decoders[topic]
            except KeyError:
                decode = decoders[topic] = _fast_decoder(topic)
            if decode is None:
                yield mapper.to_domain_event(StoredEvent(originator_id=aggregate_id, originator_version=version,
                                                         topic=topic, state=state))
            else:
                yield decode(state)
        if len(rows) < page:
            return
        after = rows[-1][0]


class PagedRow(NamedTuple):
    """A row as the narrow page select reads it, with the fields of a StoredEvent the checks read."""

    originator_id: str
    originator_version: int
    topic: str
    state: Any


def stream_verified_events(store: Any, aggregate_id: str, until: int | None = None,
                           page: int | None = None) -> Iterator[Any]:
    """`stream_events` (up to version `until`), every row checked as it is decoded, each once: the numbering,
    the event each row holds, the digest chain on the stored form (lanes_es/audit/chain.py) and, for the whole
    log, the size and chain digest this machine anchored (`store.anchored`). `DamagedLog` (naming the first
    break and `lanes-es verify`) at the first break, or once the log is read when it is shorter than what was
    anchored: a consumer writes nothing before the stream ends."""
    from lanes_es.adapters.store import DamagedLog
    from lanes_es.audit.chain import StoredLogCheck, anchored_breaks

    # The anchored tip is read before the rows: it is written only after its events were saved, so a tick
    # that appends and anchors meanwhile can never make the rows look shorter than it.
    tip = store.anchored(aggregate_id) if store.anchored is not None and until is None else None
    page = page or PAGE
    select = _page_select(store.app.recorder)
    check = StoredLogCheck()
    count, at_tip, after = 0, None, 0
    while True:
        rows = select(aggregate_id, after, page)
        for version, topic, state in rows:
            if until is not None and version > until:
                break
            row = PagedRow(aggregate_id, version, topic, state)
            event = check.feed(row)
            count += 1
            if check.broken:  # nothing is folded past a break: the events after it may not even apply
                found = check.breaks()
                raise DamagedLog(aggregate_id, found[0], len(found))
            if tip is not None and version == tip[0]:
                at_tip = row
            yield event
        if len(rows) < page or (until is not None and rows and rows[-1][0] >= until):
            break
        after = rows[-1][0]
    breaks = (check.breaks() if count else []) or anchored_breaks(count, at_tip, tip)
    if breaks:
        raise DamagedLog(aggregate_id, breaks[0], len(breaks))


def _fast_decoder(topic: str) -> Callable[[Any], Any] | None:
    """The Decoder of a class at schema version 1; None for a later one, whose rows need its upcasters."""
    cls = resolve_topic(topic)
    return msgspec.json.Decoder(cls).decode if getattr(cls, "class_version", 1) == 1 else None


def _page_select(recorder: Any) -> SelectPage:
    from eventsourcing.sqlite import SQLiteAggregateRecorder

    if isinstance(recorder, SQLiteAggregateRecorder):
        return _sqlite_page(recorder)
    # A PostgreSQL recorder exists only once eventsourcing.postgres is imported; importing it here would
    # import psycopg, which a store opened without the postgres extra does not have.
    postgres = sys.modules.get("eventsourcing.postgres")
    if postgres is not None and isinstance(recorder, postgres.PostgresAggregateRecorder):
        return _postgres_page(recorder)
    return _recorder_page(recorder)


def _sqlite_page(recorder: Any) -> SelectPage:
    statement = (f"SELECT originator_version, topic, state FROM {recorder.events_table_name} "
                 "WHERE originator_id = ? AND originator_version > ? ORDER BY originator_version LIMIT ?")

    def select(aggregate_id: str, after: int, limit: int) -> list[Any]:
        with recorder.datastore.transaction(commit=False) as cursor:
            cursor.execute(statement, (aggregate_id, after, limit))
            return cursor.fetchall()

    return select


def _postgres_page(recorder: Any) -> SelectPage:
    from psycopg.rows import tuple_row
    from psycopg.sql import SQL, Identifier

    statement = SQL("SELECT originator_version, topic, state FROM {schema}.{table} "
                    "WHERE originator_id = %s AND originator_version > %s ORDER BY originator_version LIMIT %s").format(
        schema=Identifier(recorder.datastore.schema), table=Identifier(recorder.events_table_name))

    @RETRIED
    def select(aggregate_id: str, after: int, limit: int) -> list[Any]:
        with recorder.datastore.get_connection() as connection, connection.cursor(row_factory=tuple_row) as cursor:
            cursor.execute(statement, (aggregate_id, after, limit), prepare=True)
            return cursor.fetchall()

    return select


def _recorder_page(recorder: Any) -> SelectPage:
    """Any other recorder (the in-memory one of an absent store): its own select."""

    def select(aggregate_id: str, after: int, limit: int) -> list[Any]:
        return [(row.originator_version, row.topic, row.state)
                for row in recorder.select_events(aggregate_id, gt=after, limit=limit)]

    return select


def stream_rows(store: Any, aggregate_id: str, page: int | None = None) -> Iterator[Any]:
    """Every stored row of one aggregate, as written, oldest first, `page` rows (default PAGE) in memory at a time."""
    page = page or PAGE
    recorder = store.app.recorder
    after: int | None = None
    while True:
        rows = recorder.select_events(aggregate_id, gt=after, limit=page)
        yield from rows
        if len(rows) < page:
            return
        after = rows[-1].originator_version


def newest_version(store: Any, aggregate_id: str) -> int:
    """The version of an aggregate's newest stored row (0 for none): one row read."""
    rows = store.app.recorder.select_events(aggregate_id, desc=True, limit=1)
    return rows[0].originator_version if rows else 0
