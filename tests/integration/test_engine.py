"""The engine end to end on real repositories and worktrees: the main path of issue 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.engine import Engine, Task, observe
from tests.gitfixtures import fails_if_exists, git_out, run_git, write_file

# Every test here goes through the store: run each on SQLite and on PostgreSQL (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("store_url")


def disjoint_pair(tmp_path: Path) -> Engine:
    return Engine.create(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"])})


def test_two_disjoint_tasks_in_flight_and_an_overlapping_one_waits(tmp_path):  # LANE-SCH-14
    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"]),
                                      "task-c": Task(["a.txt", "c.txt"])})
    engine.authorize(max_parallel=3)
    report = engine.tick()
    base = engine.head()
    assert [(h["role"], h["task_id"]) for h in report["handoffs"]] == [("lane-steward", "task-a"), ("lane-steward", "task-b")]
    lanes = {task: engine.provision(task, report) for task in ("task-a", "task-b")}
    report = engine.tick(offers=lanes)
    assert engine.states() == ["enrolled", "enrolled", "pending"]
    assert [h["task_id"] for h in report["handoffs"] if h["role"] == "executor"] == ["task-a", "task-b"]
    assert not any(h.get("action") == "provision" for h in report["handoffs"])
    engine.deliver("task-a", "a.txt", "a\n")
    engine.deliver("task-b", "b.txt", "b\n")
    report = engine.tick()
    assert engine.states() == ["integrated", "integrated", "pending"]
    assert sorted(engine.subjects(base)) == ["imm(task-a): Deliver task-a", "imm(task-b): Deliver task-b"]
    assert [h["task_id"] for h in report["handoffs"] if h.get("action") == "provision"] == ["task-c"]


def test_in_flight_never_above_max_parallel(tmp_path):
    engine = Engine.create(tmp_path, {f"t{i}": Task([f"f{i}.txt"]) for i in range(4)})
    engine.authorize(max_parallel=2)
    report = engine.tick()
    lanes = {}
    for handoff in report["handoffs"]:
        lanes[handoff["task_id"]] = engine.provision(handoff["task_id"], report)
    extra = engine.provision("t2", base=engine.head())
    report = engine.tick(offers={**lanes, "t2": extra})
    in_flight = [s for s in engine.states() if s in ("lane_admitted", "enrolled", "settled", "lane_committed")]
    assert len(in_flight) == 2
    assert report["lane_refusals"] == [{"task_id": "t2", "path": extra, "reason": "batch_lane_unknown_child"}]


@pytest.mark.parametrize("case", ["foreign", "coordinator", "branch", "base", "dirty", "occupied", "unknown"])
def test_every_admission_refusal_writes_nothing(tmp_path, case):  # LANE-ADM-04..09
    """Ports LANE-ADM-04, LANE-ADM-05, LANE-ADM-07, LANE-ADM-08 and LANE-ADM-09."""
    engine = Engine.create(tmp_path, {"task-a": Task(["a.txt"]), "task-b": Task(["b.txt"], blocked_by=["task-a"])})
    engine.authorize()
    report = engine.tick()
    task = "task-a"
    if case == "foreign":
        path = str(tmp_path / "foreign")
        run_git(tmp_path, "init", "-q", "-b", "imm-lane/initiative-slug/task-a", path)
        write_file(path, "x.txt", "x")
        run_git(path, "add", "-A")
        run_git(path, "-c", "user.name=x", "-c", "user.email=x@y", "commit", "-qm", "foreign")
        path = os.path.realpath(path)
    elif case == "coordinator":
        path = engine.root
    elif case == "branch":
        path = engine.provision(task, report)
        run_git(path, "checkout", "-q", "-b", "scratch")
    elif case == "base":
        path = engine.provision(task, report)
        write_file(path, "extra.txt", "x")
        run_git(path, "add", "-A")
        run_git(path, "-c", "user.name=x", "-c", "user.email=x@y", "commit", "-qm", "beyond base")
    elif case == "dirty":
        path = engine.provision(task, report)
        write_file(path, "untracked.txt", "x")
    elif case == "occupied":
        path = engine.provision(task, report)
        claim = Path(path, ".imm/state/kernel/claim.json")
        claim.parent.mkdir(parents=True)
        claim.write_text(json.dumps({"task_id": "foreign-task", "run_id": "run-x", "batch_id": "other",
                                     "claimed_at": "2026-01-01T00:00:00.000Z"}))
    else:
        task = "task-b"
        path = engine.provision("task-b", base=engine.head())
    expected = {"foreign": "batch_lane_foreign_repository", "coordinator": "batch_lane_is_coordinator",
                "branch": "batch_lane_branch_mismatch", "base": "batch_lane_base_mismatch",
                "dirty": "batch_lane_dirty", "occupied": "batch_lane_occupied",
                "unknown": "batch_lane_unknown_child"}[case]
    before = observe(engine.root, path)
    report = engine.tick(offers={task: path})
    assert report["lane_refusals"] == [{"task_id": task, "path": path, "reason": expected}]
    assert engine.states() == ["pending", "pending"]
    assert observe(engine.root, path) == before


def commit_on_batch_branch(engine: Engine, path: str, content: str, message: str = "user edit") -> str:
    """A user's own commit on the batch branch in the coordinator: a fast-forward the tick adopts."""
    write_file(engine.root, path, content)
    run_git(engine.root, "add", "--", path)
    run_git(engine.root, "-c", "user.name=User", "-c", "user.email=user@example.invalid", "commit", "-qm", message)
    return engine.head()


