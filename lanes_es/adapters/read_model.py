"""The read model: one line per batch of every repository sharing the store, kept by following
the store's notification log with eventsourcing's `ProjectionRunner`.

- `BatchesProjection` folds each event into its batch's line (`lanes_es.domain.batch_summary`).
- The view (`SQLiteBatchesView`, `PostgresBatchesView` in read_model_postgres.py) is an eventsourcing tracking recorder in
  the store's own database: it writes a line and the tracking record of the event's notification
  id in one transaction, so its position never disagrees with its rows, and a second follower
  that lost the race to an event is refused by the tracking record and writes nothing.
- Gaps: the projection expects notification ids one after another. A missing id may belong to an
  append still in flight (its transaction not yet committed), so it is waited for: the view
  takes, for an instant, a lock no append can hold at the same time (SQLite `BEGIN IMMEDIATE`,
  PostgreSQL `LOCK TABLE ... IN SHARE MODE`), then reads the missing range again. What arrived is
  folded, in order, before the event after the gap; what is still missing then belongs to an append
  that was rolled back, and can never arrive.
- SQLite's recorder has no subscription in eventsourcing 9.5; `PollingSQLiteRecorder` gives it the
  library's own pull loop (`ListenNotifySubscription`), woken by a timer instead of LISTEN/NOTIFY.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from eventsourcing.persistence import (
    ListenNotifySubscription, Notification, RecordConflictError, Tracking,
)
from eventsourcing.projection import Projection, ProjectionRunner
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteTrackingRecorder
from eventsourcing.utils import get_topic

from lanes_es.domain.batch_summary import BatchSummary, summary_after, summary_key

from .store import LanesApplication, NullTranscoder, StructMapper, store_env

APPLICATION = LanesApplication.name
POLL_SECONDS = 0.05
GAP_LOCK_SECONDS = 30
BACKLOG_PAGE = 500  # how long to wait for an append in flight before reporting the gap


class GapPending(RuntimeError):
    """A notification id is missing and the append that holds it did not end in time."""


# ---------------------------------------------------------------- SQLite subscription


class PollingSubscription(ListenNotifySubscription[SQLiteApplicationRecorder]):
    """The library's pull loop over SQLite, woken every POLL_SECONDS (SQLite has no NOTIFY)."""

    def __init__(self, recorder: SQLiteApplicationRecorder, gt: int | None = None, topics: Sequence[str] = ()) -> None:
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        self._timer = threading.Thread(target=self._tick, daemon=True)
        self._timer.start()

    def _tick(self) -> None:
        while not self._has_been_stopped:
            time.sleep(POLL_SECONDS)
            self._has_been_notified.set()


class PollingSQLiteRecorder(SQLiteApplicationRecorder):
    def subscribe(self, gt: int | None = None, topics: Sequence[str] = ()) -> Any:
        return PollingSubscription(self, gt=gt, topics=topics)


# ---------------------------------------------------------------- the views


class _BatchesView:
    """What both views share: the fold of one event, gap handling, and reading the lines."""

    TABLE = "lanes_batch_summaries"
    table = TABLE  # as raw SQL names it (schema-qualified on PostgreSQL)
    _mapper = StructMapper(transcoder=NullTranscoder())

    position: int | None = None  # the newest notification id folded, cached per follower
    gaps_waited = 0  # gaps met (each waited for before going on)
    ids_never_written = 0  # missing ids still missing once every append in flight had ended

    def follow(self, event: Any, tracking: Tracking) -> None:
        if self.position is None:
            self.position = self.max_tracking_id(tracking.application_name) or 0
        if tracking.notification_id > self.position + 1:
            self.gaps_waited += 1
            arrived = self.wait_for_gap(self.position, tracking.notification_id)
            self.ids_never_written += tracking.notification_id - self.position - 1 - len(arrived)
            for notification in arrived:
                self.fold([(self._mapper.to_domain_event(notification), notification.id)], tracking.application_name)
        self.fold([(event, tracking.notification_id)], tracking.application_name)

    def fold(self, items: Sequence[tuple[Any, int]], application_name: str = APPLICATION) -> None:
        """Fold events (each with its notification id) and record the last id, in one transaction."""
        with self._write() as cursor:
            lines: dict[str, BatchSummary | None] = {}
            for event, _ in items:
                key = summary_key(event)
                if key is None:
                    continue
                before = lines[key] if key in lines else self._line(cursor, key)
                lines[key] = summary_after(before, event)
            for line in lines.values():
                if line is not None:
                    self._put(cursor, line)
            self._insert_tracking(cursor, Tracking(application_name, items[-1][1]))
        self.position = items[-1][1]

    def summaries(self, state: str | None = None, repository: str | None = None) -> list[BatchSummary]:
        return select_lines([self._decode(row) for row in self._select_all()], state, repository)

    @staticmethod
    def _row(line: BatchSummary) -> tuple[Any, ...]:
        return (line.batch_id, line.initiative_slug, line.repository, line.batch_state,
                json.dumps(line.children), line.last_event_at, line.version)

    @staticmethod
    def _decode(row: Any) -> BatchSummary:
        values = tuple(row.values()) if isinstance(row, dict) else tuple(row)
        batch_id, slug, repository, state, children, last, version = values
        return BatchSummary(batch_id=batch_id, initiative_slug=slug, repository=repository, batch_state=state,
                            children=json.loads(children), last_event_at=last, version=version)

    # Backend-specific: _write, _line, _put, _select_all, reset, wait_for_gap.


