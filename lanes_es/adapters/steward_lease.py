"""The steward lease: at most one autopilot per Initiative, recorded in the event store's database.

A small table beside the events (`lanes_es_steward_leases`: scope, token, pid, host, since,
expires), in the same SQLite file or PostgreSQL schema as the store, so every coordinator that
shares the store sees the same lease. A lease is taken when it is free, expired, or held by a
process of this host that is gone (a SIGKILLed autopilot passes its lease on at once); its holder
renews it while it runs; a holder that dies on another host loses it when it expires.

Time is the database's on PostgreSQL (coordinators on several machines compare one clock) and
this machine's on SQLite (a file every user of which is on this machine).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from contextlib import contextmanager
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from lanes_es.adapters.processes import process_alive
from lanes_es.adapters.store import store_env
from lanes_es.adapters.store_open import outage_refusal

TABLE = "lanes_es_steward_leases"
COLUMNS = "scope, token, pid, host, since, expires"
SQLITE_BUSY_SECONDS = 15


@dataclass(frozen=True)
class LeaseHolder:
    scope: str
    token: str
    pid: int
    host: str
    since: str  # when it was taken, UTC
    expires: float  # seconds since the epoch, by the database's clock

    def describe(self) -> str:
        until = datetime.fromtimestamp(self.expires, timezone.utc).strftime("%H:%M:%SZ")
        return f"pid {self.pid} on host {self.host} (since {self.since}, lease renewed until {until})"

    def gone(self) -> bool:
        """A holder of this host whose process is no more: its lease is free whatever its expiry says."""
        return self.host == socket.gethostname() and not process_alive(self.pid)


def new_holder(scope: str) -> LeaseHolder:
    since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return LeaseHolder(scope, uuid.uuid4().hex, os.getpid(), socket.gethostname(), since, 0.0)


class StewardLeases:
    """Take, renew and give back leases, on the backend the store URL names."""

    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        self._backend: _Backend | None = None

    @property
    def backend(self) -> "_Backend":
        """Made at the first use: its table lives in the store, which a run makes only when it records."""
        if self._backend is None:
            self._backend = _backend_for(self.store_url)
        return self._backend

    def take(self, me: LeaseHolder, seconds: float) -> LeaseHolder | None:
        """Take the lease for `me.scope` for `seconds`; None when taken, else who holds it."""
        return self.backend.take(me, seconds)

    def renew(self, me: LeaseHolder, seconds: float) -> bool:
        """Push the expiry on; False when the lease is no longer `me`'s (it expired and was taken)."""
        return self.backend.renew(me, seconds)

    def give_back(self, me: LeaseHolder) -> None:
        self.backend.give_back(me)

    def holder(self, scope: str) -> LeaseHolder | None:
        return self.backend.holder(scope)


def _backend_for(url: str) -> "_Backend":
    if url == "memory:":
        return _MemoryBackend()
    env = store_env(url) if urlparse(url).scheme in ("postgresql", "postgres") else None
    if env is not None:
        return _PostgresBackend(env)
    return _SqliteBackend(store_env(url)["SQLITE_DBNAME"])


class _Backend:
    """The one decision, whatever the database: take when free, expired, or its holder is gone."""

    def take(self, me: LeaseHolder, seconds: float) -> LeaseHolder | None:
        def decide(current: LeaseHolder | None, now: float) -> LeaseHolder | None:
            if current is not None and current.token != me.token and current.expires > now and not current.gone():
                return current
            return None

        return self._exclusively(me.scope, decide, me, seconds)

    def _exclusively(self, scope: str, decide: Callable[[LeaseHolder | None, float], LeaseHolder | None],
                     me: LeaseHolder, seconds: float) -> LeaseHolder | None:
        raise NotImplementedError

    def renew(self, me: LeaseHolder, seconds: float) -> bool:
        raise NotImplementedError

    def give_back(self, me: LeaseHolder) -> None:
        raise NotImplementedError

    def holder(self, scope: str) -> LeaseHolder | None:
        raise NotImplementedError


def _row(values: Any) -> LeaseHolder | None:
    if values is None:
        return None
    scope, token, pid, host, since, expires = values
    return LeaseHolder(scope, token, int(pid), host, since, float(expires))


