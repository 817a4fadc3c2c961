"""Fixtures several integration modules share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import STORE_BACKENDS, backend_store
from tests.integration.demo_repo import Demo, make_demo


@pytest.fixture(scope="session", params=STORE_BACKENDS)
def demo_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """One completed demo batch per backend for the whole session (repository, batch id, store URL).

    On SQLite the store is the repository's own file (in its git common dir), so a copy of the
    repository copies it; on PostgreSQL it is a schema of the session, and `copy_of` clones it."""
    if request.param == "sqlite":
        repo, batch_id = make_demo(tmp_path_factory.mktemp("demo"))
        yield repo, batch_id, str(repo / ".git" / "lanes-es" / "events.sqlite")
        return
    with backend_store(request.param, tmp_path_factory) as url, pytest.MonkeyPatch.context() as patch:
        patch.setenv("LANES_ES_STORE", url)
        repo, batch_id = make_demo(tmp_path_factory.mktemp("demo"))
        patch.delenv("LANES_ES_STORE")
        yield repo, batch_id, url


@pytest.fixture
def demo(demo_run: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Demo]:
    """The session's demo batch on this test's backend (ids `[sqlite]`, `[postgresql]`), with
    LANES_ES_STORE pointing at its store while the test runs; tests edit only copies of it (`copy_of`)."""
    repo, batch_id, url = demo_run
    if url.startswith("postgresql"):
        monkeypatch.setenv("LANES_ES_STORE", url)
    else:
        monkeypatch.delenv("LANES_ES_STORE", raising=False)
    demo = Demo(repo, batch_id, url, monkeypatch)
    yield demo
    demo.drop_copies()


@pytest.fixture(scope="module")
def demo_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's repository as `make_repository` leaves it, made once for the module: a test takes a
    copy (making one spawns git five times from the test process, which forks it whole each time)."""
    from lanes_es.cli.demo import make_repository

    root = tmp_path_factory.mktemp("demo-template") / "repo"
    make_repository(root)
    return root


@pytest.fixture
def plain_repo(tmp_path: Path, demo_template: Path) -> Path:
    """The demo's repository with its own SQLite store (the default): a copy of the template, with no
    repository id or store yet, as a new repository has."""
    import shutil

    root = tmp_path / "repo"
    shutil.copytree(demo_template, root, symlinks=True)
    return root
