"""Issue 14: the engine fails closed whenever the world moves under a running batch.

Each move (the Initiative's `Blocked by:` edited and committed in the coordinator, an intent
edited, the batch branch rewritten by someone else or switched away from, the coordinator
dirtied with a user's own file, the batch ticked from another checkout) is driven through the
command line and through the autopilot (`lanes-es run`), on real repositories: the batch parks
or the tick refuses with upstream's reason, no commit lands on the batch branch after the move,
and the user's files are byte-identical afterwards. A fast-forward of the batch branch (a user's
own commit on it) is the one move that goes on: adopted in the tick that finds it, as upstream
(issue 27).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.engine import Engine, SteppingClock, Task
from tests.engine_more import make_engine
from tests.gitfixtures import all_refs, git_out, run_git
from tests.integration.world_moves import make_move
from lanes_es.usecases.confirmation import BatchOptions
from lanes_es.usecases.load import active_batch, initiative

PROJECT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("store_url")  # each test once on SQLite, once on PostgreSQL

# move -> (exit code of the tick after it, the reason's code, the batch state the log then holds)
EXPECTED = {
    "initiative": (3, "batch_plan_digest_changed", "needs_human"),
    "intent": (3, "batch_plan_digest_changed", "needs_human"),
    "intent_uncommitted": (2, "working_tree_unstaged", "running"),
    "switch": (3, "batch_branch_changed", "needs_human"),
    "rewrite": (3, "batch_head_lineage_broken", "failed"),
    "dirty": (2, "working_tree_unstaged", "running"),
}


def cli(*args: str) -> tuple[int, str, str]:
    from lanes_es.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def tick(engine: Engine, *extra: str) -> tuple[int, dict[str, Any]]:
    code, out, err = cli("--root", engine.root, "tick", engine.slug, "--json", *extra)
    assert out, err
    return code, json.loads(out)


def branch_head(engine: Engine) -> str:
    return git_out(engine.root, "rev-parse", f"imm/{engine.slug}")


def files_now(engine: Engine, files: dict[str, bytes]) -> dict[str, bytes]:
    return {path: Path(engine.root, path).read_bytes() for path in files}


def mid_batch(tmp_path: Path) -> Engine:
    """Through the CLI: s1 and s2 in their Lanes, s1 delivered and submitted; the next tick would run
    its QA, commit it and integrate it."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"]), "s2": Task(["two.txt"])})
    assert cli("--root", engine.root, "authorize", engine.slug, "--max-parallel", "2", "--yes")[0] == 0
    code, report = tick(engine)
    assert code == 0
    offers = [f"--offer={task}={engine.provision(task, report)}" for task in ("s1", "s2")]
    code, report = tick(engine, *offers)
    assert code == 0 and [c["state"] for c in report["children"]] == ["enrolled", "enrolled"]
    engine.deliver("s1", "one.txt", "one\n")
    return engine


@pytest.mark.parametrize("move", sorted(EXPECTED))
def test_a_move_through_the_cli_parks_or_refuses_and_nothing_lands_after_it(tmp_path, move):
    engine = mid_batch(tmp_path)
    files = make_move(move, engine.root, engine.slug, "s2")
    head_after_move = branch_head(engine)
    exit_code, code, state = EXPECTED[move]
    for again in (False, True):  # and again: the next tick does not go on either
        got, report = tick(engine)
        assert got == exit_code
        assert report["reason"].startswith(f"{code}: ") or (
            again and report["reason"] in ("the parked batch requires a fresh literal-user confirmation",
                                           f"terminal state already reached: {state}"))
        assert engine.batch.batch_state == state
        assert branch_head(engine) == head_after_move
        assert engine.batch.record["commits"] == [] and report["commits"] == []
        assert files_now(engine, files) == files
        assert "git add" not in report["reason"] + report["next_action"]
    events = [type(event).__name__ for event in engine.deps.store.events(engine.batch.id)]
    assert "Integrated" not in events and "LaneCommitted" not in events
    if state in ("needs_human", "failed"):  # the children in flight parked with the reason; their Lanes are kept
        assert [(c["state"], c["reason"].split(":")[0]) for c in engine.batch.record["children"]] == [
            ("needs_human", code), ("needs_human", code)]
        assert os.path.isdir(engine.lane("s1")) and os.path.isdir(engine.lane("s2"))
    else:  # refused: the record is as it was, the refusal is in the log
        assert events[-1] == "TickRejected"
        assert [c["state"] for c in engine.batch.record["children"]] == ["enrolled", "enrolled"]