def select_lines(lines: list[BatchSummary], state: str | None = None,
                 repository: str | None = None) -> list[BatchSummary]:
    """The lines of `state` and `repository` (its path, or the last part of it), in the listing's order."""
    if state is not None:
        lines = [line for line in lines if line.batch_state == state]
    if repository is not None:
        lines = [line for line in lines if _same_repository(line.repository, repository)]
    return sorted(lines, key=lambda line: (line.repository or "", line.initiative_slug, line.batch_id))


def _same_repository(recorded: str | None, wanted: str) -> bool:
    if recorded is None:
        return False
    wanted = wanted.rstrip("/")
    return recorded == wanted or recorded.endswith("/" + wanted)  # the path, or its last parts


_COLUMNS = "batch_id, initiative_slug, repository, batch_state, children, last_event_at, version"


class SQLiteBatchesView(_BatchesView, SQLiteTrackingRecorder):
    def construct_create_table_statements(self) -> list[str]:
        return super().construct_create_table_statements() + [
            f"CREATE TABLE IF NOT EXISTS {self.TABLE} (batch_id TEXT PRIMARY KEY, initiative_slug TEXT, "
            f"repository TEXT, batch_state TEXT, children TEXT, last_event_at TEXT, version INTEGER)"]

    @contextmanager
    def _write(self) -> Iterator[Any]:
        # BEGIN IMMEDIATE: the read-modify-write takes the write lock first, so a concurrent append
        # makes it wait (busy timeout) rather than fail on a stale snapshot.
        # synchronous=NORMAL: the lines are rebuilt from the log and their position is written with
        # them, so a commit need not wait for the disk; a power cut costs a re-fold, never a wrong line.
        with self.datastore.get_connection(commit=True) as connection:
            cursor = connection.cursor()
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("BEGIN IMMEDIATE")
            try:
                yield cursor
            except BaseException:
                connection.rollback()
                raise
            connection.commit()

    def _line(self, cursor: Any, batch_id: str) -> BatchSummary | None:
        cursor.execute(f"SELECT {_COLUMNS} FROM {self.TABLE} WHERE batch_id = ?", (batch_id,))
        row = cursor.fetchone()
        return None if row is None else self._decode(row)

    def _put(self, cursor: Any, line: BatchSummary) -> None:
        cursor.execute(f"INSERT OR REPLACE INTO {self.TABLE} ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       self._row(line))

    def _select_all(self) -> list[Any]:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(f"SELECT {_COLUMNS} FROM {self.TABLE}")
            return cursor.fetchall()

    def exists(self) -> bool:
        """Whether the view's tables were made (a read that must not make them asks first)."""
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN (?, 'tracking')",
                           (self.TABLE,))
            return cursor.fetchone()[0] == 2

    def reset(self) -> None:
        with self._write() as cursor:
            cursor.execute(f"DELETE FROM {self.TABLE}")
            cursor.execute("DELETE FROM tracking WHERE application_name = ?", (APPLICATION,))
        self.position = None

    def wait_for_gap(self, after: int, before: int) -> list[Notification]:
        arrived = self._range(after, before)
        if len(arrived) < before - after - 1:
            with self._write():  # every append in flight has ended once this holds the write lock
                pass
            arrived = self._range(after, before)
        return arrived

    def _range(self, after: int, before: int) -> list[Notification]:
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute("SELECT rowid, originator_id, originator_version, topic, state FROM stored_events "
                           "WHERE rowid > ? AND rowid < ? ORDER BY rowid", (after, before))
            return [Notification(id=row[0], originator_id=row[1], originator_version=row[2], topic=row[3],
                                 state=row[4]) for row in cursor.fetchall()]


