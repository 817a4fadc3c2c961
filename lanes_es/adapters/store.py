"""The event store: an eventsourcing Application whose persistence is chosen by URL.

- default (embedded): SQLite at `<git common dir>/lanes-es/events.sqlite`, shared by
  every worktree of the repository and never part of a working tree;
- `postgresql://user@host:port/dbname[?schema=NAME]`: PostgreSQL, for coordinators sharing a store;
- `memory:`: in-process, for unit tests.

Events are stored whole as compact, sorted msgspec JSON. A schema change comes with
a `class_version` on the event class and an `upcast_vN_vN+1(state)` static method;
the mapper runs them on read, so old logs keep replaying.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import socket
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import parse_qs, unquote

import msgspec
from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import Mapper, OperationalError, RecordConflictError, StoredEvent, Transcoder
from eventsourcing.sqlite import SQLiteConnection, SQLiteConnectionPool, SQLiteDatastore, SQLiteFactory
from eventsourcing.utils import get_topic, resolve_topic

from lanes_es.adapters.files import read_capped_text
from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.jstext import parse_json
from lanes_es.domain.initiative import Initiative, initiative_id, slug_of
from lanes_es.adapters.store_open import (CONNECT_TIMEOUT, VERIFY_HINT, full_disk, lost_connection,
                                         make_sqlite_store, missing_schema, missing_schema_cause, outage_refusal,
                                         parsed_store_url, privilege_refusal, probe_postgres, shown_url,
                                         sqlite_database, store_failure)
from lanes_es.errors import Refusal

_ENCODER = msgspec.json.Encoder(order="sorted")


class StoreError(Refusal, RuntimeError):
    """The store could not be opened or read; the message says which and why."""


class StoreReadOnly(StoreError):
    """The store cannot be written (its file or directory); a command that only reads can still open it."""


class StoreConflict(StoreError):
    """Another writer saved this batch first: the tick wrote nothing else."""


class BatchLockHeld(StoreConflict):
    """Another tick holds the batch lock: nothing was read for writing, nothing was written.

    `holder` names who holds it where the backend can tell (pid, host, since), else is None.
    """

    def __init__(self, name: str, holder: dict[str, Any] | None) -> None:
        self.name = name
        self.holder = holder
        super().__init__(f"the batch lock of {name} is held by {describe_holder(holder)}")


class StoreOutage(StoreError):
    """The PostgreSQL server ended the connection and does not answer a new one (or the command could not
    reconnect): an outage of the store, not damage to its log. Nothing more was written; the message names
    the server and says to run the command again once it is back (the autopilot waits for it).
    `store` is the store's URL as shown, `reason` the driver's words."""

    def __init__(self, message: str, store: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.store = store
        self.reason = reason


class StoreBusy(StoreError):
    """SQLite stayed locked by other writers longer than the busy timeout; nothing was written."""


def describe_holder(holder: dict[str, Any] | None) -> str:
    """`pid 123 on host h (since T)` for a lock holder, as far as it is known."""
    if not holder:
        return "another tick (its pid and host are not known)"
    where = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    return f"{where} since {holder['since']}" if holder.get("since") else where


def this_holder() -> dict[str, Any]:
    """Who this process is, recorded with a lock it takes so a refused tick can name it."""
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")}


class DamagedEvent(StoreError):
    """A stored row does not decode: the store was edited or damaged outside lanes-es."""

    def __init__(self, row: StoredEvent, cause: BaseException) -> None:
        self.cause = cause
        hint = (f"`lanes-es verify {row.originator_id}` lists what is damaged"
                if row.originator_id.startswith("batch-") else VERIFY_HINT)
        super().__init__(f"the event store has a damaged event: {row.originator_id} version {row.originator_version} "
                         f"does not decode ({cause}); {hint}")


class DamagedLog(StoreError):
    """A batch's stored log does not verify: its rows, its numbering or its digest chain no longer hold, or it
    is shorter than (or differs at) the size this machine anchored. Nothing is built on it; `verify` names
    every finding."""

    def __init__(self, batch_id: str, first: Any, count: int) -> None:
        self.batch_id = batch_id
        more = f" and {count - 1} more" if count > 1 else ""
        super().__init__(f"the event store's log of {batch_id} does not verify ({first.describe()}{more}); "
                         f"nothing was read from it or written to it: `lanes-es verify {batch_id}` lists every finding")


def state_bytes(row: StoredEvent) -> bytes:
    """A row's state as lanes-es wrote it (a BLOB); ValueError for anything else (a row rewritten as TEXT)."""
    if isinstance(row.state, (bytes, bytearray, memoryview)):
        return bytes(row.state)
    raise ValueError(f"its state is stored as {type(row.state).__name__}, not the bytes lanes-es writes "
                     f"(edited outside lanes-es)")


