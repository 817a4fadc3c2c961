"""The event store on both backends: the same aggregates, the same bytes, the store guarding
itself (an append carries its expected version), and the batch lock naming its holder."""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
import time
from pathlib import Path

import pytest

from lanes_es.adapters.store import BatchLockHeld, EventStore, StoreConflict
from lanes_es.domain import events as ev
from lanes_es.domain.batch import LaneBatch
from lanes_es.domain.initiative import Initiative
from eventsourcing.persistence import RecordConflictError, StoredEvent


@pytest.fixture
def store(store_url, tmp_path):
    opened = EventStore(store_url, lock_dir=tmp_path / "locks")
    yield opened
    opened.close()


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


def test_the_database_refuses_a_second_row_of_the_same_batch_and_version(store):
    """Below the aggregate: the table's key (batch, version) itself refuses a duplicate append."""
    store.save(prepared())
    row = store.stored_events("batch-pg-1")[-1]
    duplicate = StoredEvent(originator_id=row.originator_id, originator_version=row.originator_version,
                            topic=row.topic, state=row.state)
    with pytest.raises(RecordConflictError):
        store.app.recorder.insert_events([duplicate])
    assert [r.originator_version for r in store.stored_events("batch-pg-1")] == [1, 2]


def test_initiatives_and_batches_are_listed(store):
    initiative = Initiative.register(at="2026-01-01T00:00:00.000Z", slug="pg")
    store.save(initiative)
    assert store.initiative_slugs() == ["pg"]
    assert store.initiative("pg").slug == "pg"


def test_the_batch_lock_excludes_another_coordinator_and_names_the_holder(store):
    """Two coordinators (two store objects, as on two machines) cannot tick the same batch at once;
    the refused one learns the holder's pid and host."""
    other = EventStore(store.url, lock_dir=store.lock_dir)
    try:
        with store.batch_lock("batch-pg-1"):
            with pytest.raises(BatchLockHeld) as refused:
                with other.batch_lock("batch-pg-1"):
                    pass
            assert refused.value.holder["pid"] == os.getpid()
            assert refused.value.holder["host"] == socket.gethostname()
            assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(refused.value)
            with other.batch_lock("batch-pg-2"):  # another batch is not held
                pass
        with other.batch_lock("batch-pg-1"):  # released at the end of the tick
            pass
    finally:
        other.close()


def _hold_lock(url: str, lock_dir: str, name: str, held) -> None:
    """Take the lock and keep it until killed (a plain sleep: nothing shared is left mid-use)."""
    store = EventStore(url, lock_dir=Path(lock_dir))
    with store.batch_lock(name):
        held.set()
        time.sleep(120)


def test_a_held_lock_is_waited_for_and_a_lock_dies_with_its_holder(store):
    """`wait` takes the lock once its holder lets go; a SIGKILLed holder leaves no lock behind."""
    context = multiprocessing.get_context("spawn")
    held = context.Event()
    holder = context.Process(target=_hold_lock, args=(store.url, str(store.lock_dir), "batch-w", held))
    holder.start()
    try:
        assert held.wait(30)
        with pytest.raises(BatchLockHeld) as refused:
            with store.batch_lock("batch-w", wait=0.2):
                pass
        assert refused.value.holder["pid"] == holder.pid
        holder.kill()
        holder.join(10)
        with store.batch_lock("batch-w", wait=10):
            pass
    finally:
        holder.kill()
        holder.join(10)


def _append_at_random(url: str, batch_ids: list[str], appends: int, start, seed: int, results) -> None:
    """A writer that ignores the lock: load, decide, append; on a conflict reread and decide again."""
    store = EventStore(url)
    chooser = random.Random(seed)
    start.wait(300)
    done = conflicts = 0
    while done < appends:
        batch_id = chooser.choice(batch_ids)
        batch = store.batch(batch_id)
        batch.reject_tick("2026-01-01T00:00:05.000Z", f"writer {seed} append {done}")
        try:
            store.save(batch)
            done += 1
        except StoreConflict:
            conflicts += 1
    store.close()
    results.put((seed, done, conflicts))


def test_eight_processes_appending_at_once_leave_every_batch_gapless(store):
    """8 writers, no lock, 4 batches: each batch's versions are exactly 1..n, every accepted append
    is in the log once, and the chain still links (a duplicate or a gap would break it)."""
    batch_ids = [f"batch-race-{n}" for n in range(4)]
    for batch_id in batch_ids:
        store.save(prepared(batch_id))
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(8), context.Queue()
    writers = [context.Process(target=_append_at_random, args=(store.url, batch_ids, 12, start, seed, results))
               for seed in range(8)]
    for writer in writers:
        writer.start()
    outcomes = [results.get(timeout=600) for _ in writers]
    for writer in writers:
        writer.join(30)
        assert writer.exitcode == 0
    reasons: list[str] = []
    for batch_id in batch_ids:
        versions = [row.originator_version for row in store.stored_events(batch_id)]
        assert versions == list(range(1, len(versions) + 1))
        loaded = store.batch(batch_id)  # replays every event: the chain links each to the one before
        assert loaded.version == len(versions)
        reasons += [e.reason for e in store.events(batch_id) if isinstance(e, ev.TickRejected)]
    assert sorted(reasons) == sorted(f"writer {seed} append {n}" for seed in range(8) for n in range(12))
    assert sum(done for _, done, _ in outcomes) == 8 * 12


def _open_at_once(url: str, start, results) -> None:
    start.wait(300)
    try:
        EventStore(url).close()
        results.put("opened")
    except Exception as error:  # noqa: BLE001 - the test reports what went wrong
        results.put(f"{type(error).__name__}: {error}")


def test_eight_coordinators_opening_the_store_at_once_all_open_it(store):
    """Opening (re)creates the tables and, on PostgreSQL, the insert function; eight at once must not
    collide ("tuple concurrently updated" before opening took a setup lock)."""
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(8), context.Queue()
    openers = [context.Process(target=_open_at_once, args=(store.url, start, results)) for _ in range(8)]
    for opener in openers:
        opener.start()
    outcomes = [results.get(timeout=600) for _ in openers]
    for opener in openers:
        opener.join(30)
    assert outcomes == ["opened"] * 8


def test_eight_coordinators_making_a_new_sqlite_store_at_once_all_open_it(tmp_path):
    """The first command on a repository makes its SQLite store; several started together must each find
    either no file or a whole store, never the empty file the driver makes before its header (which is
    refused as not a store). On PostgreSQL the same start is the test above."""
    context = multiprocessing.get_context("spawn")
    for attempt in range(3):
        url = str(tmp_path / f"new-{attempt}.sqlite")
        start, results = context.Barrier(8), context.Queue()
        openers = [context.Process(target=_open_at_once, args=(url, start, results)) for _ in range(8)]
        for opener in openers:
            opener.start()
        outcomes = [results.get(timeout=600) for _ in openers]
        for opener in openers:
            opener.join(30)
        assert outcomes == ["opened"] * 8, url
        assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(".")) == []