class BatchesProjection(Projection[Any]):
    name = "lanes_batches"

    def process_event(self, domain_event: Any, tracking: Tracking) -> None:  # type: ignore[override]
        self.view.follow(domain_event, tracking)


def _is_postgres(url: str) -> bool:
    return url.startswith(("postgresql:", "postgres:"))


def runner_env(url: str, read_only: bool = False) -> dict[str, str]:
    env = store_env(url, read_only)
    if _is_postgres(url):
        # A follower needs a connection or two at a time; many coordinators share the server's limit.
        env.update({"POSTGRES_POOL_SIZE": "1", "POSTGRES_MAX_OVERFLOW": "2"})
    else:
        env["APPLICATION_RECORDER_TOPIC"] = get_topic(PollingSQLiteRecorder)
    return env


def view_class(url: str) -> type:
    if _is_postgres(url):  # eventsourcing.postgres imports psycopg: the embedded default runs without the extra
        from lanes_es.adapters.read_model_postgres import PostgresBatchesView

        return PostgresBatchesView
    return SQLiteBatchesView


class ReadModel:
    """The read model of one store: catch up with the log, read the lines, rebuild from scratch."""

    def __init__(self, store: Any) -> None:
        if store.url == "memory:":
            raise ValueError("the read model needs a SQLite or PostgreSQL store")
        self.store = store
        self.url = store.url
        # The store made the event tables; the view's are made once here. Runners then make none: two
        # followers starting together would race on PostgreSQL's CREATE OR REPLACE of the same function.
        self.env = {**runner_env(self.url), "CREATE_TABLE": "false"}
        self.view = _create_view(self.url, runner_env(self.url))

    def _runner(self) -> ProjectionRunner[Any, Any]:
        return ProjectionRunner(application_class=LanesApplication, projection_class=BatchesProjection,
                                view_class=view_class(self.url), env=self.env)

    def catch_up(self, timeout: float = 60.0) -> int:
        """Follow the log up to its newest notification, then stop; returns that id.

        A long backlog is folded a page per transaction first (a transaction per event costs about
        a millisecond); the runner then follows the rest one event at a time."""
        position = self.view.max_tracking_id(APPLICATION) or 0
        if (self.store.app.recorder.max_notification_id() or 0) - position > BACKLOG_PAGE:
            self.view.position = None
            self._fold_pages(self.view, position)
        deadline = time.monotonic() + timeout
        while True:
            newest = self.store.app.recorder.max_notification_id() or 0
            if (self.view.max_tracking_id(APPLICATION) or 0) >= newest:
                return newest  # folded here or by another follower
            runner = self._runner()
            try:
                with runner:
                    self._wait(runner, newest, max(deadline - time.monotonic(), 0.0))
                return newest
            except RecordConflictError:
                # Another follower recorded the same notification first; its rows stand. Go on from there.
                if time.monotonic() > deadline:
                    raise GapPending(f"the read model did not reach notification {newest} within {timeout:.0f}s "
                                     f"while other followers moved it") from None
            finally:
                runner.view.datastore.close()  # the runner closes its application, not the view it made

    @staticmethod
    def _wait(runner: Any, newest: int, timeout: float) -> None:
        """runner.wait, polled every few milliseconds (the library backs off to 0.8 s between looks)."""
        deadline = time.monotonic() + timeout
        while newest and _folded(runner.view) < newest:
            if runner.is_interrupted.wait(0.005):
                runner.wait(newest, timeout=0)  # raises the follower's error
                return
            if time.monotonic() > deadline:
                raise GapPending(f"the read model did not reach notification {newest} within {timeout:.0f}s")

    def summaries(self, state: str | None = None, repository: str | None = None) -> list[BatchSummary]:
        self.catch_up()
        return self.view.summaries(state=state, repository=repository)

    def rebuild(self, progress: Any = None) -> list[BatchSummary]:
        """Forget every line and fold the whole log again, a page per transaction."""
        self.view.reset()
        self._fold_pages(self.view, 0, progress)
        return self.view.summaries()

    def _fold_pages(self, view: Any, position: int, progress: Any = None) -> None:
        mapper = self.store.app.mapper
        for notifications in _pages(self.store, position, progress):
            if notifications[0].id != position + 1 or _has_hole(notifications):
                # A missing id: fold one event at a time, so that the follower's gap wait applies.
                for notification in notifications:
                    view.follow(mapper.to_domain_event(notification), Tracking(APPLICATION, notification.id))
            else:
                view.fold([(mapper.to_domain_event(n), n.id) for n in notifications])
            position = notifications[-1].id

    def close(self) -> None:
        self.view.datastore.close()

    def __enter__(self) -> "ReadModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def lines(self) -> list[BatchSummary]:
        """The lines as they stand, without catching up."""
        return self.view.summaries()


