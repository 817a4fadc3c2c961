"""One attempt of a named agent, run by its own process (`python -m lanes_es.executors.attempt`) against the
fake agent CLIs on PATH: the argv each fake accepted, stdin closed, the agent in a session of its own, the
usage read from its output, and the kills (wall clock, tokens, cost, the autopilot's stop, Ctrl-C) that end
its whole process group. No store: an attempt never writes to the log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from lanes_es.domain.events import AttemptLimits
from lanes_es.executors import ADAPTER_NAMES, agent_named
from lanes_es.executors.attempt import AttemptResult, AttemptSpec
from lanes_es.executors.environment import executor_environment
from tests.gitfixtures import run_git

FAKES = Path(__file__).resolve().parents[1] / "fakes" / "agents"


@pytest.fixture
def lane(tmp_path: Path) -> Path:
    path = tmp_path / "lane"
    path.mkdir()
    run_git(path, "init", "-q")
    return path


def scenario(tmp_path: Path, **step: object) -> Path:
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({"record": str(tmp_path / "records"), "default": step}))
    return path


def start(tmp_path: Path, lane: Path, name: str, step: dict, limits: AttemptLimits,
          env: dict | None = None) -> tuple[subprocess.Popen, AttemptSpec]:
    agent = agent_named(name)
    spec = AttemptSpec(agent=name, argv=agent.argv(str(FAKES / agent.program), str(lane), "Deliver it.", limits),
                       lane=str(lane), timeout_seconds=limits.timeout_seconds, max_tokens=limits.tokens,
                       max_cost_usd=limits.cost_usd, tmpdir=str(lane / ".imm" / "state" / "tmp"),
                       result_path=str(tmp_path / "result.json"), progress_path=str(tmp_path / "progress.json"),
                       stop_path=str(tmp_path / "stop.json"), submit_argv=[sys.executable, "-c", "pass"])
    (tmp_path / "spec.json").write_bytes(msgspec.json.encode(spec))
    contract = {"LANES_ES_TASK_ID": "greet", "LANES_ES_LANE_PATH": str(lane)}
    environment = executor_environment({**os.environ, **(env or {}), "FAKE_AGENT_SCENARIO": str(scenario(tmp_path, **step)),
                                        "LANES_ES_STORE": "postgresql://coordinator/secret"},
                                       contract, agent.environment(str(lane)))
    process = subprocess.Popen([sys.executable, "-P", "-m", "lanes_es.executors.attempt", str(tmp_path / "spec.json")],
                               cwd=lane, env=environment, stdin=subprocess.DEVNULL,
                               stdout=open(tmp_path / "attempt.log", "ab"), stderr=subprocess.STDOUT)
    return process, spec


def run_attempt(tmp_path: Path, lane: Path, name: str, limits: AttemptLimits = AttemptLimits(timeout_seconds=60),
                **step: object) -> AttemptResult:
    process, spec = start(tmp_path, lane, name, step, limits)
    assert process.wait(timeout=60) == 0, (tmp_path / "attempt.log").read_text()
    return msgspec.json.decode(Path(spec.result_path).read_bytes(), type=AttemptResult)


def calls(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "records" / "greet.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_an_attempt_runs_the_agent_headless_in_the_lane_and_reads_its_usage(tmp_path, lane, name):
    result = run_attempt(tmp_path, lane, name, write={"src/greet.py": "def greet(): ...\n"},
                         tokens_in=1200, tokens_out=300, cost=0.42, steps=3, denied=["WebFetch"])
    (call,) = calls(tmp_path)
    assert call["argv"] == agent_named(name).argv(str(FAKES / agent_named(name).program), str(lane), "Deliver it.",
                                                  AttemptLimits(timeout_seconds=60))[1:]
    assert call["workdir"] == str(lane) and call["cwd"] == str(lane) and call["prompt"] == "Deliver it."
    assert call["stdin"] == "devnull" and call["pgid_is_own"]  # stdin closed; a process group of its own to kill
    assert call["env"]["LANES_ES_TASK_ID"] == "greet" and "LANES_ES_STORE" not in call["env"]
    assert call["env"]["TMPDIR"] == str(lane / ".imm" / "state" / "tmp")
    assert (lane / "src" / "greet.py").read_text() == "def greet(): ...\n"
    assert (result.exit_code, result.killed) == (0, None)
    assert result.submitted is False  # asked to submit, and this Lane has no task: nothing was delivered
    usage = result.usage
    assert (usage.tokens_in, usage.tokens_out) == (1200, 300)
    assert usage.cost_usd == (None if name == "codex" else 0.42)
    assert usage.session_id and usage.agent_error is False or name != "claude-code"
    assert usage.denied_tools == (["command: WebFetch"] if name == "codex" else ["WebFetch"])
    assert msgspec.json.decode((tmp_path / "progress.json").read_bytes())["tokens_in"] == 1200


@pytest.mark.parametrize("name", ADAPTER_NAMES)
def test_an_agent_that_fails_is_recorded_with_its_own_error_and_not_submitted(tmp_path, lane, name):
    result = run_attempt(tmp_path, lane, name, error="no credentials: set ANTHROPIC_API_KEY", tokens_in=10)
    assert result.exit_code == 1 and result.submitted is None and result.killed is None
    assert result.usage.agent_error is True and "no credentials" in result.usage.error


def test_an_agent_past_its_wall_clock_limit_is_killed_with_its_whole_group(tmp_path, lane):
    began = time.monotonic()
    result = run_attempt(tmp_path, lane, "claude-code", AttemptLimits(timeout_seconds=2), sleep=60, steps=2,
                         tokens_in=10, child=True)
    assert time.monotonic() - began < 30
    assert result.killed == "timeout" and "2s wall-clock limit" in result.detail and result.submitted is None
    assert result.usage.tokens_in == 5  # the first of two steps was reported before the kill
    child = int((tmp_path / "records" / "greet.child").read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


@pytest.mark.parametrize("name,limits,expected", [
    ("opencode", AttemptLimits(timeout_seconds=60, tokens=1000), "token limit of 1000"),
    ("opencode", AttemptLimits(timeout_seconds=60, cost_usd=0.5), "cost limit of $0.50"),
    ("claude-code", AttemptLimits(timeout_seconds=60, tokens=1000), "token limit of 1000"),
])
def test_an_agent_past_its_token_or_cost_limit_is_killed_for_its_budget(tmp_path, lane, name, limits, expected):
    """As the agent reports it: OpenCode after each step, Claude Code after each message (its cost only at the
    end, where its own --max-budget-usd stops it); Codex reports a turn's tokens when the turn ends."""
    result = run_attempt(tmp_path, lane, name, limits, tokens_in=4000, tokens_out=400, cost=2.0, steps=4,
                         sleep_before_result=30)
    assert result.killed == "budget" and expected in result.detail, result
    assert result.submitted is None


