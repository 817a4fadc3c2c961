"""Deterministic QA on real processes (docs/upstream.md#the-descriptor-rerun-and-deterministic-qa): pass, fail, timeout, output limit,
prepare, missing executable, `./file` executables inside the tree, the limited environment."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lanes_es.adapters.qa import materialized_worktree, run_acceptance, run_acceptance_on_worktree
from tests.gitfixtures import descriptor, make_repo, write_file

TASK = "task-a"


def raw_descriptor(executable: str, argv: list[str], *, cwd: str = ".", timeout_ms: int = 60000,
                   max_output_bytes: int = 4096, prepare: dict | None = None) -> str:
    return json.dumps({
        "contract": "assurance_kernel/verification_descriptor/v2",
        "command": {"executable": executable, "argv": argv, "cwd": cwd, "timeout_ms": timeout_ms,
                    "max_output_bytes": max_output_bytes},
        "environment": {"prepare": prepare, "writable_paths": []},
    })


def command(executable: str, argv: list[str], *, timeout_ms: int = 60000) -> dict:
    return {"executable": executable, "argv": argv, "cwd": ".", "timeout_ms": timeout_ms, "max_output_bytes": 4096}


def intent(*verifications: str) -> dict:
    return {"task_id": TASK, "acceptance": [{"id": f"A{index}", "assertion": "holds", "verification": text}
                                            for index, text in enumerate(verifications, start=1)]}


def reasons(verdict) -> dict[str, str]:
    return {finding.id: finding.reason for finding in verdict.findings}


def test_a_passing_command_gives_a_pass_verdict(tmp_path):
    verdict = run_acceptance(str(tmp_path), TASK, intent(descriptor(["-c", "print('ok')"])))
    assert verdict.contract == "assurance_kernel/assurance_verdict/v2"
    assert verdict.decision == "pass"
    assert verdict.findings == []


def test_a_non_zero_exit_is_a_finding_with_the_item_id_and_the_output_tail(tmp_path):
    verdict = run_acceptance(str(tmp_path), TASK, intent(
        descriptor(["-c", "print('ok')"]),
        descriptor(["-c", "import sys; print('expected 3 got 2'); sys.exit(3)"])))
    assert verdict.decision == "rework"
    assert reasons(verdict) == {"task-a:A2": "python3 exited with code 3: expected 3 got 2"}


def test_a_command_over_its_time_is_killed_and_fails(tmp_path):
    verdict = run_acceptance(str(tmp_path), TASK, intent(raw_descriptor("sleep", ["30"], timeout_ms=200)))
    assert reasons(verdict) == {"task-a:A1": "timed out after 200 ms"}


def test_output_over_the_limit_kills_the_command_and_fails(tmp_path):
    verdict = run_acceptance(str(tmp_path), TASK, intent(raw_descriptor("yes", [], max_output_bytes=1000)))
    assert reasons(verdict) == {"task-a:A1": "output exceeded 1000 bytes"}


def test_output_within_the_limit_passes(tmp_path):
    verdict = run_acceptance(str(tmp_path), TASK, intent(
        descriptor(["-c", "import sys; sys.stdout.write('x' * 1000)"], max_output_bytes=1000)))
    assert verdict.decision == "pass"


def test_prepare_runs_first_in_the_group(tmp_path):
    prepare = command("python3", ["-c", "open('prepared.flag', 'w').write('1')"])
    check = raw_descriptor("python3", ["-c", "import os,sys; sys.exit(0 if os.path.exists('prepared.flag') else 1)"],
                           prepare=prepare)
    assert run_acceptance(str(tmp_path), TASK, intent(check)).decision == "pass"


def test_a_failing_prepare_fails_every_item_of_its_group_only(tmp_path):
    prepare = command("python3", ["-c", "import sys; sys.exit(4)"])
    grouped = raw_descriptor("true", [], prepare=prepare)
    other = raw_descriptor("true", [])
    verdict = run_acceptance(str(tmp_path), TASK, intent(grouped, grouped, other))
    assert reasons(verdict) == {"task-a:A1": "environment prepare failed: python3 exited with code 4",
                                "task-a:A2": "environment prepare failed: python3 exited with code 4"}


def test_a_missing_executable_is_a_failure_never_a_pass(tmp_path):
    verdict = run_acceptance(str(tmp_path), TASK, intent(raw_descriptor("no-such-tool-lanes-es", [])))
    assert reasons(verdict) == {"task-a:A1": "executable no-such-tool-lanes-es was not found on PATH"}


def test_an_invalid_descriptor_is_a_failure_with_its_reason(tmp_path):
    v1 = json.dumps({"contract": "assurance_kernel/verification_descriptor/v1", "command": "true"})
    verdict = run_acceptance(str(tmp_path), TASK, intent("not json", v1))
    found = reasons(verdict)
    assert verdict.decision == "rework"
    assert found["task-a:A1"] == "verification descriptor is not valid JSON"
    assert found["task-a:A2"].startswith("verification_contract_migration_required")


def test_no_acceptance_is_never_a_pass(tmp_path):
    verdict = run_acceptance(str(tmp_path), TASK, {"acceptance": []})
    assert verdict.decision == "rework"


def test_a_script_in_the_tree_runs_without_a_shell_from_its_cwd(tmp_path):
    write_file(tmp_path, "scripts/check.py", "#!/usr/bin/env python3\nimport os, sys\n"
                                             "sys.exit(0 if os.path.basename(os.getcwd()) == 'sub' else 9)\n",
               mode=0o755)
    (tmp_path / "sub").mkdir()
    verdict = run_acceptance(str(tmp_path), TASK, intent(raw_descriptor("./scripts/check.py", ["$HOME;", "|"],
                                                                        cwd="sub")))
    assert verdict.decision == "pass"


def test_a_missing_or_non_executable_script_fails(tmp_path):
    write_file(tmp_path, "plain.sh", "#!/bin/sh\nexit 0\n", mode=0o644)
    verdict = run_acceptance(str(tmp_path), TASK, intent(raw_descriptor("./absent.sh", []),
                                                         raw_descriptor("./plain.sh", [])))
    assert reasons(verdict) == {"task-a:A1": "executable ./absent.sh does not exist in the tree",
                                "task-a:A2": "executable ./plain.sh is not executable"}


def test_a_symlink_out_of_the_tree_is_refused(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    outside = write_file(tmp_path, "outside.sh", "#!/bin/sh\nexit 0\n", mode=0o755)
    os.symlink(outside, tree / "link.sh")
    os.symlink(str(tmp_path), tree / "up")
    verdict = run_acceptance(str(tree), TASK, intent(raw_descriptor("./link.sh", []),
                                                     raw_descriptor("true", [], cwd="up")))
    assert reasons(verdict) == {"task-a:A1": "executable ./link.sh resolves outside the tree",
                                "task-a:A2": "cwd up is not a directory inside the tree"}


def test_the_environment_is_limited_and_home_is_temporary(tmp_path, monkeypatch):
    monkeypatch.setenv("LANES_ES_SECRET", "leak")
    write_file(tmp_path, "envdump.sh", '#!/bin/sh\nenv > env.out\ntest -d "$HOME" && test -d "$TMPDIR"\n', mode=0o755)
    assert run_acceptance(str(tmp_path), TASK, intent(raw_descriptor("./envdump.sh", []))).decision == "pass"
    seen = dict(line.split("=", 1) for line in (tmp_path / "env.out").read_text().splitlines())
    shell_own = {"PWD", "OLDPWD", "SHLVL", "_"}  # what /bin/sh itself exports
    assert set(seen) - shell_own == {"PATH", "HOME", "TMPDIR", "XDG_CACHE_HOME", "IMM_VERIFICATION_PROCESS_TOKEN"}
    assert seen["HOME"] != os.environ.get("HOME")
    assert not os.path.exists(seen["HOME"])  # the temporary HOME is removed after the group
    assert len(seen["IMM_VERIFICATION_PROCESS_TOKEN"]) >= 16


def test_qa_on_a_worktree_runs_on_a_copy_of_tracked_and_untracked_files(tmp_path):
    root = make_repo(tmp_path / "repo", files={"tracked.txt": "t\n"})
    write_file(root, "untracked.txt", "u\n")
    write_file(root, ".imm/state/ignored.txt", "i\n")
    check = descriptor(["-c", "import os,sys; open('built.out','w').write('x');"
                              "sys.exit(0 if os.path.exists('tracked.txt') and os.path.exists('untracked.txt')"
                              " and not os.path.exists('.imm/state/ignored.txt') else 1)"])
    assert run_acceptance_on_worktree(root, TASK, intent(check)).decision == "pass"
    assert not Path(root, "built.out").exists()


def test_the_materialized_copy_keeps_modes_and_links_and_is_removed(tmp_path):
    root = make_repo(tmp_path / "repo", files={"run.sh": "#!/bin/sh\n"})
    os.chmod(Path(root, "run.sh"), 0o755)
    os.symlink("run.sh", Path(root, "alias.sh"))
    with materialized_worktree(root) as copy:
        assert os.access(Path(copy, "run.sh"), os.X_OK)
        assert os.readlink(Path(copy, "alias.sh")) == "run.sh"
        kept = copy
    assert not os.path.exists(kept)


@pytest.mark.parametrize("bad", [{"id": "A1", "assertion": "x"}, "not an item"])
def test_an_item_without_a_verification_fails(tmp_path, bad):
    verdict = run_acceptance(str(tmp_path), TASK, {"acceptance": [bad]})
    assert verdict.decision == "rework"


def test_a_check_that_alters_a_protected_input_fails(tmp_path):
    """docs/upstream.md#the-descriptor-rerun-and-deterministic-qa: the protected inputs are rechecked; a check that rewrites what it judges proves nothing."""
    (tmp_path / "a.txt").write_text("delivered\n")
    rewrite = raw_descriptor("python3", ["-c", "open('a.txt', 'w').write('what the check wanted\\n')"])
    verdict = run_acceptance(str(tmp_path), TASK, intent(rewrite))
    assert reasons(verdict) == {
        "task-a:A1": "the checks changed protected inputs outside the writable paths: a.txt"}


