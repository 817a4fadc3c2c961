"""`lanes-es run SLUG --executor claude-code|codex|opencode`: a whole batch through the real command line,
against the fake agent CLIs on PATH, on both store backends.

Two tasks. `farewell` is delivered at the first attempt; `greet`'s first attempt writes the wrong
greeting, its check fails with an explanation on its output, and the second attempt is a rework
whose prompt quotes that finding. Every attempt is in the batch's log with its usage; replay, the
audit page and the status show them; the projections rebuild from the log byte for byte. The whole
batch adds a third task, `shout`, whose attempt spends more tokens than its Lane's budget: it is
killed at its limit (claude-code and opencode report tokens as they go; codex only as its turn ends,
so its attempt ends by itself), no second attempt starts, and the task is stopped and parks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lanes_es.executors import ADAPTER_NAMES, agent_named
from tests.engine import Task, initiative_markdown
from tests.gitfixtures import descriptor, git_out, intent_json, make_repo

pytestmark = pytest.mark.coordinator_worktree

PROJECT = Path(__file__).resolve().parents[2]
FAKES = PROJECT / "tests" / "fakes" / "agents"
SLUG = "greetings"


def says(path: str, line: str) -> str:
    """A check that passes when `path` holds `line`, and otherwise says what it found (the output tail)."""
    return descriptor(["-c", f"import os, sys; p = {path!r}; line = {line!r}; "
                             f"text = open(p).read() if os.path.exists(p) else ''; "
                             f"print('ok' if line in text else 'expected ' + repr(line) + ' in ' + p + ', found ' "
                             f"+ repr(text)); sys.exit(0 if line in text else 1)"])


TASKS = {"greet": ("src/greet.py", "def greet(): return 'Hello'"),
         "farewell": ("src/farewell.py", "def farewell(): return 'Goodbye'")}


def repo_of(path: Path, chosen: dict[str, tuple[str, str]]) -> str:
    intents = {task: intent_json(task, [file], verification=says(file, line), goal=f"Write {file}")
               for task, (file, line) in chosen.items()}
    tasks = {task: Task([file]) for task, (file, _) in chosen.items()}
    return make_repo(path, intents=intents, files={f"docs/initiatives/{SLUG}.md": initiative_markdown(tasks)})


@pytest.fixture
def repo(tmp_path: Path, store_url: str) -> str:
    return repo_of(tmp_path / "repo", TASKS)


@pytest.fixture
def repo_with_shout(tmp_path: Path, store_url: str) -> str:
    return repo_of(tmp_path / "repo", {**TASKS, "shout": ("src/shout.py", "def shout(): return 'HEY'")})


def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({"record": str(tmp_path / "calls"), "tasks": {
        "greet": [{"write": {"src/greet.py": "def greet(): return 'Hi'\n"}, "tokens_in": 1000, "tokens_out": 100,
                   "cost": 0.05, "steps": 2, "denied": ["WebFetch"]},
                  {"write": {"src/greet.py": "def greet(): return 'Hello'\n"}, "tokens_in": 2000, "tokens_out": 300,
                   "cost": 0.10}],
        "farewell": [{"write": {"src/farewell.py": "def farewell(): return 'Goodbye'\n"}, "tokens_in": 500,
                      "tokens_out": 50, "cost": 0.02}]}}))
    return path


def lanes_es(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lanes_es.cli.main", *args], cwd=PROJECT, capture_output=True,
                          text=True, env=env, timeout=timeout)


def agent_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{FAKES}{os.pathsep}{os.environ['PATH']}",
            "FAKE_AGENT_SCENARIO": str(scenario(tmp_path)), "ANTHROPIC_API_KEY": "sk-test-user-key"}


def calls(tmp_path: Path, task: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "calls" / f"{task}.jsonl").read_text().splitlines()]


def events_of(repo: str, batch_id: str) -> list[Any]:
    from lanes_es.bootstrap import bootstrap

    return bootstrap(repo, read_only=True).store.events(batch_id)


@pytest.mark.parametrize("agent", ADAPTER_NAMES)
def test_a_whole_batch_runs_with_a_named_agent_a_rework_round_and_a_budget_stop(repo_with_shout, tmp_path, agent):
    repo, lanes = repo_with_shout, tmp_path / "lanes"
    env = agent_env(tmp_path)
    plan = json.loads(Path(env["FAKE_AGENT_SCENARIO"]).read_text())
    plan["tasks"]["shout"] = [{"write": {"src/shout.py": "def shout(): return 'hey'\n"}, "tokens_in": 10000,
                               "steps": 2, "sleep_before_result": 0 if agent == "codex" else 60}]
    Path(env["FAKE_AGENT_SCENARIO"]).write_text(json.dumps(plan))
    budgets = ["--lane-budget-tokens", "5000", "--initiative-budget-attempts", "6"]
    if agent == "codex":  # it reports no cost: a dollar budget is refused before anything is confirmed
        refused = lanes_es("--root", repo, "run", SLUG, "--max-parallel", "3", "--lanes-dir", str(lanes),
                           "--executor", agent, "--yes", "--initiative-budget-usd", "5", env=env)
        assert refused.returncode == 2 and "--initiative-budget-usd cannot bound this Executor (codex reports no " \
                                           "cost)" in refused.stderr, refused.stdout + refused.stderr
        assert not refused.stderr.startswith("Traceback") and "batch_id" not in lanes_es(
            "--root", repo, "status", SLUG, "--json").stdout
    else:
        budgets += ["--initiative-budget-usd", "5"]
    done = lanes_es("--root", repo, "run", SLUG, "--max-parallel", "3", "--lanes-dir", str(lanes), "--executor", agent,
                    "--yes", "--poll", "0.05", *budgets, env=env)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "greet exited with 0" in done.stdout and "(attempt 2)" in done.stdout
    assert git_out(repo, "show", f"imm/{SLUG}:src/greet.py") == "def greet(): return 'Hello'"
    assert "Executor budget: per Lane: 5000 tokens; for the Initiative (all its Lanes): 6 attempts" in done.stdout
    assert "shout was stopped for its Executor budget: the Lane's budget of 5000 tokens is spent (" in done.stdout
    assert ("tokens used); a stopped task does not resume in this batch: to give it more, `lanes-es retire "
            "greetings`, remove its Lane, then run greetings again with a higher --lane-budget-tokens") in done.stdout

    greet_calls, farewell_calls, shout_calls = calls(tmp_path, "greet"), calls(tmp_path, "farewell"), calls(tmp_path, "shout")
    assert [call["attempt"] for call in greet_calls] == [1, 2] and len(farewell_calls) == len(shout_calls) == 1
    program = agent_named(agent).program
    for call in greet_calls + farewell_calls + shout_calls:
        lane = str(lanes / ("greet" if call in greet_calls else "farewell" if call in farewell_calls else "shout"))
        assert call["argv"] == agent_named(agent).argv(program, lane, call["prompt"], limits_of(call))[1:]
        if agent == "claude-code":  # the dollars left of the Initiative's budget, passed on
            assert 0 < call["flags"]["max_budget_usd"] <= 5
        assert call["cwd"] == lane and call["stdin"] == "devnull" and call["pgid_is_own"]
        assert "LANES_ES_STORE" not in call["env"] and call["env"]["LANES_ES_LANE_PATH"] == lane
    first, rework = (call["prompt"] for call in greet_calls)
    assert "first delivery" in first and "Write src/greet.py" in first and "- src/greet.py" in first
    assert "This attempt (2): rework" in rework
    assert "> greet:A1: python3 exited with code 1: expected \"def greet(): return 'Hello'\" in src/greet.py, found " \
           "\"def greet(): return 'Hi'\\n\"" in rework

    batch_id = json.loads(lanes_es("--root", repo, "status", SLUG, "--json").stdout)["batch_id"]
    events = events_of(repo, batch_id)
    attempts = [(type(event).__name__, event.task_id, event.attempt) for event in events
                if type(event).__name__.startswith("ExecutorRun")]
    shout_end = "ExecutorRunFinished" if agent == "codex" else "ExecutorRunKilled"
    assert sorted(attempts) == sorted([("ExecutorRunStarted", "greet", 1), ("ExecutorRunFinished", "greet", 1),
                                       ("ExecutorRunStarted", "greet", 2), ("ExecutorRunFinished", "greet", 2),
                                       ("ExecutorRunStarted", "farewell", 1), ("ExecutorRunFinished", "farewell", 1),
                                       ("ExecutorRunStarted", "shout", 1), (shout_end, "shout", 1)])
    shout_started, shout_ended = (event for event in events
                                  if type(event).__name__.startswith("ExecutorRun") and event.task_id == "shout")
    assert shout_started.limits.tokens == 5000 and shout_ended.usage.tokens_in >= 5000
    if agent != "codex":
        assert shout_ended.reason == "budget" and "token limit of 5000" in shout_ended.detail
    stop = next(event for event in events if type(event).__name__ == "ExecutorBudgetExhausted")
    assert (stop.task_id, stop.scope, stop.measure, stop.limit) == ("shout", "lane", "tokens", 5000)
    parked = next(child for child in json.loads(lanes_es("--root", repo, "status", SLUG, "--json").stdout)["children"]
                  if child["task_id"] == "shout")
    assert (parked["state"], parked["reason"]) == ("needs_human", "Kernel reported the child stopped")
    started = [event for event in events if type(event).__name__ == "ExecutorRunStarted" and event.task_id == "greet"]
    assert [event.obligation for event in started] == ["first_delivery", "rework"]
    assert all(event.adapter == agent and event.prompt_sha256 in " ".join(event.argv) for event in started)
    assert not any("You are the Executor" in argument for event in started for argument in event.argv)
    finished = {(event.task_id, event.attempt): event for event in events if type(event).__name__ == "ExecutorRunFinished"}
    first_greet = finished[("greet", 1)]
    assert (first_greet.exit_code, first_greet.submitted) == (0, True)
    assert (first_greet.usage.tokens_in, first_greet.usage.tokens_out) == (1000, 100)
    assert first_greet.usage.cost_usd == (None if agent == "codex" else 0.05)
    assert first_greet.usage.session_id
    settled = [event for event in events if type(event).__name__ == "BatchSettled"][-1]
    totals = {total.task_id: total for total in settled.extras.executor_totals}
    assert (totals["greet"].attempts, totals["greet"].tokens_in, totals["farewell"].attempts) == (2, 3000, 1)
    assert totals["shout"].killed == (0 if agent == "codex" else 1)

    assert lanes_es("--root", repo, "rebuild", batch_id, "--check").returncode == 0
    replayed = lanes_es("--root", repo, "replay", batch_id)
    assert replayed.returncode == 0 and "ExecutorRunFinished" in replayed.stdout, replayed.stdout
    page = tmp_path / "audit.html"
    assert lanes_es("--root", repo, "audit", batch_id, "--html", str(page)).returncode == 0
    html = page.read_text()
    assert "Executor attempts" in html and "first_delivery" in html and "rework" in html
    assert "shout</a> was stopped for its Executor budget: the Lane&#x27;s budget of 5000 tokens" in html
    status = lanes_es("--root", repo, "status", SLUG)
    assert "greet: 2 attempts" in status.stdout, status.stdout
    assert "  greet: spent 2 attempts, " in status.stdout and "3400 tokens" in status.stdout
    assert "left 1600 tokens" in status.stdout and "the Initiative (all Lanes): spent 4 attempts" in status.stdout
    assert "left 2 attempts" in status.stdout and "shout was stopped: the Lane's budget" in status.stdout


def limits_of(call: dict[str, Any]) -> Any:
    from lanes_es.domain.events import AttemptLimits

    cost = call["flags"].get("max_budget_usd")
    return AttemptLimits(timeout_seconds=3600, tokens=5000, cost_usd=cost)


def scenario_of(tmp_path: Path, greet: list[dict[str, Any]]) -> dict[str, str]:
    """The fakes' environment with `greet`'s attempts as given (farewell is delivered at once)."""
    env = agent_env(tmp_path)
    plan = json.loads(Path(env["FAKE_AGENT_SCENARIO"]).read_text())
    plan["tasks"]["greet"] = greet
    Path(env["FAKE_AGENT_SCENARIO"]).write_text(json.dumps(plan))
    return env


def attempt_events(repo: str, batch_id: str, task: str) -> list[Any]:
    return [event for event in events_of(repo, batch_id)
            if type(event).__name__.startswith("ExecutorRun") and event.task_id == task]


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_an_attempt_past_its_timeout_is_killed_recorded_and_named_in_the_summary(repo, tmp_path):
    env = scenario_of(tmp_path, [{"sleep": 60, "tokens_in": 10, "child": True}])
    done = lanes_es("--root", repo, "run", SLUG, "--max-parallel", "2", "--lanes-dir", str(tmp_path / "lanes"),
                    "--executor", "claude-code", "--executor-timeout", "2", "--yes", "--poll", "0.05", env=env)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "greet waits for submit_assurance" in done.stdout
    assert "its last attempt was killed after" in done.stdout and "timeout: the attempt ran past its 2s" in done.stdout
    batch_id = json.loads(lanes_es("--root", repo, "status", SLUG, "--json").stdout)["batch_id"]
    started, killed = attempt_events(repo, batch_id, "greet")
    assert started.limits.timeout_seconds == 2
    assert (type(killed).__name__, killed.reason, killed.usage.tokens_in) == ("ExecutorRunKilled", "timeout", 10)
    child = int((tmp_path / "calls" / "greet.child").read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


def test_a_killed_autopilot_leaves_its_attempt_running_and_the_next_run_records_it_once(repo, tmp_path):
    """The attempt outlives the autopilot (SIGKILL), submits its work and leaves its result; the next run adopts
    it by its pid file, records its end, and completes the batch with no second attempt."""
    env = scenario_of(tmp_path, [{"write": {"src/greet.py": "def greet(): return 'Hello'\n"}, "tokens_in": 7,
                                  "sleep_before_result": 4}])
    args = ["--root", repo, "run", SLUG, "--max-parallel", "2", "--lanes-dir", str(tmp_path / "lanes"),
            "--executor", "opencode", "--yes", "--poll", "0.05"]
    first = subprocess.Popen([sys.executable, "-m", "lanes_es.cli.main", *args], cwd=PROJECT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    greet_calls = tmp_path / "calls" / "greet.jsonl"
    deadline = time.monotonic() + 60
    while not greet_calls.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    first.kill()
    first.wait()
    again = lanes_es(*args, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    batch_id = json.loads(lanes_es("--root", repo, "status", SLUG, "--json").stdout)["batch_id"]
    events = attempt_events(repo, batch_id, "greet")
    assert [(type(event).__name__, event.attempt) for event in events] == [
        ("ExecutorRunStarted", 1), ("ExecutorRunFinished", 1)]
    assert events[1].submitted is True and events[1].usage.tokens_in == 7
    assert len(calls(tmp_path, "greet")) == 1


def test_an_attempt_lost_with_its_autopilot_is_recorded_lost_and_retried(repo, tmp_path):
    env = scenario_of(tmp_path, [{"sleep": 60}, {"write": {"src/greet.py": "def greet(): return 'Hello'\n"}}])
    args = ["--root", repo, "run", SLUG, "--max-parallel", "2", "--lanes-dir", str(tmp_path / "lanes"),
            "--executor", "codex", "--yes", "--poll", "0.05"]
    first = subprocess.Popen([sys.executable, "-m", "lanes_es.cli.main", *args], cwd=PROJECT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    greet_calls = tmp_path / "calls" / "greet.jsonl"
    deadline = time.monotonic() + 60
    while not greet_calls.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the autopilot and the attempt's process with it (a closed terminal)
    first.wait()
    agent = calls(tmp_path, "greet")[0]["pid"]  # its own session: the kernel's parent-death signal ends it
    deadline = time.monotonic() + 30
    while not gone(agent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(agent), "the agent outlived the attempt process that watched it"
    again = lanes_es(*args, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "recorded how the last attempt of greet, started by an earlier run, ended" in again.stdout
    batch_id = json.loads(lanes_es("--root", repo, "status", SLUG, "--json").stdout)["batch_id"]
    events = attempt_events(repo, batch_id, "greet")
    assert [(type(event).__name__, event.attempt) for event in events][:3] == [
        ("ExecutorRunStarted", 1), ("ExecutorRunKilled", 1), ("ExecutorRunStarted", 2)]
    assert events[1].reason == "lost" and events[2].obligation == "retry"
    assert "Attempt 1 ended without delivering" in calls(tmp_path, "greet")[1]["prompt"]