class NullTranscoder(Transcoder):
    """The mapper encodes whole events itself; this fills eventsourcing's transcoder slot."""

    def encode(self, obj: Any) -> bytes:
        return obj

    def decode(self, data: bytes) -> Any:
        return data


class StructMapper(Mapper[str]):
    """Whole msgspec events as sorted, compact UTF-8 JSON."""

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        state = _ENCODER.encode(domain_event)
        class_version = getattr(type(domain_event), "class_version", 1)
        if class_version > 1:
            decoded = msgspec.json.decode(state)
            decoded["class_version"] = class_version
            state = _ENCODER.encode(decoded)
        return StoredEvent(originator_id=domain_event.originator_id,
                           originator_version=domain_event.originator_version,
                           topic=get_topic(type(domain_event)), state=state)

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        try:
            return self.decode(stored_event)
        except Exception as error:  # a damaged row may fail anywhere in decoding: name it and point at verify
            raise DamagedEvent(stored_event, error) from error

    @staticmethod
    def decode(stored_event: StoredEvent) -> Any:
        """The event of a row; any error when the row was damaged."""
        cls = resolve_topic(stored_event.topic)
        class_version = getattr(cls, "class_version", 1)
        state = state_bytes(stored_event)
        if class_version == 1:
            return msgspec.json.decode(state, type=cls)
        fields = msgspec.json.decode(state)
        from_version = fields.pop("class_version", 1)
        while from_version < class_version:
            getattr(cls, f"upcast_v{from_version}_v{from_version + 1}")(fields)
            from_version += 1
        return msgspec.convert(fields, type=cls)


# SQLite waits this long for another process's write to end before it reports busy
# (LANES_ES_SQLITE_BUSY_SECONDS sets another, e.g. for a test that holds a write past it).
SQLITE_BUSY_SECONDS = 15


def sqlite_busy_seconds() -> int:
    """Whole seconds (eventsourcing's SQLITE_LOCK_TIMEOUT is an integer); a bad value keeps the default."""
    try:
        seconds = int(os.environ.get("LANES_ES_SQLITE_BUSY_SECONDS", SQLITE_BUSY_SECONDS))
    except ValueError:
        return SQLITE_BUSY_SECONDS
    return seconds if seconds > 0 else SQLITE_BUSY_SECONDS


class DurableSQLitePool(SQLiteConnectionPool):
    """WAL (eventsourcing's default for files) with `synchronous=FULL`: an appended event is on disk
    when the append returns, so a power cut cannot take back a step the audit log already showed."""

    def _create_connection(self) -> SQLiteConnection:
        connection = super()._create_connection()
        if not self.is_sqlite_memory_mode:
            connection.cursor().execute("PRAGMA synchronous=FULL")
        return connection


class DurableSQLiteDatastore(SQLiteDatastore):
    def __init__(self, db_name: str, **options: Any) -> None:
        super().__init__(db_name, **options)
        self.pool = DurableSQLitePool(db_name=db_name, lock_timeout=options.get("lock_timeout"))