def test_conflict_and_broken_sibling_acceptance_park_with_the_branch_unmoved(tmp_path):
    """Ports LANE-LCM-02 and LANE-INT-15."""
    engine = Engine.create(tmp_path, {
        "alpha": Task(["alpha.txt"], verification=fails_if_exists("breaker.txt")),
        "breaker": Task(["breaker.txt"]),
        "conflict": Task(["base.txt"]),
        "dependent": Task(["dep.txt"], blocked_by=["conflict"]),
        "disjoint": Task(["disjoint.txt"]),
    })
    engine.authorize(max_parallel=4)
    report = engine.tick()
    starters = ["alpha", "breaker", "conflict", "disjoint"]
    assert [h["task_id"] for h in report["handoffs"]] == starters
    engine.tick(offers={t: engine.provision(t, report) for t in starters})
    assert engine.states() == ["enrolled", "enrolled", "enrolled", "enrolled", "pending"]
    user_head = commit_on_batch_branch(engine, "base.txt", "user edit\n")
    for task_id, path in [("alpha", "alpha.txt"), ("breaker", "breaker.txt"), ("conflict", "base.txt"),
                          ("disjoint", "disjoint.txt")]:
        engine.deliver(task_id, path, f"{task_id}\n")
    # the user's commit moved the batch branch: the tick adopts it and integrates onto it
    report = engine.tick()
    children = {c["task_id"]: c for c in report["children"]}
    assert report["batch_state"] == "needs_human"
    assert children["alpha"]["state"] == "integrated"
    assert children["disjoint"]["state"] == "integrated"
    assert children["breaker"]["state"] == "needs_human"
    assert children["breaker"]["reason"].startswith("batch_integration_check_failed: ")
    assert children["conflict"]["state"] == "needs_human"
    assert children["conflict"]["reason"].startswith("batch_integration_conflict: ")
    assert children["dependent"] == {**children["dependent"], "state": "skipped_blocked",
                                     "reason": "dependency conflict parked"}
    assert engine.batch.record["adopted_heads"] == [{"from": engine.batch.record["base_head"], "to": user_head}]
    # the parked changes never reached the batch branch; the Lanes and their commits are kept
    tree = git_out(engine.root, "ls-tree", "-r", "--name-only", "imm/initiative-slug").split()
    assert "breaker.txt" not in tree and "alpha.txt" in tree and "disjoint.txt" in tree
    assert git_out(engine.root, "show", "imm/initiative-slug:base.txt") == "user edit"
    assert report["commits"] == [children["alpha"]["commit"], children["disjoint"]["commit"]]
    for task_id in ("breaker", "conflict"):
        lane = children[task_id]["lane"]
        assert Path(lane["path"]).is_dir()
        assert git_out(engine.root, "rev-parse", lane["branch"]) == lane["lane_commit"]


