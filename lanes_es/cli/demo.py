"""`lanes-es demo`: a whole batch on a fresh repository, with the demo playing steward and Executor.

It writes a small Initiative (six tasks with dependencies, two with overlapping scopes),
confirms it, and runs the autopilot (`lanes-es run`) with a scripted Executor until the
batch completes: a worktree for each provision handoff, an Executor process in each Lane
that edits inside its task's scope and runs `lanes-es task submit`, a Lane removed on each
release handoff. It then prints the batch branch's commits, the final report's summary
and the result of `rebuild --check`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from lanes_es.adapters.git import git

SLUG = "demo"

# task id -> (slice, blocked_by, scope, goal, file, content)
TASKS: dict[str, tuple[str, list[str], list[str], str, str, str]] = {
    "greet": ("S1", [], ["src/greet.py"], "Add a greeting function", "src/greet.py",
              "def greet(name):\n    return f'Hello, {name}!'\n"),
    "farewell": ("S2", [], ["src/farewell.py"], "Add a farewell function", "src/farewell.py",
                 "def farewell(name):\n    return f'Goodbye, {name}.'\n"),
    "guide-intro": ("S3", [], ["docs/guide.md"], "Write the guide's introduction", "docs/guide.md",
                    "# Guide\n\nThis app greets and says goodbye.\n"),
    "guide-usage": ("S4", [], ["docs/guide.md"], "Add usage to the guide", "docs/guide.md",
                    "\n## Usage\n\n    python -m src.cli NAME\n"),
    "cli": ("S5", ["greet", "farewell"], ["src/cli.py"], "Add a command line", "src/cli.py",
            "import sys\nfrom src.greet import greet\nfrom src.farewell import farewell\n\n"
            "if __name__ == '__main__':\n    print(greet(sys.argv[1]))\n    print(farewell(sys.argv[1]))\n"),
    "smoke-test": ("S6", ["cli"], ["tests/test_cli.py"], "Add a smoke test for the command line",
                   "tests/test_cli.py", "from src.cli import greet\n\n\ndef test_greet():\n"
                   "    assert greet('x') == 'Hello, x!'\n"),
}


def register(commands: Any) -> None:
    command = commands.add_parser(
        "demo", help="run a whole batch on a new temporary repository",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("--dir", default=None, help="where to make the repository (default: a new temp dir)")
    from lanes_es.cli.main import positive_int

    command.add_argument("--max-parallel", type=positive_int, default=3, help="Lanes in flight at once (default 3)")
    command.add_argument("--no-run", action="store_true",
                         help="only make the repository and the scripted Executor's hints (DIR/repo, "
                              "DIR/executor-hints.json) and print the `lanes-es run` command that runs it")
    command.set_defaults(func=lambda args: (make_only(args.dir, args.max_parallel) if args.no_run
                                            else run_demo(args.dir, args.max_parallel)))


def initiative_markdown() -> str:
    lines = ["# Demo Initiative", "", "A small app built in parallel Lanes.", ""]
    for task_id, (slice_id, blocked_by, _, goal, _, _) in TASKS.items():
        lines += [f"## {slice_id}: {goal}", ""]
        if blocked_by:
            lines += [f"Blocked by: {', '.join(blocked_by)}", ""]
        lines += ["Tasks:", f"- {task_id}", ""]
    return "\n".join(lines)


def intent_json(task_id: str) -> str:
    _, _, scope, goal, path, content = TASKS[task_id]
    probe = content.strip().splitlines()[-1].strip()
    check = (f"import pathlib, sys; text = pathlib.Path({path!r}).read_text() "
             f"if pathlib.Path({path!r}).exists() else ''; sys.exit(0 if {probe!r} in text else 1)")
    intent = {
        "contract": "assurance_kernel/task_intent/v1",
        "task_id": task_id,
        "goal": goal,
        "acceptance": [{
            "id": "A1",
            "assertion": f"{path} holds the delivered text",
            "verification": json.dumps({
                "contract": "assurance_kernel/verification_descriptor/v2",
                "command": {"executable": "python3", "argv": ["-c", check], "cwd": ".",
                            "timeout_ms": 60000, "max_output_bytes": 4096},
                "environment": {"prepare": None, "writable_paths": []},
            }),
        }],
        "scope_hint": scope,
        "risk": "routine",
        "revision": 1,
        "owner": "user",
    }
    return json.dumps(intent, indent=2) + "\n"


def make_repository(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    git(str(root), "init", "-q", "-b", "main")
    git(str(root), "config", "user.name", "Demo User")
    git(str(root), "config", "user.email", "demo@example.invalid")
    (root / ".gitignore").write_text(".imm/state/\n__pycache__/\n")
    (root / "README.md").write_text("# demo app\n")
    (root / "docs" / "initiatives").mkdir(parents=True)
    (root / "docs" / "plans").mkdir(parents=True)
    (root / "docs" / "initiatives" / f"{SLUG}.md").write_text(initiative_markdown())
    for task_id in TASKS:
        (root / "docs" / "plans" / f"{task_id}.intent.json").write_text(intent_json(task_id))
    git(str(root), "add", "-A")
    git(str(root), "commit", "-q", "-m", "Demo base: an Initiative and its intents")


def refuse_used_directory(base: Path, *inside: Path) -> None:
    """The demo makes its repository and Lanes only in new places: it never writes over a user's files."""
    from lanes_es.errors import ServiceError

    if base.exists() and not base.is_dir():
        raise ServiceError("invalid_demo_dir", f"--dir {base} is a file; name a new or empty directory")
    for path in inside:
        if path.exists():
            raise ServiceError("invalid_demo_dir", f"{path} already exists; name a new or empty directory with "
                                                   f"`lanes-es demo --dir DIR`, or leave --dir out for a temporary one")