def test_a_changed_plan_goes_on_only_as_a_new_confirmation_of_the_new_plan(tmp_path):
    """Re-confirming the parked batch does not cover the new plan (refused, nothing written); retiring
    it and authorizing the Initiative confirms the new plan as a new batch."""
    engine = mid_batch(tmp_path)
    files = make_move("initiative", engine.root, engine.slug, "s2")
    old = engine.batch.id
    assert tick(engine)[0] == 3
    code, _, err = cli("--root", engine.root, "authorize", engine.slug, "--max-parallel", "2", "--yes")
    assert code == 2 and "batch_plan_digest_changed" in err and "lanes-es retire" in err
    assert initiative(engine.deps, engine.slug).current.batch_id == old
    assert cli("--root", engine.root, "retire", engine.slug, "--yes")[0] == 0
    code, out, err = cli("--root", engine.root, "authorize", engine.slug, "--max-parallel", "2", "--yes", "--json")
    assert code == 0, err
    facts = json.loads(out)
    assert facts["batch_id"] != old
    assert [(c["task_id"], c["blocked_by"]) for c in facts["children"]] == [("s1", []), ("s2", ["s1"])]
    assert files_now(engine, files) == files


def test_a_fast_forward_of_the_batch_branch_is_adopted_in_the_same_tick_and_the_user_commit_stays(tmp_path):
    """docs/upstream.md#the-steps-of-a-tick: `adopted_heads` gets {from: the expected head, to: the user's
    commit}, s1 integrates onto it in that very tick, and the batch completes under the one confirmation it had."""
    engine = mid_batch(tmp_path)
    expected = branch_head(engine)
    files = make_move("branch", engine.root, engine.slug, "s2")
    user_commit = branch_head(engine)
    code, report = tick(engine)
    assert code == 0 and report["batch_state"] == "running" and report["reason"] is None
    assert engine.batch.record["adopted_heads"] == [{"from": expected, "to": user_commit}]
    assert engine.states()[0] == "integrated"
    assert git_out(engine.root, "rev-parse", f"{report['commits'][0]}^") == user_commit
    engine.deliver("s2", "two.txt", "two\n")
    for _ in range(4):
        code, report = tick(engine)
        if report["batch_state"] != "running":
            break
    assert report["batch_state"] == "completed" and code == 0
    assert git_out(engine.root, "merge-base", "--is-ancestor", user_commit, branch_head(engine)) == ""
    assert len(initiative(engine.deps, engine.slug).authorizations) == 1
    assert files_now(engine, files) == files


def test_a_dirtied_coordinator_goes_on_once_the_user_moved_the_file_away(tmp_path):
    engine = mid_batch(tmp_path)
    files = make_move("dirty", engine.root, engine.slug, "s2")
    assert tick(engine)[0] == 2
    kept = tmp_path / "kept.txt"
    Path(engine.root, "scratch/mine.txt").rename(kept)
    assert kept.read_bytes() == files["scratch/mine.txt"]
    code, report = tick(engine)
    assert code == 0 and report["commits"] and engine.states()[0] == "integrated"


# ---------------------------------------------------------------- the autopilot


