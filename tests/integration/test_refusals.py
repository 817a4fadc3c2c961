"""A refusal writes only its audit event (and the checkpoint that anchors it), through the real command line,
on both backends, and says so on stderr in CLI words."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lanes_es.exit_codes import EXIT_REFUSED
from tests.integration.test_user_errors import SLUG, lanes, rows, started
from tests.store_rows import StoreRows, store_url_of

pytestmark = pytest.mark.usefixtures("store_url")  # each test once on SQLite, once on PostgreSQL


@pytest.fixture
def repo(plain_repo: Path) -> Path:
    return plain_repo  # the demo's repository (tests/integration/conftest.py), its store the test's


def test_a_rejected_tick_says_so_on_stderr_in_cli_words_and_records_only_the_refusal(repo):
    batch_id = started(repo)
    before, files, refs = rows(repo), _projections(repo), _refs(repo)

    refused = lanes(repo, "tick", SLUG, "--max-parallel", "3")
    as_json = lanes(repo, "tick", SLUG, "--max-parallel", "3", "--json")

    assert refused.returncode == EXIT_REFUSED and refused.stdout == "", refused.stdout
    line = refused.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert line.startswith("lanes-es: tick refused: batch_parallel_mismatch: the recorded batch runs with "
                           "max_parallel 2; nothing was changed"), line
    assert line.endswith(f"next: fix what the reason names, then `lanes-es tick {SLUG}`"), line
    assert "start_unattended_batch" not in line, line
    assert as_json.returncode == EXIT_REFUSED and as_json.stderr.strip().startswith("lanes-es: tick refused: ")
    assert json.loads(as_json.stdout)["batch_state"] == "rejected"  # the report stays data on stdout for scripts
    newest = max(version for aggregate, version in before if aggregate == batch_id)
    added = StoreRows(store_url_of(repo)).query("SELECT originator_id, originator_version, topic FROM {events} "
                                                 "WHERE originator_version > ? OR originator_id <> ?", newest, batch_id)
    assert sorted((aggregate, version, topic.rsplit(":", 1)[-1]) for aggregate, version, topic in added
                  if (aggregate, version) not in before) == [
        (batch_id, newest + 1, "TickRejected"), (batch_id, newest + 2, "TickRejected")]  # its audit event, each
    checkpoint = f"refs/lanes-es/checkpoints/{batch_id}"
    assert _projections(repo) == files and _refs(repo).keys() == refs.keys()  # no projection, Lane or branch
    assert {ref: sha for ref, sha in _refs(repo).items() if sha != refs[ref]}.keys() == {checkpoint}  # anchors them


def _projections(repo: Path) -> dict[str, bytes]:
    return {str(path): path.read_bytes() for path in (repo / ".imm").rglob("*") if path.is_file()}


def _refs(repo: Path) -> dict[str, str]:
    listed = subprocess.run(["git", "-C", str(repo), "for-each-ref", "--format=%(refname) %(objectname)"],
                            capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ") for line in listed.splitlines())


def test_refused_first_commands_on_a_fresh_repository_make_no_store_and_no_repository_id(repo, store_url, monkeypatch,
                                                                                         tmp_path):
    """Each refused first command, through the real command line, leaves no store (SQLite: no
    .git/lanes-es/events.sqlite, the repository's own; PostgreSQL: no table, type or function in the schema),
    no repository id, no coordinator worktree, no lock or other file under .git/lanes-es. On main a refused
    authorize, tick or retire made the store and the id, and a confirmation refused at the gate its coordinator
    worktree. The first command that records makes them."""
    if not store_url.startswith("postgresql"):
        monkeypatch.delenv("LANES_ES_STORE")  # the repository's own store, where a new repository has none
    (repo / "dirty.txt").write_text("not committed\n")
    refused = {
        "preflight": lanes(repo, "authorize", SLUG, "--yes"),  # dirty_working_tree, before the confirmation
        "bad option": lanes(repo, "authorize", SLUG, "--yes", "--max-parallel", "0"),
        "plan": lanes(repo, "plan", "no-such-initiative"),
        "tick": lanes(repo, "tick", SLUG),  # no authorization yet
        "retire": lanes(repo, "retire", SLUG, "--yes"),  # no batch yet
        "run": lanes(repo, "run", SLUG, "--yes", "--max-parallel", "1", "--lanes-dir", str(tmp_path / "lanes"),
                     "--executor", str(tmp_path / "no-such-executor")),
    }
    (repo / "dirty.txt").unlink()
    worktree = {"LANES_ES_COORDINATOR": ""}  # the default: a new batch in a coordinator worktree of its own
    refused["gate"] = lanes(repo, "authorize", SLUG, env=worktree)  # no terminal to ask on, the coordinator made
    refused["run at the gate"] = lanes(repo, "run", SLUG, "--max-parallel", "1", "--lanes-dir", str(tmp_path / "lanes"),
                                       "--executor", "/bin/true", env=worktree)
    for what, result in refused.items():
        assert result.returncode == EXIT_REFUSED, (what, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr, (what, result.stderr)
    assert not (repo / ".git" / "lanes-es").exists(), sorted(map(str, (repo / ".git" / "lanes-es").rglob("*")))
    assert not (repo / ".git" / "worktrees").exists()  # the coordinator worktree made for the gate is gone again
    assert _schema_objects(store_url) in (None, 0)

    assert lanes(repo, "authorize", SLUG, "--yes").returncode == 0  # the first append makes both
    assert (repo / ".git" / "lanes-es" / "repository-id").exists() and rows(repo)
    assert _schema_objects(store_url) != 0  # eventsourcing's table, its index and sequence, row type and function


def _schema_objects(store_url: str) -> int | None:
    """How many relations, types and functions the test's PostgreSQL schema holds (None on SQLite)."""
    if not store_url.startswith("postgresql"):
        return None
    import psycopg

    from tests.conftest import POSTGRES_SERVER

    schema = store_url.rsplit("schema=", 1)[1]
    with psycopg.connect(POSTGRES_SERVER, autocommit=True) as connection:
        return connection.execute(
            "SELECT (SELECT count(*) FROM pg_class WHERE relnamespace = n.oid) + (SELECT count(*) FROM pg_type t "
            "WHERE typnamespace = n.oid AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.reltype = t.oid)) + "
            "(SELECT count(*) FROM pg_proc WHERE pronamespace = n.oid) FROM pg_namespace n WHERE nspname = %s",
            (schema,)).fetchone()[0]
