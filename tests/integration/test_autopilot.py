"""`lanes-es run`, the autopilot, on real repositories with a real Executor script.

Six tasks at max_parallel 3: four independent, one serialized behind another by an
overlapping scope, one blocked by two. The Executor is lanes_es/cli/example_executor.py, told what to
write through LANES_ES_EXECUTOR_HINT; it ends with `lanes-es task submit` as a person would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.engine import SteppingClock, Task, initiative_markdown
from tests.gitfixtures import (
    add_lane, descriptor, git_out, head, intent_json, make_repo, run_git, write_file,
)
from lanes_es.steward.lanes import Steward, StewardRefusal
from lanes_es.steward.run import AutopilotOptions, run_autopilot
from lanes_es.usecases.confirmation import BatchOptions
from lanes_es.usecases.load import active_batch, initiative

PROJECT = Path(__file__).resolve().parents[2]
SLUG = "six"
EXECUTOR = [sys.executable, "-P", "-m", "lanes_es.cli.example_executor"]

# task -> (scope, blocked_by, file, content); notes-2 overlaps notes-1, merge waits for one and two
TASKS: dict[str, tuple[list[str], list[str], str, str]] = {
    "one": (["src/one.txt"], [], "src/one.txt", "one\n"),
    "two": (["src/two.txt"], [], "src/two.txt", "two\n"),
    "three": (["src/three.txt"], [], "src/three.txt", "three\n"),
    "notes-1": (["docs/notes.md"], [], "docs/notes.md", "first note\n"),
    "notes-2": (["docs/notes.md"], [], "docs/notes.md", "second note\n"),
    "merge": (["src/merge.txt"], ["one", "two"], "src/merge.txt", "one and two\n"),
}
EXPECTED_FILES = {"src/one.txt": "one\n", "src/two.txt": "two\n", "src/three.txt": "three\n",
                  "docs/notes.md": "first note\nsecond note\n", "src/merge.txt": "one and two\n"}
HINT = json.dumps({task: {"path": path, "content": content} for task, (_, _, path, content) in TASKS.items()})


def holds_line(path: str, line: str) -> str:
    """A descriptor that passes when `path` holds `line`: the delivery is there."""
    return descriptor(["-c", f"import os, sys; p = {path!r}; "
                             f"sys.exit(0 if os.path.exists(p) and {line!r} in open(p).read() else 1)"])


@pytest.fixture
def repo(tmp_path: Path, store_url: str) -> str:
    """The six-task coordinator; its store is the test's (once on SQLite, once on PostgreSQL)."""
    intents = {task: intent_json(task, scope, verification=holds_line(path, content.strip()))
               for task, (scope, _, path, content) in TASKS.items()}
    tasks = {task: Task(scope, blocked_by=blocked) for task, (scope, blocked, _, _) in TASKS.items()}
    return make_repo(tmp_path / "repo", intents=intents, files={f"docs/initiatives/{SLUG}.md": initiative_markdown(tasks)})


@pytest.fixture
def executor_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("LANES_ES_EXECUTOR_HINT", HINT)
    monkeypatch.setenv("PYTHONPATH", str(PROJECT))
    return dict(os.environ)


def options(lanes: str | Path, max_parallel: int = 3, executor: list[str] = EXECUTOR, **more: Any) -> AutopilotOptions:
    """`lanes-es run --max-parallel N --lanes-dir LANES --executor ...` with `more` (yes, poll, json_lines)."""
    return AutopilotOptions(batch=BatchOptions(max_parallel=max_parallel), lanes_dir=lanes, executor=executor, **more)


def deps_of(root: str) -> Any:
    from lanes_es.bootstrap import bootstrap

    return bootstrap(root, clock=SteppingClock(time.time()))


def coordinator(root: str) -> Path:
    """The batch's coordinator worktree (the default); the tests marked `coordinator_worktree` run there."""
    return Path(root, ".git", "lanes-es", "coordinators", SLUG)


def batch_files(root: str) -> dict[str, Any]:
    folder = (coordinator(root) if coordinator(root).exists() else Path(root)) / ".imm" / "state" / "batches"
    found = sorted(folder.glob("*.json")) if folder.exists() else []
    return {path.stem: json.loads(path.read_text()) for path in found if not path.name.endswith(".report.json")}


