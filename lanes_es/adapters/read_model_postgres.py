"""The batches view on PostgreSQL (lanes_es/adapters/read_model.py has the rest of the read model).

A module of its own because eventsourcing.postgres imports psycopg, which only the
`postgres` extra installs: the embedded SQLite default must run without it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from eventsourcing.persistence import Notification
from eventsourcing.postgres import PostgresTrackingRecorder

from lanes_es.domain.batch_summary import BatchSummary

from .log_reader import RETRIED
from .read_model import _COLUMNS, APPLICATION, GAP_LOCK_SECONDS, GapPending, _BatchesView


class PostgresBatchesView(_BatchesView, PostgresTrackingRecorder):
    def __init__(self, datastore: Any, **kwargs: Any) -> None:
        super().__init__(datastore, **kwargs)
        from psycopg.sql import SQL, Identifier

        self._table = SQL("{0}.{1}").format(Identifier(self.datastore.schema), Identifier(self.TABLE))
        self.table = f'"{self.datastore.schema}".{self.TABLE}'
        self._events = SQL("{0}.{1}").format(Identifier(self.datastore.schema),
                                             Identifier(f"{APPLICATION.lower()}_events"))
        self.sql_create_statements.append(SQL(
            "CREATE TABLE IF NOT EXISTS {0} (batch_id text PRIMARY KEY, initiative_slug text, repository text, "
            "batch_state text, children text, last_event_at text, version bigint)").format(self._table))

    @contextmanager
    def _write(self) -> Iterator[Any]:
        with self.datastore.transaction(commit=True) as cursor:
            yield cursor

    def _line(self, cursor: Any, batch_id: str) -> BatchSummary | None:
        from psycopg.sql import SQL

        cursor.execute(SQL(f"SELECT {_COLUMNS} FROM {{0}} WHERE batch_id = %s FOR UPDATE").format(self._table),
                       (batch_id,))
        row = cursor.fetchone()
        return None if row is None else self._decode(row)

    def _put(self, cursor: Any, line: BatchSummary) -> None:
        from psycopg.sql import SQL

        cursor.execute(SQL(
            f"INSERT INTO {{0}} ({_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (batch_id) DO UPDATE SET "
            "initiative_slug = EXCLUDED.initiative_slug, repository = EXCLUDED.repository, "
            "batch_state = EXCLUDED.batch_state, children = EXCLUDED.children, "
            "last_event_at = EXCLUDED.last_event_at, version = EXCLUDED.version").format(self._table), self._row(line))

    @RETRIED
    def _select_all(self) -> list[Any]:
        from psycopg.sql import SQL

        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(SQL(f"SELECT {_COLUMNS} FROM {{0}}").format(self._table))
            return cursor.fetchall()

    @RETRIED
    def exists(self) -> bool:
        """Whether the view's tables were made (a read that must not make them asks first)."""
        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL AS made",
                           (self.table, f'"{self.datastore.schema}"."{self.tracking_table_name}"'))
            return bool(cursor.fetchone()["made"])

    def reset(self) -> None:
        from psycopg.sql import SQL, Identifier

        with self._write() as cursor:
            cursor.execute(SQL("DELETE FROM {0}").format(self._table))
            cursor.execute(SQL("DELETE FROM {0}.{1} WHERE application_name = %s").format(
                Identifier(self.datastore.schema), Identifier(self.tracking_table_name)), (APPLICATION,))
        self.position = None

    def wait_for_gap(self, after: int, before: int) -> list[Notification]:
        from psycopg.sql import SQL

        arrived = self._range(after, before)
        if len(arrived) < before - after - 1:
            # SHARE conflicts with the ROW EXCLUSIVE and EXCLUSIVE locks every insert holds until it
            # commits or rolls back: once granted, no append is in flight.
            with self.datastore.transaction(commit=False) as cursor:
                cursor.execute(SQL("SET LOCAL lock_timeout = '{0}s'").format(SQL(str(GAP_LOCK_SECONDS))))
                try:
                    cursor.execute(SQL("LOCK TABLE {0} IN SHARE MODE").format(self._events))
                except Exception as error:
                    raise GapPending(f"notification ids {after + 1} to {before - 1} are missing and the append "
                                     f"holding them did not end within {GAP_LOCK_SECONDS}s ({error})") from error
            arrived = self._range(after, before)
        return arrived

    @RETRIED
    def _range(self, after: int, before: int) -> list[Notification]:
        from psycopg.sql import SQL

        with self.datastore.transaction(commit=False) as cursor:
            cursor.execute(SQL("SELECT notification_id, originator_id, originator_version, topic, state FROM {0} "
                               "WHERE notification_id > %s AND notification_id < %s ORDER BY notification_id")
                           .format(self._events), (after, before))
            return [Notification(id=row["notification_id"], originator_id=row["originator_id"],
                                 originator_version=row["originator_version"], topic=row["topic"],
                                 state=bytes(row["state"])) for row in cursor.fetchall()]