def test_writes_inside_the_writable_paths_and_new_files_are_allowed(tmp_path):
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "old.o").write_text("old\n")
    writes = json.dumps({
        "contract": "assurance_kernel/verification_descriptor/v2",
        "command": {"executable": "python3", "cwd": ".", "timeout_ms": 60000, "max_output_bytes": 4096,
                    "argv": ["-c", "open('build/old.o', 'w').write('new'); open('report.txt', 'w').write('ok')"]},
        "environment": {"prepare": None, "writable_paths": ["build"]},
    })
    assert run_acceptance(str(tmp_path), TASK, intent(writes)).decision == "pass"


def test_each_item_gets_the_digest_of_its_commands_output_or_none_when_it_never_ran(tmp_path):
    import hashlib

    from lanes_es.adapters.qa import run_acceptance_with_outputs

    verdict, outputs = run_acceptance_with_outputs(str(tmp_path), TASK, intent(
        descriptor(["-c", "import sys; print('ok', flush=True); sys.stderr.write('warn')"]),
        descriptor(["-c", "import sys; print('expected 3 got 2'); sys.exit(3)"]),
        raw_descriptor("no-such-tool-anywhere", []),
        "not a descriptor"))
    assert verdict == run_acceptance(str(tmp_path), TASK, intent(  # the same verdict as before, digests beside it
        descriptor(["-c", "import sys; print('ok', flush=True); sys.stderr.write('warn')"]),
        descriptor(["-c", "import sys; print('expected 3 got 2'); sys.exit(3)"]),
        raw_descriptor("no-such-tool-anywhere", []),
        "not a descriptor"))
    assert [(output.id, output.passed, output.output_sha256, output.output_bytes) for output in outputs] == [
        ("task-a:A1", True, hashlib.sha256(b"ok\nwarn").hexdigest(), 7),
        ("task-a:A2", False, hashlib.sha256(b"expected 3 got 2\n").hexdigest(), 17),
        ("task-a:A3", False, None, 0),
        ("task-a:A4", False, None, 0)]


