"""Opt-in smoke test: a real coding agent's CLI runs a one-task batch through `lanes-es run --executor NAME`.

Skipped unless LANES_ES_REAL_AGENT names an adapter (claude-code, codex or opencode) whose program is on
PATH with its credentials (the user's login or API key, which the attempt inherits): it costs money and
needs the network, so CI does not run it (docs/development.md says how to). It checks what the fakes
cannot: that the real CLI accepts the flags lanes-es passes, that its output is read as its documented
format (a session id and tokens in the log), that its sandbox lets it write in the Lane, and that the
task's check passes on what it wrote. One store backend (SQLite), to pay for one run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lanes_es.executors import ADAPTER_NAMES, agent_named
from tests.engine import Task, initiative_markdown
from tests.gitfixtures import descriptor, intent_json, make_repo

PROJECT = Path(__file__).resolve().parents[2]
AGENT = os.environ.get("LANES_ES_REAL_AGENT", "")
SLUG = "smoke"
LINE = "def answer():\n    return 42\n"

pytestmark = pytest.mark.skipif(
    AGENT not in ADAPTER_NAMES or shutil.which(agent_named(AGENT).program if AGENT in ADAPTER_NAMES else "") is None,
    reason="opt-in: set LANES_ES_REAL_AGENT to claude-code, codex or opencode, with that CLI on PATH and logged in")


def test_a_real_agent_delivers_a_one_task_batch_within_its_budget(tmp_path: Path) -> None:
    check = descriptor(["-c", "from answer import answer; assert answer() == 42"])
    intent = intent_json("answer", ["answer.py"], verification=check,
                         goal="Create answer.py with a function answer() that returns the integer 42. Nothing else.")
    repo = make_repo(tmp_path / "repo", intents={"answer": intent},
                     files={f"docs/initiatives/{SLUG}.md": initiative_markdown({"answer": Task(["answer.py"])})})
    budgets = ["--lane-budget-attempts", "2", "--lane-budget-wall", "10m", "--lane-budget-tokens", "2000000"]
    if agent_named(AGENT).reports_cost:
        budgets += ["--lane-budget-usd", os.environ.get("LANES_ES_REAL_AGENT_USD", "1")]
    env = {**os.environ, "LANES_ES_STORE": str(tmp_path / "events.sqlite")}
    done = subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "--root", repo, "run", SLUG, "--max-parallel",
                           "1", "--lanes-dir", str(tmp_path / "lanes"), "--executor", AGENT, "--yes", *budgets],
                          cwd=PROJECT, capture_output=True, text=True, env=env, timeout=1500)
    status = json.loads(subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "--root", repo, "status", SLUG,
                                        "--json"], cwd=PROJECT, capture_output=True, text=True, env=env).stdout)
    attempts = status["executor_attempts"]["answer"]["attempts"]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    first = attempts[0]
    assert first["adapter"] == AGENT and first["usage"]["session_id"], first
    assert (first["usage"]["tokens_in"] or 0) > 0, first
    assert status["batch_state"] == "completed" and status["executor_budget"]["lanes"]["answer"]["spent"]["attempts"] <= 2