class DurableSQLiteFactory(SQLiteFactory):
    """eventsourcing's SQLite persistence with the durable pool above."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        old = self.datastore
        self.datastore = DurableSQLiteDatastore(old.pool.db_name, lock_timeout=old.pool.lock_timeout,
                                                single_row_tracking=old.single_row_tracking,
                                                originator_id_type=old.originator_id_type)
        old.pool.close()


# eventsourcing writes the schema into its SQL unquoted: a name PostgreSQL takes as one plain identifier.
_PLAIN_SCHEMA = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")


def _schema_of(url: str, query: str) -> str:
    schema = parse_qs(query).get("schema", ["public"])[0]
    if not _PLAIN_SCHEMA.fullmatch(schema):
        raise StoreError(f"invalid store URL {shown_url(url)}: schema {schema!r} is not a plain PostgreSQL name "
                         f"(letters, digits, _ and $, not starting with a digit, at most 63); name another schema")
    return schema


def store_env(url: str, read_only: bool = False, make: bool = True) -> dict[str, str]:
    """eventsourcing's environment for a store URL (checked: lanes_es/adapters/store_open.py); `make` False: a
    SQLite store that does not exist yet is not made (its first append makes it)."""
    env = {
        "MAPPER_TOPIC": get_topic(StructMapper),
        "TRANSCODER_TOPIC": get_topic(NullTranscoder),
        "ORIGINATOR_ID_TYPE": "text",
    }
    if url == "memory:":
        env["PERSISTENCE_MODULE"] = "eventsourcing.popo"
        return env
    parsed = parsed_store_url(url)
    if parsed.scheme in ("postgresql", "postgres"):
        env.update({
            # eventsourcing's PostgreSQL persistence, whose retries stop when the server does not answer
            "PERSISTENCE_MODULE": "lanes_es.adapters.store_postgres:PostgresStoreFactory",
            "POSTGRES_DBNAME": unquote(parsed.path.lstrip("/")) or "postgres",
            "POSTGRES_HOST": parsed.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(parsed.port or 5432),
            "POSTGRES_USER": unquote(parsed.username or "postgres"),
            "POSTGRES_PASSWORD": unquote(parsed.password or ""),
            "POSTGRES_SCHEMA": _schema_of(url, parsed.query),
            # One command needs one connection at a time; many coordinators share the server's limit.
            "POSTGRES_POOL_SIZE": "1",
            "POSTGRES_MAX_OVERFLOW": "2",
            "POSTGRES_CONNECT_TIMEOUT": str(CONNECT_TIMEOUT),
        })
        return env
    if parsed.scheme == "sqlite":
        path = unquote(parsed.path)
    elif parsed.scheme == "":
        path = url
    else:
        raise StoreError(f"unknown store URL {url!r}: use a SQLite path, sqlite:///PATH, postgresql://USER@HOST/DB "
                         f"or memory: with --store or LANES_ES_STORE")
    database = sqlite_database(path, read_only, make)
    env.update({"PERSISTENCE_MODULE": get_topic(DurableSQLiteFactory), "SQLITE_DBNAME": database,
                "SQLITE_LOCK_TIMEOUT": str(sqlite_busy_seconds())})
    if database != path and database != ":memory:":
        env["CREATE_TABLE"] = "no"  # opened read-only: the tables are there or the store is not lanes-es's
    return env


def _opened_for_writing(env: dict[str, str]) -> bool:
    """Whether a read-only open's environment opens the store's own place as it is (not a read-only URI, not an
    empty store in memory standing in for one that does not exist)."""
    database = env.get("SQLITE_DBNAME")
    return database is None or (database != ":memory:" and not database.startswith("file:"))


class LanesApplication(Application[str]):
    name = "LanesES"


class EventStore:
    """Load and save the two aggregates; read a batch's raw log for audit and rebuild.

    `repository_id` names the repository (clone) this store is opened for: its Initiatives are
    keyed by it, so repositories sharing a store never share one (None: keyed by slug alone, as
    stores before repository ids were). `owns_checkout(path)` tells whether a checkout path that
    an old authorization recorded is one of this repository's; it decides, with the claim of a
    newer authorization, which repository an Initiative keyed by slug alone belongs to.
    """

    def __init__(self, url: str, lock_dir: Path | None = None, read_only: bool = False,
                 repository_id: str | None = None, owns_checkout: Callable[[str], bool] | None = None,
                 anchored: Callable[[str], tuple[int, str] | None] | None = None,
                 id_to_make: Any = None, made_by_first_save: bool = False) -> None:
        self.url = url
        self.lock_dir = lock_dir
        self._repository_id = repository_id
        self._id_to_make = id_to_make  # RepositoryIdToMake: this clone has no id yet, its first Initiative makes it
        self.owns_checkout = owns_checkout
        self.anchored = anchored
        env = store_env(url, read_only, make=not made_by_first_save)
        # False when a read-only open found a store this user cannot write, or none at all (then it
        # reads an empty one in memory): what would write there (the read model) must fold in memory.
        self.writable = not read_only or _opened_for_writing(env)
        has_log = True
        postgres = is_postgres_url(url)
        if postgres:
            has_log, may_create = probe_postgres(url, env, f"{LanesApplication.name.lower()}_events",
                                                 writes=not read_only)
            if read_only:  # a command that only reads makes no table, type or function in the schema
                env = {**env, "CREATE_TABLE": "no"} if has_log else store_env("memory:")
                self.writable = has_log and may_create  # a role that may only read folds the read model in memory
            elif has_log:
                # eventsourcing makes its type in a transaction of its own before the one that makes the
                # table and its index, so a log table means all of them are there: a writer of an
                # existing store runs no DDL (a third of its open) and needs no ownership of the schema.
                env = {**env, "CREATE_TABLE": "no"}
        elif not read_only and env.get("SQLITE_DBNAME", ":memory:") != ":memory:":
            has_log = Path(env["SQLITE_DBNAME"]).exists()
        # `made_by_first_save` (every command): a store that does not exist yet is made by its first append, not
        # by opening it, so a command refused before it records anything leaves no file, table or type behind.
        # Until then it reads as empty.
        self._unmade_env = None if read_only or has_log or not made_by_first_save else env
        self._app = (LanesApplication(env=store_env("memory:")) if self._unmade_env
                     else self._open(env, makes_tables=postgres and not read_only and not has_log))

    @property
    def app(self) -> LanesApplication:
        """eventsourcing's application over the store; while the store is not made, one over an empty log in
        memory, until another command makes the store (a long-lived process then reads what it wrote)."""
        if self._unmade_env is not None and self._appeared(self._unmade_env):
            postgres = is_postgres_url(self.url)  # a SQLite file made by another command may have no table yet
            if not postgres:  # its header read once, before any connection (see store_open._refuse_foreign)
                sqlite_database(self._unmade_env["SQLITE_DBNAME"], read_only=False, make=False)
            self._switch(self._open({**self._unmade_env, "CREATE_TABLE": "no"} if postgres else self._unmade_env,
                                    makes_tables=False))
        return self._app

    def _appeared(self, env: dict[str, str]) -> bool:
        if is_postgres_url(self.url):
            return probe_postgres(self.url, env, f"{LanesApplication.name.lower()}_events", writes=True)[0]
        return Path(env["SQLITE_DBNAME"]).exists()

    def _switch(self, app: LanesApplication) -> None:
        self._app.close()
        self._app, self._unmade_env = app, None

    @property
    def repository_id(self) -> str | None:
        """This clone's id; None while it has none (it then has no Initiative keyed by one): made with its first
        Initiative (`new_initiative`), or by another command meanwhile."""
        if self._id_to_make is not None:
            found = self._id_to_make.found()
            if found is not None:
                self._repository_id, self._id_to_make = found, None
        return self._repository_id

    @property
    def made(self) -> bool:
        """Whether the store exists (a writer's store not made yet reads as empty until its first append)."""
        self.app  # noqa: B018 - opened as it stands when another command made it meanwhile
        return self._unmade_env is None

    def _open(self, env: dict[str, str], makes_tables: bool) -> LanesApplication:
        url = self.url
        try:
            if makes_tables:  # this command makes the store's tables
                with self._setup_lock():
                    return LanesApplication(env=env)
            return LanesApplication(env=env)
        except Exception as error:  # a driver error names the path or host; keep it
            refused = privilege_refusal(error, new_store=makes_tables)  # the probe named this store
            if refused is not None:
                raise refused from None
            if missing_schema(error):
                raise store_failure(url, missing_schema_cause(env)) from None
            full = full_disk(url, error)
            raise StoreError(f"cannot open the event store {shown_url(url)}: {full or error}") from error

    def _make(self) -> None:
        """Before the first append: the store itself (the SQLite file, or the PostgreSQL tables), unless another
        command made it meanwhile."""
        env = self._unmade_env
        if env is None or self._appeared(env):
            self.app  # noqa: B018 - made by another command meanwhile: opened as it stands
            return
        if is_postgres_url(self.url):
            self._switch(self._open(env, makes_tables=True))
        else:
            make_sqlite_store(Path(env["SQLITE_DBNAME"]))
            self._switch(self._open(env, makes_tables=False))

    @property
    def shown_url(self) -> str:
        """The store's URL as a message shows it (a PostgreSQL password hidden)."""
        return shown_url(self.url)

    @contextmanager
    def _setup_lock(self) -> Iterator[None]:
        """eventsourcing (re)creates its tables, types and insert function whenever a store opens; on
        PostgreSQL two processes doing so at once fail ("tuple concurrently updated"), so coordinators
        started together open the store one after another (a short advisory lock per schema)."""
        env = store_env(self.url)
        with _lock_connection(env) as connection:
            key = _lock_key(env, "store-setup")
            connection.execute("SELECT pg_advisory_lock(%s)", (key,))
            try:
                yield
            finally:
                _unlock(connection, key)

    def close(self) -> None:
        self._app.close()

    # ------------------------------------------------------------ aggregates

    def save(self, *aggregates: Any) -> int:
        """Append every pending event; returns how many were appended."""
        count = sum(len(aggregate.pending_events) for aggregate in aggregates)
        if not count:
            return 0
        self._make()
        try:
            self.app.save(*aggregates)
        except RecordConflictError as error:
            raise StoreConflict(f"the store changed under this tick ({error}); nothing more was written") from error
        except OperationalError as error:
            full = full_disk(self.url, error)
            if full is not None:
                raise StoreError(f"the event store {self.url} cannot grow: {full}") from error
            lost = outage_refusal(error)
            if lost is not None:  # the append's commit may or may not have landed: the next command reads the log
                raise lost from None
            if "locked" not in str(error) and "busy" not in str(error):
                raise
            raise StoreBusy(f"the store {self.url} stayed locked by other writers for {sqlite_busy_seconds()} s "
                            f"({error}); nothing was written, run the command again") from error
        return count

    def batch(self, batch_id: str, version: int | None = None) -> LaneBatch | None:
        """The batch as of `version` (default: its whole log), None when absent; `DamagedLog` when its log does
        not verify (lanes_es/adapters/log_reader.py `stream_verified_events`: each row checked as it is decoded)."""
        return project(None, self._verified(batch_id, version))

    def verified_events(self, batch_id: str) -> list[Any]:
        """Every event of a batch, oldest first, checked as `batch` checks them (`DamagedLog` when they do not
        verify): what a command hands on (the MCP timeline, `flakes`) rather than folds."""
        return list(self._verified(batch_id, None))

    def _verified(self, batch_id: str, version: int | None) -> Iterator[Any]:
        from lanes_es.adapters.log_reader import stream_verified_events

        try:
            yield from stream_verified_events(self, batch_id, until=version)
        except StoreError:
            raise
        except Exception as error:
            refused = privilege_refusal(error) or outage_refusal(error)
            if refused is not None:
                raise refused from None
            raise

    def initiative(self, slug: str) -> Initiative | None:
        """This repository's Initiative of `slug`: keyed by the repository id, else one keyed by slug alone
        (written before repository ids) that belongs to this repository."""
        if self.repository_id is not None:
            own = self._aggregate(initiative_id(slug, self.repository_id))
            if own is not None:
                return own
        legacy = self._aggregate(initiative_id(slug))
        return legacy if legacy is not None and self._belongs_here(legacy) else None

    def new_initiative(self, at: str, slug: str) -> Initiative:
        return Initiative.register(at=at, slug=slug, repository_id=self.recorded_repository_id())

    def recorded_repository_id(self) -> str | None:
        """This clone's id, for a confirmation about to be recorded: made now when the clone has none yet."""
        if self._id_to_make is not None and self.repository_id is None:
            self._repository_id, self._id_to_make = self._id_to_make.make(), None
        return self.repository_id

    def initiative_lock_name(self, slug: str) -> str:
        """The lock `authorize` holds: per repository too, so repositories sharing a store never wait on each other."""
        return f"initiative-{self.repository_id}-{slug}" if self.repository_id else f"initiative-{slug}"

    def _belongs_here(self, legacy: Initiative) -> bool:
        """An Initiative keyed by slug alone is this repository's when an authorization claimed it for this
        repository, or, unclaimed, when every checkout its authorizations recorded is one of this
        repository's (those from before v2 recorded none: a store was then one repository's)."""
        if legacy.owner is not None:
            return legacy.owner == self.repository_id
        recorded = [a.repository for a in legacy.authorizations if a.repository]
        return self.owns_checkout is None or all(self.owns_checkout(path) for path in recorded)

    def _aggregate(self, aggregate_id: str, version: int | None = None) -> Any:
        """The aggregate as of `version`, None when absent; a log that cannot be folded is a damaged store."""
        try:
            return self.app.repository.get(aggregate_id, version=version, projector_func=project)
        except AggregateNotFoundError:
            return None
        except StoreError:
            raise
        except Exception as error:  # a gap or a reordered row breaks the fold anywhere: name it, point at verify
            refused = privilege_refusal(error) or outage_refusal(error)
            if refused is not None:  # not damage: the role may not read the log, or the server is gone
                raise refused from None
            hint = f"lanes-es verify {aggregate_id}" if aggregate_id.startswith("batch-") else "lanes-es verify BATCH_ID"
            raise StoreError(f"the event store's log of {aggregate_id} cannot be replayed ({type(error).__name__}"
                             f"{': ' + str(error) if str(error) else ''}: an event is missing, reordered or damaged); "
                             f"`{hint}` lists what is damaged") from error

    def events(self, aggregate_id: str) -> list[Any]:
        """Every event of one aggregate, oldest first."""
        return list(self.app.repository.event_store.get(aggregate_id))

    def events_after(self, aggregate_id: str, version: int) -> list[Any]:
        """The events of one aggregate after `version`, oldest first (what a follower has not seen)."""
        return list(self.app.repository.event_store.get(aggregate_id, gt=version))

    def stored_events(self, aggregate_id: str, after: int = 0) -> list[StoredEvent]:
        """The raw stored records (after version `after`), for verification that must not trust decoding alone."""
        return list(self.app.recorder.select_events(aggregate_id, gt=after or None))

    def initiative_ids(self) -> list[str]:
        """Every Initiative's aggregate id, of every repository sharing the store, in the order registered."""
        topic = get_topic(ev.InitiativeRegistered)
        ids: list[str] = []
        start = 1
        while True:
            page = self.app.recorder.select_notifications(start=start, limit=500, topics=[topic])
            if not page:
                return ids
            ids.extend(notification.originator_id for notification in page)
            start = page[-1].id + 1

    def initiative_slugs(self) -> list[str]:
        return [slug_of(aggregate_id) for aggregate_id in self.initiative_ids()]

    def batch_ids(self) -> list[str]:
        """Every batch of every repository sharing the store."""
        return list(self.batch_authorizations())

    def batch_authorizations(self) -> dict[str, ev.BatchAuthorized]:
        """Every batch of every repository sharing the store, with its newest authorization (which names the
        checkout and repository coordinating it), in the order their Initiatives were registered."""
        found: dict[str, ev.BatchAuthorized] = {}
        for aggregate_id in self.initiative_ids():
            initiative = self._aggregate(aggregate_id)
            for authorization in initiative.authorizations if initiative is not None else []:
                found[authorization.batch_id] = authorization  # a batch keeps its place, its newest authorization
        return found

    # ------------------------------------------------------------ the batch lock

    @contextmanager
    def batch_lock(self, name: str, wait: float = 0.0) -> Iterator[None]:
        """Upstream's batch lock: one tick at a time per batch (or per Initiative before a batch exists).

        On PostgreSQL, a session advisory lock in the database, so that coordinators on several
        machines sharing the store exclude each other; otherwise an exclusive lock on a file
        beside the SQLite store, which records its holder. A held lock is waited for up to `wait`
        seconds, then refused with `BatchLockHeld` naming the holder. The store's optimistic
        concurrency (an append carries its expected version) is the second fence.
        """
        if is_postgres_url(self.url):
            with self._database_lock(name, wait):
                yield
            return
        if self.lock_dir is None or not self.made:
            # Nothing to guard in a store not made yet, and nothing is written for it: its first append is
            # fenced by the log's expected versions and by the link that makes the repository id.
            yield
            return
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        path = self.lock_dir / f"{name.replace('/', '_').replace(':', '_')}.lock"
        with open(path, "a+") as handle:
            _poll(lambda: _try_flock(handle), wait, lambda: BatchLockHeld(name, _read_holder(path)))
            try:
                handle.seek(0)
                handle.truncate()
                handle.write(json.dumps(this_holder()))
                handle.flush()
                yield
            finally:
                handle.truncate(0)
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextmanager
    def _database_lock(self, name: str, wait: float) -> Iterator[None]:
        env = store_env(self.url)
        # The key names the database and schema too: two stores on one server never share a lock.
        key = _lock_key(env, name)
        with _lock_connection(env, application_name=_application_name(this_holder())) as connection:
            _poll(lambda: connection.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0], wait,
                  lambda: BatchLockHeld(name, _advisory_holder(connection, key)))
            try:
                yield
            finally:
                _unlock(connection, key)