# A check leads its own session (so that its whole tree can be killed), so the terminal's Ctrl-C does not
# reach it: lanes-es ends it. These run in a Python of their own, whose main thread receives the SIGINT.
INTERRUPTED_WHILE_STARTING = """
import os, signal, subprocess
from lanes_es.adapters import processes

class SignalledBeforePopenReturns(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        print(self.pid, flush=True)
        os.kill(os.getpid(), signal.SIGINT)  # Python raises it at its next step, inside this Popen

processes.subprocess.Popen = SignalledBeforePopenReturns
try:
    with processes.groups_ended_on_interrupt():
        processes.start_group(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print("not interrupted", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""

INTERRUPTED_WHILE_A_POOL_WAITS = """
import os, signal, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from lanes_es.adapters import processes

def interrupt_once_started():
    while not processes.STARTED.running:
        time.sleep(0.01)
    print(next(iter(processes.STARTED.running)).pid, flush=True)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt_once_started, daemon=True).start()
try:
    with processes.groups_ended_on_interrupt(), ThreadPoolExecutor(max_workers=2) as pool:
        pool.submit(processes.run_bounded, ["sleep", "60"], ".", b"", 90, 100, 100).result()
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def interrupted_script(script: str) -> tuple[list[str], float]:
    """The lines the script printed and the seconds it took."""
    import subprocess
    import sys
    import time

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    return done.stdout.split(), time.monotonic() - started


def gone_within(pid: int, seconds: float) -> bool:
    import time

    from lanes_es.adapters.processes import process_alive

    deadline = time.monotonic() + seconds
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not process_alive(pid)


def test_an_interrupt_while_a_check_starts_still_ends_the_check():
    (pid, said), _ = interrupted_script(INTERRUPTED_WHILE_STARTING)
    assert said == "interrupted"
    assert gone_within(int(pid), 10)  # raised inside Popen, the child was not yet known: it slept on


def test_an_interrupt_while_a_pool_waits_on_its_checks_ends_them_at_once():
    (pid, said), seconds = interrupted_script(INTERRUPTED_WHILE_A_POOL_WAITS)
    assert said == "interrupted"
    assert gone_within(int(pid), 10)
    assert seconds < 45  # not waiting for its 60 s check to end on its own
