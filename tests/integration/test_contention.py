"""Contention is an outcome, not an error: ticks that find their batch locked wait for it or
refuse as busy (exit 2, naming the holder, nothing written), on SQLite and on PostgreSQL; a tick
whose append lost a race rereads the log and decides again."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest

from lanes_es.adapters.store import EventStore
from lanes_es.usecases.lock import BatchBusy
from tests.engine import Engine, Task, initiative_markdown
from tests.gitfixtures import intent_json, make_repo, requires_file
from tests.integration.test_mcp_server import SLUG, TASKS as MCP_TASKS, User, call, host
from lanes_es.cli.main import main
from lanes_es.usecases.tick import tick

pytestmark = pytest.mark.usefixtures("store_url")

TASKS = {"a": Task(["a.txt"]), "b": Task(["b.txt"])}


def authorized(tmp_path: Path) -> tuple[Engine, str]:
    engine = Engine.create(tmp_path, TASKS)
    batch_id = engine.authorize(max_parallel=2)
    engine.tick()
    return engine, batch_id


def holder_of_the_lock(engine: Engine) -> EventStore:
    """A second coordinator's store, as on another machine: its batch_lock is the tick's lock."""
    return EventStore(engine.deps.store.url, lock_dir=engine.deps.store.lock_dir)


def versions(engine: Engine, batch_id: str) -> list[int]:
    return [row.originator_version for row in engine.deps.store.stored_events(batch_id)]


def start_ticks(engine: Engine, count: int, *extra: str) -> list[subprocess.Popen]:
    """`count` × `lanes-es tick SLUG --json`, started together as separate processes."""
    command = [sys.executable, "-m", "lanes_es.cli.main", "--root", engine.root, "tick", engine.slug, "--json", *extra]
    return [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(count)]


def finished(processes: list[subprocess.Popen]) -> list[tuple[int, dict, str]]:
    results = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        results.append((process.returncode, json.loads(out) if out.strip() else {}, err))
    return results


def test_four_ticks_on_a_held_batch_refuse_as_busy_naming_the_holder_and_write_nothing(tmp_path):
    engine, batch_id = authorized(tmp_path)
    before = versions(engine, batch_id)
    other = holder_of_the_lock(engine)
    try:
        with other.batch_lock(batch_id):
            results = finished(start_ticks(engine, 4, "--wait", "0"))
    finally:
        other.close()
    for code, report, err in results:
        assert code == 2, err
        assert report["outcome"] == "busy" and report["batch_id"] == batch_id
        assert report["holder"]["pid"] == os.getpid() and report["holder"]["host"] == socket.gethostname()
        assert "--wait" in report["next_action"]
        assert "Traceback" not in err and "internal error" not in err
    assert versions(engine, batch_id) == before


def test_without_json_the_refusal_is_one_line_naming_batch_and_holder(tmp_path, capsys):
    engine, batch_id = authorized(tmp_path)
    other = holder_of_the_lock(engine)
    try:
        with other.batch_lock(batch_id):
            code = main(["--root", engine.root, "tick", engine.slug, "--wait", "0.1"])
    finally:
        other.close()
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1
    assert batch_id in err and f"pid {os.getpid()} on host {socket.gethostname()}" in err and "busy" in err


def test_four_ticks_that_wait_all_run_once_the_holder_lets_go(tmp_path):
    """Held while they start, released a moment later: each waits its turn and applies."""
    engine, batch_id = authorized(tmp_path)
    other = holder_of_the_lock(engine)
    released = threading.Event()
    try:
        with other.batch_lock(batch_id):
            processes = start_ticks(engine, 4, "--wait", "120")
            threading.Timer(1.0, released.set).start()
            released.wait()
        results = finished(processes)
    finally:
        other.close()
    assert [code for code, _, _ in results] == [0, 0, 0, 0], [err for _, _, err in results]
    assert all(report["batch_state"] == "running" for _, report, _ in results)
    assert versions(engine, batch_id) == list(range(1, len(versions(engine, batch_id)) + 1))


def test_four_ticks_started_together_each_apply_or_refuse_as_busy(tmp_path):
    """No holder from outside: whichever tick takes the lock applies, the others refuse (exit 2,
    outcome busy) or, if it ended first, run after it and refuse the offer it already took (exit 2,
    the offer in lane_refusals); never an error, never a gap in the log."""
    engine, batch_id = authorized(tmp_path)
    lane = engine.provision("a", engine.tick())
    results = finished(start_ticks(engine, 4, "--wait", "0", "--offer", f"a={lane}"))
    codes = sorted(code for code, _, _ in results)
    assert set(codes) <= {0, 2} and 0 in codes, [err for _, _, err in results]
    for code, report, err in results:
        if code == 2 and "outcome" in report:
            assert report["outcome"] == "busy" and report["holder"]["pid"] != os.getpid()
        elif code == 2:  # started after the tick that admitted the Lane: the repeated offer is refused
            assert report["lane_refusals"] == [{"task_id": "a", "path": lane, "reason": "batch_lane_unknown_child"}], err
    assert versions(engine, batch_id) == list(range(1, len(versions(engine, batch_id)) + 1))
    admitted = [e for e in engine.deps.store.events(batch_id) if type(e).__name__ == "LaneAdmitted"]
    assert [e.task_id for e in admitted] == ["a"]  # the offer was taken once, however many ticks carried it


def test_the_service_raises_busy_and_takes_the_lock_when_it_frees_within_the_wait(tmp_path):
    engine, batch_id = authorized(tmp_path)
    other = holder_of_the_lock(engine)
    try:
        with other.batch_lock(batch_id):
            with pytest.raises(BatchBusy) as busy:
                tick(engine.deps, engine.slug, wait=0)
            assert busy.value.code == "batch_busy" and busy.value.holder["pid"] == os.getpid()
        assert tick(engine.deps, engine.slug, wait=5).report["batch_state"] == "running"
    finally:
        other.close()


def test_a_tick_that_lost_the_race_rereads_and_decides_again(tmp_path):
    """Another writer appends between this tick's read and its append (as one that ignored the lock
    would): the store refuses the stale append, the tick rereads and re-decides, and the other
    writer's event stays in the log exactly once."""
    engine, batch_id = authorized(tmp_path)
    lane = engine.provision("a", engine.tick())
    store = engine.deps.store
    real_save = store.save
    raced = []

    def save_after_a_rival(*aggregates):
        if not raced:
            rival = holder_of_the_lock(engine)
            batch = rival.batch(batch_id)
            batch.reject_tick("2030-01-01T00:00:00.000Z", "a rival writer")
            rival.save(batch)
            rival.close()
            raced.append(True)
        return real_save(*aggregates)

    store.save = save_after_a_rival
    report = engine.tick(offers={"a": lane})
    store.save = real_save
    assert raced and report["batch_state"] == "running"
    events = store.events(batch_id)
    assert [getattr(e, "reason", None) for e in events].count("a rival writer") == 1
    assert [e.task_id for e in events if type(e).__name__ == "LaneAdmitted"] == ["a"]
    assert versions(engine, batch_id) == list(range(1, len(events) + 1))


def test_the_mcp_tick_of_a_held_batch_is_a_busy_refusal_naming_the_holder(tmp_path):
    intents = {task: intent_json(task, spec.scope, verification=requires_file(spec.scope[0]))
               for task, spec in MCP_TASKS.items()}
    root = make_repo(tmp_path / "mcp-repo", intents=intents,
                     files={f"docs/initiatives/{SLUG}.md": initiative_markdown(MCP_TASKS)})

    async def scenario() -> tuple[bool, dict]:
        async with host(root, tmp_path, User()) as client:
            _, started = await call(client, "start_unattended_batch", initiative_slug=SLUG, max_parallel=1)
            other = EventStore(os.environ["LANES_ES_STORE"], lock_dir=Path(root) / ".git" / "lanes-es" / "locks")
            try:
                with other.batch_lock(started["batch_id"]):
                    return await call(client, "start_unattended_batch", initiative_slug=SLUG)
            finally:
                other.close()

    is_error, payload = anyio.run(scenario)
    assert is_error and payload["state"] == "blocked" and payload["reason_key"] == "batch_busy"
    assert payload["outcome"] == "busy" and payload["holder"]["pid"] == os.getpid()
    assert "again shortly" in payload["recovery_action"]