def test_a_candidate_that_lost_the_lane_change_fails_the_identity_check(tmp_path):  # LANE-INT-05 end to end
    engine = Engine.create(tmp_path, {"task-a": Task(["g.txt"])})
    engine.authorize()
    report = engine.tick()
    engine.tick(offers={"task-a": engine.provision("task-a", report)})
    engine.deliver("task-a", "g.txt", "same\n")
    # the batch branch gains the identical edit, so the replayed Lane change comes out different
    before = commit_on_batch_branch(engine, "g.txt", "same\n")
    report = engine.tick()  # the moved head is adopted; the Lane's change replayed onto it is not the Lane's
    child = report["children"][0]
    assert child["state"] == "needs_human"
    assert child["reason"].startswith("batch_integration_conflict: ")
    assert "does not carry the lane commit" in child["reason"]
    assert engine.head() == before


def test_state_file_rebuilds_byte_for_byte_and_edits_are_reported(tmp_path, capsys):
    from lanes_es.cli.main import main

    engine = disjoint_pair(tmp_path)
    batch_id = engine.authorize(max_parallel=2)
    report = engine.tick()
    engine.tick(offers={t: engine.provision(t, report) for t in ("task-a", "task-b")})
    original = engine.state_file().read_bytes()
    engine.state_file().unlink()
    assert main(["--root", engine.root, "rebuild", batch_id]) == 0
    assert engine.state_file().read_bytes() == original
    edited = original.replace(b'"enrolled"', b'"settled"', 1)
    engine.state_file().write_bytes(edited)
    capsys.readouterr()
    assert main(["--root", engine.root, "rebuild", batch_id, "--check"]) == 1
    assert "differs from the log" in capsys.readouterr().out
    assert engine.state_file().read_bytes() == edited  # --check writes nothing
    assert main(["--root", engine.root, "rebuild", "--all"]) == 1  # the drift found, and repaired
    assert engine.state_file().read_bytes() == original
    assert main(["--root", engine.root, "rebuild", "--all"]) == 0


def test_the_demo_completes_with_one_commit_per_task_and_no_drift(tmp_path, capsys):
    from lanes_es.cli.demo import TASKS, run_demo

    lines: list[str] = []
    assert run_demo(str(tmp_path / "demo"), 3, out=lines.append) == 0
    repo = tmp_path / "demo" / "repo"
    log = git_out(repo, "log", "--format=%H %s%n%(trailers:key=Immune-Brain-Batch,valueonly)", "main..imm/demo")
    subjects = [line.split(" ", 1)[1] for line in log.splitlines() if line and " imm(" in line]
    tasks = [subject[len("imm("):subject.index(")")] for subject in subjects]
    assert sorted(tasks) == sorted(TASKS)
    order = list(reversed(tasks))
    for task_id, (_, blocked_by, *_rest) in TASKS.items():
        for blocker in blocked_by:
            assert order.index(blocker) < order.index(task_id)
    for commit in git_out(repo, "rev-list", "main..imm/demo").split():
        files = git_out(repo, "diff-tree", "--no-commit-id", "--name-only", "-r", commit).split()
        task = next(t for t in TASKS if any(f.startswith(f".imm/audit/{t}/") for f in files))
        assert any(f.endswith("/task-record.json") for f in files)
        assert any(f.endswith("/terminal-proof.json") for f in files)
        assert task in git_out(repo, "log", "-1", "--format=%s", commit)
    assert any("no drift" in line for line in lines)
