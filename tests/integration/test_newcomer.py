"""What a newcomer meets, through the real command line: authoring an Initiative, the CLI's conventions, and
every dead end found by trying (each test here failed before its fix).

Each test runs `lanes-es` in a subprocess on a real repository and store (`repo` runs on both backends).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lanes_es.exit_codes import EXIT_OK
from tests.gitfixtures import make_repo, run_git
from tests.integration.test_user_errors import lanes, refused

PROJECT = Path(__file__).resolve().parents[2]
GREET_CHECK = "python3 -c \"from greet import greet; assert greet('Ada') == 'Hello, Ada!'\""


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == EXIT_OK, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stdout


@pytest.fixture
def greeter(tmp_path: Path) -> Path:
    return Path(make_repo(tmp_path / "greeter", files={"greet.py": "def greet(name):\n    raise NotImplementedError\n"}))


# ---------------------------------------------------------------- authoring


def test_the_readme_example_is_what_add_task_writes(greeter: Path) -> None:
    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    commands = re.search(r"```sh\n(lanes-es initiative new .*?)```", readme, re.S).group(1)
    shell = f"set -e\nlanes-es() {{ {sys.executable} -m lanes_es.cli.main \"$@\"; }}\n{commands}"
    done = subprocess.run(["bash", "-c", shell], cwd=greeter, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(PROJECT)})
    assert done.returncode == 0, done.stderr
    shown = re.search(r"```json\n(.*?)```", readme, re.S).group(1)
    assert json.loads((greeter / "docs/plans/greet.intent.json").read_text()) == json.loads(shown)
    shown_initiative = re.search(r"```markdown\n(.*?)```", readme, re.S).group(1)
    assert (greeter / "docs/initiatives/greeting.md").read_text() == shown_initiative


def test_authored_files_make_a_plan_and_the_plan_warns_of_scope_that_matches_nothing(greeter: Path) -> None:
    ok(lanes(greeter, "initiative", "new", "greeting"))
    ok(lanes(greeter, "initiative", "add-task", "greeting", "greet", "--goal", "Write greet", "--scope", "greet.py",
             "--check", GREET_CHECK))
    out = ok(lanes(greeter, "initiative", "add-task", "greeting", "cli", "--goal", "A command line",
                   "--scope", "cli.py", "bin", "--blocked-by", "greet", "--check", "python3 cli.py Ada"))
    assert "note: scope entry cli.py matches no committed file yet" in out
    run_git(greeter, "add", "docs")
    run_git(greeter, "commit", "-q", "-m", "Initiative greeting")
    out = ok(lanes(greeter, "plan", "greeting"))
    assert "greet [enrollable]" in out and "cli [enrollable] (blocked by greet)" in out
    assert "warning: cli's scope cli.py, bin matches no file of HEAD" in out
    plan = json.loads(ok(lanes(greeter, "plan", "greeting", "--json")))
    assert plan["unmatched_scope"] == {"cli": ["cli.py", "bin"]}


@pytest.mark.parametrize("args, words", [
    (["--check", "pytest -q | tee log"], ["uses shell syntax ('|')", "runs without a shell", "--check ./"]),
    (["--check", "echo $HOME"], ["uses shell syntax ('$')"]),
    (["--check", "/usr/bin/true"], ["absolute path"]),
    (["--check", "true", "--blocked-by", "nope"], ["--blocked-by names nope"]),
    (["--check", "true", "--scope", "../outside"], ["--scope[1]"]),
])
def test_a_task_that_cannot_be_written_is_refused_and_nothing_is_written(greeter: Path, args: list[str],
                                                                          words: list[str]) -> None:
    ok(lanes(greeter, "initiative", "new", "greeting"))
    before = (greeter / "docs/initiatives/greeting.md").read_text()
    refused(lanes(greeter, "initiative", "add-task", "greeting", "t1", "--goal", "g", "--scope", "greet.py", *args),
            "invalid_task", *words)
    assert (greeter / "docs/initiatives/greeting.md").read_text() == before
    assert not (greeter / "docs/plans/t1.intent.json").exists()


@pytest.mark.coordinator_worktree  # the batch runs in its own worktree: the user's checkout is not judged
def test_authoring_refusals_name_the_command_that_moves_on(greeter: Path) -> None:
    refused(lanes(greeter, "initiative", "add-task", "nope", "t1", "--goal", "g", "--scope", "a", "--check", "true"),
            "initiative_not_found", "lanes-es initiative new nope")
    refused(lanes(greeter, "plan", "nope"), "does not exist", "lanes-es initiative new nope")
    ok(lanes(greeter, "initiative", "new", "greeting"))
    refused(lanes(greeter, "initiative", "new", "greeting"), "initiative_exists", "lanes-es initiative add-task")
    refused(lanes(greeter, "plan", "greeting"), "declares no Slice", "lanes-es initiative add-task greeting")
    out = ok(lanes(greeter, "initiative", "add-task", "greeting", "t1", "--goal", "g", "--scope", "greet.py/",
                   "--check", "true"))
    assert "note:" not in out  # a trailing slash names the same path
    # Not committed yet: `plan` reads the checkout, but a batch runs what is committed (its coordinator
    # worktree is made at HEAD), and says so instead of "does not exist".
    refused(lanes(greeter, "authorize", "greeting", "--yes"), "is in your checkout but not committed",
            "git add docs/initiatives/greeting.md docs/plans && git commit")


# ---------------------------------------------------------------- a batch of one's own, and its dead ends

EXECUTOR = """#!/bin/sh
set -e
printf 'def greet(name):\\n    return f"Hello, {name}!"\\n' > greet.py
lanes-es task submit
"""


def authored(greeter: Path) -> Path:
    """The greeter with a one-task Initiative `greeting`, committed, and a scripted Executor beside it that calls
    plain `lanes-es` (found through the PATH the autopilot gives it)."""
    ok(lanes(greeter, "initiative", "new", "greeting"))
    ok(lanes(greeter, "initiative", "add-task", "greeting", "greet", "--goal", "Write greet", "--scope", "greet.py",
             "--check", GREET_CHECK))
    run_git(greeter, "add", "docs")
    run_git(greeter, "commit", "-q", "-m", "Initiative greeting")
    executor = greeter.parent / "executor"
    executor.write_text(EXECUTOR)
    executor.chmod(0o755)
    return executor


def lanes_es_script(*args: str, cwd: Path, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess[str]:
    """The installed `lanes-es` script, run with a PATH that does not hold it (no activated venv)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run([str(Path(sys.executable).parent / "lanes-es"), *args], cwd=cwd, text=True,
                          capture_output=True, env={**env, "PATH": path}, stdin=subprocess.DEVNULL, timeout=300)


