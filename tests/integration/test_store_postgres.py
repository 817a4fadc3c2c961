"""The PostgreSQL store: the same aggregates, the same bytes, the same optimistic concurrency."""

from __future__ import annotations

import uuid

import pytest

from lanes_es.adapters.store import EventStore, StoreConflict
from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.initiative import Initiative

import psycopg  # the postgres extra, installed by .ci/run

DSN = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture
def store():
    schema = f"lanes_{uuid.uuid4().hex[:12]}"
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    opened = EventStore(f"{DSN}?schema={schema}")
    yield opened
    opened.close()
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA {schema} CASCADE")


def prepared(batch_id: str = "batch-pg-1") -> LaneBatch:
    batch = LaneBatch.prepare(
        at="2026-01-01T00:00:00.000Z", batch_id=batch_id, initiative_slug="pg", plan_digest="sha256:0",
        base_head="a" * 40, branch="imm/pg", confirmation_time="2026-01-01T00:00:00.000Z",
        budget=ev.Budget(max_children=1, qa_failure_limit=2), max_parallel=1,
        children=[ev.PlanChild(task_id="a", slice_id="S1", blocked_by=[])])
    batch.start("2026-01-01T00:00:01.000Z")
    return batch


def test_round_trip_keeps_the_record_and_the_chain(store):
    batch = prepared()
    batch.admit_lane("2026-01-01T00:00:02.000Z", "a", ev.LaneBinding(path="/l", branch="imm-lane/pg/a", base_head="a" * 40))
    assert store.save(batch) == 3
    loaded = store.batch("batch-pg-1")
    assert loaded.record == batch.record
    assert loaded.last_digest == batch.last_digest
    assert [type(e).__name__ for e in store.events("batch-pg-1")] == ["BatchPrepared", "BatchStarted", "LaneAdmitted"]


def test_a_concurrent_save_is_refused(store):
    store.save(prepared())
    first, second = store.batch("batch-pg-1"), store.batch("batch-pg-1")
    first.reject_tick("2026-01-01T00:00:03.000Z", "one")
    second.reject_tick("2026-01-01T00:00:03.000Z", "two")
    store.save(first)
    with pytest.raises(StoreConflict):
        store.save(second)
    assert [e.reason for e in store.events("batch-pg-1") if isinstance(e, ev.TickRejected)] == ["one"]


def test_initiatives_and_batches_are_listed(store):
    initiative = Initiative.register(at="2026-01-01T00:00:00.000Z", slug="pg")
    store.save(initiative)
    assert store.initiative_slugs() == ["pg"]
    assert store.initiative("pg").slug == "pg"


def test_the_batch_lock_excludes_another_coordinator_through_the_database(store):
    """Two coordinators (two store objects, as on two machines) cannot tick the same batch at once."""
    other = EventStore(store.url)
    try:
        with store.batch_lock("batch-pg-1"):
            with pytest.raises(StoreConflict, match="advisory lock"):
                with other.batch_lock("batch-pg-1"):
                    pass
            with other.batch_lock("batch-pg-2"):  # another batch is not held
                pass
        with other.batch_lock("batch-pg-1"):  # released at the end of the tick
            pass
    finally:
        other.close()
