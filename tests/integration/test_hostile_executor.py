"""A hostile Executor arms every git key that can name a program; nothing runs in any git call of lanes-es.

`lanes-es run` (the real command line) runs a batch of three tasks whose Executor
(tests/integration/hostile_executor.py) first writes the repository's shared config (filters, merge and diff
drivers, fsmonitor, editors, pager, signature checks, credential helper, askpass, ssh, hooks, an included
file), `.git/info/attributes` and an in-scope `.gitattributes` naming its drivers for every path, then
delivers. Every lanes-es git call site runs after that: the Lanes' QA copy and delivery identity (`task
submit`), the coordinator's status, the lane commit's `add -A`, the candidate (merge-tree, ls-tree,
cat-file), the integration's `merge --ff-only`, the steward's `worktree add` of the task that waits for
the first and its `worktree remove`s, the checkpoints (cat-file, fast-import), and `verify`. The batch
completes and no program left a marker. On both store backends.

Each key on its own, with proof that it is armed: test_git_programs.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine import Task, initiative_markdown
from tests.gitfixtures import batch_state_files, descriptor, intent_json, make_repo

pytestmark = pytest.mark.coordinator_worktree

PROJECT = Path(__file__).resolve().parents[2]
EXECUTOR = Path(__file__).with_name("hostile_executor.py")
SLUG = "hostile"
TASKS = {  # task -> (scope, blocked_by, path, content)
    "arm": ([".gitattributes", "src/arm.txt"], [], "src/arm.txt", "armed\n"),
    "beside": (["src/beside.txt"], [], "src/beside.txt", "beside\n"),
    "after": (["src/after.txt"], ["arm"], "src/after.txt", "after\n"),
}


def holds(path: str, content: str) -> str:
    return descriptor(["-c", f"import sys; sys.exit(0 if open({path!r}).read() == {content!r} else 1)"])


def lanes_es(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lanes_es.cli.main", *args], cwd=PROJECT, env=env, text=True,
                          capture_output=True, timeout=600)


def test_a_hostile_executor_arms_every_program_and_none_runs_in_lanes_es_git(tmp_path, store_url):
    intents = {task: intent_json(task, scope, verification=holds(path, content))
               for task, (scope, _, path, content) in TASKS.items()}
    tasks = {task: Task(scope, blocked_by=blocked) for task, (scope, blocked, _, _) in TASKS.items()}
    repo = make_repo(tmp_path / "repo", intents=intents,
                     files={f"docs/initiatives/{SLUG}.md": initiative_markdown(tasks)})
    markers = tmp_path / "hostile" / "markers"
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "HOSTILE_MARKERS": str(markers),
           "LANES_ES_EXECUTOR_HINT": json.dumps({task: {"path": path, "content": content}
                                                  for task, (_, _, path, content) in TASKS.items()})}

    ran = lanes_es("--root", repo, "run", SLUG, "--max-parallel", "2", "--lanes-dir", str(tmp_path / "lanes"),
                   "--yes", "--executor", f"{sys.executable} {EXECUTOR}", env=env)
    assert sorted(path.name for path in markers.iterdir()) == [], ran.stdout + ran.stderr
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert '[filter "evil"]' in Path(repo, ".git", "config").read_text()  # the Executor did arm the repository

    (state,) = batch_state_files(repo, SLUG)
    record = json.loads(state.read_text())
    assert record["batch_state"] == "completed" and len(record["commits"]) == 3
    verified = lanes_es("--root", repo, "verify", state.stem, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert sorted(path.name for path in markers.iterdir()) == []
