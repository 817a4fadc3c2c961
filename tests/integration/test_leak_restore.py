"""Lane leak restore on real repositories (issue 3): bytes a Lane wrote into the coordinator
checkout by mistake are restored with a reversible backup and recorded in `restores`
(LANE-LEAK-03); nothing is touched when any path's origin is unknown, `.imm/` is never
restored, and staged user work is never a Lane write (LANE-LEAK-06)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from tests.engine import Engine, Task
from tests.engine_more import enroll, make_engine, state_bytes
from tests.gitfixtures import git_out, porcelain, run_git, write_file

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")

LEAKS = {"a.txt": "lane a\n", "base.txt": "lane edit\n"}


def leaking_lane(tmp_path: Path) -> Engine:
    """task-a enrolled; its Lane holds a new a.txt and an edited base.txt, and the same bytes leaked
    into the coordinator checkout (an Executor that wrote to the wrong directory)."""
    engine = make_engine(tmp_path, {"task-a": Task(["a.txt", "base.txt"])})
    engine.authorize()
    enroll(engine, "task-a")
    for path, content in LEAKS.items():
        write_file(engine.lane("task-a"), path, content)
        write_file(engine.root, path, content)
    return engine


def test_lane_bytes_leaked_into_the_coordinator_are_restored_with_a_reversible_backup(tmp_path):  # LANE-LEAK-03
    engine = leaking_lane(tmp_path)
    report = engine.tick()
    assert porcelain(engine.root) == ""
    assert Path(engine.root, "base.txt").read_text() == "base\n"
    assert not Path(engine.root, "a.txt").exists()
    [restore] = engine.batch.record["restores"]
    assert sorted((p["path"], p["kind"], p["lane_task_id"]) for p in restore["paths"]) == [
        ("a.txt", "untracked", "task-a"), ("base.txt", "modified", "task-a")]
    stamp = "".join(ch for ch in restore["at"] if ch.isdigit() or ch in "TZ")
    assert restore["backup"] == f".imm/state/batches/restores/{engine.batch.id}/{stamp}"
    backup = Path(engine.root, restore["backup"])
    assert {path: (backup / "files" / path).read_text() for path in LEAKS} == LEAKS
    assert "+lane edit" in (backup / "restore.patch").read_text()
    manifest = json.loads((backup / "restore.json").read_text())
    assert manifest == {"at": restore["at"], "backup": restore["backup"], "paths": restore["paths"],
                        "undo": "copy each file under files/ back to the same repository path"}
    assert report["restores"] == engine.batch.record["restores"]
    # the Lane keeps its own work, and the Executor's delivery goes on to integration
    assert {path: Path(engine.lane("task-a"), path).read_text() for path in LEAKS} == LEAKS
    engine.submit("task-a")
    report = engine.tick()
    assert report["batch_state"] == "completed"
    assert git_out(engine.root, "show", f"imm/{engine.slug}:base.txt") == "lane edit"
    # the undo the manifest names gives the leaked bytes back
    for path in LEAKS:
        shutil.copy(backup / "files" / path, Path(engine.root, path))
    assert Path(engine.root, "a.txt").read_text() == "lane a\n"


def dot_imm(engine: Engine) -> None:
    write_file(engine.root, ".imm/notes.txt", "lane a\n")


def unknown_origin(engine: Engine) -> None:
    write_file(engine.root, "stray.txt", "the user's own file\n")


def staged_user_work(engine: Engine) -> None:
    run_git(engine.root, "add", "--", "base.txt")


def not_the_lanes_bytes(engine: Engine) -> None:
    write_file(engine.root, "base.txt", "the user's edit\n")


@pytest.mark.parametrize("dirty, path, why", [
    (dot_imm, ".imm/notes.txt", "Immune-Brain state is never restored"),
    (unknown_origin, "stray.txt", "its bytes match no Lane of this batch"),
    (staged_user_work, "base.txt", "status M  is not a Lane write"),
    (not_the_lanes_bytes, "base.txt", "its bytes match no Lane of this batch"),
], ids=["dot_imm", "unknown_origin", "staged_user_work", "not_the_lanes_bytes"])
def test_nothing_is_touched_when_any_path_is_not_provably_a_lanes(tmp_path, dirty: Callable[[Engine], None],
                                                                  path: str, why: str):
    """LANE-LEAK-06, and upstream's preflight (docs/upstream.md#lane-leak-restore, #reason-codes): the
    tick refuses, naming the path and why, touches no file, and never tells the user to `git add`."""
    engine = leaking_lane(tmp_path)
    dirty(engine)
    status = porcelain(engine.root)
    files = {path: Path(engine.root, path).read_bytes() for path in ("a.txt", "base.txt")}
    cached = git_out(engine.root, "diff", "--cached", "--name-only")
    before = state_bytes(engine)
    report = engine.tick()
    assert report["batch_state"] == "rejected"
    assert report["reason"].startswith(
        f"working_tree_unstaged: branch preflight failed: working tree has unstaged or untracked changes "
        f"(not restored: {path}: {why}); {path} is not a write of this batch's Lanes")
    assert "git add" not in report["reason"] + report["next_action"]
    assert engine.batch.batch_state == "running"
    assert type(list(engine.deps.store.events(engine.batch.id))[-1]).__name__ == "TickRejected"
    assert porcelain(engine.root) == status
    assert {path: Path(engine.root, path).read_bytes() for path in files} == files
    assert git_out(engine.root, "diff", "--cached", "--name-only") == cached
    assert "restores" not in engine.batch.record and "restores" not in report
    assert not Path(engine.root, ".imm/state/batches/restores").exists()
    assert state_bytes(engine) == before


def test_a_restore_git_cannot_do_changes_nothing_names_the_backup_and_goes_on_next_tick(tmp_path):
    """upstream's "failed to restore <path> from HEAD; its bytes are backed up under <backup>": here
    another git process holds the index lock. The tick is refused with that text (its only event a
    TickRejected), the checkout keeps every leaked byte, the backup holds them too, and once the
    lock is gone the next tick restores them."""
    engine = leaking_lane(tmp_path)
    lock = Path(engine.root, ".git/index.lock")
    lock.touch()
    events = len(list(engine.deps.store.events(engine.batch.id)))
    report = engine.tick()
    assert report["batch_state"] == "rejected"
    reason = report["reason"]
    assert reason.startswith("leak_restore_failed: failed to restore base.txt from HEAD; its bytes are backed up "
                             f"under .imm/state/batches/restores/{engine.batch.id}/"), reason
    assert "index.lock" in reason and f"lanes-es tick {engine.slug}" in reason
    assert {path: Path(engine.root, path).read_text() for path in LEAKS} == LEAKS
    backup = Path(engine.root, reason.split("backed up under ", 1)[1].split(" ", 1)[0])
    assert (backup / "files/base.txt").read_text() == LEAKS["base.txt"]
    logged = [type(event).__name__ for event in engine.deps.store.events(engine.batch.id)][events:]
    assert logged == ["TickRejected"] and not engine.batch.record.get("restores")
    lock.unlink()
    engine.tick()
    [restore] = engine.batch.record["restores"]
    assert sorted(p["path"] for p in restore["paths"]) == ["a.txt", "base.txt"]
    assert Path(engine.root, "base.txt").read_text() == "base\n" and not Path(engine.root, "a.txt").exists()