def _lock_connection(env: dict[str, str], **options: Any) -> Any:
    """A connection of its own for an advisory lock, which lives as long as its session; a server that does
    not answer is a `StoreOutage`."""
    import psycopg

    try:
        return psycopg.connect(host=env["POSTGRES_HOST"], port=env["POSTGRES_PORT"], user=env["POSTGRES_USER"],
                               password=env["POSTGRES_PASSWORD"] or None, dbname=env["POSTGRES_DBNAME"],
                               autocommit=True, connect_timeout=CONNECT_TIMEOUT, **options)
    except psycopg.Error as error:
        outage = outage_refusal(error)
        if outage is None:
            raise
        raise outage from None


def _unlock(connection: Any, key: int) -> None:
    """Give an advisory lock back. A session the server ended (`pg_terminate_backend`, a restart) already
    gave it back with the session: nothing to do then (what was appended meanwhile was fenced by the
    store's expected versions)."""
    try:
        connection.execute("SELECT pg_advisory_unlock(%s)", (key,))
    except Exception as error:  # noqa: BLE001 - only a lost session is let go
        if lost_connection(error) is None:
            raise


def project(aggregate: Any, events: Iterable[Any]) -> Any:
    """eventsourcing's project_aggregate without its per-event `assert isinstance(event, CanMutateProtocol)`: an
    isinstance on a runtime Protocol, which took half the time of loading a batch."""
    for event in events:
        aggregate = event.mutate(aggregate)
    return aggregate