HINTS_FILE = "executor-hints.json"


def executor_hints() -> dict[str, dict[str, str]]:
    """What the scripted Executor writes for each task: the content each demo task's check asks for."""
    return {task_id: {"path": spec[4], "content": spec[5]} for task_id, spec in TASKS.items()}


def example_executor(hints: Path | None = None) -> list[str]:
    """The scripted Executor's argv: this interpreter (it has lanes-es), -P so a Lane's files never shadow it."""
    return [sys.executable, "-P", "-m", "lanes_es.cli.example_executor", *(["--hints", str(hints)] if hints else [])]


def demo_places(directory: str | None) -> tuple[Path, Path, Path]:
    """The demo's base directory, its repository and its Lanes' directory; refused when either is used."""
    base = Path(directory).resolve() if directory else Path(tempfile.mkdtemp(prefix="lanes-es-demo-"))
    repo, lanes = base / "repo", base / "lanes"
    refuse_used_directory(base, repo, lanes, base / HINTS_FILE)
    return base, repo, lanes


def run_command(base: Path, max_parallel: int) -> list[str]:
    """The `lanes-es run` command that runs the demo's Initiative made by `make_only`."""
    return ["lanes-es", "--root", str(base / "repo"), "run", SLUG, "--max-parallel", str(max_parallel),
            "--lanes-dir", str(base / "lanes"), "--executor", shlex.join(example_executor(base / HINTS_FILE))]


def make_only(directory: str | None, max_parallel: int = 3, out: Callable[[str], None] = print) -> int:
    """`demo --no-run`: the repository and the hints, and the command that runs the autopilot on them."""
    base, repo, _ = demo_places(directory)
    make_repository(repo)
    (base / HINTS_FILE).write_text(json.dumps(executor_hints(), indent=2) + "\n", encoding="utf-8")
    out(f"demo repository: {repo}")
    out(f"the scripted Executor's hints: {base / HINTS_FILE}")
    out("run the batch to the end (add --yes to confirm without being asked):")
    out(f"  {shlex.join(run_command(base, max_parallel))}")
    return 0


def run_demo(directory: str | None, max_parallel: int = 3, out: Callable[[str], None] = print,
             coordinator: str | None = None) -> int:
    """Make the repository, then let the autopilot play Parent, steward and (scripted) Executor to the end, in
    the batch's coordinator worktree (`coordinator`: `.` in the repository itself, as upstream)."""
    from lanes_es.steward.run import AutopilotOptions, run_autopilot
    from lanes_es.cli.main import main as cli
    from lanes_es.bootstrap import bootstrap
    from lanes_es.usecases.confirmation import BatchOptions
    from lanes_es.usecases.load import active_batch

    base, repo, lanes = demo_places(directory)
    make_repository(repo)
    out(f"demo repository: {repo}")
    out(f"Initiative docs/initiatives/{SLUG}.md: {len(TASKS)} tasks; guide-intro and guide-usage share "
        f"docs/guide.md, so they run one after the other")
    deps = bootstrap(repo)
    options = AutopilotOptions(batch=BatchOptions(max_parallel=max_parallel), lanes_dir=lanes,
                               executor=example_executor(), yes=True,
                               executor_env={"LANES_ES_EXECUTOR_HINT": json.dumps(executor_hints())},
                               coordinator=coordinator)
    code = run_autopilot(deps, SLUG, options, out=out)
    batch = active_batch(deps, SLUG)
    if code != 0 or batch is None or batch.batch_state != "completed":
        out(f"the batch did not complete (exit {code})")
        return code or 3
    out("")
    out(f"batch branch imm/{SLUG} ({len(batch.record['commits'])} commits, oldest last):")
    out(git(str(repo), "log", "--format=  %h %s", f"{batch.record['base_head']}..imm/{SLUG}").text)
    report = batch.report or {}
    out("")
    out(f"final report: {report.get('batch_state')}: {report.get('reason')}")
    from lanes_es.usecases.coordinator import batch_root

    out(f"  {Path(batch_root(deps.store, repo, batch.id)) / '.imm/state/batches' / f'{batch.id}.report.json'}")

    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        check = cli(["--root", str(repo), "rebuild", batch.id, "--check"])
    out(f"rebuild --check: {buffer.getvalue().strip()} (exit {check})")
    out(f"audit it: lanes-es --root {repo} verify {batch.id}")
    return 0 if check == 0 else 1


if __name__ == "__main__":
    sys.exit(run_demo(sys.argv[1] if len(sys.argv) > 1 else None))
