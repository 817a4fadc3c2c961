"""An autopilot killed outright (SIGKILL) mid-check leaves no check running and no temporary tree behind.

`lanes-es run` (the real command line) runs one task whose check, the first time, starts a child of its own
and then sleeps. The autopilot is killed while the check runs: the check's leader ends with it (the kernel's
parent-death signal), and the next `lanes-es run` ends the child the leader left (its group was recorded) and
removes the killed autopilot's temporary trees before it runs the check again, which then passes. The
autopilot runs with a temporary directory of its own, so the trees counted are its. The batch runs in its
coordinator worktree (the default), where it converges; the user's checkout stays on main, untouched. On
both store backends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lanes_es.adapters.processes import process_alive
from tests.engine import Task, initiative_markdown
from tests.gitfixtures import descriptor, intent_json, make_repo

pytestmark = pytest.mark.coordinator_worktree
PROJECT = Path(__file__).resolve().parents[2]
SLUG = "slow"
# First run: a child of its own (in the check's group), the pids where the test reads them, then a long sleep.
CHECK = ("import os, subprocess, sys, time; flag = sys.argv[1]; os.path.exists(flag) and sys.exit(0); "
         "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
         "open(flag + '.tmp', 'w').write('%d %d' % (os.getpid(), child.pid)); os.rename(flag + '.tmp', flag); "
         "time.sleep(120)")


def lanes_run(repo: str, tmp_path: Path, env: dict[str, str]) -> list[str]:
    return [sys.executable, "-m", "lanes_es.cli.main", "--root", repo, "run", SLUG, "--max-parallel", "1",
            "--lanes-dir", str(tmp_path / "lanes"), "--yes",
            "--executor", f"{sys.executable} -P -m lanes_es.cli.example_executor"]


def temporary_trees(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory)
                  if name.startswith(("lanes-es-candidate-", "lanes-es-qa-home-", "lanes-es-qa-tree-")))


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_an_autopilot_killed_mid_check_leaves_no_check_running_and_no_tree(tmp_path, store_url):
    flag = tmp_path / "check-started"
    check = descriptor(["-c", CHECK, str(flag)], timeout_ms=180_000)
    repo = make_repo(tmp_path / "repo", intents={"slow": intent_json("slow", ["slow.txt"], verification=check)},
                     files={f"docs/initiatives/{SLUG}.md": initiative_markdown({"slow": Task(["slow.txt"])})})
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "PYTHONPATH": str(PROJECT), "TMPDIR": str(temporary),
           "LANES_ES_EXECUTOR_HINT": json.dumps({"path": "slow.txt", "content": "slow\n"})}
    pids: list[int] = []
    try:
        first = subprocess.Popen(lanes_run(repo, tmp_path, env), cwd=PROJECT, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        assert wait_for(flag.exists, 240), "the check never started"
        pids = [int(pid) for pid in flag.read_text().split()]
        assert temporary_trees(temporary), "the check runs in temporary trees"
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)

        leader, child = pids
        assert wait_for(lambda: not process_alive(leader), 10), "the check's leader outlived its autopilot"

        again = subprocess.run(lanes_run(repo, tmp_path, env), cwd=PROJECT, env=env, capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        assert not process_alive(child), "what the killed check started still runs"
        assert temporary_trees(temporary) == []
        coordinator = Path(repo, ".git", "lanes-es", "coordinators", SLUG)
        (state,) = [path for path in Path(coordinator, ".imm/state/batches").glob("*.json")
                    if ".report" not in path.name]
        assert json.loads(state.read_text())["batch_state"] == "completed"
        assert subprocess.run(["git", "-C", repo, "status", "--porcelain=v1", "--branch"], capture_output=True,
                              text=True).stdout == "## main\n"
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
