"""A symlink to a directory is an input like any other: it passes the Lane's QA and the candidate's rerun.

The Lane's QA copies the worktree (the link as a link) and the candidate writes its tree from git's objects
(the link as a link); both then compare the inputs the checks may not change. A directory's symlink was
listed among the directories by the walk that reads them after the checks, so the candidate, which counts
it from the tree, saw it "removed" and parked the Lane with batch_integration_check_failed. Through
`lanes-es run` (the real command line), on both store backends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine import Task, initiative_markdown
from tests.gitfixtures import batch_state_files, descriptor, git_out, intent_json, make_repo

pytestmark = pytest.mark.coordinator_worktree

PROJECT = Path(__file__).resolve().parents[2]
SLUG = "links"
EXECUTOR = """
import os, subprocess, sys
lane = os.environ["LANES_ES_LANE_PATH"]
os.symlink("v2", os.path.join(lane, "src", "x", "latest"))
sys.exit(subprocess.run([sys.executable, "-P", "-m", "lanes_es.cli.main", "--root", lane, "task", "submit"]).returncode)
"""


def test_a_symlink_to_a_directory_passes_lane_qa_and_integrates(tmp_path, store_url):
    reads_through_the_link = descriptor(
        ["-c", "import sys; sys.exit(0 if open('src/x/latest/data.txt').read() == 'v2\\n' else 1)"])
    repo = make_repo(tmp_path / "repo", intents={"link": intent_json("link", ["src/x/"],
                                                                      verification=reads_through_the_link)},
                     files={"src/x/v2/data.txt": "v2\n",
                            f"docs/initiatives/{SLUG}.md": initiative_markdown({"link": Task(["src/x/"])})})
    executor = tmp_path / "executor.py"
    executor.write_text(EXECUTOR)
    ran = subprocess.run([sys.executable, "-m", "lanes_es.cli.main", "--root", repo, "run", SLUG, "--max-parallel", "1",
                          "--lanes-dir", str(tmp_path / "lanes"), "--yes", "--executor", f"{sys.executable} {executor}"],
                         cwd=PROJECT, env={**os.environ, "PYTHONPATH": str(PROJECT)}, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (state,) = batch_state_files(repo, SLUG)
    record = json.loads(state.read_text())
    assert record["batch_state"] == "completed", record
    assert git_out(repo, "ls-tree", f"imm/{SLUG}", "src/x/latest").split()[:1] == ["120000"]
    assert git_out(repo, "cat-file", "-p", f"imm/{SLUG}:src/x/latest") == "v2"
