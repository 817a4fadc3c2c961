"""What `lanes-es status` and `--help` import: never git's runner (`sh`, which brings asyncio), the tick,
or the audit modules (DSSE, Merkle, signing). Start-up time is measured in `lanes-es bench startup`;
this test pins what the commands load, so a top-level import that undoes it fails here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tools.bench_startup import ENTRY, _env, prepare

# Run the command as the lanes-es script does, then list the modules it loaded, on stderr.
PROBE = ("import atexit, json, sys\n"
         "atexit.register(lambda: print('MODULES ' + json.dumps(sorted(sys.modules)), file=sys.stderr))\n" + ENTRY)
HEAVY = ("sh", "asyncio", "lanes_es.tick", "lanes_es.audit", "lanes_es.adapters.lane_git", "lanes_es.steward")
# The digest chain every command that loads a batch checks its rows against (hashlib and msgspec, under a
# millisecond to import), with its package: not the DSSE, Merkle and signing modules.
LIGHT = ("lanes_es.audit", "lanes_es.audit.chain")


def loaded(cwd, *args: str) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True,
                          env=_env(), check=False)
    line = next(line for line in done.stderr.splitlines() if line.startswith("MODULES "))
    return done.returncode, json.loads(line[len("MODULES "):])


@pytest.mark.parametrize("args", [["--help"], ["status", "demo"]])
def test_a_read_only_command_loads_no_git_runner_tick_or_audit_module(tmp_path, args):
    repo, _ = prepare(tmp_path)
    code, modules = loaded(repo, *args)
    assert code == 0
    assert [name for name in modules if name not in LIGHT
            and any(name == heavy or name.startswith(heavy + ".") for heavy in HEAVY)] == []
