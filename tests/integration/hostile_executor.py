"""An Executor that arms every key of the repository's git config that can name a program, then does its task.

Started by `lanes-es run` in its Lane (as any Executor, with LANES_ES_TASK_ID, LANES_ES_LANE_PATH and
LANES_ES_INTENT), it writes, with plain git and plain files, what an Executor can write: the repository's
shared config (`git config` in a Lane writes the common `.git/config`), a file that config includes,
`.git/info/attributes`, a hooks directory, and an in-scope `.gitattributes` naming the drivers for every
path. Each program touches `$HOSTILE_MARKERS/<key>` (filters pass their input through). Then it writes
its delivery (`{"path", "content"}` per task in LANES_ES_EXECUTOR_HINT) and runs `lanes-es task submit`.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ATTRIBUTES = "* filter=evil diff=evil merge=evil\n"


def program(markers: Path, key: str, then: str = "cat") -> str:
    path = markers.parent / "programs" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(markers / key))}\n{then}\n")
    path.chmod(0o755)
    return str(path)


def arm(lane: Path, markers: Path) -> None:
    def config(key: str, value: str) -> None:
        for _ in range(100):  # Executors arm at once in parallel Lanes: git config waits for no lock of another
            if subprocess.run(["git", "-C", str(lane), "config", key, value], capture_output=True).returncode == 0:
                return
            time.sleep(0.05)
        raise SystemExit(f"hostile executor: git config {key} kept failing")

    for key in ("clean", "smudge"):
        config(f"filter.evil.{key}", program(markers, f"filter.{key}"))
    config("filter.evil.required", "true")
    config("merge.evil.driver", program(markers, "merge.driver", "exit 0"))
    config("merge.default", "evil")
    config("diff.evil.textconv", program(markers, "diff.textconv", 'cat "$1"'))
    config("diff.evil.command", program(markers, "diff.command", "exit 0"))
    config("diff.external", program(markers, "diff.external", "exit 0"))
    config("core.fsmonitor", program(markers, "core.fsmonitor", "exit 1"))
    config("core.editor", program(markers, "core.editor", "exit 0"))
    config("sequence.editor", program(markers, "sequence.editor", "exit 0"))
    config("core.pager", program(markers, "core.pager"))
    config("pager.status", program(markers, "pager.status"))
    config("gpg.program", program(markers, "gpg.program", "exit 1"))
    config("merge.verifySignatures", "true")
    config("log.showSignature", "true")
    config("credential.helper", "!" + program(markers, "credential.helper", "exit 0"))
    config("core.askPass", program(markers, "core.askPass", "exit 0"))
    config("core.sshCommand", program(markers, "core.sshCommand", "exit 1"))
    config("core.alternateRefsCommand", program(markers, "core.alternateRefsCommand", "exit 0"))
    hooks = markers.parent / "hooks"
    hooks.mkdir(exist_ok=True)
    for hook in ("pre-commit", "commit-msg", "post-commit", "post-checkout", "post-merge", "reference-transaction",
                 "pre-auto-gc", "post-index-change"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {shlex.quote(str(markers / ('hook.' + hook)))}\n")
        (hooks / hook).chmod(0o755)
    config("core.hooksPath", str(hooks))
    included = markers.parent / "included.cfg"
    included.write_text(f'[filter "included"]\n\tclean = {program(markers, "included.clean")}\n'
                        f'\tsmudge = {program(markers, "included.smudge")}\n')
    config("include.path", str(included))
    common = Path(subprocess.run(["git", "-C", str(lane), "rev-parse", "--path-format=absolute", "--git-common-dir"],
                                 check=True, capture_output=True, text=True).stdout.strip())
    (common / "info").mkdir(exist_ok=True)
    (common / "info" / "attributes").write_text("*.txt filter=included\n")


def main() -> int:
    task_id = os.environ["LANES_ES_TASK_ID"]
    lane = Path(os.environ["LANES_ES_LANE_PATH"])
    markers = Path(os.environ["HOSTILE_MARKERS"])
    markers.mkdir(parents=True, exist_ok=True)
    arm(lane, markers)
    hint = json.loads(os.environ["LANES_ES_EXECUTOR_HINT"])[task_id]
    target = lane / hint["path"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(hint["content"])
    scope = json.loads(os.environ["LANES_ES_INTENT"])["scope_hint"]
    if ".gitattributes" in scope:
        (lane / ".gitattributes").write_text(ATTRIBUTES)
    return subprocess.run([sys.executable, "-P", "-m", "lanes_es.cli.main", "--root", str(lane), "task", "submit"],
                          cwd=lane).returncode


if __name__ == "__main__":
    sys.exit(main())
