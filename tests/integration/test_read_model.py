"""The read model across batches and repositories, on SQLite and PostgreSQL: `lanes-es batches`
follows the notification log, keeps its position with its rows, waits for gaps, and
`lanes-es rebuild --all` finds and repairs its drift."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest


from lanes_es.adapters.read_model import APPLICATION, ReadModel
from lanes_es.adapters.store import EventStore
from tests.engine import Engine, Task
from tools.bench_logs import write_batch
from lanes_es.cli.main import main


def two_repositories(tmp_path, store_url):
    alpha = Engine.create(tmp_path / "alpha", {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"])},
                          slug="alpha", store_url=store_url)
    beta = Engine.create(tmp_path / "beta", {"task-c": Task(["c.txt"])}, slug="beta", store_url=store_url)
    return alpha, beta


def batches(root, store_url, *options, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["--root", root, "--store", store_url, "batches", "--json", *options]) == 0
    return json.loads(capsys.readouterr().out)


def test_one_read_model_across_repositories_through_the_command_line(tmp_path, store_url, capsys):
    alpha, beta = two_repositories(tmp_path, store_url)
    alpha_id = alpha.authorize(max_parallel=2)
    report = alpha.tick()
    alpha.tick(offers={task: alpha.provision(task, report) for task in ("task-a", "task-b")})
    beta_id = beta.authorize()

    lines = batches(alpha.root, store_url, capsys=capsys)
    assert [(line["batch_id"], line["batch_state"], line["repository"], line["children"]) for line in lines] == [
        (alpha_id, "running", alpha.root, {"enrolled": 2}),
        (beta_id, "authorized", beta.root, {"pending": 1}),
    ]
    assert lines[0]["initiative_slug"] == "alpha" and lines[0]["version"] == alpha.batch.version
    assert lines[0]["last_event_at"] == alpha.batch.record["updated_at"]

    beta.tick()  # the read model follows what was appended since
    assert [line["batch_id"] for line in batches(beta.root, store_url, "--state", "running", capsys=capsys)] == \
        [alpha_id, beta_id]
    assert [line["batch_id"] for line in batches(beta.root, store_url, "--repo", "beta/repo", capsys=capsys)] == [beta_id]
    assert len(batches(beta.root, store_url, "--repo", "repo", capsys=capsys)) == 2
    assert batches(beta.root, store_url, "--repo", alpha.root, "--state", "completed", capsys=capsys) == []
    assert main(["--root", beta.root, "--store", store_url, "batches"]) == 0
    assert f"{alpha_id}  running" in capsys.readouterr().out


def test_the_position_is_the_last_event_folded_and_a_second_follower_folds_nothing_twice(tmp_path, store_url):
    store = EventStore(store_url)
    write_batch(store, "batch-one-1", "one", 120, children=3)
    model = ReadModel(store)
    model.catch_up()
    newest = store.app.recorder.max_notification_id()
    assert model.lines()[0].version == 120
    write_batch(store, "batch-two-1", "two", 60, children=2)
    followers = [threading.Thread(target=ReadModel(EventStore(store_url)).catch_up) for _ in range(3)]  # noqa
    for follower in followers:
        follower.start()
    for follower in followers:
        follower.join()
    lines = {line.batch_id: line for line in model.lines()}
    assert (lines["batch-one-1"].version, lines["batch-two-1"].version) == (120, 60)
    assert lines["batch-two-1"].children_by_status() == {"released": 2}
    assert model.view.max_tracking_id(APPLICATION) == newest + 60
    store.close()


def test_rebuild_all_finds_and_repairs_drift_in_the_read_model(tmp_path, store_url, capsys):
    alpha, _ = two_repositories(tmp_path, store_url)
    alpha.authorize()
    alpha.tick()
    assert len(batches(alpha.root, store_url, capsys=capsys)) == 1
    model = ReadModel(alpha.deps.store)
    view = model.view
    with view._write() as cursor:  # a line edited behind the projection's back
        cursor.execute(f"UPDATE {view.table} SET batch_state = 'completed'")

    assert main(["--root", alpha.root, "--store", store_url, "rebuild", "--all", "--check"]) == 1
    out = capsys.readouterr().out
    assert "read model: 1 line(s) differs from the log" in out
    assert main(["--root", alpha.root, "--store", store_url, "rebuild", "--all"]) == 1
    assert "rebuilt" in capsys.readouterr().out
    assert main(["--root", alpha.root, "--store", store_url, "rebuild", "--all"]) == 0
    assert "read model: 1 batch line(s), no drift" in capsys.readouterr().out
    assert [line["batch_state"] for line in batches(alpha.root, store_url, capsys=capsys)] == ["running"]


def test_rebuild_all_judges_and_writes_only_this_checkouts_batches_on_a_shared_store(tmp_path, store_url):
    """Two clones share the store: each one's `rebuild --all [--check]`, through the real command line, judges
    and writes its own batch only; the other's projections live in the other checkout (on main, the other
    batch's files were "missing" here, exit 1, and `rebuild --all` wrote them into this checkout)."""
    from tests.integration.test_user_errors import lanes

    alpha, beta = two_repositories(tmp_path, store_url)
    ids = {}
    for engine in (alpha, beta):
        ids[engine.root] = engine.authorize()
        engine.tick()
    state = Path(alpha.root) / ".imm" / "state" / "batches"
    written_before = sorted(path.name for path in state.iterdir())

    for engine, other in ((alpha, beta), (beta, alpha)):
        checked = lanes(engine.root, "rebuild", "--all", "--check")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"{ids[engine.root]}: no drift" in checked.stdout and ids[other.root] not in checked.stdout
        assert "1 batch(es) of other checkouts sharing the store left to them" in checked.stdout
        assert "read model: 2 batch line(s), no drift" in checked.stdout  # the read model is the store's, whole
    engine_state = alpha.state_file()
    engine_state.unlink()
    rebuilt = lanes(alpha.root, "rebuild", "--all")
    assert rebuilt.returncode == 1 and f"{ids[alpha.root]}: rewrote " in rebuilt.stdout, rebuilt.stdout  # it had drifted
    assert ids[beta.root] not in rebuilt.stdout and engine_state.exists()
    assert sorted(path.name for path in state.iterdir()) == written_before  # nothing of beta's here


