"""A test's store rows by hand, on either backend: the tests that damage a store as an attacker or a
broken disk would (an edited payload, a deleted event) write SQL once, here, for SQLite and PostgreSQL.

    rows = StoreRows(store_url_of(repo))
    rows.execute("DELETE FROM {events} WHERE originator_id=? AND originator_version=?", batch_id, 3)

`{events}` is the events table (`stored_events` on SQLite, `laneses_events` on PostgreSQL) and `?`
the placeholder on both. `clone_postgres_schema` copies a whole PostgreSQL store (tables, sequence,
the insert function and its type), as copying a repository copies its SQLite file.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from lanes_es.adapters.store import is_postgres_url, store_env

EVENTS_TABLE = {"sqlite": "stored_events", "postgresql": "laneses_events"}


def store_url_of(repo: Path | str) -> str:
    """The store a command run in `repo` opens: $LANES_ES_STORE (the store_url fixture sets it), else the
    repository's own SQLite file."""
    return os.environ.get("LANES_ES_STORE") or str(Path(repo) / ".git" / "lanes-es" / "events.sqlite")


def backend_of(url: str) -> str:
    return "postgresql" if is_postgres_url(url) else "sqlite"


class StoreRows:
    def __init__(self, url: str) -> None:
        self.url = url
        self.backend = backend_of(url)
        self.events = EVENTS_TABLE[self.backend]

    def query(self, statement: str, *args: Any) -> list[tuple[Any, ...]]:
        return self._run(statement, args, fetch=True)  # type: ignore[return-value]

    def execute(self, statement: str, *args: Any) -> int:
        """Run one changing statement; the number of rows it changed."""
        return self._run(statement, args, fetch=False)  # type: ignore[return-value]

    def _run(self, statement: str, args: tuple[Any, ...], fetch: bool) -> list[tuple[Any, ...]] | int:
        sql = statement.format(events=self.events)
        if self.backend == "sqlite":
            import sqlite3

            connection = sqlite3.connect(self.url)
            try:
                cursor = connection.execute(sql, args)
                result = [tuple(row) for row in cursor.fetchall()] if fetch else cursor.rowcount
                connection.commit()
                return result
            finally:
                connection.close()
        with postgres_connection(self.url) as connection:
            cursor = connection.execute(sql.replace("?", "%s"), args)  # type: ignore[arg-type]
            return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in cursor.fetchall()] \
                if fetch else cursor.rowcount


def postgres_connection(url: str) -> Any:
    """An autocommit connection to the server of `url`, its schema first on the search path."""
    import psycopg

    env = store_env(url)
    return psycopg.connect(host=env["POSTGRES_HOST"], port=env["POSTGRES_PORT"], user=env["POSTGRES_USER"],
                           dbname=env["POSTGRES_DBNAME"], autocommit=True, connect_timeout=10,
                           options=f"-c search_path={env['POSTGRES_SCHEMA']}")


def postgres_schema(url: str) -> str:
    return store_env(url)["POSTGRES_SCHEMA"]


def clone_postgres_schema(url: str) -> str:
    """A new schema holding a copy of everything in `url`'s; its store URL. The schema names are random
    hex, so renaming them in pg_dump's text is exact."""
    env = store_env(url)
    old = env["POSTGRES_SCHEMA"]
    new = f"t_{uuid.uuid4().hex[:16]}"
    server = ["-h", env["POSTGRES_HOST"], "-p", env["POSTGRES_PORT"], "-U", env["POSTGRES_USER"]]
    dump = subprocess.run(["pg_dump", *server, "--no-owner", "-n", old, env["POSTGRES_DBNAME"]],
                          capture_output=True, check=True).stdout
    subprocess.run(["psql", *server, "-q", "-v", "ON_ERROR_STOP=1", "-d", env["POSTGRES_DBNAME"]],
                   input=dump.replace(old.encode(), new.encode()), capture_output=True, check=True)
    return url.replace(f"schema={old}", f"schema={new}")


def remove_store(url: str) -> None:
    """The store gone, as on a machine that never had it: the SQLite file deleted, the schema dropped."""
    if backend_of(url) == "sqlite":
        Path(url).unlink()
        return
    from tests.conftest import postgres_statement

    postgres_statement(f"DROP SCHEMA {postgres_schema(url)} CASCADE")


def store_exists(url: str) -> bool:
    """Whether anything made the store yet: its SQLite file, or any table, type or function in its PostgreSQL
    schema (eventsourcing makes all three)."""
    rows = StoreRows(url)
    if rows.backend == "sqlite":
        return Path(url).exists()
    return bool(rows.query(
        "SELECT 1 FROM pg_class WHERE relnamespace = to_regnamespace(?) UNION ALL "
        "SELECT 1 FROM pg_type WHERE typnamespace = to_regnamespace(?) UNION ALL "
        "SELECT 1 FROM pg_proc WHERE pronamespace = to_regnamespace(?)", *[postgres_schema(url)] * 3))


def event_rows(url: str) -> list[tuple[Any, ...]]:
    """(originator id, version) of every stored event; [] when the store was never made."""
    if not store_exists(url):
        return []
    return sorted(StoreRows(url).query("SELECT originator_id, originator_version FROM {events}"))