@pytest.mark.usefixtures("store_url")
@pytest.mark.coordinator_worktree
def test_a_batch_of_ones_own_runs_without_an_activated_venv_and_is_verified_from_main(greeter: Path) -> None:
    """Dead ends: the Executor's `lanes-es task submit` exited 127 without an activated venv; `--executor
    ../relative` was looked up from each Lane; `verify` judged the checked-out branch (lineage_mismatch on main).
    As the README has it: the batch runs in its coordinator worktree, the checkout stays on main, `land` lands it."""
    authored(greeter)
    out = lanes_es_script("run", "greeting", "--max-parallel", "1", "--lanes-dir", "../lanes", "--executor",
                          "../executor", "--yes", cwd=greeter)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
    assert "exited with 127" not in out.stdout and ": completed" in out.stdout
    assert run_git(greeter, "branch", "--show-current").stdout.decode().strip() == "main"
    ok(lanes_es_script("land", "greeting", cwd=greeter))
    verified = lanes_es_script("verify", "greeting", cwd=greeter)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "completion: verified 1 children on the batch branch" in verified.stdout
    run_git(greeter, "branch", "-q", "-D", "imm/greeting")
    verified = lanes_es_script("verify", "greeting", cwd=greeter)
    assert verified.returncode == 0 and "is gone" in verified.stdout, verified.stdout + verified.stderr
    audit = lanes_es_script("audit", "batch-greeting", "-o", "../audit.html", cwd=greeter)  # an id prefix, and -o
    assert audit.returncode == 0 and (greeter.parent / "audit.html").stat().st_size > 0, audit.stderr