def autopilot_with_a_move(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, move: str) -> tuple[int, str, Any, dict]:
    """`lanes-es run` on two tasks at max_parallel 1 (s2 waits for s1): the Executor of s1 makes the move in the
    coordinator, then delivers. (exit code, what the run said, the service, what the move left)."""
    from tests.gitfixtures import intent_json, make_repo
    from tests.engine import initiative_markdown
    from lanes_es.steward.run import AutopilotOptions, run_autopilot
    from lanes_es.bootstrap import bootstrap

    tasks = {"s1": Task(["one.txt"]), "s2": Task(["two.txt"])}
    root = make_repo(tmp_path / "repo", intents={t: intent_json(t, task.scope) for t, task in tasks.items()},
                     files={"docs/initiatives/moves.md": initiative_markdown(tasks)})
    moved = tmp_path / "moved.json"
    monkeypatch.setenv("PYTHONPATH", str(PROJECT))
    monkeypatch.setenv("LANES_ES_EXECUTOR_TEST_MOVE", move)
    monkeypatch.setenv("LANES_ES_EXECUTOR_TEST_MOVED", str(moved))
    monkeypatch.setenv("LANES_ES_EXECUTOR_TEST_OTHER_TASK", "s2")
    monkeypatch.setenv("LANES_ES_EXECUTOR_HINT", json.dumps({"s1": {"path": "one.txt", "content": "one\n"},
                                                             "s2": {"path": "two.txt", "content": "two\n"}}))
    deps = bootstrap(root, clock=SteppingClock(time.time()))
    lines: list[str] = []
    executor = [sys.executable, "-P", "-m", "tests.integration.world_moves"]
    options = AutopilotOptions(batch=BatchOptions(max_parallel=1), lanes_dir=tmp_path / "lanes", executor=executor,
                               yes=True, poll=0.05)
    code = run_autopilot(deps, "moves", options, out=lines.append)
    return code, "\n".join(lines), deps, json.loads(moved.read_text())


@pytest.mark.parametrize("move", sorted(EXPECTED))
def test_a_move_during_an_autopilot_run_stops_it_with_the_reason(tmp_path, monkeypatch, move):
    """The autopilot's next tick after the move stops the batch with upstream's reason and nothing lands after it."""
    code, text, deps, facts = autopilot_with_a_move(tmp_path, monkeypatch, move)
    exit_code, reason_code, state = EXPECTED[move]
    assert code == exit_code, text
    assert reason_code in text, text
    batch = active_batch(deps, "moves")
    assert batch.batch_state == state
    assert batch.record["commits"] == []  # s1 was delivered, but never integrated after the move
    assert git_out(deps.root, "rev-parse", "imm/moves") == facts["head_after"]
    assert {path: Path(deps.root, path).read_bytes().hex() for path in facts["files"]} == facts["files"]


def test_a_fast_forward_during_an_autopilot_run_is_adopted_and_the_run_completes(tmp_path, monkeypatch):
    """The user's commit on the batch branch is adopted by the next tick; s1 integrates onto it, s2's Lane is cut
    from the history above it, and the run completes without asking again."""
    code, text, deps, facts = autopilot_with_a_move(tmp_path, monkeypatch, "branch")
    assert code == 0, text
    batch = active_batch(deps, "moves")
    assert batch.batch_state == "completed"
    assert batch.record["adopted_heads"] == [{"from": facts["head_before"], "to": facts["head_after"]}]
    assert git_out(deps.root, "rev-parse", f"{batch.record['commits'][0]}^") == facts["head_after"]
    assert [child["lane"]["base_head"] for child in batch.record["children"]] == [  # s1 was cut before the move
        facts["head_before"], batch.record["commits"][0]]
    assert len(initiative(deps, "moves").authorizations) == 1


# ---------------------------------------------------------------- a move between any two ticks

STOPPING = {"batch_plan_digest_changed", "batch_branch_changed", "batch_head_lineage_broken", "working_tree_unstaged"}
GOES_ON = ("touch", "branch")  # nothing the confirmation covers moved; a fast-forward is adopted
NOT_AFTER_A_MOVE = {"LaneAdmitted", "Enrolled", "LaneCommitted", "Integrated"}


def touch_only(root: str) -> dict[str, bytes]:
    """A move that changes nothing the confirmation covers: the Initiative's file is rewritten as it was."""
    path = Path(root, "docs/initiatives", next(Path(root, "docs/initiatives").iterdir()).name)
    path.write_bytes(path.read_bytes())
    os.utime(path, (1, 1))
    return {}


