"""The anchored audit on both event stores: a batch run through the service on SQLite and on
PostgreSQL leaves a checkpoint that covers its whole log, and the newest events deleted from
either store are found by `verify` through the command line."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests.engine import Engine, Task
from tests.gitfixtures import git_out
from lanes_es.cli.main import main

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


def _postgres(statement: str, *args: object) -> int:
    import psycopg

    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True) as connection:
        return connection.execute(statement, args or None).rowcount


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    if request.param == "sqlite":
        yield "sqlite", str(tmp_path / "events.sqlite")
        return
    schema = f"anchor_{uuid.uuid4().hex[:12]}"
    _postgres(f"CREATE SCHEMA {schema}")
    try:
        yield schema, f"{POSTGRES}?schema={schema}"
    finally:
        _postgres(f"DROP SCHEMA {schema} CASCADE")


def delete_newest(backend: tuple[str, str], batch_id: str, keep: int) -> None:
    name, url = backend
    if name == "sqlite":
        connection = sqlite3.connect(url)
        connection.execute("delete from stored_events where originator_id = ? and originator_version > ?",
                           (batch_id, keep))
        connection.commit()
        connection.close()
        return
    assert _postgres(f"DELETE FROM {name}.laneses_events WHERE originator_id = %s AND originator_version > %s",
                     batch_id, keep) > 0


def test_a_batch_on_either_store_is_anchored_and_a_cut_store_is_found(backend, tmp_path, capsys):
    engine = Engine.create(tmp_path, {"a": Task(["a.txt"])}, store_url=backend[1])
    batch_id = engine.authorize()
    report = engine.run_to_end({"a": ("a.txt", "a\n")})
    engine.deps.store.close()
    assert report["batch_state"] == "completed"
    size = int(git_out(engine.root, "show", f"refs/lanes-es/checkpoints/{batch_id}:checkpoint").splitlines()[1])
    assert main(["--root", engine.root, "--store", backend[1], "verify", batch_id]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint {size} events" in out and "verified: every check holds" in out
    delete_newest(backend, batch_id, size - 2)
    assert main(["--root", engine.root, "--store", backend[1], "verify", batch_id]) == 1
    out = capsys.readouterr().out
    assert f"log_cut_short: the log holds {size - 2} events but the signed checkpoint covers {size}" in out
