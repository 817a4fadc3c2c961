"""docs/upstream.md#reason-codes, the reason and error codes no other test produced yet, each on a real repository."""

from __future__ import annotations

import contextlib
import os
import io
import json
from pathlib import Path

import pytest

from lanes_es.adapters.lane_git import GitLaneInspector
from lanes_es.errors import ServiceError
from tests.engine import Task
from tests.engine_more import enroll, make_engine, state_bytes
from tests.gitfixtures import git_out, make_repo, porcelain, run_git
from lanes_es.usecases.authorize import authorize
from lanes_es.usecases.confirmation import prepare_confirmation
from lanes_es.usecases.load import initiative

pytestmark = [pytest.mark.usefixtures("store_url"), pytest.mark.coordinator_worktree]  # each test once on SQLite, once on PostgreSQL


def cli(*args: str) -> tuple[int, str, str]:
    from lanes_es.cli.main import main

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
    assert initiative(engine.deps, engine.slug) is None  # nothing was recorded


def test_confirmation_failed_when_a_confirmation_is_not_newer_than_the_last(tmp_path):
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    engine.authorize()
    confirmation = prepare_confirmation(engine.deps, engine.slug)
    engine.deps.now = lambda: "2001-01-01T00:00:00.000Z"  # a clock set back
    with pytest.raises(ServiceError) as failed:
        authorize(engine.deps, confirmation)
    assert failed.value.code == "confirmation_failed"
    assert "a fresh confirmation must be newer than the one before it" in str(failed.value)
    assert len(initiative(engine.deps, engine.slug).authorizations) == 1


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
    """docs/upstream.md#reason-codes: `current HEAD is unreadable` (the batch branch checked out but unborn)."""
    root = make_repo(tmp_path / "repo")
    base = git_out(root, "rev-parse", "HEAD")
    run_git(root, "checkout", "-q", "--orphan", "imm/initiative-slug")
    lineage = GitLaneInspector().classify_lineage(root, "imm/initiative-slug", base, [], "batch-x")
    assert lineage.kind == "broken"
    assert lineage.message == "batch_head_lineage_broken: current HEAD is unreadable"


def tick_cli(engine, *extra: str) -> tuple[int, dict]:
    code, out, err = cli("--root", engine.root, "tick", engine.slug, "--json", *extra)
    assert out, err
    return code, json.loads(out)


def test_residual_unstaged_changes_a_dirty_submodule_in_the_lane_parks_the_child(tmp_path):
    """docs/upstream.md#the-lane-commit: a change `git add` in the Lane cannot capture (the modified content of
    a submodule inside the scope) parks the child with upstream's text; nothing is committed in the
    Lane or on the batch branch, and the Executor's bytes stay as they were."""
    engine = make_engine(tmp_path, {"s1": Task(["vendor"])})
    assert cli("--root", engine.root, "authorize", engine.slug, "--yes")[0] == 0
    code, report = tick_cli(engine)
    lane = engine.provision("s1", report)
    assert tick_cli(engine, f"--offer=s1={lane}")[0] == 0
    sub = Path(lane, "vendor")  # the Executor vendors a repository and stages it, then edits inside it
    run_git(tmp_path, "init", "-q", "-b", "main", str(sub))
    (sub / "lib.txt").write_text("v1\n")
    run_git(sub, "add", "lib.txt")
    run_git(sub, "-c", "user.name=U", "-c", "user.email=u@example.invalid", "commit", "-q", "-m", "v1")
    run_git(lane, "add", "vendor")
    (sub / "lib.txt").write_text("v2, never committed in the submodule\n")
    engine.submit("s1")
    lane_head, batch_head = git_out(lane, "rev-parse", "HEAD"), engine.head()
    code, report = tick_cli(engine)
    assert code == 3 and report["batch_state"] == "needs_human"
    child = report["children"][0]
    assert child["state"] == "needs_human"
    assert child["reason"] == "residual unstaged changes cannot be captured by the parent repository: vendor"
    assert git_out(lane, "rev-parse", "HEAD") == lane_head and engine.head() == batch_head
    assert (sub / "lib.txt").read_text() == "v2, never committed in the submodule\n"
    assert git_out(lane, "diff", "--cached", "--name-only") == "vendor"  # the index as the Executor left it


GIT_THAT_MOVES_THE_STATE = """#!{python}
# git, except that while the completion verifier reads the audit pairs (its one cat-file --batch
# naming .imm/audit paths) the state file gains a byte: the record moves under the verifier.
import os, subprocess, sys
args = sys.argv[1:]
if "--batch" not in args:
    os.execv({git!r}, [{git!r}, *args])
data = sys.stdin.buffer.read()
if b":.imm/audit/" in data:
    with open({state!r}, "ab") as state:
        state.write(b"\\n")
sys.exit(subprocess.run([{git!r}, *args], input=data).returncode)
"""