def play_until(engine: Engine, move_before: int, move: str) -> dict[str, Any]:
    """Play steward and Executor tick after tick; before tick number `move_before`, make the move.
    Returns what the move left and the batch as the log has it at the end."""
    deliveries = {"s1": ("one.txt", "one\n"), "s2": ("two.txt", "two\n")}
    offers: dict[str, str] = {}
    moved: dict[str, Any] = {}
    report: dict[str, Any] = {"batch_state": "running", "handoffs": []}
    for number in range(12):
        if number == move_before:
            files = touch_only(engine.root) if move == "touch" else make_move(move, engine.root, engine.slug, "s2")
            moved = {"files": files, "head": branch_head(engine) if engine.batch else None,
                     "events": len(list(engine.deps.store.events(engine.batch.id))) if engine.batch else 0,
                     "terminal": report["batch_state"] not in ("running", "rejected")}
        report = engine.tick(offers=offers)
        offers = {}
        if report["batch_state"] not in ("running",):
            if number >= move_before:
                break
            continue
        for handoff in report["handoffs"]:
            if handoff.get("action") == "provision" and os.path.isdir(engine.lane(handoff["task_id"])):
                # offered at a head the batch has since moved past (an adopted fast-forward): the steward
                # brings the clean Lane forward and offers it again
                run_git(engine.lane(handoff["task_id"]), "merge", "--ff-only", "-q", handoff["base_head"])
                offers[handoff["task_id"]] = engine.lane(handoff["task_id"])
            elif handoff.get("action") == "provision":
                offers[handoff["task_id"]] = engine.provision(handoff["task_id"], report)
            elif handoff["role"] == "executor" and handoff["next_obligation"] == "submit_assurance":
                engine.deliver(handoff["task_id"], *deliveries[handoff["task_id"]])
    return {**moved, "report": report}


@pytest.mark.parametrize("move", [*GOES_ON, *sorted(EXPECTED)])
def test_a_move_between_any_two_ticks_is_either_covered_or_stops_the_batch(tmp_path, move, another_store):
    """Issue 3's convergence, extended (issue 14): for every gap between two ticks of a two-task
    batch, the move is made there; the engine either goes on because nothing it covers moved
    ("touch") or stops with upstream's reason, and after the move no Lane is admitted, enrolled,
    committed or integrated and no commit lands on the batch branch."""
    # The batch settles after six ticks; a touch needs no more than two gaps to show it changes nothing.
    # The two backends share the gaps out (the store only records what the move did): CI time.
    on_postgres = another_store().startswith("postgresql")
    for gap in ((2, 4) if move == "touch" else range(1 + on_postgres, 7, 2)):
        engine = make_engine(tmp_path / f"gap-{gap}", {"s1": Task(["one.txt"]), "s2": Task(["two.txt"])},
                             store_url=another_store())  # a store per repository: each authorizes the same slug
        engine.authorize(max_parallel=1)
        outcome = play_until(engine, gap, move)
        report, batch = outcome["report"], engine.batch
        if move in GOES_ON or outcome["terminal"]:
            assert batch.batch_state == "completed", (gap, report["reason"])
            adopted = [entry["to"] for entry in batch.record.get("adopted_heads", [])]
            assert adopted == ([outcome["head"]] if move == "branch" and not outcome["terminal"] else []), gap
            continue
        assert report["reason"].split(":")[0] in STOPPING, (gap, report["reason"])
        assert report["reason"].split(":")[0] == EXPECTED[move][1], (gap, report["reason"])
        after = [type(e).__name__ for e in list(engine.deps.store.events(batch.id))[outcome["events"]:]]
        assert not NOT_AFTER_A_MOVE & set(after), (gap, after)
        assert branch_head(engine) == outcome["head"], gap
        assert files_now(engine, outcome["files"]) == outcome["files"], gap


# ---------------------------------------------------------------- the repository moved (a shared store)


def other_checkout(engine: Engine, tmp_path: Path) -> str:
    """A copy of the coordinator made by copying it whole (`.git` and its repository id included), so it
    finds the same Initiative in the shared store: the same root commit, Initiative, intents, branch,
    head and repository id; only the checkout differs. (A clone has an id, and Initiatives, of its own.)"""
    copy = tmp_path / "clone"
    shutil.copytree(engine.root, copy, symlinks=True)
    assert git_out(str(copy), "rev-parse", "HEAD") == branch_head(engine)
    return os.path.realpath(copy)


