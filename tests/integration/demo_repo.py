"""The demo batch as audit tests use it: one completed run (the session fixture in conftest.py),
copied per test before the test edits it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.gitfixtures import git_out, identity_env, run_git
from lanes_es.cli.demo import run_demo


def make_demo(base: Path) -> tuple[Path, str]:
    """Run the demo into `base`, in place (its audit tests are about the checkout that ran it, and copy it
    whole); the repository and its batch id."""
    assert run_demo(str(base), out=lambda _line: None, coordinator=".") == 0
    repo = base / "repo"
    states = [path for path in (repo / ".imm/state/batches").glob("*.json") if not path.name.endswith(".report.json")]
    assert len(states) == 1
    return repo, states[0].stem


class Demo(tuple):  # type: ignore[type-arg]
    """(repository, batch id) of the session's demo batch, and the store it lives in."""

    def __new__(cls, repo: Path, batch_id: str, store: str, monkeypatch: Any) -> "Demo":
        demo = super().__new__(cls, (repo, batch_id))
        demo.store, demo._monkeypatch, demo._copies = store, monkeypatch, []
        demo._moved_aside: list[tuple[Path, Path]] = []  # (where the demo waits, the place it comes back to)
        return demo

    def copy_store(self) -> str:
        """A PostgreSQL store's copy, which LANES_ES_STORE then names for the rest of the test."""
        from tests.store_rows import clone_postgres_schema

        url = clone_postgres_schema(self.store)
        self._copies.append(url)
        self._monkeypatch.setenv("LANES_ES_STORE", url)
        return url

    def move_aside(self, place: Path) -> Path:
        """Move the demo repository to `place` until the test ends (put back by `drop_copies`); where it was."""
        repo = Path(self[0])
        repo.rename(place)  # both under pytest's basetemp: one file system, so a rename
        self._moved_aside.append((place, repo))
        return repo

    def drop_copies(self) -> None:
        from tests.conftest import postgres_statement
        from tests.store_rows import postgres_schema

        for url in self._copies:
            postgres_statement(f"DROP SCHEMA IF EXISTS {postgres_schema(url)} CASCADE")
        for kept, repo in reversed(self._moved_aside):
            shutil.rmtree(repo)
            kept.rename(repo)


def copy_of(demo: tuple[Path, str], tmp_path: Path) -> Path:
    """A copy of the demo repository and of its store (on SQLite the file in the repository's git dir)."""
    copy = tmp_path / "repo"
    shutil.copytree(demo[0], copy, symlinks=True)
    if isinstance(demo, Demo) and demo.store.startswith("postgresql"):
        demo.copy_store()
    return copy


def copy_in_place(demo: Demo, tmp_path: Path) -> Path:
    """A copy of the demo repository standing where the demo stood, and of its store; the demo waits in
    `tmp_path` and is put back when the test ends.

    For a test that ticks in the copy: the confirmation names the demo's checkout, and on a shared store
    (PostgreSQL) a tick anywhere else is refused as batch_repository_changed, while the demo's batch is
    completed and cannot be confirmed again. So the copy takes the demo's path, and on PostgreSQL a schema
    of its own holding the demo schema's rows (on SQLite the store is the file in the copy's git dir)."""
    kept = tmp_path / "demo-moved-aside"
    repo = demo.move_aside(kept)
    shutil.copytree(kept, repo, symlinks=True)
    if demo.store.startswith("postgresql"):
        demo.copy_store()
    return repo


def rewrite_documents(repo: Path, batch_id: str, change: Any) -> None:
    """Edit the state file and the report alike, as someone covering their tracks would."""
    for name in (f"{batch_id}.json", f"{batch_id}.report.json"):
        path = repo / ".imm/state/batches" / name
        document = json.loads(path.read_text())
        change(document)
        path.write_text(json.dumps(document, indent=2) + "\n")


def amend_last_without_audit_pair(repo: Path, batch_id: str) -> None:
    """Amend the batch branch's last commit without its task's audit pair, and make the documents follow."""
    last = git_out(repo, "rev-parse", "HEAD")
    task = git_out(repo, "log", "-n", "1", "--format=%s").split(")")[0].removeprefix("imm(")
    run_git(repo, "rm", "-q", "-r", "--", f".imm/audit/{task}")
    run_git(repo, "commit", "-q", "--amend", "--no-edit", "--no-verify", env=identity_env())
    amended = git_out(repo, "rev-parse", "HEAD")

    def follow(document: dict[str, Any]) -> None:
        document["commits"] = [amended if commit == last else commit for commit in document["commits"]]
        for child in document["children"]:
            if child["commit"] == last:
                child["commit"] = amended

    rewrite_documents(repo, batch_id, follow)