def test_unstable_evidence_when_the_record_moves_while_the_completion_verifier_reads(tmp_path):
    """docs/upstream.md#the-completion-verifier through `lanes-es verify`: everything is re-read at the end, and a state
    file that changed while the batch was being verified is `unstable_evidence` (exit 1), though
    every other check held; the same batch verifies when nothing moves."""
    import shutil
    import subprocess
    import sys

    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    engine.authorize()
    assert engine.run_to_end({"s1": ("one.txt", "one\n")})["batch_state"] == "completed"
    lanes_es = str(Path(sys.executable).with_name("lanes-es"))
    verify = [lanes_es, "--root", engine.root, "verify", engine.batch.id, "--json"]
    steady = subprocess.run(verify, capture_output=True, text=True)
    assert steady.returncode == 0, steady.stdout + steady.stderr
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    wrapper.write_text(GIT_THAT_MOVES_THE_STATE.format(python=sys.executable, git=shutil.which("git"),
                                                       state=str(engine.state_file())))
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}"}
    moved = subprocess.run(verify, capture_output=True, text=True, env=env)
    assert moved.returncode == 1, moved.stdout + moved.stderr
    findings = json.loads(moved.stdout)["findings"]
    assert [(f["check"], f["code"]) for f in findings] == [("completion", "unstable_evidence")]
    assert findings[0]["message"] == "the state file changed while the batch was being verified"


def test_dirty_working_tree_when_index_flags_hide_a_change_from_the_first_tick(tmp_path, monkeypatch):
    """docs/upstream.md#the-batch-branch-preflight: a file marked skip-worktree (or assume-unchanged) could hide the user's
    change from status, so the new batch's preflight refuses it: no branch, no batch, no flag cleared."""
    monkeypatch.setenv("LANES_ES_COORDINATOR", ".")  # about the coordinator checkout itself: in place
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    assert cli("--root", engine.root, "authorize", engine.slug, "--yes")[0] == 0
    run_git(engine.root, "update-index", "--skip-worktree", "base.txt")
    Path(engine.root, "base.txt").write_text("the user's hidden change\n")
    code, report = tick_cli(engine)
    assert code == 2 and report["batch_state"] == "rejected"
    assert report["reason"] == ("dirty_working_tree: unsupported index flags (assume-unchanged or skip-worktree) "
                                "on base.txt")
    assert engine.batch is None and git_out(engine.root, "branch", "--list", "imm/*") == ""
    assert git_out(engine.root, "ls-files", "-v", "base.txt") == "S base.txt"
    assert Path(engine.root, "base.txt").read_text() == "the user's hidden change\n"


def test_dirty_outside_scope_when_index_flags_hide_a_change_in_the_lane(tmp_path):
    """docs/upstream.md#the-lane-commit: the same flags in a Lane park the child at its lane commit."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    engine.authorize()
    enroll(engine, "s1")
    lane = engine.lane("s1")
    run_git(lane, "update-index", "--assume-unchanged", "base.txt")
    engine.deliver("s1", "one.txt", "one\n")
    report = engine.tick()
    assert report["children"][0]["reason"] == "dirty_outside_scope: index flags hide changes to base.txt"
    assert report["commits"] == [] and git_out(lane, "rev-parse", "HEAD") == git_out(engine.root, "rev-parse", "main")


def test_working_tree_unstaged_names_a_symlink_whose_bytes_cannot_be_read(tmp_path):
    """docs/upstream.md#lane-leak-restore: a dirty path whose bytes cannot be hashed as a file (a symlink of the
    user's) is of unknown origin: refused with the path and why, the link left as it was."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    engine.authorize()
    enroll(engine, "s1")
    os.symlink("/etc/hostname", Path(engine.root, "mine"))
    code, report = tick_cli(engine)
    assert code == 2
    assert report["reason"].startswith("working_tree_unstaged: branch preflight failed: working tree has unstaged "
                                       "or untracked changes (not restored: mine: its bytes cannot be read)")
    assert os.readlink(Path(engine.root, "mine")) == "/etc/hostname"


def test_a_parked_child_needs_a_human_decision_when_the_last_sibling_lands_later(tmp_path):
    """docs/upstream.md#the-steps-of-a-tick: a batch that goes idle in a tick that parked nothing, with a child
    parked earlier, settles needs_human with upstream's fixed reason."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"]), "s2": Task(["two.txt"])})
    engine.authorize(max_parallel=2)
    enroll(engine, "s1", "s2")
    run_git(engine.root, "worktree", "remove", "--force", engine.lane("s1"))  # s1's Lane and its run are gone
    report = engine.tick()
    assert report["batch_state"] == "running" and report["children"][0]["state"] == "needs_human"
    assert report["reason"] is None
    engine.deliver("s2", "two.txt", "two\n")
    report = engine.tick()
    assert report["batch_state"] == "needs_human"
    assert report["reason"] == "a parked child needs a human decision"
    assert [c["state"] for c in report["children"]] == ["needs_human", "integrated"]