# ---------------------------------------------------------------- gaps in the notification ids


def stored_first_events(*slugs: str) -> list:
    """The stored rows of BatchPrepared for each slug, as the store would write them."""
    from lanes_es.adapters.store import NullTranscoder, StructMapper
    from tools.bench_logs import prepared_batch

    mapper = StructMapper(transcoder=NullTranscoder())
    return [mapper.to_stored_event(prepared_batch(f"batch-{slug}-1", slug, ["task-a"]).pending_events[0])
            for slug in slugs]


def insert_sql(url: str) -> str:
    schema = url.rsplit("schema=", 1)[1]
    return (f"INSERT INTO {schema}.laneses_events (originator_id, originator_version, topic, state) "
            f"VALUES (%s, %s, %s, %s)")


@pytest.mark.postgres
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_a_gap_left_by_an_append_in_flight_is_waited_for_not_skipped(tmp_path, outcome):
    """An append that drew notification id N commits after one that drew N + 1 (possible for any writer
    that does not take the library's table lock): the follower waits for N, then folds N before N + 1.
    Rolled back instead, N can never arrive, and the follower goes on once the append has ended."""
    import psycopg

    from tests.integration.store_backends import PG_DSN

    for url in _postgres_url():
        store = EventStore(url)
        write_batch(store, "batch-first-1", "first", 10, children=1)
        model = ReadModel(store)
        model.catch_up()
        late, early = stored_first_events("late", "early")
        with psycopg.connect(PG_DSN) as in_flight, psycopg.connect(PG_DSN, autocommit=True) as other:
            in_flight.execute(insert_sql(url), (late.originator_id, 1, late.topic, late.state))  # draws N
            other.execute(insert_sql(url), (early.originator_id, 1, early.topic, early.state))  # N + 1, committed
            follower = threading.Thread(target=model.catch_up)
            follower.start()
            follower.join(0.5)
            assert follower.is_alive()  # waiting for N, with N + 1 already readable
            assert "batch-early-1" not in {line.batch_id for line in model.lines()}
            in_flight.commit() if outcome == "commit" else in_flight.rollback()
        follower.join(10)
        assert not follower.is_alive()
        lines = {line.batch_id for line in model.lines()}
        assert "batch-early-1" in lines
        assert ("batch-late-1" in lines) == (outcome == "commit")
        store.close()


def _postgres_url():
    from tests.integration.store_backends import postgres_schema_url

    return postgres_schema_url()


def test_a_hole_in_sqlite_rowids_is_checked_under_the_write_lock_then_passed(tmp_path):
    """SQLite hands out rowids inside its one write transaction, so a hole can only be a row that is gone;
    the follower still waits for the write lock (no append in flight) before it goes on."""
    import sqlite3

    url = str(tmp_path / "events.sqlite")
    store = EventStore(url)
    write_batch(store, "batch-first-1", "first", 10, children=1)
    late, early = stored_first_events("late", "early")
    newest = store.app.recorder.max_notification_id()
    model = ReadModel(store)
    model.catch_up()
    with sqlite3.connect(url) as connection:
        connection.execute("INSERT INTO stored_events (rowid, originator_id, originator_version, topic, state) "
                           "VALUES (?, ?, 1, ?, ?)", (newest + 2, early.originator_id, early.topic, early.state))
    blocker = sqlite3.connect(url, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # an append in flight holds the write lock
    follower = threading.Thread(target=model.catch_up)
    follower.start()
    follower.join(0.5)
    assert follower.is_alive()
    blocker.execute("ROLLBACK")
    follower.join(10)
    assert not follower.is_alive()
    assert "batch-early-1" in {line.batch_id for line in model.lines()}
    store.close()


def test_waiting_never_overwrites_the_followers_position_with_a_stale_stored_one():
    """The follower's thread folds notification 12 while the caller reads the stored position (still 11,
    read just before that fold committed). The wait must end: it used to set the follower's position
    from that stale read, and then waited out its whole timeout for a notification already folded."""
    from lanes_es.adapters.read_model import GapPending

    class View:
        position = None

        def max_tracking_id(self, application_name):
            self.position = 12  # the thread's fold commits meanwhile
            return 11

    class Runner:
        view = View()
        is_interrupted = threading.Event()

    try:
        ReadModel._wait(Runner(), 12, timeout=0.5)
    except GapPending as stuck:
        pytest.fail(f"the wait did not see the fold: {stuck}")
    assert Runner.view.position == 12