def assert_completed_as_planned(root: str, lanes: Path) -> dict[str, Any]:
    """The one batch completed: six commits, one per task, the delivered files, every Lane gone."""
    (batch_id, record), = batch_files(root).items()
    assert record["batch_state"] == "completed"
    assert len(record["commits"]) == 6 and len(set(record["commits"])) == 6
    subjects = git_out(root, "log", "--format=%s", f"{record['base_head']}..imm/{SLUG}").splitlines()
    assert sorted(subject.split(":")[0] for subject in subjects) == sorted(f"imm({task})" for task in TASKS)
    for path, content in EXPECTED_FILES.items():
        assert git_out(root, "show", f"imm/{SLUG}:{path}") + "\n" == content, path
    in_a_worktree = coordinator(root).exists()  # else in place: the user's checkout is the coordinator
    assert git_out(root, "worktree", "list", "--porcelain").count("worktree ") == 1 + in_a_worktree
    if in_a_worktree:
        assert git_out(root, "status", "--porcelain=v1", "--branch") == "## main"  # the user's checkout untouched
    assert sorted(entry.name for entry in lanes.iterdir()) == [".executor-logs"]
    assert git_out(root, "branch", "--list", f"imm-lane/{SLUG}/*") == ""  # each released Lane's branch went too
    verified = subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "--root", root, "verify", batch_id], cwd=PROJECT,
                              capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    return record


def most_in_flight(root: str, batch_id: str) -> int:
    """The most Lanes admitted and not yet integrated at any point of the log."""
    deps = deps_of(root)
    in_flight: set[str] = set()
    most = 0
    for event in deps.store.events(batch_id):
        name = type(event).__name__
        if name == "LaneAdmitted":
            in_flight.add(event.task_id)
        elif name in ("Integrated", "Parked"):
            in_flight.discard(event.task_id)
        most = max(most, len(in_flight))
    return most


# ---------------------------------------------------------------- a whole batch


@pytest.mark.coordinator_worktree
def test_six_tasks_at_max_parallel_3_complete_with_a_real_executor(repo, tmp_path, executor_env):
    lanes, lines = tmp_path / "lanes", []
    code = run_autopilot(deps_of(repo), SLUG, options(lanes, yes=True, poll=0.05), out=lines.append)
    assert code == 0, "\n".join(lines)
    record = assert_completed_as_planned(repo, lanes)
    assert most_in_flight(repo, record["batch_id"]) == 3
    text = "\n".join(lines)
    assert f"batch {record['batch_id']}: completed: all enrollable children integrated" in text
    assert "6 commits on imm/six; 6 Lanes released by the steward" in text
    assert "Lane mode: max_parallel=3" in text  # the confirmation facts were shown before --yes answered
    assert (lanes / ".executor-logs" / "merge.log").read_text().count("submitted merge") == 1


def test_the_confirmation_takes_final_verification_and_delegation(repo, tmp_path, executor_env):
    """`run --final-verification CMD --delegate-revisions` confirms them; the completed batch ran the command."""
    from lanes_es.cli.main import main

    lanes = tmp_path / "lanes"
    code = main(["--root", str(repo), "run", SLUG, "--max-parallel", "3", "--lanes-dir", str(lanes),
                 "--executor", " ".join(EXECUTOR), "--yes", "--poll", "0.05",
                 "--final-verification", "git status", "--delegate-revisions"])
    assert code == 0
    deps = deps_of(repo)
    batch = active_batch(deps, SLUG)
    assert batch.record["final_verification"] == ["git status"]
    assert batch.record["revision_delegation"] == {
        "confirmation_time": initiative(deps, SLUG).current.confirmation_time}
    assert batch.report["final_verification"]["passed"] is True
    assert [r["command"] for r in batch.report["final_verification"]["results"]] == ["git status"]


# The default mode on both backends, the other modes on one each (the store only records the run): CI time.
@pytest.mark.parametrize("store_url, mode", [("sqlite", "speculative"), ("postgresql", "speculative"),
                                             ("postgresql", "serial"), ("sqlite", "batched")], indirect=["store_url"])
