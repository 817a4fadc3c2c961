"""What the three fake agent CLIs share: the scenario they play, the record of each call, the Lane edits.

A test puts tests/fakes/agents first on PATH and writes a scenario (FAKE_AGENT_SCENARIO, a JSON
file); each fake (`claude`, `codex`, `opencode`) parses its argv with exactly the flags its real
CLI documents (anything else is refused as the real one would, exit 1 or 2), appends one JSON line
per call to the record directory (its argv, working directory, environment, whether stdin was
closed, the prompt), does what the scenario says for this task's attempt, and prints that
agent's documented output format.

Scenario:
    {"record": DIR,
     "default": STEP, "tasks": {TASK: [STEP for attempt 1, STEP for attempt 2, ...]}}
STEP (every key optional):
    {"write": {PATH: TEXT}, "append": {PATH: TEXT},   # edits in the working directory
     "tokens_in": N, "tokens_out": N, "cost": USD, "steps": N,  # usage, spread over N steps
     "denied": [TOOL, ...], "error": TEXT, "exit": CODE,
     "sleep": SECONDS, "sleep_before_result": SECONDS,     # to be killed at a timeout or a limit
     "child": true}                                     # leave a sleeping child in its process group
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def scenario() -> dict[str, Any]:
    return json.loads(Path(os.environ["FAKE_AGENT_SCENARIO"]).read_text())


def stdin_state() -> str:
    """How stdin was handed over: "devnull", "closed", or "open" (a pipe or terminal that could block)."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return "closed"
    if stat.S_ISCHR(mode) and os.path.realpath(f"/proc/self/fd/0") == "/dev/null":
        return "devnull"
    return "open"


def play(agent: str, argv: list[str], workdir: str, prompt: str, flags: dict[str, Any]) -> dict[str, Any]:
    """Record the call, make the step's edits; the step (with its attempt number) for the output."""
    plan = scenario()
    task = os.environ.get("LANES_ES_TASK_ID", "")
    records = Path(plan["record"])
    records.mkdir(parents=True, exist_ok=True)
    log = records / f"{task or 'no-task'}.jsonl"
    attempt = (len(log.read_text().splitlines()) if log.exists() else 0) + 1
    steps = plan.get("tasks", {}).get(task)
    step = dict(steps[min(attempt, len(steps)) - 1] if steps else plan.get("default", {}))
    with log.open("a") as handle:
        handle.write(json.dumps({
            "agent": agent, "attempt": attempt, "pid": os.getpid(), "argv": argv, "cwd": os.getcwd(), "workdir": workdir,
            "prompt": prompt, "flags": flags, "stdin": stdin_state(), "pgid_is_own": os.getpgid(0) == os.getpid(),
            "env": {name: value for name, value in os.environ.items()
                    if name.startswith(("LANES_ES_", "FAKE_", "GIT_", "OPENCODE_")) or name in ("TMPDIR", "HOME")},
        }) + "\n")
    for relative, text in step.get("write", {}).items():
        target = Path(workdir) / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for relative, text in step.get("append", {}).items():
        target = Path(workdir) / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as handle:
            handle.write(text)
    if step.get("child"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        (records / f"{task}.child").write_text(str(child.pid))
    step["attempt"] = attempt
    return step


def emit(item: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(item) + "\n")
    sys.stdout.flush()


def shares(total: int, parts: int) -> list[int]:
    """`total` split into `parts` whole shares adding up to it."""
    base, rest = divmod(total, parts)
    return [base + (1 if index < rest else 0) for index in range(parts)]


def pause(step: dict[str, Any], key: str) -> None:
    if step.get(key):
        time.sleep(float(step[key]))


def refuse(text: str, code: int = 1) -> None:
    sys.stderr.write(text + "\n")
    sys.exit(code)