def untouched(checkout: str) -> dict[str, Any]:
    """Everything a tick could write in a checkout: refs, status with ignored files, worktrees, `.imm/`."""
    return {"refs": all_refs(checkout), "status": git_out(checkout, "status", "--porcelain", "--ignored",
                                                          "--untracked-files=all"),
            "worktrees": git_out(checkout, "worktree", "list", "--porcelain"),
            "imm": sorted(str(p) for p in Path(checkout, ".imm").rglob("*"))}


def test_a_tick_in_another_checkout_of_the_shared_store_is_refused_and_writes_only_its_audit_event(tmp_path):
    """lanes-es's own blocker (upstream runs in the one checkout it is called in): the store is
    shared, the clone matches in everything but the repository; the tick there is refused with
    batch_repository_changed, only a TickRejected is appended, neither checkout changes, and the
    batch goes on in its own repository."""
    engine = mid_batch(tmp_path)
    clone = other_checkout(engine, tmp_path)
    coordinator, elsewhere = untouched(engine.root), untouched(clone)
    state, events = engine.state_file().read_bytes(), len(list(engine.deps.store.events(engine.batch.id)))
    for _ in range(2):
        code, out, err = cli("--root", clone, "tick", engine.slug, "--json")
        report = json.loads(out)
        assert code == 2 and report["batch_state"] == "rejected", err
        assert report["reason"].startswith(f"batch_repository_changed: this checkout {clone} is not the repository "
                                           f"the batch was confirmed in ({engine.root})")
        assert f"lanes-es authorize {engine.slug}" in report["reason"]
        assert untouched(clone) == elsewhere and untouched(engine.root) == coordinator
        assert engine.state_file().read_bytes() == state
    logged = [type(e).__name__ for e in engine.deps.store.events(engine.batch.id)][events:]
    assert logged == ["TickRejected", "TickRejected"]
    assert engine.batch.batch_state == "running" and engine.states() == ["enrolled", "enrolled"]
    code, report = tick(engine)  # in its own checkout the batch goes on: s1 integrates
    assert code == 0 and engine.states()[0] == "integrated" and report["commits"]