def test_an_agent_that_crosses_its_limit_as_it_ends_is_not_killed(tmp_path, lane):
    result = run_attempt(tmp_path, lane, "opencode", AttemptLimits(timeout_seconds=60, cost_usd=0.5), cost=0.75)
    assert result.killed is None and result.exit_code == 0 and result.usage.cost_usd == 0.75


@pytest.mark.parametrize("signum,reason", [(signal.SIGTERM, "budget"), (signal.SIGINT, "interrupted")])
def test_the_autopilot_stops_an_attempt_with_its_reason(tmp_path, lane, signum, reason):
    process, spec = start(tmp_path, lane, "codex", {"sleep": 60, "steps": 2, "tokens_in": 10},
                          AttemptLimits(timeout_seconds=120))
    progress = Path(spec.progress_path)
    deadline = time.monotonic() + 30
    while not progress.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    Path(spec.stop_path).write_text(json.dumps({"reason": "budget", "detail": "the Initiative's tokens are spent"}))
    process.send_signal(signum)
    assert process.wait(timeout=30) == 0
    result = msgspec.json.decode(Path(spec.result_path).read_bytes(), type=AttemptResult)
    assert result.killed == reason and result.exit_code == -signal.SIGKILL
    assert result.detail == ("the Initiative's tokens are spent" if reason == "budget" else "Ctrl-C reached the attempt")


def test_an_agent_that_is_not_installed_is_an_attempt_that_could_not_start(tmp_path, lane):
    spec = AttemptSpec(agent="codex", argv=[str(tmp_path / "no-such-codex"), "exec", "x"], lane=str(lane),
                       timeout_seconds=10, result_path=str(tmp_path / "r.json"), progress_path=str(tmp_path / "p"),
                       stop_path=str(tmp_path / "s"), submit_argv=["true"])
    (tmp_path / "spec.json").write_bytes(msgspec.json.encode(spec))
    done = subprocess.run([sys.executable, "-P", "-m", "lanes_es.executors.attempt", str(tmp_path / "spec.json")],
                          cwd=lane, stdin=subprocess.DEVNULL, capture_output=True)
    assert done.returncode == 0, done.stderr
    result = msgspec.json.decode((tmp_path / "r.json").read_bytes(), type=AttemptResult)
    assert result.exit_code == 127 and "could not start" in result.usage.error
