"""contracts §5, the reason and error codes no other test produced yet, each on a real repository."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from lanes_es.adapters.lane_git import GitLanes
from lanes_es.service import ServiceError
from tests.engine import Task
from tests.engine_more import enroll, make_engine, state_bytes
from tests.gitfixtures import git_out, make_repo, porcelain, run_git

pytestmark = pytest.mark.usefixtures("store_url")  # each test once on SQLite, once on PostgreSQL


def cli(*args: str) -> tuple[int, str, str]:
    from tools.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_invalid_slug_is_refused_before_anything_is_read(tmp_path):
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    code, out, err = cli("--root", engine.root, "plan", "-no good")
    assert (code, out) == (2, "")
    assert err.startswith("lanes-es: invalid_slug: initiative_slug '-no good' is invalid")


def test_empty_enrollable_set_when_every_task_is_excluded(tmp_path):
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"], risk="critical")})
    code, out, err = cli("--root", engine.root, "authorize", engine.slug, "--yes")
    assert (code, out) == (2, "")
    assert "empty_enrollable_set: batch plan has no enrollable children; nothing to confirm" in err
    assert engine.service.initiative(engine.slug) is None  # nothing was recorded


def test_confirmation_failed_when_a_confirmation_is_not_newer_than_the_last(tmp_path):
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    engine.authorize()
    confirmation = engine.service.confirmation(engine.slug)
    engine.service.now = lambda: "2001-01-01T00:00:00.000Z"  # a clock set back
    with pytest.raises(ServiceError) as failed:
        engine.service.authorize(confirmation)
    assert failed.value.code == "confirmation_failed"
    assert "a fresh confirmation must be newer than the one before it" in str(failed.value)
    assert len(engine.service.initiative(engine.slug).authorizations) == 1


def test_working_tree_dirty_when_the_user_staged_work_of_their_own(tmp_path):
    """Staged work is never a Lane's write and never restored: with only staged changes the preflight
    refuses as `working_tree_dirty` (upstream checks them against a serial child's scope instead,
    `working_tree_out_of_scope`), naming the path and why; the index and the bytes stay as they were."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    engine.authorize()
    enroll(engine, "s1")
    Path(engine.root, "mine.txt").write_bytes(b"the user's staged bytes\n")
    run_git(engine.root, "add", "--", "mine.txt")
    status, before = porcelain(engine.root), state_bytes(engine)
    report = engine.tick()
    assert report["batch_state"] == "rejected"
    assert report["reason"].startswith("working_tree_dirty: branch preflight failed: working tree is dirty "
                                       "(not restored: mine.txt: status A  is not a Lane write)")
    assert porcelain(engine.root) == status and state_bytes(engine) == before
    assert Path(engine.root, "mine.txt").read_bytes() == b"the user's staged bytes\n"
    assert git_out(engine.root, "diff", "--cached", "--name-only") == "mine.txt"


def test_lineage_broken_when_the_batch_head_is_unreadable(tmp_path):
    """contracts §5 Lineage: `current HEAD is unreadable` (the batch branch checked out but unborn)."""
    root = make_repo(tmp_path / "repo")
    base = git_out(root, "rev-parse", "HEAD")
    run_git(root, "checkout", "-q", "--orphan", "imm/initiative-slug")
    lineage = GitLanes().classify_lineage(root, "imm/initiative-slug", base, [], "batch-x")
    assert lineage.kind == "broken"
    assert lineage.message == "batch_head_lineage_broken: current HEAD is unreadable"
