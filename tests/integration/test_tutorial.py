"""docs/tutorial.md, run as written: every `sh` block between its tutorial-test markers, in order, in one
bash, from an empty directory, with `lanes-es` on PATH as the tutorial's activated venv has it.

The Executor is the tutorial's own script, and the batch really runs: Lanes, QA, candidates, the
batch branch, `verify`, and `main` fast-forwarded. If a command or an output the text relies on
changes, this fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.coordinator_worktree  # the tutorial runs its batch in the default coordinator worktree
PROJECT = Path(__file__).resolve().parents[2]
TUTORIAL = PROJECT / "docs" / "tutorial.md"


def tutorial_script() -> str:
    text = TUTORIAL.read_text(encoding="utf-8")
    part = text.split("<!-- tutorial-test: start -->", 1)[1].split("<!-- tutorial-test: end -->", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```$", part, flags=re.S | re.M)
    assert len(blocks) >= 6, "the tutorial's commands were not found"
    return "set -euo pipefail\n" + "\n".join(blocks)


def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = Tutorial Reader\n\temail = reader@example.invalid\n")
    work = tmp_path / "work"
    work.mkdir()
    bin_dir = str(Path(sys.executable).parent)  # the venv's: `. .venv/bin/activate` puts it first
    env = {**os.environ, "HOME": str(home), "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
           "GIT_CONFIG_NOSYSTEM": "1"}
    for name in ("LANES_ES_STORE", "GIT_DIR", "GIT_WORK_TREE"):
        env.pop(name, None)
    done = subprocess.run(["bash", "-c", tutorial_script()], cwd=work, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = done.stdout
    repo = work / "greeter"
    assert "cli [enrollable] (blocked by greet)" in out
    assert "warning: cli's scope cli.py matches no file of HEAD" in out
    assert ": completed" in out and "verified: every check holds" in out
    assert "Hello, Ada!" in out
    assert (repo / "cli.py").is_file()
    log = subprocess.run(["git", "log", "--format=%s", "main"], cwd=repo, env=env, capture_output=True, text=True)
    assert log.stdout.splitlines()[:2] == ["imm(cli): Add cli.py: python3 cli.py NAME prints the greeting",
                                           "imm(greet): Make greet(name) in greet.py return 'Hello, NAME!'"]
    assert "imm/greeting" not in subprocess.run(["git", "branch"], cwd=repo, env=env, capture_output=True,
                                                text=True).stdout
    assert (work / "greeting-audit.html").stat().st_size > 0