# ---------------------------------------------------------------- conventions


def test_global_options_are_taken_after_the_command_too(greeter: Path, tmp_path: Path) -> None:
    ok(lanes(greeter, "initiative", "new", "greeting"))
    ok(lanes(tmp_path, "initiative", "add-task", "greeting", "greet", "--goal", "g", "--scope", "greet.py",
             "--check", "true", "--root", str(greeter)))
    assert (greeter / "docs/plans/greet.intent.json").is_file()


def test_a_mistyped_command_gets_a_suggestion(tmp_path: Path) -> None:
    for typed, meant in ((["stauts"], "'status'"), (["task", "sbumit"], "'submit'"), (["initiative", "ad-task"],
                                                                                     "'add-task'")):
        result = lanes(tmp_path, *typed)
        assert result.returncode == 2 and f"did you mean {meant}?" in result.stderr, result.stderr


@pytest.mark.usefixtures("store_url")
def test_a_lane_offered_by_a_relative_path_is_admitted(greeter: Path) -> None:
    authored(greeter)
    ok(lanes(greeter, "authorize", "greeting", "--yes"))
    first = lanes(greeter, "tick", "greeting", "--json")
    handoff = json.loads(first.stdout)["handoffs"][0]
    run_git(greeter, "worktree", "add", "-q", "-b", handoff["lane_branch"], "../lane-greet", handoff["base_head"])
    tick = lanes(greeter, "tick", "greeting", "--offer", "greet=../lane-greet")
    assert tick.returncode == 0, tick.stdout + tick.stderr
    assert "greet" in tick.stdout and "enrolled" in tick.stdout


@pytest.mark.usefixtures("store_url")
def test_a_resumed_run_tells_only_what_is_new(greeter: Path) -> None:
    """Dead end: a run going on with a batch reprinted every event of its log as if new."""
    executor = authored(greeter)
    ready = greeter.parent / "ready"
    executor.write_text(f"#!/bin/sh\n[ -f {ready} ] || exit 1\n" + EXECUTOR.split("\n", 1)[1])
    first = lanes_es_script("run", "greeting", "--max-parallel", "1", "--lanes-dir", "../lanes", "--executor",
                            "../executor", "--yes", "--poll", "0.2", cwd=greeter)
    assert first.returncode == 3 and "greet: lane admitted" in first.stdout, first.stdout + first.stderr
    ready.write_text("")
    second = lanes_es_script("run", "greeting", "--max-parallel", "1", "--lanes-dir", "../lanes", "--executor",
                             "../executor", "--poll", "0.2", cwd=greeter)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "going on with batch batch-greeting-" in second.stdout
    assert "greet: lane admitted" not in second.stdout and "greet: settled" in second.stdout


# ---------------------------------------------------------------- dead ends of a batch of one's own

STOPPING = "#!/bin/sh\nlanes-es task stop --reason 'cannot do it'\n"
MCP_WORDS = ("start_unattended_batch", "lane_offers", "lane-mode parameters")


