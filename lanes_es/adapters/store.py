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
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, unquote, urlparse

import msgspec
from eventsourcing.application import AggregateNotFoundError, Application
from eventsourcing.persistence import Mapper, RecordConflictError, StoredEvent, Transcoder
from eventsourcing.utils import get_topic, resolve_topic

from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.initiative import Initiative, initiative_id

_ENCODER = msgspec.json.Encoder(order="sorted")


class StoreError(RuntimeError):
    """The store could not be opened or read; the message says which and why."""


class StoreConflict(StoreError):
    """Another writer saved this batch first: the tick wrote nothing else."""


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
        cls = resolve_topic(stored_event.topic)
        class_version = getattr(cls, "class_version", 1)
        state = bytes(stored_event.state)
        if class_version == 1:
            return msgspec.json.decode(state, type=cls)
        fields = msgspec.json.decode(state)
        from_version = fields.pop("class_version", 1)
        while from_version < class_version:
            getattr(cls, f"upcast_v{from_version}_v{from_version + 1}")(fields)
            from_version += 1
        return msgspec.convert(fields, type=cls)


def store_env(url: str) -> dict[str, str]:
    """eventsourcing's environment for a store URL."""
    env = {
        "MAPPER_TOPIC": get_topic(StructMapper),
        "TRANSCODER_TOPIC": get_topic(NullTranscoder),
        "ORIGINATOR_ID_TYPE": "text",
    }
    if url == "memory:":
        env["PERSISTENCE_MODULE"] = "eventsourcing.popo"
        return env
    parsed = urlparse(url)
    if parsed.scheme in ("postgresql", "postgres"):
        env.update({
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": unquote(parsed.path.lstrip("/")) or "postgres",
            "POSTGRES_HOST": parsed.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(parsed.port or 5432),
            "POSTGRES_USER": unquote(parsed.username or "postgres"),
            "POSTGRES_PASSWORD": unquote(parsed.password or ""),
            "POSTGRES_SCHEMA": parse_qs(parsed.query).get("schema", ["public"])[0],
        })
        return env
    if parsed.scheme == "sqlite":
        path = unquote(parsed.path)
    elif parsed.scheme == "":
        path = url
    else:
        raise StoreError(f"unknown store URL {url!r}: use a SQLite path, sqlite:///PATH, postgresql://... or memory:")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    env.update({"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": path})
    return env


class LanesApplication(Application[str]):
    name = "LanesES"


class EventStore:
    """Load and save the two aggregates; read a batch's raw log for audit and rebuild."""

    def __init__(self, url: str, lock_dir: Path | None = None) -> None:
        self.url = url
        self.lock_dir = lock_dir
        try:
            self.app = LanesApplication(env=store_env(url))
        except Exception as error:  # a driver error names the path or host; keep it
            raise StoreError(f"cannot open the event store {url}: {error}") from error

    def close(self) -> None:
        self.app.close()

    # ------------------------------------------------------------ aggregates

    def save(self, *aggregates: Any) -> int:
        """Append every pending event; returns how many were appended."""
        count = sum(len(aggregate.pending_events) for aggregate in aggregates)
        if not count:
            return 0
        try:
            self.app.save(*aggregates)
        except RecordConflictError as error:
            raise StoreConflict(f"the store changed under this tick ({error}); nothing more was written") from error
        return count

    def batch(self, batch_id: str, version: int | None = None) -> LaneBatch | None:
        try:
            return self.app.repository.get(batch_id, version=version)
        except AggregateNotFoundError:
            return None

    def initiative(self, slug: str) -> Initiative | None:
        try:
            return self.app.repository.get(initiative_id(slug))
        except AggregateNotFoundError:
            return None

    def events(self, aggregate_id: str) -> list[Any]:
        """Every event of one aggregate, oldest first."""
        return list(self.app.repository.event_store.get(aggregate_id))

    def events_after(self, aggregate_id: str, version: int) -> list[Any]:
        """The events of one aggregate after `version`, oldest first (what a follower has not seen)."""
        return list(self.app.repository.event_store.get(aggregate_id, gt=version))

    def stored_events(self, aggregate_id: str) -> list[StoredEvent]:
        """The raw stored records, for verification that must not trust decoding alone."""
        return list(self.app.recorder.select_events(aggregate_id))

    def initiative_slugs(self) -> list[str]:
        topic = get_topic(ev.InitiativeRegistered)
        slugs: list[str] = []
        start = 1
        while True:
            page = self.app.recorder.select_notifications(start=start, limit=500, topics=[topic])
            if not page:
                return slugs
            slugs.extend(notification.originator_id.split(":", 1)[1] for notification in page)
            start = page[-1].id + 1

    def batch_ids(self) -> list[str]:
        ids: list[str] = []
        for slug in self.initiative_slugs():
            initiative = self.initiative(slug)
            if initiative is not None:
                ids.extend(initiative.batch_ids())
        return ids

    # ------------------------------------------------------------ the batch lock

    @contextmanager
    def batch_lock(self, name: str) -> Iterator[None]:
        """Upstream's batch lock: one tick at a time per batch (or per Initiative before a batch exists).

        On PostgreSQL, a session advisory lock in the database, so that coordinators on several
        machines sharing the store exclude each other; otherwise an exclusive lock on a file
        beside the SQLite store. The store's optimistic concurrency is the second fence.
        """
        if urlparse(self.url).scheme in ("postgresql", "postgres"):
            with self._database_lock(name):
                yield
            return
        if self.lock_dir is None:
            yield
            return
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        path = self.lock_dir / f"{name.replace('/', '_').replace(':', '_')}.lock"
        with open(path, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreConflict(f"the batch lock {path} is held by another tick; retry when it ends") from None
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextmanager
    def _database_lock(self, name: str) -> Iterator[None]:
        import psycopg

        env = store_env(self.url)
        key = int.from_bytes(hashlib.sha256(f"lanes-es:{name}".encode()).digest()[:8], "big", signed=True)
        with psycopg.connect(host=env["POSTGRES_HOST"], port=env["POSTGRES_PORT"], user=env["POSTGRES_USER"],
                             password=env["POSTGRES_PASSWORD"] or None, dbname=env["POSTGRES_DBNAME"],
                             autocommit=True) as connection:
            held = connection.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]
            if not held:
                raise StoreConflict(f"the batch lock of {name} is held by another tick (a PostgreSQL advisory "
                                    f"lock); retry when it ends")
            try:
                yield
            finally:
                connection.execute("SELECT pg_advisory_unlock(%s)", (key,))


def default_store_url(git_common_dir: Path) -> str:
    return str(git_common_dir / "lanes-es" / "events.sqlite")


def store_url_from_env(explicit: str | None, git_common_dir: Path) -> str:
    return explicit or os.environ.get("LANES_ES_STORE") or default_store_url(git_common_dir)