def _pages(store: Any, position: int, progress: Any = None) -> Iterator[Sequence[Notification]]:
    recorder = store.app.recorder
    newest = recorder.max_notification_id() or 0
    while True:
        notifications = recorder.select_notifications(start=position, limit=BACKLOG_PAGE, inclusive_of_start=False)
        if not notifications:
            return
        yield notifications
        position = notifications[-1].id
        if progress is not None:
            progress(min(position, newest), newest)


def fold_from_scratch(store: Any, progress: Any = None) -> dict[str, BatchSummary]:
    """Every line folded in memory from the whole log, to compare with the view; writes nothing."""
    return fold_in_memory(store, {}, 0, progress)


def caught_up_in_memory(store: Any) -> dict[str, BatchSummary]:
    """The view's stored lines caught up with the log in memory: what `ReadModel.catch_up` would leave in the
    view, on a store this user cannot write (writes nothing). No view yet: the fold of the whole log."""
    lines, position = stored_lines(store)
    return fold_in_memory(store, lines, position)


def stored_lines(store: Any) -> tuple[dict[str, BatchSummary], int]:
    """The view's lines and position as they stand, read without writing (no table made); ({}, 0) with no view."""
    if not store.url or store.url == "memory:" or not _has_log(store):
        return {}, 0
    view = _open_view(store.url, {**runner_env(store.url, read_only=True), "CREATE_TABLE": "false"})
    try:
        if not view.exists():
            return {}, 0
        return {line.batch_id: line for line in view.summaries()}, view.max_tracking_id(APPLICATION) or 0
    finally:
        view.datastore.close()


def _has_log(store: Any) -> bool:
    return (store.app.recorder.max_notification_id() or 0) > 0


def fold_in_memory(store: Any, lines: dict[str, BatchSummary], position: int,
                   progress: Any = None) -> dict[str, BatchSummary]:
    """`lines` with every event after notification `position` folded in, in memory; writes nothing."""
    mapper = store.app.mapper
    for notifications in _pages(store, position, progress):
        for notification in notifications:
            event = mapper.to_domain_event(notification)
            key = summary_key(event)
            if key is not None:
                line = summary_after(lines.get(key), event)
                if line is not None:
                    lines[key] = line
    return lines


def _folded(view: Any) -> int:
    """The newest notification the follower folded: its own position once it folded one, else the stored one.
    Only the follower's thread sets its position: set from here, a stored id read just before the thread's
    fold committed could overwrite the newer one, and the wait then never ended (seen under load)."""
    return view.position if view.position is not None else (view.max_tracking_id(APPLICATION) or 0)


def _has_hole(notifications: Sequence[Notification]) -> bool:
    return notifications[-1].id - notifications[0].id != len(notifications) - 1


def _create_view(url: str, env: dict[str, str], attempts: int = 5) -> Any:
    from eventsourcing.persistence import PersistenceError

    for attempt in range(attempts):
        try:
            return _open_view(url, env)
        except PersistenceError:  # another follower is making the same tables at this instant
            if attempt == attempts - 1:
                raise
            time.sleep(0.1 * (attempt + 1))
    raise AssertionError("unreachable")


def _open_view(url: str, env: dict[str, str]) -> Any:
    from eventsourcing.persistence import InfrastructureFactory
    from eventsourcing.utils import Environment

    factory = InfrastructureFactory.construct(env=Environment(BatchesProjection.name, env))
    view = factory.tracking_recorder(view_class(url))
    view._factory = factory  # the factory owns the connection pool: keep it alive with the view
    return view


__all__ = ["ReadModel", "BatchesProjection", "SQLiteBatchesView", "GapPending",
           "PollingSQLiteRecorder"]