@pytest.mark.coordinator_worktree  # killed and run again, it converges in its coordinator worktree
def test_killed_after_the_first_integration_and_run_again_it_completes_the_same_batch(repo, tmp_path, executor_env,
                                                                                       mode):
    lanes = tmp_path / "lanes"
    command = [sys.executable, "-m", "lanes_es.cli.main", "--root", repo, "run", SLUG, "--max-parallel", "3",
               "--lanes-dir", str(lanes), "--executor", " ".join(EXECUTOR), "--yes", "--poll", "0.05",
               "--integration", mode]
    with open(tmp_path / "first-run.log", "w") as log:
        first = subprocess.Popen(command, cwd=PROJECT, env=executor_env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and first.poll() is None:
            records = batch_files(repo)
            if any(child["state"] in ("integrated", "released") for record in records.values()
                   for child in record["children"]):
                break
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait()
    (batch_id, interrupted), = batch_files(repo).items()
    assert interrupted["batch_state"] == "running", (tmp_path / "first-run.log").read_text()
    assert any(child["state"] == "pending" for child in interrupted["children"])  # killed in the middle

    again = subprocess.run(command, cwd=PROJECT, env=executor_env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Start the unattended" not in again.stdout  # no new confirmation: the same authorization
    record = assert_completed_as_planned(repo, lanes)
    assert record["batch_id"] == batch_id
    assert f"batch {batch_id}: completed" in again.stdout


# ---------------------------------------------------------------- never destroy work


def test_a_lane_dirtied_before_its_release_is_kept_and_reported(repo, tmp_path, executor_env, monkeypatch):
    lanes, lines = tmp_path / "lanes", []
    original = Steward.release

    def dirty_then_release(self: Steward, path: str, lane_branch: str, *rest: Any) -> str | None:
        if lane_branch.endswith("/three"):  # integrated and offered for release, then someone writes in it
            write_file(path, "scratch.txt", "work nobody committed\n")
        return original(self, path, lane_branch, *rest)

    monkeypatch.setattr(Steward, "release", dirty_then_release)
    code = run_autopilot(deps_of(repo), SLUG, options(lanes, yes=True, poll=0.05), out=lines.append)
    text = "\n".join(lines)
    assert code == 0, text
    assert (lanes / "three" / "scratch.txt").read_text() == "work nobody committed\n"
    assert git_out(repo, "worktree", "list", "--porcelain").count("worktree ") == 2  # the coordinator and three
    assert f"kept the Lane of three: {lanes / 'three'}: it is dirty (1 changed path: scratch.txt)" in text
    assert "5 Lanes released by the steward" in text
    assert sorted(entry.name for entry in lanes.iterdir()) == [".executor-logs", "three"]
    assert git_out(repo, "for-each-ref", "--format=%(refname:short)", f"refs/heads/imm-lane/{SLUG}/") == f"imm-lane/{SLUG}/three"


def test_an_executor_that_never_submits_stops_the_run_with_what_to_do(repo, tmp_path):
    lanes, lines = tmp_path / "lanes", []
    failing = [sys.executable, "-c", "import sys; print('cannot work'); sys.exit(1)"]
    code = run_autopilot(deps_of(repo), SLUG, options(lanes, executor=failing, yes=True, poll=0.05), out=lines.append)
    text = "\n".join(lines)
    assert code == 3, text
    assert "executor: one exited with 1" in text
    assert (f"one waits for submit_assurance in {os.path.realpath(lanes / 'one')}: its Executor exited with 1 "
            f"without moving it (log {lanes / '.executor-logs' / 'one.log'})") in text
    assert "nothing more moves without you" in text
    assert "cannot work" in (lanes / ".executor-logs" / "one.log").read_text()
    (record,) = batch_files(repo).values()
    assert record["batch_state"] == "running" and (lanes / "one").is_dir()  # the Lanes and their work are kept


def test_without_yes_and_without_a_terminal_nothing_is_confirmed(repo, tmp_path):
    lines: list[str] = []
    code = run_autopilot(deps_of(repo), SLUG, options(tmp_path / "lanes", yes=False), out=lines.append)
    assert code == 2
    assert "confirmation_port_unavailable: no terminal to ask on; review the facts above and run again with --yes" \
        in "\n".join(lines)
    assert batch_files(repo) == {} and not (tmp_path / "lanes").exists()


def test_lanes_inside_the_coordinator_checkout_are_refused(repo):
    from lanes_es.errors import ServiceError

    with pytest.raises(ServiceError, match="invalid_lanes_dir"):
        run_autopilot(deps_of(repo), SLUG, options(Path(repo) / "lanes", yes=True), out=lambda line: None)


# ---------------------------------------------------------------- the steward on git


def test_the_steward_makes_reuses_and_fast_forwards_lanes_but_never_moves_other_work(repo, tmp_path):
    lanes = tmp_path / "lanes"
    steward = Steward(repo, lanes)
    base = head(repo)
    made = steward.provision("one", "imm-lane/six/one", base)
    assert made == str(lanes / "one") and head(made) == base
    assert git_out(made, "symbolic-ref", "HEAD") == "refs/heads/imm-lane/six/one"
    assert steward.provision("one", "imm-lane/six/one", base) == made  # found again after a restart

    run_git(repo, "branch", "imm-lane/six/two", base)  # left by an interrupted run, its worktree gone
    assert head(steward.provision("two", "imm-lane/six/two", base)) == base

    write_file(repo, "moved.txt", "the batch moved\n")
    run_git(repo, "add", "moved.txt")
    run_git(repo, "commit", "-q", "-m", "batch head moves")
    moved = head(repo)
    assert head(steward.provision("one", "imm-lane/six/one", moved)) == moved  # clean and behind: fast-forward

    foreign = add_lane(repo, SLUG, "three", tmp_path / "elsewhere")
    write_file(foreign, "src/three.txt", "someone's work\n")
    run_git(foreign, "add", "-A")
    run_git(foreign, "commit", "-q", "-m", "work the batch does not hold")
    run_git(repo, "worktree", "remove", foreign)
    kept = git_out(repo, "rev-parse", "imm-lane/six/three")
    with pytest.raises(StewardRefusal, match="holds other work"):
        steward.provision("three", "imm-lane/six/three", moved)
    assert git_out(repo, "rev-parse", "imm-lane/six/three") == kept and not (lanes / "three").exists()

    (lanes / "notes-1").mkdir()
    with pytest.raises(StewardRefusal, match="is not a worktree of this repository"):
        steward.provision("notes-1", "imm-lane/six/notes-1", moved)

    write_file(made, "src/one.txt", "uncommitted\n")
    assert steward.release(made, "imm-lane/six/one") == "it is dirty (1 changed path: src/one.txt)"
    assert (Path(made) / "src" / "one.txt").read_text() == "uncommitted\n"


def test_the_steward_lists_branches_once_a_round_and_asks_git_to_remove_only_a_clean_lane(repo, tmp_path):
    from lanes_es.adapters.git import STATS

    steward, base = Steward(repo, tmp_path / "lanes"), head(repo)
    run_git(repo, "branch", "imm-lane/six/b", base)
    steward.begin_round()
    STATS.reset()
    made = [steward.provision(task, f"imm-lane/six/{task}", base) for task in ("a", "b", "c")]
    assert STATS.spawns == 5  # worktree list, for-each-ref, three worktree add
    assert [head(lane) for lane in made] == [base] * 3
    STATS.reset()
    assert steward.release(made[0], "imm-lane/six/a", base) is None
    assert STATS.spawns == 2 and not Path(made[0]).exists()  # worktree remove, the branch's update-ref
    assert git_ok_code(repo, "rev-parse", "--verify", "-q", "refs/heads/imm-lane/six/a") != 0
    write_file(made[1], "scratch.txt", "left\n")
    assert steward.release(made[1], "imm-lane/six/b") == "it is dirty (1 changed path: scratch.txt)"
    assert (Path(made[1]) / "scratch.txt").exists()


def git_ok_code(root: str, *args: str) -> int:
    import subprocess

    return subprocess.run(["git", "-C", root, *args], capture_output=True).returncode


def test_failed_qa_starts_the_executor_again_then_stops_for_the_coordinators_correction(tmp_path, monkeypatch,
                                                                                     store_url):
    solo = {"solo": intent_json("solo", ["solo.txt"], verification=holds_line("solo.txt", "the right thing"))}
    root = make_repo(tmp_path / "repo", intents=solo,
                     files={"docs/initiatives/one.md": initiative_markdown({"solo": Task(["solo.txt"])})})
    monkeypatch.setenv("LANES_ES_EXECUTOR_HINT", json.dumps({"path": "solo.txt", "content": "the wrong thing\n"}))
    monkeypatch.setenv("PYTHONPATH", str(PROJECT))
    lanes, lines = tmp_path / "lanes", []
    code = run_autopilot(deps_of(root), "one", options(lanes, 1, yes=True, poll=0.05), out=lines.append)
    text = "\n".join(lines)
    assert code == 3, text
    assert text.count("executor: started for solo") == 2  # after each failed QA (qa_failure_limit 2)
    assert "solo needs a design-level correction" in text and '"kind": "correction"' in text
    assert "next: send the correction above, then run the same `lanes-es run` command again" in text
    (record,) = batch_files(root).values()
    assert record["batch_state"] == "running" and record["children"][0]["qa_failures"] == 2
    assert (lanes / "solo" / "solo.txt").read_text() == "the wrong thing\n"  # the Lane and its work are kept


# ---------------------------------------------------------------- what it shows


def run_on_a_terminal(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run a command with stdout and stderr on a pseudo-terminal; its exit code and what the terminal got."""
    from tests.terminal import read_terminal

    master, slave = os.openpty()
    process = subprocess.Popen(command, cwd=PROJECT, env={**env, "COLUMNS": "160", "LINES": "40", "TERM": "xterm"},
                               stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    shown = read_terminal(master, process)
    return process.wait(timeout=120), shown


def test_on_a_terminal_the_run_draws_a_live_line_per_lane_and_the_batchs_progress(repo, tmp_path, executor_env):
    lanes = tmp_path / "lanes"
    code, terminal = run_on_a_terminal(
        [sys.executable, "-m", "lanes_es.cli.main", "--root", repo, "run", SLUG, "--max-parallel", "3", "--lanes-dir",
         str(lanes), "--executor", " ".join(EXECUTOR), "--yes", "--poll", "0.05"], executor_env)
    assert code == 0, terminal
    record = assert_completed_as_planned(repo, lanes)
    assert "\x1b[" in terminal  # drawn in place, not printed line after line
    screens = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", part) for part in re.split(r"\x1b\[\d*A", terminal)]
    # while it runs: a Lane's line holds its task, its state, the time in that state and its last event
    lane_lines = [line for screen in screens for line in screen.splitlines()
                  if re.match(r"^(one|two|three|notes-1|notes-2|merge)\s+(lane_admitted|enrolled|settled|"
                              r"lane_committed|integrated|released)\s+\d+\.\ds\s+\S", line)]
    assert {line.split()[0] for line in lane_lines} == set(TASKS), terminal[-3000:]
    assert any(re.search(r"Executor working \(pid \d+\) · enrolled run_id=run-", line) for line in lane_lines)
    # the batch's progress grows to all six, and the board's last drawing stays above the summary
    done = [int(found) for found in re.findall(r"(\d)/6 done", terminal)]
    assert done[0] < 6 and done[-1] == 6 and done == sorted(done)
    assert terminal.rindex("6/6 done") < terminal.rindex(f"batch {record['batch_id']}: completed")
    assert "executor: started for merge" in terminal  # the steward's moves print above the board


def test_json_gives_one_object_per_line_for_every_event_and_move(repo, tmp_path, executor_env):
    lanes, lines = tmp_path / "lanes", []
    code = run_autopilot(deps_of(repo), SLUG, options(lanes, yes=True, poll=0.05, json_lines=True), out=lines.append)
    items = [json.loads(line) for line in lines]  # every line is one JSON object
    assert code == 0, lines
    record = assert_completed_as_planned(repo, lanes)
    events = [item for item in items if item["kind"] == "event"]
    stored = deps_of(repo).store.events(record["batch_id"])
    # every event of the log, each once, in order, however the watcher and the loop shared the reading
    assert [item["version"] for item in events] == list(range(1, len(stored) + 1))
    assert [item["type"] for item in events] == [type(event).__name__ for event in stored]
    integrated = [item["fields"]["task_id"] for item in events if item["type"] == "Integrated"]
    assert sorted(integrated) == sorted(TASKS)
    moves = [(item["action"], item.get("task_id")) for item in items if item["kind"] == "steward"]
    assert {task for action, task in moves if action == "lane_provisioned"} == set(TASKS)  # some twice: re-offered
    assert sorted(task for action, task in moves if action == "lane_released") == sorted(TASKS)
    assert {task for action, task in moves if action == "executor_exited"} == set(TASKS)
    assert items[-1]["kind"] == "summary" and items[-1]["exit_code"] == 0
    assert items[-1]["batch_state"] == "completed" and items[-1]["batch_id"] == record["batch_id"]
    assert any(item["kind"] == "note" and item["text"].startswith("Start the unattended") for item in items)


def start_a_survivor(tmp_path: Path, revision: int, seconds: float) -> tuple[dict[str, Any], Any, Any]:
    """An Executor working `seconds` in a Lane, started by an autopilot that a test then treats as killed."""
    from lanes_es.steward.executors import Executors

    lane = tmp_path / "lane"
    lane.mkdir()
    handoff = {"task_id": "t", "lane_path": str(lane), "record_revision": revision, "next_obligation": "submit_assurance"}
    first = Executors([sys.executable, "-c", f"import time; time.sleep({seconds})"], str(tmp_path), tmp_path / "logs")
    return handoff, first, first.start(handoff, "{}")


def reap_within(executors: Any, seconds: float) -> list[Any]:
    deadline = time.monotonic() + seconds
    done: list[Any] = []
    while not done and time.monotonic() < deadline:
        done = executors.reap()
        time.sleep(0.02)
    return done


def test_an_executor_that_survived_a_killed_run_is_waited_for_not_doubled(tmp_path):
    """After a SIGKILL the Executors keep running; the restarted autopilot adopts them by pid."""
    from lanes_es.steward.executors import Executors

    handoff, first, running = start_a_survivor(tmp_path, revision=1, seconds=1.5)
    restarted = Executors([sys.executable, "-c", "raise SystemExit(3)"], str(tmp_path), tmp_path / "logs")
    assert restarted.should_start(handoff) is False  # the survivor is adopted
    assert "t" in restarted.running and restarted.reap() == []
    running.process.wait()
    first.reap()  # the first autopilot is gone in real life; here it reaps its own child
    done = reap_within(restarted, 5)
    assert [finished.task_id for finished in done] == ["t"]
    assert not (tmp_path / "logs" / "t.pid").exists()
    fresh = Executors([sys.executable, "-c", "pass"], str(tmp_path), tmp_path / "logs")
    assert fresh.should_start(handoff) is True  # nothing left to adopt


def test_a_survivor_that_exits_before_the_next_report_is_not_started_again_on_a_stale_report(tmp_path):
    """The restarted autopilot adopts survivors when it starts: if one submits and exits before the report
    it already read is acted on, that stale report (same record revision) starts no second Executor."""
    from lanes_es.steward.executors import Executors

    handoff, _, running = start_a_survivor(tmp_path, revision=4, seconds=0.5)
    restarted = Executors([sys.executable, "-c", "pass"], str(tmp_path), tmp_path / "logs")
    running.process.wait()  # the survivor finished its work before the restarted autopilot looked at the report
    assert restarted.should_start(handoff) is False  # still counted as running until reaped
    done = reap_within(restarted, 5)
    assert [(finished.task_id, finished.record_revision) for finished in done] == [("t", 4)]
    assert restarted.should_start(handoff) is False  # the report it read was from before the survivor's submit
    assert restarted.should_start({**handoff, "record_revision": 5}) is True  # the task moved: next obligation


def test_only_run_on_a_terminal_imports_the_progress_library():
    """rich costs about 0.12 s of start-up: `--help`, `run --help` and the other commands never import it."""
    for args in (["--help"], ["run", "--help"], ["status", "--help"]):
        shown = subprocess.run([sys.executable, "-X", "importtime", "-m", "lanes_es.cli.main", *args], cwd=PROJECT,
                               capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        imported = [line.rsplit("|", 1)[-1].strip() for line in shown.stderr.splitlines() if "|" in line]
        assert "lanes_es.steward.run" not in imported and len(imported) > 10
        assert not [name for name in imported if name.split(".")[0] == "rich"], args
