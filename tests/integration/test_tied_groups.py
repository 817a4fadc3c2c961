"""A command lanes-es waits for (a check, an Executor attempt) ends with the thread that started it, even one
killed outright: through util-linux's `setpriv --pdeathsig KILL` (started with vfork, the default where the
machine has it), and through the `preexec_fn` fallback. Real processes: a supervisor Python is SIGKILLed
while its command runs, and the command must be gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lanes_es.adapters import processes
from lanes_es.adapters.processes import kill_group, start_tied_group

PROJECT = str(Path(__file__).resolve().parents[2])
HAS_SETPRIV = processes._pdeathsig_trampoline() is not None

SUPERVISOR = """\
import sys, time
from lanes_es.adapters import processes
if sys.argv[1] == "fallback":
    processes._TRAMPOLINE[:] = [None]
process = processes.start_tied_group(["sleep", "120"])
print(process.pid, flush=True)
time.sleep(120)
"""


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def program_of(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().split(b"\0")[0]


@pytest.mark.parametrize("way", ["trampoline", "fallback"])
def test_a_command_ends_with_its_supervisor_killed_outright(way):
    if way == "trampoline" and not HAS_SETPRIV:
        pytest.fail("this machine's setpriv does not take --pdeathsig (util-linux 2.33 or later is needed)")
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR, way], cwd=PROJECT, stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": PROJECT})
    assert supervisor.stdout is not None
    command = int(supervisor.stdout.readline())
    # The pid Popen gave is the command's own: the trampoline execs it (Popen returns once setpriv runs)
    deadline = time.monotonic() + 10
    while not program_of(command).endswith(b"sleep") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert program_of(command).endswith(b"sleep"), program_of(command)
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    deadline = time.monotonic() + 10
    while not gone(command) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(command), "the command outlived its supervisor"


def test_a_program_that_is_missing_or_not_executable_does_not_start_as_with_popen(tmp_path):
    with pytest.raises(FileNotFoundError):
        start_tied_group([str(tmp_path / "no-such-agent")])
    with pytest.raises(FileNotFoundError):
        start_tied_group(["no-such-agent-on-path"], env={"PATH": str(tmp_path)})
    plain = tmp_path / "plain"
    plain.write_text("not a program\n")
    with pytest.raises(PermissionError):
        start_tied_group(["./plain"], cwd=tmp_path)


def test_a_program_is_found_on_the_path_of_the_environment_it_is_given(tmp_path):
    program = tmp_path / "greet"
    program.write_text("#!/bin/sh\necho greeted from \"$PWD\"\n")
    program.chmod(0o755)
    process = start_tied_group(["greet"], cwd=tmp_path, env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
                               stdout=subprocess.PIPE)
    out, _ = process.communicate(timeout=30)
    kill_group(process)
    assert out.decode().strip() == f"greeted from {tmp_path}"