def _lock_key(env: dict[str, str], name: str) -> int:
    """An advisory lock key that names the database and schema too: two stores on one server never share one."""
    scope = f"lanes-es:{env['POSTGRES_DBNAME']}:{env['POSTGRES_SCHEMA']}:{name}"
    return int.from_bytes(hashlib.sha256(scope.encode()).digest()[:8], "big", signed=True)


def is_postgres_url(url: str) -> bool:
    return parsed_store_url(url).scheme in ("postgresql", "postgres")


def _poll(try_once: Any, wait: float, refusal: Any) -> None:
    """Take a lock now, or within `wait` seconds, or raise the refusal."""
    deadline = time.monotonic() + max(wait, 0.0)
    pause = 0.02
    while not try_once():
        if time.monotonic() >= deadline:
            raise refusal()
        time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
        pause = min(pause * 2, 0.25)


def _try_flock(handle: Any) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _read_holder(path: Path) -> dict[str, Any] | None:
    """The holder a lock file records; None while the holder is between taking the lock and writing it."""
    for _ in range(3):
        try:
            holder = parse_json(read_capped_text(path, 64 * 1024) or "null")
        except (OSError, ValueError):
            holder = None
        if holder:
            return holder
        time.sleep(0.01)
    return None


def _application_name(holder: dict[str, Any]) -> str:
    """pg_stat_activity shows the server's backend pid and the client address; the name carries ours."""
    return f"lanes-es pid={holder['pid']} host={holder['host']} since={holder['since']}"[:63]


def _advisory_holder(connection: Any, key: int) -> dict[str, Any] | None:
    """Who holds an advisory lock, from pg_locks and pg_stat_activity."""
    row = connection.execute(
        "SELECT a.application_name, a.pid, host(a.client_addr), a.backend_start FROM pg_locks l "
        "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid = %s AND l.objid = %s AND l.objsubid = 1",
        ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)).fetchone()
    if row is None:
        return None
    name, backend_pid, address, started = row
    fields = dict(part.split("=", 1) for part in (name or "").split()[1:] if "=" in part)
    if (name or "").startswith("lanes-es ") and "pid" in fields:
        return {"pid": int(fields["pid"]), "host": fields.get("host", "?"), "since": fields.get("since")}
    return {"pid": backend_pid, "host": address or "local socket", "since": started.isoformat() if started else None,
            "server_pid": True}


def default_store_url(git_common_dir: Path) -> str:
    return str(git_common_dir / "lanes-es" / "events.sqlite")


def store_url_from_env(explicit: str | None, git_common_dir: Path) -> str:
    return explicit or os.environ.get("LANES_ES_STORE") or default_store_url(git_common_dir)