def test_retire_from_another_checkout_of_the_shared_store_is_refused_and_retires_nothing(tmp_path):
    """Retiring writes the superseded record and its checkpoint into the checkout it runs in: from a copy
    sharing the store it is refused as a tick is (batch_repository_changed), the batch stays active for
    its own checkout, neither checkout changes, and in its own checkout it retires."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    assert cli("--root", engine.root, "authorize", engine.slug, "--yes")[0] == 0
    clone = str(tmp_path / "clone")
    shutil.copytree(engine.root, clone, symlinks=True)
    clone = os.path.realpath(clone)
    coordinator, elsewhere = untouched(engine.root), untouched(clone)
    code, out, err = cli("--root", clone, "retire", engine.slug, "--yes")
    assert code == 2, out + err
    assert f"batch_repository_changed: this checkout {clone} is not the repository the batch was confirmed in " \
           f"({engine.root})" in err and "nothing was retired" in err and f"in {engine.root}" in err
    assert len(err.strip().splitlines()) == 1
    assert untouched(clone) == elsewhere and untouched(engine.root) == coordinator
    assert initiative(engine.deps, engine.slug).current is not None
    code, out, err = cli("--root", engine.root, "retire", engine.slug, "--yes")
    assert code == 0, out + err
    assert initiative(engine.deps, engine.slug).current is None


def test_a_renamed_checkout_is_another_repository_until_it_is_put_back(tmp_path):
    """The repository is the checkout's real path: renamed, it is refused (nothing written there);
    put back, the batch goes on."""
    engine = mid_batch(tmp_path)
    moved = str(tmp_path / "renamed")
    os.rename(engine.root, moved)
    code, out, _ = cli("--root", moved, "tick", engine.slug, "--json")
    assert code == 2 and json.loads(out)["reason"].startswith("batch_repository_changed: ")
    assert not Path(moved, ".imm/state/batches/restores").exists()
    os.rename(moved, engine.root)
    code, report = tick(engine)
    assert code == 0 and engine.states()[0] == "integrated"


def test_a_first_tick_in_another_checkout_creates_no_batch_and_no_branch(tmp_path):
    """Authorized in the coordinator, ticked first from a copy of it: refused before the preflight, so
    the copy gains no batch branch and the store no batch."""
    engine = make_engine(tmp_path, {"s1": Task(["one.txt"])})
    assert cli("--root", engine.root, "authorize", engine.slug, "--yes")[0] == 0
    clone = str(tmp_path / "clone")
    shutil.copytree(engine.root, clone, symlinks=True)
    before = untouched(clone)
    code, out, _ = cli("--root", clone, "tick", engine.slug, "--json")
    assert code == 2 and json.loads(out)["reason"].startswith("batch_repository_changed: ")
    assert untouched(clone) == before and engine.batch is None
    assert tick(engine)[0] == 0 and engine.batch.batch_state == "running"


def test_an_autopilot_run_in_another_checkout_is_refused_and_makes_no_lane(tmp_path, monkeypatch):
    """`lanes-es run` from a clone sharing the store: the first tick is refused with the reason, the
    autopilot exits 2 without making a Lane or starting an Executor, and neither checkout changes."""
    from lanes_es.steward.run import AutopilotOptions, run_autopilot
    from lanes_es.bootstrap import bootstrap

    engine = mid_batch(tmp_path)
    clone = other_checkout(engine, tmp_path)
    coordinator, elsewhere = untouched(engine.root), untouched(clone)
    started = tmp_path / "started"
    lines: list[str] = []
    deps = bootstrap(clone, clock=SteppingClock(time.time()))
    executor = [sys.executable, "-c", f"open({str(started)!r}, 'w').close()"]
    options = AutopilotOptions(batch=BatchOptions(max_parallel=2), lanes_dir=tmp_path / "clone-lanes",
                               executor=executor, yes=True, poll=0.05)
    code = run_autopilot(deps, engine.slug, options, out=lines.append)
    text = "\n".join(lines)
    assert code == 2, text
    assert "batch_repository_changed" in text, text
    assert not started.exists() and not (tmp_path / "clone-lanes").exists()
    assert untouched(clone) == elsewhere and untouched(engine.root) == coordinator
    assert engine.batch.batch_state == "running" and engine.states() == ["enrolled", "enrolled"]


def test_a_renamed_checkout_with_its_own_store_took_its_log_along_and_goes_on(tmp_path, monkeypatch):
    """With the repository's own embedded store the log moved with the checkout and no other checkout
    reads it: the repository is not judged. With the Lanes' links repaired (`git worktree repair`),
    the batch goes on at the new place."""
    monkeypatch.delenv("LANES_ES_STORE")
    engine = mid_batch(tmp_path)
    moved = str(tmp_path / "renamed")
    os.rename(engine.root, moved)
    run_git(moved, "worktree", "repair", engine.lane("s1"), engine.lane("s2"))
    code, out, err = cli("--root", moved, "tick", engine.slug, "--json")
    report = json.loads(out)
    assert code == 0, report["reason"]
    assert report["children"][0]["state"] == "integrated" and report["commits"]


def test_a_lane_whose_links_broke_with_a_renamed_checkout_parks_as_lost(tmp_path, monkeypatch):
    """Not repaired, the Lane is no git worktree any more: its QA cannot run, and the child parks
    (batch_lane_lost, with git's words) instead of the tick failing; the sibling is left as it was."""
    monkeypatch.delenv("LANES_ES_STORE")
    engine = mid_batch(tmp_path)
    moved = str(tmp_path / "renamed")
    os.rename(engine.root, moved)
    code, out, err = cli("--root", moved, "tick", engine.slug, "--json")
    assert code == 0, err
    report = json.loads(out)
    lost, waiting = report["children"]
    assert lost["state"] == "needs_human"
    assert lost["reason"].startswith("batch_lane_lost: the Lane's git failed: git add -A failed")
    assert waiting["state"] == "enrolled" and report["commits"] == []