class _SqliteBackend(_Backend):
    def __init__(self, path: str) -> None:
        self.path = path
        with self._connect() as connection:
            connection.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (scope TEXT PRIMARY KEY, token TEXT NOT NULL, "
                               f"pid INTEGER NOT NULL, host TEXT NOT NULL, since TEXT NOT NULL, expires REAL NOT NULL)")

    def _connect(self) -> sqlite3.Connection:
        # autocommit, with explicit BEGIN IMMEDIATE where a decision needs the database to itself
        return sqlite3.connect(self.path, timeout=SQLITE_BUSY_SECONDS, isolation_level=None)

    def _exclusively(self, scope: str, decide: Callable[[LeaseHolder | None, float], LeaseHolder | None],
                     me: LeaseHolder, seconds: float) -> LeaseHolder | None:
        connection = self._connect()
        try:
            connection.execute("BEGIN IMMEDIATE")
            now = time.time()
            current = _row(connection.execute(f"SELECT {COLUMNS} FROM {TABLE} WHERE scope = ?", (scope,)).fetchone())
            refused = decide(current, now)
            if refused is None:
                connection.execute(f"INSERT OR REPLACE INTO {TABLE} ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                                   (scope, me.token, me.pid, me.host, me.since, now + seconds))
            connection.execute("COMMIT")
            return refused
        finally:
            connection.close()

    def renew(self, me: LeaseHolder, seconds: float) -> bool:
        connection = self._connect()
        try:
            updated = connection.execute(f"UPDATE {TABLE} SET expires = ? WHERE scope = ? AND token = ?",
                                         (time.time() + seconds, me.scope, me.token))
            return updated.rowcount == 1
        finally:
            connection.close()

    def give_back(self, me: LeaseHolder) -> None:
        connection = self._connect()
        try:
            connection.execute(f"DELETE FROM {TABLE} WHERE scope = ? AND token = ?", (me.scope, me.token))
        finally:
            connection.close()

    def holder(self, scope: str) -> LeaseHolder | None:
        connection = self._connect()
        try:
            return _row(connection.execute(f"SELECT {COLUMNS} FROM {TABLE} WHERE scope = ?", (scope,)).fetchone())
        finally:
            connection.close()


class _PostgresBackend(_Backend):
    NOW = "EXTRACT(EPOCH FROM clock_timestamp())::float8"

    def __init__(self, env: dict[str, str]) -> None:
        from psycopg import sql

        self.env = env
        self.table = sql.Identifier(env["POSTGRES_SCHEMA"], TABLE)
        self.sql = sql
        with self._connect() as connection:
            try:
                connection.execute(self._q("CREATE TABLE IF NOT EXISTS {} (scope TEXT PRIMARY KEY, token TEXT NOT NULL, "
                                           "pid INTEGER NOT NULL, host TEXT NOT NULL, since TEXT NOT NULL, "
                                           "expires DOUBLE PRECISION NOT NULL)"))
            except Exception as error:  # two first users at once: the other one made it
                if "already exists" not in str(error) and "duplicate key" not in str(error):
                    raise

    def _q(self, text: str) -> Any:
        return self.sql.SQL(text).format(self.table)

    @contextmanager
    def _connect(self) -> Iterator[Any]:
        """A connection for one decision; a server that ended it or does not answer is a `StoreOutage` (the
        autopilot waits for the store to come back)."""
        import psycopg

        env = self.env
        try:
            with psycopg.connect(host=env["POSTGRES_HOST"], port=env["POSTGRES_PORT"], user=env["POSTGRES_USER"],
                                 password=env["POSTGRES_PASSWORD"] or None, dbname=env["POSTGRES_DBNAME"],
                                 autocommit=True, connect_timeout=10) as connection:
                yield connection
        except psycopg.Error as error:
            outage = outage_refusal(error)
            if outage is None:
                raise
            raise outage from None

    def _exclusively(self, scope: str, decide: Callable[[LeaseHolder | None, float], LeaseHolder | None],
                     me: LeaseHolder, seconds: float) -> LeaseHolder | None:
        with self._connect() as connection, connection.transaction():
            # one decision at a time for the whole table: leases are taken seldom, at an autopilot's start
            connection.execute(self._q("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE"))
            now = connection.execute(f"SELECT {self.NOW}").fetchone()[0]
            current = _row(connection.execute(self._q(f"SELECT {COLUMNS} FROM {{}} WHERE scope = %s"),
                                              (scope,)).fetchone())
            refused = decide(current, now)
            if refused is None:
                connection.execute(self._q(f"INSERT INTO {{}} ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s) "
                                           "ON CONFLICT (scope) DO UPDATE SET token = EXCLUDED.token, pid = EXCLUDED.pid, "
                                           "host = EXCLUDED.host, since = EXCLUDED.since, expires = EXCLUDED.expires"),
                                   (scope, me.token, me.pid, me.host, me.since, now + seconds))
            return refused

    def renew(self, me: LeaseHolder, seconds: float) -> bool:
        with self._connect() as connection:
            updated = connection.execute(self._q(f"UPDATE {{}} SET expires = {self.NOW} + %s "
                                                 "WHERE scope = %s AND token = %s"), (seconds, me.scope, me.token))
            return updated.rowcount == 1

    def give_back(self, me: LeaseHolder) -> None:
        with self._connect() as connection:
            connection.execute(self._q("DELETE FROM {} WHERE scope = %s AND token = %s"), (me.scope, me.token))

    def holder(self, scope: str) -> LeaseHolder | None:
        with self._connect() as connection:
            return _row(connection.execute(self._q(f"SELECT {COLUMNS} FROM {{}} WHERE scope = %s"),
                                           (scope,)).fetchone())


class _MemoryBackend(_Backend):
    """A `memory:` store lives in one process, and so do its leases."""

    leases: dict[str, LeaseHolder] = {}
    lock = threading.Lock()

    def _exclusively(self, scope: str, decide: Callable[[LeaseHolder | None, float], LeaseHolder | None],
                     me: LeaseHolder, seconds: float) -> LeaseHolder | None:
        with self.lock:
            now = time.time()
            refused = decide(self.leases.get(scope), now)
            if refused is None:
                self.leases[scope] = LeaseHolder(scope, me.token, me.pid, me.host, me.since, now + seconds)
            return refused

    def renew(self, me: LeaseHolder, seconds: float) -> bool:
        with self.lock:
            current = self.leases.get(me.scope)
            if current is None or current.token != me.token:
                return False
            self.leases[me.scope] = LeaseHolder(me.scope, me.token, me.pid, me.host, me.since, time.time() + seconds)
            return True

    def give_back(self, me: LeaseHolder) -> None:
        with self.lock:
            if (current := self.leases.get(me.scope)) is not None and current.token == me.token:
                del self.leases[me.scope]

    def holder(self, scope: str) -> LeaseHolder | None:
        return self.leases.get(scope)