def run_greeting(greeter: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return lanes_es_script("run", "greeting", "--max-parallel", "1", "--lanes-dir", "../lanes", "--executor",
                           "../executor", "--yes", "--poll", "0.2", *extra, cwd=greeter)


@pytest.mark.usefixtures("store_url")
def test_status_after_a_tick_with_final_verification_shows_the_commands(greeter: Path) -> None:
    """Dead end: `status SLUG` crashed (TypeError, exit 70) after the first tick of a batch confirmed with
    --final-verification: the record's list of commands was read as a run's result."""
    authored(greeter)
    ok(lanes(greeter, "authorize", "greeting", "--yes", "--final-verification", "python3 -V"))
    assert lanes(greeter, "tick", "greeting").returncode == 0
    out = ok(lanes(greeter, "status", "greeting"))
    assert "final verification: python3 -V (runs once every child is integrated)" in out


@pytest.mark.usefixtures("store_url")
def test_a_failed_final_verification_is_not_exit_0(greeter: Path) -> None:
    """Dead end: `run` ended with exit 0 and "completed" when the final verification failed."""
    authored(greeter)
    out = run_greeting(greeter, "--final-verification", "false")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "final verification failed (false)" in out.stdout and "fix it on imm/greeting" in out.stdout
    status = ok(lanes(greeter, "status", "greeting"))
    assert "final verification: FAILED" in status


@pytest.mark.usefixtures("store_url")
def test_a_stopped_task_names_retire_and_the_kept_lane_is_named_for_the_next_batch(greeter: Path) -> None:
    """Dead ends: after `task stop` every `next:` said "continuing needs a new Batch Authorization" while only
    `retire` moves on; after `retire` the old Lane blocked the new batch (batch_lane_occupied) and nothing named
    `git worktree remove` / `git branch -D`."""
    executor = authored(greeter)
    executor.write_text(STOPPING)
    out = run_greeting(greeter)
    assert out.returncode == 3 and "`lanes-es retire greeting` ends the batch" in out.stdout, out.stdout
    status = ok(lanes(greeter, "status", "greeting"))
    assert "greet cannot resume in this batch" in status and "lanes-es retire greeting" in status
    retired = ok(lanes(greeter, "retire", "greeting", "--yes"))
    lane = greeter.parent / "lanes" / "greet"
    assert f"git worktree remove --force {lane}" in retired and "git branch -D imm-lane/greeting/greet" in retired
    executor.write_text(EXECUTOR)
    again = run_greeting(greeter)
    assert again.returncode == 3 and "batch_lane_occupied" in again.stdout
    assert f"git worktree remove --force {lane}" in again.stdout
    run_git(greeter, "worktree", "remove", "--force", str(lane))
    run_git(greeter, "branch", "-D", "imm-lane/greeting/greet")
    done = run_greeting(greeter)
    assert done.returncode == 0 and ": completed" in done.stdout, done.stdout + done.stderr
    for said in (out.stdout, status, retired, again.stdout, done.stdout):
        assert not any(word in said for word in MCP_WORDS), said


@pytest.mark.usefixtures("store_url")
def test_refused_ticks_speak_cli_and_name_the_way_on(greeter: Path) -> None:
    """Dead ends: CLI output said "call start_unattended_batch again" and "Correct the lane-mode parameters" for
    a dirty tree; an existing imm/<slug> was rejected without naming what to do with it."""
    authored(greeter)
    ok(lanes(greeter, "authorize", "greeting", "--yes"))
    (greeter / "junk.txt").write_text("mine\n")
    dirty = lanes(greeter, "tick", "greeting")
    # A refused tick speaks on stderr, in one line, as every refusal does.
    assert dirty.returncode == 2 and "commit, stash or move away the changes" in dirty.stderr, dirty.stderr
    (greeter / "junk.txt").unlink()
    first = lanes(greeter, "tick", "greeting")
    assert "make a Lane for each provision handoff" in first.stdout and "--offer TASK=PATH" in first.stdout
    for said in (dirty.stdout, dirty.stderr, first.stdout):
        assert not any(word in said for word in MCP_WORDS), said
    more = ok(lanes(greeter, "initiative", "add-task", "greeting", "more", "--goal", "g", "--scope", "more.py",
                    "--check", "true"))
    assert "is running" in more and "batch_plan_digest_changed" in more and "lanes-es retire greeting" in more


@pytest.mark.usefixtures("store_url")
def test_an_executor_that_exits_127_is_explained(greeter: Path) -> None:
    executor = authored(greeter)
    executor.write_text("#!/bin/sh\nno-such-agent --do-it\n")
    out = run_greeting(greeter)
    assert out.returncode == 3
    assert "exited with 127 (a command it ran was not found on its PATH (see the log for which))" in out.stdout


def test_missing_extras_name_their_pip_install(greeter: Path) -> None:
    """`lanes-es mcp` without the mcp extra, and checkpoints without the audit extra: each names its install."""
    hide = "import sys\nsys.modules['mcp'] = sys.modules['anyio'] = sys.modules['cryptography'] = None"
    refused(lanes(greeter, "mcp", prelude=hide), "pip install 'lanes-es[mcp]'")
    authored(greeter)
    ok(lanes(greeter, "authorize", "greeting", "--yes", prelude=hide))
    tick = lanes(greeter, "tick", "greeting", prelude=hide)
    assert "checkpoint not written" in tick.stderr and "pip install 'lanes-es[audit]'" in tick.stderr
    verified = ok(lanes(greeter, "verify", "greeting", prelude=hide))
    assert "no checkpoint" in verified and "pip install 'lanes-es[audit]'" in verified
    refused(lanes(greeter, "prove", "greeting", "--event", "1", prelude=hide), "no_checkpoint",
            "pip install 'lanes-es[audit]'")


@pytest.mark.usefixtures("store_url")
def test_what_would_refuse_a_new_batch_refuses_it_before_anything_is_confirmed(greeter: Path) -> None:
    """Dead ends: running an Initiative again while imm/<slug> exists confirmed a new batch, then rejected it
    (batch_branch_exists) and `tick` failed the same way; a dirty tree and an unusable --lanes-dir were found only
    after the confirmation was recorded; `plan` after completion said empty_enrollable_set without why."""
    authored(greeter)
    assert run_greeting(greeter).returncode == 0
    run_git(greeter, "switch", "-q", "main")
    again = run_greeting(greeter)
    # The refusal on stderr, as every command's; nothing prepared on stdout
    assert again.returncode == 2 and "batch_branch_exists" in again.stderr and "nothing was confirmed" in again.stderr
    assert "git branch -d imm/greeting" in again.stderr and "batch prepared" not in again.stdout + again.stderr
    status = ok(lanes(greeter, "status", "greeting"))
    assert ": completed" in status  # the completed batch is still the Initiative's: nothing new was confirmed
    run_git(greeter, "merge", "-q", "--ff-only", "imm/greeting")
    run_git(greeter, "branch", "-q", "-d", "imm/greeting")
    refused(lanes(greeter, "plan", "greeting"), "empty_enrollable_set", "already done", "greet",
            "lanes-es initiative add-task greeting")
    ok(lanes(greeter, "initiative", "add-task", "greeting", "shout", "--goal", "Shout", "--scope", "shout.py",
             "--check", "python3 shout.py"))
    run_git(greeter, "add", "docs")
    run_git(greeter, "commit", "-q", "-m", "another task")
    (greeter / "junk.txt").write_text("mine\n")
    refused(lanes(greeter, "authorize", "greeting", "--yes"), "dirty_working_tree", "junk.txt", "nothing was confirmed")
    (greeter / "junk.txt").unlink()
    refused(lanes_es_script("run", "greeting", "--max-parallel", "1", "--lanes-dir", "/proc/lanes", "--executor",
                            "../executor", "--yes", cwd=greeter), "invalid_lanes_dir", "/proc/lanes")
    assert ": completed" in ok(lanes(greeter, "status", "greeting"))  # still the old batch: nothing confirmed


@pytest.mark.usefixtures("store_url")
def test_a_confirmed_batch_not_yet_started_is_said_so_by_the_audit_commands(greeter: Path) -> None:
    """Dead end: replay, verify, export and audit of a batch confirmed but never ticked said "the store has no
    batch" and sent to `status`, which sent back to `tick`."""
    authored(greeter)
    ok(lanes(greeter, "authorize", "greeting", "--yes"))
    for command in (["replay"], ["verify"], ["export"], ["audit", "-o", str(greeter.parent / "a.html")]):
        refused(lanes(greeter, *command[:1], "greeting", *command[1:]), "batch_not_started",
                "lanes-es tick greeting")


@pytest.mark.usefixtures("store_url")
def test_run_without_the_audit_extra_says_once_why_no_checkpoint_is_written(greeter: Path) -> None:
    authored(greeter)
    hide = "import sys\nsys.modules['cryptography'] = None"
    out = lanes(greeter, "run", "greeting", "--max-parallel", "1", "--lanes-dir", "../lanes", "--executor",
                "../executor", "--yes", "--poll", "0.2", prelude=hide)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("checkpoint not written: the `cryptography` package is not installed") == 1
    assert "pip install 'lanes-es[audit]'" in out.stdout
